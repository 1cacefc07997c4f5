"""A pre-imported Python process that forks one pytest run per request.

``kvspec mutants`` runs the whole suite once per mutant. In a fresh
interpreter most of a quick kill is start-up: importing pytest, Hypothesis,
pydantic and kvspec, and (where bytecode is not cached, e.g. with
``PYTHONDONTWRITEBYTECODE``) compiling kvspec and assertion-rewriting
Hypothesis, which pytest rewrites because it is a plugin's package. The
server pays that once: it imports what the suite needs, freezes the heap
(``gc.freeze``: a child's garbage collections then skip the inherited
objects) and forks a child per request. Each child is a new session
(killed as a process group on a timeout), runs ``pytest.main`` with the
requested arguments and its output in a log file, and exits with pytest's
status. The suite's test modules are *not* imported by the server, so each
child still collects and assertion-rewrites them as a fresh pytest would.

Protocol (one JSON object per line): the client writes
``{"argv": [...], "cwd": DIR, "log": FILE}``; the server answers
``{"pid": N}`` as soon as the child exists and ``{"rc": CODE, "cpu": S}``
when it has ended (negative: killed by that signal; ``S``: the CPU seconds
the child and its own children used, a figure that does not depend on the
machine's load). It serves one run at a time;
the campaign starts one server per job. End of input ends the server.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib
import inspect
import json
import os
import pkgutil
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


class ForkServerError(RuntimeError):
    """The server died or broke the protocol (not a verdict on a suite run)."""


# ------------------------------------------------------------ what to import


def suite_imports(suite: Path) -> list[str]:
    """The absolute modules the suite's test files import (``from X import``
    and ``import X``), read from their source without importing them."""
    found: list[str] = []
    for path in sorted(suite.glob("test_*.py")):
        try:
            tree = ast.parse(path.read_text(), str(path))
        except (OSError, SyntaxError):
            continue  # pytest will report it when the child collects
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append(node.module)
            elif isinstance(node, ast.Import):
                found.extend(a.name for a in node.names)
    return list(dict.fromkeys(found))


def package_modules(package: str, skip: Sequence[str] = ()) -> list[str]:
    """Every module of ``package`` (recursively) but test modules (``test_*``:
    pytest must import those itself to rewrite their assertions) and those
    under the ``skip`` prefixes."""
    try:
        pkg = importlib.import_module(package)
    except Exception:
        return []
    return [
        m.name
        for m in pkgutil.walk_packages(getattr(pkg, "__path__", []), prefix=f"{package}.")
        if not m.name.rsplit(".", 1)[-1].startswith("test_") and not m.name.startswith(tuple(skip))
    ]


def _preload(modules: Iterable[str]) -> None:
    """Import ``modules`` (``module:function``: import, then call the function
    once, e.g. to fill a cache), pytest's default plugins, and fill
    ``inspect``'s module-by-file cache, which a failure's traceback report
    otherwise builds in every child by resolving every loaded module's path."""
    import pytest  # noqa: F401  (pytest's own modules, then its default plugins)
    from _pytest.config import default_plugins

    for name in default_plugins:
        with contextlib.suppress(Exception):
            importlib.import_module(f"_pytest.{name}")
    for entry in modules:
        name, _, func = entry.partition(":")
        # a module that does not import is the child's error to report
        with contextlib.suppress(Exception):
            mod = importlib.import_module(name)
            if func:
                getattr(mod, func)()
    inspect.getmodule(compile("0", "<kvspec fork server>", "eval"))


# ------------------------------------------------------------------ the server


def _child(request: dict[str, Any], proto: Sequence[int]) -> None:
    """In the forked child: become a session, send output to the log, run
    pytest, exit with its status. Never returns."""
    code = 3
    try:
        os.setsid()
        for fd in proto:
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.chdir(request["cwd"])
        import pytest

        code = int(pytest.main(list(request["argv"])))
    except BaseException as e:  # the child must exit, never return into the server loop
        with contextlib.suppress(Exception):
            print(f"kvspec fork server: the run failed to start: {e!r}", file=sys.stderr)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _send(fd: int, obj: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(obj) + "\n").encode())


