"""A child process in its own process group, talked to in lines, never waited on unboundedly.

Every adapter that crosses a process boundary (the JSON-lines transport, and
any host process another transport starts) needs the same four guarantees,
so they live here once:

- **Bounded waits.** Every read and write takes a deadline; the calling
  thread multiplexes the child's stdout and stderr with ``selectors`` on
  non-blocking pipes, so nothing blocks past it and no reader thread has to
  be stopped afterwards.
- **Bounded memory.** A line longer than ``max_bytes`` is refused once that
  many bytes are buffered, whether or not its newline ever comes; stderr is
  kept as a tail of ``stderr_tail_bytes``.
- **stderr never wedges the child.** stderr is drained during every wait,
  so a chatty child cannot block on a full pipe while we wait for stdout.
- **Nothing survives.** The child is started with ``start_new_session=True``
  (its own session and process group, out of reach of the terminal's
  Ctrl-C, which we handle instead) and every exit path signals the whole
  group: ``close()`` (polite, then SIGTERM, then SIGKILL), and a
  ``weakref.finalize`` that runs when the object is collected or at
  interpreter exit (``finalize`` registers itself with ``atexit``), which is
  what cleans up after a KeyboardInterrupt. A child that calls ``setsid``
  itself leaves the group and cannot be tracked; a well-behaved child also
  exits on EOF of its stdin, which covers a parent killed with SIGKILL.

POSIX only (process groups, non-blocking pipes in ``select``).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvspec.spec.errors import AdapterError

DEFAULT_STDERR_TAIL_BYTES = 16 * 1024
_CHUNK = 64 * 1024


class ChildTimeoutError(AdapterError):
    """The deadline passed before the child produced what was waited for."""


class ChildExitedError(AdapterError):
    """The child closed its stdout or stdin (it exited or is exiting)."""

    def __init__(self, message: str, *, partial: bytes = b"") -> None:
        super().__init__(message)
        #: bytes of an unterminated last line, if any
        self.partial = partial


class LineTooLongError(AdapterError):
    """The child wrote more than ``max_bytes`` without ending the line."""

    def __init__(self, message: str, *, size: int, excerpt: bytes) -> None:
        super().__init__(message)
        self.size = size
        self.excerpt = excerpt


def describe_exit(returncode: int | None) -> str:
    """``exit status 3`` / ``killed by signal SIGSEGV`` / ``still running``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exit status {returncode}"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid`` (Linux /proc scan).

    Used by tests and by ``close()`` to prove nothing was left behind; on a
    system without /proc it falls back to ``killpg(pgid, 0)``.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # fields after the parenthesised command: state ppid pgrp ...
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) >= 3 and rest[0] != "Z" and int(rest[2]) == pgid:
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # pgid reused by someone else's process: not ours
        return False
    return True


