"""Run the retrieval server in a child process: for tests, benchmarks, the demo and auto-started envs.

    with RetrievalServer("indexes/wiki") as server:      # a free loopback port, waits for /health
        client = RetrievalClient(server.url)
        ...
    # stopped on exit (also at interpreter exit if never stopped)

The child is `python -m retrieval_index.server`; it binds port 0 (or the port asked for), writes the
port it got to a file, and logs to `log_path`. `kill()` ends it abruptly (SIGKILL, as a crash would);
`start()` again brings it back on the same port, so clients that knew the URL recover.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["RetrievalServer", "ServerStartError", "shared_server"]


class ServerStartError(RuntimeError):
    """The server process did not come up; the message holds the end of its log."""


class RetrievalServer:
    """A retrieval server in a child process.

    Args:
        index_dir: the index to serve.
        port: the port (None or 0: a free one, kept across `kill()`/`start()`).
        host: the address to bind (loopback by default).
        batching: coalesce concurrent requests (False: one Lucene call per query).
        extra_args: more `serve-retrieval` options, e.g. `["--threads", "16"]`.
        log_path: where the child's output goes (default: a temporary file).
        startup_timeout: seconds to wait for /health.
    """

    def __init__(
        self,
        index_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        batching: bool = True,
        extra_args: list[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        self.index_dir = str(index_dir)
        self.host = host
        self.port = int(port or 0)
        self.batching = batching
        self.extra_args = list(extra_args or [])
        self._tmp = tempfile.TemporaryDirectory(prefix="agentgym-retrieval-")
        self.log_path = Path(log_path) if log_path else Path(self._tmp.name) / "server.log"
        self.startup_timeout = float(startup_timeout)
        self.process: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)

    @property
    def url(self) -> str:
        """The server's base URL (http://host:port)."""
        if not self.port:
            raise RuntimeError("the server has not been started yet")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> RetrievalServer:
        """Start the child and wait until /health answers (no-op when running)."""
        if self.running:
            return self
        port_file = Path(self._tmp.name) / "port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "retrieval_index.server", "--index", self.index_dir, "--host", self.host,
               "--port", str(self.port), "--port-file", str(port_file), "--exit-with-parent", str(os.getpid()),
               *self.extra_args]  # fmt: skip
        if not self.batching:
            cmd.append("--no-batching")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"the retrieval server exited with status {self.process.returncode}:\n{self.log_tail()}")
            if port_file.exists():
                text = port_file.read_text().strip()
                if text.isdigit():
                    self.port = int(text)
                    if self._healthy():
                        return self
            time.sleep(0.05)
        self.stop()
        raise ServerStartError(
            f"the retrieval server did not answer within {self.startup_timeout:g} s:\n{self.log_tail()}")

    def _healthy(self) -> bool:
        import requests

        try:
            return requests.get(f"{self.url}/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the child (SIGTERM, then SIGKILL after `timeout` seconds). Idempotent."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    def kill(self) -> None:
        """End the child at once with SIGKILL (what a crash looks like to clients)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {self.url}" if self.running else "stopped"
        return f"RetrievalServer({self.index_dir!r}, {state})"


_SHARED: dict[str, RetrievalServer] = {}


def shared_server(index_dir: str | os.PathLike[str]) -> RetrievalServer:
    """One running server per index for the whole process (started on first use, stopped at exit)."""
    key = str(Path(index_dir).resolve())
    server = _SHARED.get(key)
    if server is None:
        server = _SHARED[key] = RetrievalServer(key)
    return server.start()
