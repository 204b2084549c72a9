"""Env worker processes: each env lives in its own process, so a crash, a hang or a kill costs one
episode, never the run.

The rollout loop (`agentgym_opsd.rollout.run_episodes`) talks to every env through an `EnvHandle`:
`reset_async`/`reset_wait` and `step_async`/`step_wait`. `LocalEnv` plays the env in this process
(the call happens in `*_async`, `*_wait` returns its result). `WorkerEnv` plays it in a child
process: `*_async` sends the command down a pipe and returns at once, so all envs of a tick step in
parallel, and `*_wait` collects the answer, up to a deadline.

What can go wrong in a worker, and what the rollout sees (an `EnvFailure` whose message is the
reason the episode is marked errored with):

- the env raises (in reset, step, or a method an agent calls): `step failed: ValueError: ...`;
- the step runs past the timeout: the worker is killed with SIGKILL, `step timed out after 5s`;
- the process dies (killed, segfault, `os._exit`): `worker process died (killed by SIGKILL)`.

After a failure the handle restarts its worker (a fresh process and env) before its next episode.

Scripted agents read the env (`env.expert_action()`, `env.format_action(...)`): they get a
`RemoteEnvProxy` that forwards attribute reads and method calls to the worker. A
`numpy.random.Generator` passed to a remote method is advanced exactly as a local call would
advance it (its state is sent back), so results do not depend on where the env runs.

Workers start from the `forkserver` (a clean process that imports `agentgym_opsd` once and forks a
worker per env) when the env factory can be pickled: `EnvFactory(env_id, kwargs)` is the one to use.
A closure or lambda factory falls back to `fork`, which is fast and carries closures, but is unsafe
when this process runs a JVM (pyjnius, for the Lucene-backed envs) or other threads: a forked worker
can hang on a lock a vanished thread held (a warning says so). A worker exits by itself when the
process that started it goes away.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym_opsd.registry import UnknownEnvError, entry, load_plugins, make

__all__ = [
    "EnvFactory", "EnvFailure", "EnvHandle", "LocalEnv", "WorkerEnv", "RemoteEnvProxy", "default_start_method",
    "describe_exit",
]


class EnvFailure(RuntimeError):
    """An env failed (raised, timed out, or its process died); the message is the reason."""


def describe_exit(exitcode: int | None) -> str:
    """`killed by SIGKILL`, `exit code 3`, ... for a process's exit code."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _env_name(env: Any) -> str:
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(getattr(env, "unwrapped", env)).__name__