def _finalize_child(popen: subprocess.Popen[bytes], pgid: int) -> None:
    """Last-resort cleanup (GC or interpreter exit): kill the group, reap."""
    _signal_group(pgid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        popen.wait(timeout=2.0)
    for f in (popen.stdin, popen.stdout, popen.stderr):
        if f is not None:
            with contextlib.suppress(Exception):
                f.close()


class ChildProcess:
    """One child process with line-framed stdout and a bounded stderr tail.

    Raises ``AdapterError`` if the command cannot be started.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        stderr_tail_bytes: int = DEFAULT_STDERR_TAIL_BYTES,
    ) -> None:
        self.argv = list(argv)
        try:
            self.popen: subprocess.Popen[bytes] = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                close_fds=True,
                bufsize=0,
            )
        except OSError as e:
            raise AdapterError(f"cannot start {self.argv!r}: {e}") from e
        self.pid = self.popen.pid
        #: the child leads its own session, so its group id is its pid
        self.pgid = self.popen.pid
        self._finalizer = weakref.finalize(self, _finalize_child, self.popen, self.pgid)
        assert self.popen.stdin and self.popen.stdout and self.popen.stderr
        self._in_fd: int | None = self.popen.stdin.fileno()
        self._out_fd: int | None = self.popen.stdout.fileno()
        self._err_fd: int | None = self.popen.stderr.fileno()
        for fd in (self._in_fd, self._out_fd, self._err_fd):
            os.set_blocking(fd, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._out_fd, selectors.EVENT_READ, "out")
        self._sel.register(self._err_fd, selectors.EVENT_READ, "err")
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no newline
        self._tail = bytearray()
        self._tail_limit = stderr_tail_bytes
        self._stderr_total = 0
        self._closed = False

    # ------------------------------------------------------------- state

    @property
    def returncode(self) -> int | None:
        """Exit status once the child has exited (negative: killed by a signal)."""
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def closed(self) -> bool:
        return self._closed

    def buffered(self) -> bytes:
        """stdout bytes read but not yet returned as a line."""
        return bytes(self._buf)

    # ------------------------------------------------------------- stderr

    def _keep_stderr(self, chunk: bytes) -> None:
        self._stderr_total += len(chunk)
        self._tail += chunk
        if len(self._tail) > self._tail_limit:
            del self._tail[: len(self._tail) - self._tail_limit]

    def stderr_tail(self) -> str:
        """The last ``stderr_tail_bytes`` the child wrote to stderr, as text."""
        text = self._tail.decode("utf-8", errors="replace")
        dropped = self._stderr_total - len(self._tail)
        if dropped > 0:
            text = f"[... {dropped} earlier bytes of stderr dropped ...]\n" + text
        return text

    # ------------------------------------------------------------- I/O core

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for output; move what came into the buffers."""
        if not self._sel.get_map():
            time.sleep(max(0.0, min(timeout, 0.01)))
            return
        for key, _ in self._sel.select(max(0.0, timeout)):
            fd = key.fd
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if key.data == "err":
                if chunk:
                    self._keep_stderr(chunk)
                else:
                    self._sel.unregister(fd)
                    self._err_fd = None
            elif chunk:
                self._buf += chunk
            else:
                self._sel.unregister(fd)
                self._out_fd = None

    def read_line(self, deadline: float, max_bytes: int) -> bytes:
        """The next stdout line (without its newline), by ``deadline`` (monotonic).

        Raises ``ChildTimeoutError``, ``ChildExitedError`` (stdout closed; ``partial``
        holds an unterminated last line) or ``LineTooLongError`` (never buffers
        more than ``max_bytes`` plus one read chunk)."""
        while True:
            nl = self._buf.find(b"\n", self._scanned)
            if nl >= 0:
                if nl > max_bytes:
                    raise LineTooLongError(
                        f"line of {nl} bytes exceeds the limit of {max_bytes}",
                        size=nl,
                        excerpt=bytes(self._buf[:200]),
                    )
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buf)
            if len(self._buf) > max_bytes:
                raise LineTooLongError(
                    f"more than {max_bytes} bytes without a newline",
                    size=len(self._buf),
                    excerpt=bytes(self._buf[:200]),
                )
            if self._out_fd is None:
                raise ChildExitedError("the child closed its stdout", partial=bytes(self._buf))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChildTimeoutError("no complete line before the deadline")
            self._pump(remaining)

    def write(self, data: bytes, deadline: float) -> None:
        """Write all of ``data`` to the child's stdin by ``deadline``.

        Raises ``ChildExitedError`` if the child closed its stdin, ``ChildTimeoutError``
        if it stopped reading. stderr is drained while waiting."""
        if self._in_fd is None:
            raise ChildExitedError("the child's stdin is already closed")
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._in_fd, view)
                view = view[n:]
                continue
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError) as e:
                raise ChildExitedError(f"the child closed its stdin ({e.strerror})") from e
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChildTimeoutError("the child stopped reading its stdin")
            # wait for stdin to drain while keeping stderr/stdout moving
            with selectors.DefaultSelector() as wsel:
                wsel.register(self._in_fd, selectors.EVENT_WRITE)
                if wsel.select(min(remaining, 0.05)):
                    continue
            self._pump(0)

    def close_stdin(self) -> None:
        """Signal EOF to the child (idempotent)."""
        if self._in_fd is not None and self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        self._in_fd = None

    def wait_exit(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s for the child to exit, draining its output.

        Returns the exit status, or None if it is still running."""
        deadline = time.monotonic() + timeout
        while True:
            rc = self.popen.poll()
            if rc is not None:
                return rc
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if len(self._buf) > _CHUNK * 4:  # nobody is reading stdout any more
                self._buf.clear()
                self._scanned = 0
            self._pump(min(remaining, 0.02))

    def drain_stderr(self, timeout: float) -> None:
        """Collect what is left on stderr until EOF or ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while self._err_fd is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if len(self._buf) > _CHUNK * 4:
                self._buf.clear()
                self._scanned = 0
            self._pump(remaining)

    # ------------------------------------------------------------- ending

    def kill(self) -> None:
        """SIGKILL the whole process group now and reap the child (idempotent)."""
        _signal_group(self.pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=2.0)

    def close(self, grace_s: float = 1.0, term_s: float = 1.0) -> int | None:
        """End the child and everything in its group; return its exit status.

        EOF on stdin first (a well-behaved child exits), then after
        ``grace_s`` SIGTERM to the group, after ``term_s`` more SIGKILL.
        The group is SIGKILLed at the end in any case, so grandchildren
        left behind by a child that exited cleanly go too. Idempotent."""
        if self._closed:
            return self.popen.returncode
        self.close_stdin()
        rc = self.wait_exit(grace_s)
        if rc is None and _signal_group(self.pgid, signal.SIGTERM):
            rc = self.wait_exit(term_s)
        _signal_group(self.pgid, signal.SIGKILL)
        if rc is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rc = self.popen.wait(timeout=2.0)
        self.drain_stderr(0.2)
        self._release()
        return rc

    def _release(self) -> None:
        self._closed = True
        with contextlib.suppress(Exception):
            self._sel.close()
        self._out_fd = self._err_fd = self._in_fd = None
        for f in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        # the group is gone and the child reaped: nothing left to finalize
        if self.popen.returncode is not None:
            self._finalizer.detach()
