"""The worker child process an engine adapter drives (adapters/sglang,
adapters/vllm, adapters/rust_mocker): JSON lines over the child's stdin and
stdout, one request line in and one or more reply lines out.

The engines run in a child because importing them is slow (vLLM, SGLang:
seconds, torch) or because they need a process of their own (Dynamo's
mocker: its own runtime, sockets and network namespace). What the three
adapters need from that child is the same and lives here: a deadline on
every read, a bound on a reply's size, a reply that must be a JSON object,
an ``{"error": ...}`` reply turned into an error, and every failure an
``AdapterError`` that carries the child's stderr tail and exit status, so a
crash in the engine is reported with the engine's own last words.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from kvspec.api import ChildExitedError, ChildProcess, ChildTimeoutError, LineTooLongError
from kvspec.spec.errors import AdapterError

#: how long a request line may take to write (the child reads its stdin at once)
WRITE_TIMEOUT_S = 10.0
#: how much of the child's stderr a failure carries
STDERR_TAIL = 4000


class EngineWorker:
    """One worker child process spoken to in JSON lines.

    ``name`` is how messages name the child ("the vLLM worker"), ``engine``
    how they name the engine when the child reports an error ("vLLM")."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        engine: str,
        env: dict[str, str],
        max_reply_bytes: int,
        cwd: str | None = None,
        close_grace_s: float = 2.0,
    ) -> None:
        self.name = name
        self.engine = engine
        self.max_reply_bytes = max_reply_bytes
        self.close_grace_s = close_grace_s
        self.child = ChildProcess(list(argv), env=env, cwd=cwd)

    @property
    def alive(self) -> bool:
        return self.child.alive() and not self.child.closed

    def send(self, msg: dict[str, Any]) -> None:
        """Write one request line."""
        try:
            self.child.write((json.dumps(msg) + "\n").encode(), time.monotonic() + WRITE_TIMEOUT_S)
        except (ChildExitedError, ChildTimeoutError) as e:
            raise self.failure(f"could not send {msg.get('op')!r} to {self.name}: {e}") from None

    def recv(self, timeout_s: float, what: str) -> dict[str, Any]:
        """Read one reply line (within ``timeout_s``; ``what`` names the
        request in messages): a JSON object without an ``error`` key."""
        try:
            line = self.child.read_line(time.monotonic() + timeout_s, self.max_reply_bytes)
        except ChildTimeoutError:
            raise self.failure(f"{self.name} did not answer {what} within {timeout_s:.0f} s") from None
        except ChildExitedError:
            self.child.wait_exit(1.0)
            raise self.failure(f"{self.name} exited during {what}") from None
        except LineTooLongError as e:
            raise self.failure(f"{self.name}'s reply to {what} is too long ({e.size} bytes)") from None
        try:
            reply = json.loads(line)
        except ValueError:
            raise self.failure(
                f"{self.name} wrote something that is not a JSON line during {what}: {line[:200]!r}"
            ) from None
        if not isinstance(reply, dict):
            raise self.failure(f"{self.name}'s reply to {what} is not an object: {line[:200]!r}")
        if "error" in reply:
            trace = f"\n{reply['trace']}" if reply.get("trace") else ""
            stage = reply.get("stage", what)
            raise self.failure(f"{self.engine} reported an error during {stage}: {reply['error']}{trace}")
        return reply

    def ask(self, msg: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
        """Send ``msg`` and read its one reply."""
        self.send(msg)
        return self.recv(timeout_s, what)

    def failure(self, message: str) -> AdapterError:
        """An AdapterError with the child's stderr tail and exit status (for the caller to raise)."""
        self.child.drain_stderr(0.2)
        return AdapterError(
            message, stderr_tail=self.child.stderr_tail()[-STDERR_TAIL:], exit_status=self.child.returncode
        )

    def close(self) -> None:
        """End the child: its stdin closed, then TERM and KILL if it lingers."""
        self.child.close(grace_s=self.close_grace_s, term_s=1.0)


W = TypeVar("W", bound=EngineWorker)


class SharedWorker(Generic[W]):
    """One worker for the whole test run, started on first use and again if
    it died (its engine's import is paid once; each session opens a fresh
    engine object inside it)."""

    def __init__(self, start: Callable[[], W]) -> None:
        self._start = start
        self._worker: W | None = None

    def get(self) -> W:
        if self._worker is None or not self._worker.alive:
            self._worker = self._start()
        return self._worker
