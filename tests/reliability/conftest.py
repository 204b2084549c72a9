"""Reliability tests: load, slow clients, fuzzing, corrupt files, crash-safety and security defaults.

`load_tools` is `benchmarks.load` (the load driver the benchmark uses). `assert_listens_on_loopback_only(pid)`
checks where a real server process listens, from the kernel's socket tables.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # reliability_fuzz.py (shared hypothesis strategies) is imported by name
    sys.path.insert(0, HERE)


@pytest.fixture(scope="session")
def load_tools():
    import benchmarks.load

    return benchmarks.load


def listening_addresses(pid: int) -> list[str]:
    """The local IP addresses of the TCP sockets process `pid` listens on (from /proc/net/tcp{,6})."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(local.split(":")[0])
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # /proc prints host-order words
            out.append(str(ipaddress.ip_address(words)) if family == socket.AF_INET
                       else str(ipaddress.IPv6Address(words)))
    return out


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None
                              and ip.ipv4_mapped.is_loopback)


@pytest.fixture(scope="session")
def assert_listens_on_loopback_only():
    def check(pid: int) -> list[str]:
        addresses = listening_addresses(pid)
        assert addresses, f"process {pid} listens on no TCP socket"
        assert all(is_loopback(a) for a in addresses), f"process {pid} listens on {addresses}"
        return addresses

    return check