def serve(modules: Sequence[str]) -> None:
    """The server's main loop (``python -m kvspec.conformance.run.forkserver``)."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # nothing an import prints can reach the protocol
    os.dup2(2, 1)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client decides when runs end
    _preload(modules)
    gc.collect()
    gc.freeze()
    _send(proto_out, {"ready": True})
    reader = os.fdopen(proto_in, "rb", buffering=0)
    while True:
        line = reader.readline()
        if not line:
            return
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, (proto_in, proto_out))
        _send(proto_out, {"pid": pid})
        _, status, usage = os.wait4(pid, 0)
        _send(proto_out, {"rc": os.waitstatus_to_exitcode(status), "cpu": usage.ru_utime + usage.ru_stime})


# ------------------------------------------------------------------ the client


class ForkServer:
    """One server process and the run it is serving (used from one thread)."""

    def __init__(self, modules: Sequence[str], *, cwd: Path, startup_timeout: float = 300.0) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kvspec.conformance.run.forkserver", *modules],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
            start_new_session=True,
        )
        self._buf = b""
        self.child: int | None = None
        self.last_cpu: float | None = None
        self._expect("ready", time.monotonic() + startup_timeout)

    def _line(self, deadline: float | None) -> dict[str, Any] | None:
        """The next message, or None when ``deadline`` passes first."""
        assert self._proc.stdout is not None
        out = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([out], [], [], wait)
            if not ready:
                return None
            chunk = os.read(out, 4096)
            if not chunk:
                raise ForkServerError(f"the fork server ended (exit status {self._proc.wait()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        msg: dict[str, Any] = json.loads(line)
        return msg

    def _expect(self, key: str, deadline: float | None) -> Any:
        msg = self._line(deadline)
        if msg is None:
            self.close()
            raise ForkServerError(f"the fork server sent no {key!r} in time")
        if key not in msg:
            raise ForkServerError(f"the fork server sent {msg!r}, expected {key!r}")
        return msg[key]

    def run(self, argv: Sequence[str], *, cwd: Path, log: Path, timeout: float) -> int | None:
        """Run ``pytest argv`` in a forked child; its exit status, or None
        if it was still running after ``timeout`` seconds (then killed).
        ``last_cpu`` is then the CPU seconds the run used."""
        assert self._proc.stdin is not None
        self.last_cpu = None
        deadline = time.monotonic() + timeout
        self._proc.stdin.write((json.dumps({"argv": list(argv), "cwd": str(cwd), "log": str(log)}) + "\n").encode())
        self.child = int(self._expect("pid", None))
        try:
            msg = self._line(deadline)
            if msg is None:
                self.kill_child()
                self._expect("rc", None)
                return None
            self.last_cpu = float(msg.get("cpu", 0.0))
            return int(msg["rc"])
        finally:
            self.child = None

    def kill_child(self) -> None:
        """Kill the running child's whole process group (it is a session)."""
        pid = self.child
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def close(self) -> None:
        """Kill the running child, let the server reap it and end."""
        self.kill_child()
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class ServerPool:
    """Up to ``size`` servers, each lent to one thread at a time (started
    on first need, so a server's start-up overlaps the runs already going)."""

    def __init__(self, size: int, modules: Sequence[str], *, cwd: Path) -> None:
        self._size = max(1, size)
        self._modules = list(modules)
        self._cwd = cwd
        self._idle: list[ForkServer] = []
        self._all: list[ForkServer | _Starting] = []
        self._cond = threading.Condition()
        self._closed = False

    def acquire(self) -> ForkServer:
        with self._cond:
            while not self._idle and len(self._all) >= self._size and not self._closed:
                self._cond.wait()
            if self._closed:
                raise ForkServerError("the fork servers were shut down")
            if self._idle:
                return self._idle.pop()
            self._all.append(placeholder := _Starting())
        try:
            server = ForkServer(self._modules, cwd=self._cwd)
        except BaseException:
            with self._cond:
                self._all.remove(placeholder)
                self._cond.notify()
            raise
        with self._cond:
            self._all[self._all.index(placeholder)] = server
            if self._closed:
                server.close()
                raise ForkServerError("the fork servers were shut down")
        return server

    def release(self, server: ForkServer) -> None:
        with self._cond:
            self._idle.append(server)
            self._cond.notify()

    def close(self) -> None:
        """Kill every running child and end every server (any thread)."""
        with self._cond:
            self._closed = True
            servers = [s for s in self._all if isinstance(s, ForkServer)]
            self._cond.notify_all()
        for s in servers:
            s.kill_child()
        for s in servers:
            s.close()


class _Starting:
    """Holds a server's place in the pool while it starts."""


if __name__ == "__main__":
    serve(sys.argv[1:])
