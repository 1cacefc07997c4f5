"""The JSON-lines transport: an implementation running as a child process.

``JsonlImplementation`` starts the command of a ``kind = "subprocess"``
manifest, performs the handshake of spec/PROTOCOL.md and then sends one
operation per line, validating every reply against ``spec.protocol``.
Opened with an ``EngineConfig`` it runs a request-level session (protocol
version 2): ``engine_call`` sends one request-level operation
(``spec.engine_wire``) and returns its ``EngineOutcome``;
``conformance.transport.engine`` drives whole workloads with it. The
allocator and radix sessions (``transport/manager.py``, ``transport/radix.py``)
are this class opened with ``manager=`` or ``radix=``: one handshake for every
kind of session. Its hello offers the versions of the session's kind (1 and 2,
2, 3, 4 or 5) and, when the manifest declares ``[start] protocol = 6``, 6
beside them with the session's ``family`` named (PROTOCOL.md section 13); the
ready must choose an offered version and, under 6, repeat the family.

It treats the child as untrusted. Every way the child can misbehave ends in
an ``AdapterError`` that says what went wrong and on which request, within
the manifest's timeouts, with the child's exit status and the tail of its
stderr when they exist: a hang (no reply within ``start.timeout_s``), a
crash, a line that is not JSON, a reply to the wrong id, a reply that does
not match the schema (the offending fields named), an oversized reply, a
protocol error reply, a refused or inconsistent handshake. The process group
is killed before the error is raised, and the implementation is dead from
then on: the next call raises at once instead of talking to a child whose
state nobody knows.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.transport.process import (
    ChildExitedError,
    ChildProcess,
    ChildTimeoutError,
    LineTooLongError,
    describe_exit,
)
from kvspec.spec.config import ManagerConfig
from kvspec.spec.engine_wire import EngineConfig, EngineOp, EngineOutcome
from kvspec.spec.errors import HANG_MARK, AdapterError, ConfigError
from kvspec.spec.manager_wire import ManagerConfigKind
from kvspec.spec.manifest import Capabilities, Manifest
from kvspec.spec.protocol import (
    FAMILY_VERSION,
    EngineOutcomeReply,
    ErrorReply,
    Hello,
    OutcomeReply,
    Ready,
    Refused,
    SessionFamily,
    WorkerOutcomeReply,
    session_versions,
)
from kvspec.spec.radix_wire import RadixConfig
from kvspec.spec.registry import RADIX_FAMILY
from kvspec.spec.wire import Operation, ProcessOutcome, StepOutcome, parse_operation

#: how long a child may take to exit after ``bye`` before it is signalled
BYE_GRACE_S = 1.0
#: how long to wait for a crashing child's exit status and last stderr
CRASH_GRACE_S = 1.0
_EXCERPT = 120


def expand_command(command: list[str], adapter_dir: Path) -> list[str]:
    """Replace ``{python}`` (this interpreter) and ``{adapter_dir}`` in argv."""
    return [part.replace("{python}", sys.executable).replace("{adapter_dir}", str(adapter_dir)) for part in command]


def offered_versions(
    engine: EngineConfig | None = None, workers: int = 1, newest: int | None = None
) -> tuple[int, ...]:
    """The versions the parent offers a block-level or request-level session:
    1 and 2 for a block-level one, 2 alone for a request-level one, 5 alone
    for a session of several workers; and 6 with them when the child's
    manifest says it reads version-6 hellos (``newest``, ``[start] protocol``)."""
    return session_versions("block" if engine is None else "request", workers, newest)


def hello_family(
    engine: EngineConfig | None = None, manager: ManagerConfigKind | None = None, radix: RadixConfig | None = None
) -> SessionFamily:
    """The family of the session these parameters open (at most one is given)."""
    if radix is not None:
        return RADIX_FAMILY
    if manager is not None:
        return "manager"
    return "block" if engine is None else "request"


def encode_hello(
    config: ManagerConfig,
    engine: EngineConfig | None = None,
    workers: int = 1,
    *,
    manager: ManagerConfigKind | None = None,
    radix: RadixConfig | None = None,
    newest: int | None = None,
) -> bytes:
    """The hello line the parent writes (without its newline), for any kind of
    session. A field the session does not use is left out, so a child of an
    older version reads exactly the hello it knows: ``family`` travels only
    when version 6 is offered (``newest``: the manifest's ``[start] protocol``),
    ``workers`` only when there are several."""
    family = hello_family(engine, manager, radix)
    versions = session_versions(family, workers, newest)
    hello = Hello(
        type="hello",
        versions=list(versions),
        family=family if FAMILY_VERSION in versions else None,
        config=config,
        engine=engine,
        manager=manager,
        radix=radix,
        workers=workers if workers > 1 else None,
    )
    leave_out = {f for f in ("family", "engine", "manager", "radix", "workers") if getattr(hello, f) is None}
    return hello.model_dump_json(exclude=leave_out).encode()


def encode_request(rid: int, op: BaseModel, worker: int | None = None) -> bytes:
    """One request line (without its newline): every field of the op (a block,
    request or allocator operation), nulls included; ``worker`` in a
    version-5 session only."""
    if worker is not None:
        return b'{"id":%d,"worker":%d,"op":%s}' % (rid, worker, op.model_dump_json().encode())
    return b'{"id":%d,"op":%s}' % (rid, op.model_dump_json().encode())


def excerpt(raw: bytes, limit: int = _EXCERPT, total: int | None = None) -> str:
    """A short, printable form of a line, for error messages (control characters escaped)."""
    text = raw[:limit].decode("utf-8", errors="replace")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    size = len(raw) if total is None else total
    more = f"... ({size} bytes)" if size > limit else ""
    return f"'{text}{more}'"


def summarize_validation(err: ValidationError, limit: int = 4) -> str:
    """``field.path: message`` for the first few errors of a pydantic error."""
    parts = []
    for e in err.errors(include_url=False)[:limit]:
        loc = ".".join(str(x) for x in e["loc"]) or "(message)"
        parts.append(f"{loc}: {e['msg']}")
    more = err.error_count() - limit
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


#: list capabilities by the singular prefix ``Capabilities.has`` uses
_LIST_CAPABILITY = {"profiles": "profile", "policies": "policy", "tiers": "tier"}


def capability_mismatches(claimed: Capabilities, announced: Capabilities) -> list[str]:
    """What the manifest claims that the child's handshake does not."""
    out = []
    for name, value in claimed:
        got = getattr(announced, name)
        if isinstance(value, bool):
            if value and not got:
                out.append(name)
        elif isinstance(value, list):
            prefix = _LIST_CAPABILITY.get(name, name)
            out.extend(f"{prefix}:{v}" for v in value if v not in got)
        elif isinstance(value, int) and got < value:
            out.append(f"{name} >= {value} (announces {got})")
    return out


class AdapterProtocolError(AdapterError):
    """The child answered a request with a protocol-level error reply."""

    def __init__(self, message: str, *, code: str, stderr_tail: str = "", exit_status: int | None = None) -> None:
        super().__init__(message, stderr_tail=stderr_tail, exit_status=exit_status)
        self.code = code


ChildKey = tuple[tuple[str, ...], str]

#: the sessions whose versions were offered alone before version 6, for the message of a wrong version
_FAMILY_WHAT: dict[SessionFamily, str] = {"manager": "an allocator-level session", RADIX_FAMILY: "a radix session"}


class ChildPool:
    """Idle children that announced ``multi_session``, ready for another ``hello``.

    Starting an interpreter and importing a manager costs far more than a
    lockstep example (hundreds of milliseconds against tens), so the suite
    can reuse processes: inside ``reuse_children()``, ``close()`` hands a
    healthy multi-session child back here instead of ending it, and the next
    ``JsonlImplementation`` with the same command takes it and opens a new
    session with its own ``hello``. Children that failed, that did not
    announce ``multi_session``, or that exceed ``max_idle`` per command are
    ended as usual. Leaving the context ends every idle child (bye, then the
    usual escalation); each also keeps its own exit-time finalizer.
    """

    def __init__(self, max_idle: int = 2) -> None:
        self.max_idle = max_idle
        self._idle: dict[ChildKey, list[ChildProcess]] = {}
        self.reused = 0
        self.closed = False

    def take(self, key: ChildKey) -> ChildProcess | None:
        idle = self._idle.get(key, [])
        while idle:
            child = idle.pop()
            if child.alive() and not child.buffered():
                self.reused += 1
                return child
            child.close(grace_s=0, term_s=0)
        return None

    def give(self, key: ChildKey, child: ChildProcess) -> bool:
        idle = self._idle.setdefault(key, [])
        if self.closed or len(idle) >= self.max_idle:
            return False
        idle.append(child)
        return True

    def idle_children(self) -> list[ChildProcess]:
        return [c for cs in self._idle.values() for c in cs]

    def close(self) -> None:
        """End every idle child."""
        self.closed = True
        children = self.idle_children()
        self._idle.clear()
        for child in children:
            with contextlib.suppress(AdapterError):
                child.write(b'{"type":"bye"}\n', time.monotonic() + 0.2)
            child.close_stdin()
        for child in children:  # they exit in parallel; then the usual escalation
            child.close(grace_s=BYE_GRACE_S, term_s=1.0)


_pool: ChildPool | None = None


@contextlib.contextmanager
def reuse_children(max_idle: int = 2) -> Iterator[ChildPool]:
    """Reuse multi-session children across implementations opened inside the block."""
    global _pool
    previous, pool = _pool, ChildPool(max_idle)
    _pool = pool
    try:
        yield pool
    finally:
        _pool = previous
        pool.close()


class JsonlImplementation(Implementation):
    """An implementation in a child process speaking spec/PROTOCOL.md."""

    def __init__(
        self,
        manifest: Manifest,
        adapter_dir: Path,
        config: ManagerConfig,
        *,
        engine: EngineConfig | None = None,
        workers: int = 1,
        manager: ManagerConfigKind | None = None,
        radix: RadixConfig | None = None,
    ) -> None:
        if not manifest.start.command:
            raise ConfigError(f"{manifest.name}: kind 'subprocess' needs start.command (argv list)")
        self.manifest = manifest
        self.config = config
        #: set for a request-level session (protocol version 2)
        self.engine = engine
        if workers > 1 and engine is not None:
            raise ConfigError(f"{manifest.name}: a request-level session has one worker")
        #: several workers of one process: a version-5 session
        self.workers = workers
        #: an allocator-level session (version 3) or a radix session (version 4)
        self.manager = manager
        self.radix = radix
        #: the kind of session, named by a version-6 hello
        self.family: SessionFamily = hello_family(engine, manager, radix)
        if sum(x is not None for x in (engine, manager, radix)) > 1:
            raise ConfigError(f"{manifest.name}: a session is of one family (engine, manager or radix)")
        #: the versions the hello offers (6 only to a child whose manifest says it reads it)
        self.offered = session_versions(self.family, workers, manifest.start.protocol)
        self.adapter_dir = Path(adapter_dir)
        self.timeout_s = manifest.start.timeout_s
        self.max_reply_bytes = manifest.start.max_reply_bytes
        self.ready: Ready | None = None
        self.exit_status: int | None = None
        self._next_id = 0
        self._dead: str | None = None
        self._closed = False
        argv = expand_command(manifest.start.command, self.adapter_dir)
        #: the child's command line, placeholders expanded
        self.argv = argv
        self._key: ChildKey = (tuple(argv), str(self.adapter_dir))
        self._pool = _pool
        started = time.monotonic()
        child = self._pool.take(self._key) if self._pool is not None else None
        #: True when this session runs in a process an earlier session used
        self.reused = child is not None
        if child is None:
            try:
                child = ChildProcess(argv, cwd=self.adapter_dir)
            except AdapterError as e:
                raise AdapterError(f"adapter {manifest.name!r}: {e}") from e
        self._child = child
        try:
            self.ready = self._handshake(started + manifest.start.startup_timeout_s)
        except BaseException:
            # the caller never gets the object, so it cannot close it
            self._child.kill()
            self._child.close(grace_s=0, term_s=0)
            raise

    # ------------------------------------------------------------- info

    @property
    def pid(self) -> int:
        return self._child.pid

    @property
    def pgid(self) -> int:
        return self._child.pgid

    @property
    def dead(self) -> str | None:
        """Why the implementation is unusable, or None while it is healthy."""
        return self._dead

    # ------------------------------------------------------------- failure

    def _fail(self, what: str, *, cls: type[AdapterError] = AdapterError, **extra: Any) -> AdapterError:
        """Kill the group, collect exit status and stderr, mark dead; return the error to raise."""
        child = self._child
        rc = child.returncode  # before the kill: a status of its own making
        child.kill()
        child.drain_stderr(0.5)
        self.exit_status = rc if rc is not None else child.returncode
        message = f"adapter {self.manifest.name!r}: {what}"
        self._dead = message
        child.close(grace_s=0, term_s=0)
        return cls(message, stderr_tail=child.stderr_tail(), exit_status=rc, **extra)

    def _crash(self, during: str, e: ChildExitedError) -> AdapterError:
        rc = self._child.wait_exit(CRASH_GRACE_S)
        if rc is None:
            what = f"closed its stdout {during} but did not exit"
        else:
            what = f"exited {during} ({describe_exit(rc)})"
        if e.partial:
            what += f"; unterminated last output: {excerpt(e.partial)}"
        return self._fail(what)

    def _read(self, deadline: float, during: str, limit_s: float) -> bytes:
        try:
            return self._child.read_line(deadline, self.max_reply_bytes)
        except ChildTimeoutError:
            raise self._fail(
                f"no reply {during} within {limit_s:g} s: {HANG_MARK}; its process group was killed"
            ) from None
        except ChildExitedError as e:
            raise self._crash(during, e) from None
        except LineTooLongError as e:
            raise self._fail(
                f"reply {during} is larger than max_reply_bytes={self.max_reply_bytes} "
                f"({e.size} bytes read without an end of line), starting {excerpt(e.excerpt, 60, e.size)}"
            ) from None

    def _write(self, data: bytes, deadline: float, during: str, limit_s: float) -> None:
        try:
            self._child.write(data, deadline)
        except ChildTimeoutError:
            raise self._fail(
                f"stopped reading its stdin {during} for {limit_s:g} s; its process group was killed"
            ) from None
        except ChildExitedError as e:
            raise self._crash(during, e) from None

    def _decode(self, raw: bytes, during: str) -> dict[str, Any]:
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise self._fail(f"reply {during} is not valid JSON ({e}): {excerpt(raw)}") from None
        if not isinstance(obj, dict):
            raise self._fail(f"reply {during} is not a JSON object: {excerpt(raw)}")
        return obj

    def _validate(self, model: type[BaseModel], obj: dict[str, Any], raw: bytes, during: str) -> Any:
        try:
            return model.model_validate(obj)
        except ValidationError as e:
            raise self._fail(
                f"{model.__name__} {during} does not match the protocol schema: "
                f"{summarize_validation(e)}; line: {excerpt(raw)}"
            ) from None

    # ------------------------------------------------------------- handshake

    def _hello(self) -> bytes:
        """The hello line, without its newline: every version this session can run."""
        return encode_hello(
            self.config,
            self.engine,
            self.workers,
            manager=self.manager,
            radix=self.radix,
            newest=self.manifest.start.protocol,
        )

    def _wrong_version(self, ready: Ready) -> str | None:
        """Why the version the ready chose, or the family it names, does not
        answer the hello, or None. Under version 6 the ready repeats the
        hello's family; under the older versions it has no family field."""
        chosen = ready.protocol
        if chosen not in self.offered:
            what = _FAMILY_WHAT.get(self.family)
            if what is not None:
                return f"chose protocol version {chosen}; {what} offers only {' and '.join(map(str, self.offered))}"
            return f"chose protocol version {chosen}, which the parent did not offer (offered {list(self.offered)})"
        if chosen < FAMILY_VERSION:
            if ready.family is not None:
                return f"chose protocol version {chosen}, whose ready has no family, yet names family {ready.family!r}"
            return None
        if ready.family is None:
            return f"chose protocol version {chosen} but its ready names no family (the hello named {self.family!r})"
        if ready.family != self.family:
            return (
                f"answered a hello for a {self.family!r} session with a ready for a {ready.family!r} session "
                f"(ready.family); a version-{chosen} child opens the family the hello names or refuses it"
            )
        return None

    def _handshake(self, deadline: float) -> Ready:
        limit = self.manifest.start.startup_timeout_s
        self._write(self._hello() + b"\n", deadline, "during the handshake", limit)
        raw = self._read(deadline, "to hello (the handshake)", limit)
        obj = self._decode(raw, "to hello")
        kind = obj.get("type")
        if kind == "refused":
            refused: Refused = self._validate(Refused, obj, raw, "to hello")
            raise self._fail(
                f"refused the handshake ({refused.error.code}): {refused.error.message}",
                cls=AdapterProtocolError,
                code=refused.error.code,
            )
        if kind != "ready":
            raise self._fail(f"answered hello with {kind!r} instead of 'ready' or 'refused': {excerpt(raw)}")
        ready: Ready = self._validate(Ready, obj, raw, "to hello")
        wrong = self._wrong_version(ready)
        if wrong is not None:
            raise self._fail(wrong)
        if ready.profile != self.config.profile:
            raise self._fail(f"runs profile {ready.profile!r} but was configured with {self.config.profile!r}")
        missing = capability_mismatches(self.manifest.capabilities, ready.capabilities)
        if missing:
            raise self._fail(
                f"manifest.toml declares capabilities the adapter's handshake does not: {', '.join(missing)}"
            )
        return ready

    # ------------------------------------------------------------- steps

    def step(self, op: Operation) -> StepOutcome:
        if self.engine is not None:
            raise ConfigError(f"adapter {self.manifest.name!r}: a request-level session takes no block operations")
        if self.workers > 1:
            return self.step_on(0, op).outcome
        if isinstance(op, dict):
            op = parse_operation(op)
        obj, raw, during = self._exchange(op)
        reply: OutcomeReply = self._validate(OutcomeReply, obj, raw, during)
        return reply.outcome

    def step_on(self, worker: int, op: Operation) -> ProcessOutcome:
        if self.workers == 1:
            return super().step_on(worker, op)
        if not 0 <= worker < self.workers:
            raise ConfigError(f"adapter {self.manifest.name!r}: worker {worker} of a {self.workers}-worker session")
        obj, raw, during = self._exchange(op, worker)
        reply: WorkerOutcomeReply = self._validate(WorkerOutcomeReply, obj, raw, during)
        bad = [o.worker for o in reply.others if o.worker == worker or o.worker >= self.workers]
        if bad:
            raise self._fail(f"reply {during} lists events of worker {bad[0]} under others (worker {worker} stepped)")
        return reply.process_outcome()

    def engine_call(self, op: EngineOp) -> EngineOutcome:
        """Send one request-level operation (spec.engine_wire) of a
        request-level session and return its outcome."""
        if self.engine is None:
            raise ConfigError(
                f"adapter {self.manifest.name!r}: a block-level session takes no request-level operations"
            )
        obj, raw, during = self._exchange(op)
        reply: EngineOutcomeReply = self._validate(EngineOutcomeReply, obj, raw, during)
        return reply.outcome

    def _exchange(self, op: BaseModel, worker: int | None = None) -> tuple[dict[str, Any], bytes, str]:
        """Write one request, read its reply line: (the decoded reply, its
        raw line, "to request N (kind)" for messages). A protocol error reply
        or any misbehaviour raises AdapterError."""
        if self._dead is not None:
            raise AdapterError(f"not usable after an earlier failure: {self._dead}")
        if self._closed:
            raise AdapterError(f"adapter {self.manifest.name!r} is closed")
        self._next_id += 1
        rid = self._next_id
        on = "" if worker is None else f" on worker {worker}"
        during = f"to request {rid} ({getattr(op, 'op', type(op).__name__)}{on})"
        if self._child.buffered():
            raise self._fail(f"wrote unsolicited output before request {rid}: {excerpt(self._child.buffered())}")
        deadline = time.monotonic() + self.timeout_s
        self._write(encode_request(rid, op, worker) + b"\n", deadline, during, self.timeout_s)
        raw = self._read(deadline, during, self.timeout_s)
        obj = self._decode(raw, during)
        got = obj.get("id")
        if got != rid or type(got) is not int:
            raise self._fail(f"reply {during} carries id {got!r}, expected {rid}: {excerpt(raw)}")
        if "outcome" in obj:
            return obj, raw, during
        if "error" in obj:
            err: ErrorReply = self._validate(ErrorReply, obj, raw, during)
            raise self._fail(
                f"protocol error {during}: {err.error.code}: {err.error.message}",
                cls=AdapterProtocolError,
                code=err.error.code,
            )
        raise self._fail(f"reply {during} has neither 'outcome' nor 'error': {excerpt(raw)}")

    # ------------------------------------------------------------- close

    def close(self) -> None:
        """Say bye, give the child ``BYE_GRACE_S`` to exit, then signal the group. Idempotent.

        Inside ``reuse_children()`` a healthy multi-session child goes back
        to the pool instead (the pool ends it later)."""
        if self._closed:
            return
        self._closed = True
        child = self._child
        if (
            self._pool is not None
            and self._dead is None
            and self.ready is not None
            and self.ready.multi_session
            and child.alive()
            and not child.buffered()
            and self._pool.give(self._key, child)
        ):
            return  # the next session will say hello to it
        if not child.closed and self._dead is None and child.alive():
            with contextlib.suppress(AdapterError):  # it is going away anyway; close() escalates
                child.write(b'{"type":"bye"}\n', time.monotonic() + 0.2)
        self.exit_status = child.close(grace_s=BYE_GRACE_S, term_s=1.0)