def _error_text(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


class EnvHandle:
    """How the rollout loop drives one env. Results come back from the `*_wait` calls; every
    failure is an `EnvFailure`.

    Attributes:
        env_id: the Gymnasium id (or the class name of an unregistered env).
        instructions: the env's system prompt.
    """

    env_id: str = ""
    instructions: str = ""

    def reset_async(self, seed: int, options: dict[str, Any]) -> None:
        raise NotImplementedError

    def reset_wait(self) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def step_async(self, response: str) -> None:
        raise NotImplementedError

    def step_wait(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        raise NotImplementedError

    @property
    def agent_env(self) -> Any:
        """What an agent gets as `env`: the unwrapped env, or a proxy to it."""
        raise NotImplementedError

    @property
    def broken(self) -> str | None:
        """Why the env is unusable until `restart()` (after a failure), or None."""
        return None

    def hindsight(self) -> Any:
        return self.agent_env.hindsight()

    def restart(self) -> None:
        """Replace the env by a fresh one (after a failure)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class LocalEnv(EnvHandle):
    """An env played in this process. No timeouts: a hung step hangs the caller."""

    def __init__(self, make_env: Callable[[], Any]) -> None:
        self._make_env = make_env
        self.env = make_env()
        self._result: tuple[bool, Any] | None = None
        self._describe()

    def _describe(self) -> None:
        self.env_id = _env_name(self.env)
        self.instructions = getattr(self.env.unwrapped, "instructions", "")

    def _call(self, what: str, fn: Callable[[], Any]) -> None:
        try:
            self._result = (True, fn())
        except Exception as e:  # the env's bug becomes the episode's error
            self._result = (False, f"{what} failed: {_error_text(e)}")

    def _take(self) -> Any:
        assert self._result is not None, "wait without async"
        ok, value = self._result
        self._result = None
        if not ok:
            raise EnvFailure(value)
        return value

    def reset_async(self, seed: int, options: dict[str, Any]) -> None:
        self._call("reset", lambda: self.env.reset(seed=seed, options=options))

    def reset_wait(self) -> tuple[str, dict[str, Any]]:
        return self._take()

    def step_async(self, response: str) -> None:
        self._call("step", lambda: self.env.step(response))

    def step_wait(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self._take()

    @property
    def agent_env(self) -> Any:
        return self.env.unwrapped

    def restart(self) -> None:
        try:
            self.env.close()
        except Exception:
            pass
        self.env = self._make_env()
        self._describe()

    def close(self) -> None:
        self.env.close()


# ---------------------------------------------------------------------------------------------
# The worker process.

# The parent ends of every live worker's pipe: a forked child closes the ones that are not its own,
# so that a worker sees EOF when the parent dies even if a sibling is still alive.
_PARENT_ENDS: weakref.WeakSet = weakref.WeakSet()

_POLL_SECONDS = 1.0


def _worker_main(conn: Any, make_env: Callable[[], Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        _serve(conn, make_env)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        pass  # the parent went away (Ctrl-C, a kill) while this worker answered: end quietly


def _serve(conn: Any, make_env: Callable[[], Any]) -> None:
    # The process that started this one: the rollout (fork) or the fork server, which exits with
    # the rollout. When it goes, this worker is re-parented and ends.
    parent_pid = os.getppid()
    for other in list(_PARENT_ENDS):
        try:
            other.close()
        except OSError:
            pass
    try:
        env = make_env()
    except Exception as e:
        conn.send(("error", f"env construction failed: {_error_text(e)}", _portable(e)))
        return
    raw = env.unwrapped
    conn.send(("ok", {"env_id": _env_name(env), "instructions": getattr(raw, "instructions", "")}, None))
    methods: dict[str, bool] = {}
    while True:
        try:
            while not conn.poll(_POLL_SECONDS):
                if os.getppid() != parent_pid:  # orphaned: the rollout is gone
                    return
            message = conn.recv()
        except (EOFError, OSError):
            return
        command, args = message[0], message[1:]
        try:
            if command == "reset":
                seed, options, prefetch = args
                result: Any = env.reset(seed=seed, options=options)
                reply: Any = (result, _prefetch(raw, prefetch))
            elif command == "step":
                response, prefetch = args
                result = env.step(response)
                reply = (result, {} if result[2] or result[3] else _prefetch(raw, prefetch))
            elif command == "attr":
                value = getattr(raw, args[0])
                methods[args[0]] = callable(value)
                reply = ("method", None) if callable(value) else ("value", value)
            elif command == "call":
                name, call_args, call_kwargs = args
                generators = [a for a in (*call_args, *call_kwargs.values()) if isinstance(a, np.random.Generator)]
                value = getattr(raw, name)(*call_args, **call_kwargs)
                reply = (value, [g.bit_generator.state for g in generators])
            elif command == "close":
                env.close()
                conn.send(("ok", None, None))
                return
            else:
                raise ValueError(f"unknown worker command {command!r}")
        except Exception as e:
            conn.send(("error", f"{command} failed: {_error_text(e)}", _portable(e)))
            continue
        try:
            conn.send(("ok", reply, None))
        except Exception as e:  # an unpicklable result: the env's bug, reported, not fatal
            why = f"{command} failed: its result cannot be sent between processes ({_error_text(e)})"
            conn.send(("error", why, None))


def _prefetch(raw: Any, names: tuple[str, ...]) -> dict[str, tuple[bool, Any]]:
    """The results of the env's zero-argument methods `names` in its current state (what the agent
    will ask next), each `(True, value)` or `(False, exception)`."""
    out: dict[str, tuple[bool, Any]] = {}
    for name in names:
        try:
            out[name] = (True, getattr(raw, name)())
        except Exception as e:
            out[name] = (False, _portable(e) or RuntimeError(f"{name} failed: {_error_text(e)}"))
    return out


def _portable(e: BaseException) -> BaseException | None:
    """`e` if it survives a trip through pickle (what the parent can re-raise), else None."""
    try:
        pickle.loads(pickle.dumps(e))
    except Exception:
        return None
    return e


@dataclass(frozen=True)
class EnvFactory:
    """A picklable `make_env` for a registered id: `EnvFactory("agentgym/WebShop-v0", {"split": "test"})`.

    It carries the parent's `sys.path`, so a worker started from the fork server or by spawn finds
    plug-ins the parent put on its path, and registers them again if the id is not known there.
    """

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    paths: tuple[str, ...] = field(default_factory=lambda: tuple(sys.path))

    def __call__(self) -> Any:
        missing = [p for p in self.paths if p not in sys.path]
        if missing:
            sys.path.extend(missing)
        try:
            entry(self.env_id)
        except UnknownEnvError:
            load_plugins(reload=True)
        return make(self.env_id, **self.kwargs)


def default_start_method(make_env: Callable[[], Any]) -> str:
    """`forkserver` when `make_env` can be pickled (workers then start from a clean process that
    never ran a JVM, a CUDA context or threads), else `fork` (closures and lambdas)."""
    try:
        pickle.dumps(make_env)
    except Exception:
        return "fork"
    return "forkserver"


def _warn_if_fork_is_unsafe() -> None:
    if "jnius" in sys.modules:  # pyjnius starts the JVM on import; its threads do not survive fork
        warnings.warn(
            "forking env workers from a process that runs a JVM (pyjnius) can hang them; pass a picklable "
            "make_env (agentgym_opsd.workers.EnvFactory) so that workers start from the fork server",
            RuntimeWarning,
            stacklevel=4,
        )


class WorkerEnv(EnvHandle):
    """An env played in its own process.

    The process starts at once; the first request waits for its env to be built, so several
    workers build their envs in parallel.

    Args:
        make_env: builds the env; called in the child.
        step_timeout: seconds a reset, step or method call may take before the worker is killed
            (None: no limit).
        start_timeout: seconds the child may take to build its env.
        start_method: `fork`, `forkserver` or `spawn`; by default `default_start_method(make_env)`.
        prefetch: names of zero-argument env methods the agent calls before each turn (its
            `env_prefetch`, e.g. the expert's `expert_action`): the worker computes them with each
            reset and step and sends them along, saving the agent a round trip per turn.
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        *,
        step_timeout: float | None = 60.0,
        start_timeout: float = 300.0,
        start_method: str | None = None,
        prefetch: tuple[str, ...] = (),
    ) -> None:
        self._make_env = make_env
        self.prefetch = tuple(prefetch)
        self._prefetched: dict[str, tuple[bool, Any]] = {}
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        self.start_method = start_method or default_start_method(make_env)
        self._ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":
            self._ctx.set_forkserver_preload(["agentgym_opsd"])
        elif self.start_method == "fork":
            _warn_if_fork_is_unsafe()
        self._process: Any = None
        self._conn: Any = None
        self._pending: str | None = None  # the command awaiting its answer
        self._sent_at = 0.0
        self._broken: str | None = None  # why the worker is unusable until restarted
        self._proxy = RemoteEnvProxy(self)
        self._spawn()

    # -- process life ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The worker process's id."""
        return None if self._process is None else self._process.pid

    def _spawn(self) -> None:
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=_worker_main, args=(child_end, self._make_env), daemon=True,
                                    name="agentgym-env-worker")
        _PARENT_ENDS.add(parent_end)
        process.start()
        child_end.close()
        self._process, self._conn = process, parent_end
        self._pending, self._broken = "start", None
        self._sent_at = time.monotonic()

    def wait_started(self) -> None:
        """Wait until the worker has built its env (raises what building it raised)."""
        if self._pending != "start":
            return
        try:
            info = self._wait(self.start_timeout)
        except EnvFailure as e:
            raise EnvFailure(f"env worker could not start: {e}") from None
        self.env_id, self.instructions = info["env_id"], info["instructions"]

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            try:
                os.kill(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._process is not None:
            self._process.join(timeout=5)
        if self._conn is not None:
            _PARENT_ENDS.discard(self._conn)
            self._conn.close()
        self._process, self._conn = None, None

    @property
    def broken(self) -> str | None:
        return self._broken

    def restart(self) -> None:
        self._kill()
        self._spawn()
        self.wait_started()

    def close(self) -> None:
        if self._process is None:
            return
        if self._broken is None and self._pending is None:
            try:
                self._conn.send(("close",))
                if self._conn.poll(5):
                    self._conn.recv()
            except (OSError, EOFError):
                pass
            self._process.join(timeout=5)
        self._kill()

    def __del__(self) -> None:  # a forgotten handle must not leave a process behind
        try:
            self._kill()
        except Exception:
            pass

    # -- requests -------------------------------------------------------------------------------

    def _send(self, *message: Any) -> None:
        self._prefetched = {}  # answers for the state before this request
        self.wait_started()
        if self._broken is not None:
            raise EnvFailure(self._broken)
        assert self._pending is None, f"worker busy with {self._pending}"
        self._pending, self._sent_at = str(message[0]), time.monotonic()
        try:
            self._conn.send(message)
        except (OSError, EOFError):  # it died; _wait reports how
            pass

    def _died(self) -> str:
        self._process.join(timeout=2)
        return f"worker process died ({describe_exit(self._process.exitcode)})"

    def _wait(self, timeout: float | None) -> Any:
        """The answer to the pending command, or EnvFailure (and the worker is marked broken)."""
        command = self._pending
        assert command is not None, "wait without a request"
        deadline = None if timeout is None else self._sent_at + timeout
        try:
            while True:
                left = _POLL_SECONDS if deadline is None else min(_POLL_SECONDS, deadline - time.monotonic())
                try:
                    # An answer already waiting is taken even when the deadline has passed (this
                    # handle may be collected after a slow sibling's).
                    if self._conn.poll(max(0.0, left)):
                        status, value, exc = self._conn.recv()
                        break
                except (EOFError, OSError):
                    raise EnvFailure(self._died()) from None
                if not self._process.is_alive() and not self._conn.poll(0):
                    raise EnvFailure(self._died())
                if deadline is not None and time.monotonic() >= deadline:
                    self._kill()
                    raise EnvFailure(f"{command} timed out after {timeout:g}s (worker killed)")
        except EnvFailure as e:
            self._pending, self._broken = None, str(e)
            raise
        self._pending = None
        if status == "ok":
            return value
        if command == "start" and exc is not None:
            self._kill()
            self._broken = value
            raise exc  # what building the env raised (EnvUnavailable says how to fix it)
        if command in ("call", "attr"):
            # A method's own exception (or a missing attribute), raised as a local call would raise
            # it; the env is still usable.
            raise exc if exc is not None else RuntimeError(value)
        # An env that raised may be in any state: it is replaced before its next episode.
        self._broken = value
        raise EnvFailure(value)

    def reset_async(self, seed: int, options: dict[str, Any]) -> None:
        self._reset_request = (seed, options)
        self._send("reset", seed, options, self.prefetch)

    def reset_wait(self) -> tuple[str, dict[str, Any]]:
        try:
            result, self._prefetched = self._wait(self.step_timeout)
        except EnvFailure as e:
            # A worker found dead at reset died before this episode played anything (killed while
            # idle between episodes, e.g. by the OOM killer): replace it and reset once more, so an
            # episode is not lost for a death that was not its own. A second death is reported.
            if not str(e).startswith("worker process died"):
                raise
            self.restart()
            self._send("reset", *self._reset_request, self.prefetch)
            result, self._prefetched = self._wait(self.step_timeout)
        return result

    def step_async(self, response: str) -> None:
        self._send("step", response, self.prefetch)

    def step_wait(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        result, self._prefetched = self._wait(self.step_timeout)
        return result

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call a method of the unwrapped env in the worker and return its result (a prefetched
        answer for this state is used once)."""
        if not args and not kwargs and name in self._prefetched:
            ok, value = self._prefetched.pop(name)
            if ok:
                return value
            raise value
        self._send("call", name, args, kwargs)
        value, states = self._wait(self.step_timeout)
        generators = [a for a in (*args, *kwargs.values()) if isinstance(a, np.random.Generator)]
        for generator, state in zip(generators, states, strict=True):
            generator.bit_generator.state = state
        return value

    def attribute(self, name: str) -> tuple[str, Any]:
        """`("value", v)` for a plain attribute of the unwrapped env, `("method", None)` for a method."""
        self._send("attr", name)
        return self._wait(self.step_timeout)

    @property
    def agent_env(self) -> RemoteEnvProxy:
        return self._proxy


class RemoteEnvProxy:
    """Stands for a worker's unwrapped env: attribute reads and method calls go to the worker.

    `env.expert_action()` runs the expert in the worker; `env.instructions` reads the attribute there.
    Reads are answered fresh each time (the env changes between steps); which names are methods is
    remembered. An attribute the env lacks raises `AttributeError`, as it would locally.
    """

    def __init__(self, handle: WorkerEnv) -> None:
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_methods", set())

    @property
    def worker_pid(self) -> int | None:
        """The process the env lives in."""
        return self._handle.pid

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        handle: WorkerEnv = self._handle
        if name not in self._methods:
            kind, value = handle.attribute(name)
            if kind == "value":
                return value
            self._methods.add(name)

        def method(*args: Any, **kwargs: Any) -> Any:
            return handle.call(name, *args, **kwargs)

        method.__name__ = name
        return method

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a remote env is read-only from the parent process")

    def __repr__(self) -> str:
        return f"<RemoteEnvProxy {self._handle.env_id} in pid {self._handle.pid}>"
