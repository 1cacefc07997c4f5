"""JSON-lines server of the reference model: ``python -m kvspec.adapters.reference_jsonl.server``.

It is both the proof that the subprocess path works end to end and a worked
example for anyone writing an adapter in another language: read ``hello``,
answer ``ready`` (or ``refused``), then answer one line per request until
``bye`` or end of input. See spec/PROTOCOL.md.

It speaks versions 1 to 6. A ``hello`` with ``engine`` opens a
request-level session (version 2): the reference engine
(``engine_session.py``) answers ``add_request`` / ``step`` /
``reset_prefix_cache``; otherwise the session is block-level, as in version 1.
A ``hello`` with ``manager`` (version 3) opens an allocator-level session
(profile paged or session) answered by the reference models of those
profiles (``adapters/reference/managers.py``). A ``hello`` with ``radix``
(version 4) opens a radix session answered by the radix model
(``reference/radix.py``). A ``hello`` with ``workers`` (version 5) opens a
process session: several kvbm workers sharing G3/G4 (``reference/process.py``),
each request naming its worker. Version 6 opens each of these sessions by
name: its ``hello`` says ``family`` (block, request, manager, radix) next to
the same parameters, the ``ready`` repeats it, and the requests and replies
are those of the family's older version; a hello naming a family this server
does not know, or parameters that do not fit the family it names, is refused
with a message that names what was wrong.

The capabilities it announces are those of ``adapters/reference`` (it runs
the same model), with the request level only under version 2, so the
handshake check in the parent catches a ``reference_jsonl/manifest.toml``
that claims more than the model has.

``--mutant NAME`` runs the request driver of a request-level mutant
(``adapters/mutants/request_bugs.py``) in request-level sessions; the
mutant campaign serves those mutants through this server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import IO, Any

from pydantic import ValidationError

from kvspec.adapters.reference.adapter import outcome_of, process_outcome_of
from kvspec.adapters.reference.managers import ModelManager
from kvspec.adapters.reference_jsonl.engine_session import EngineSession
from kvspec.api import Capabilities, Process, RadixModel, RequestDriver, VllmPoolModel, load_manifest, make_model
from kvspec.api import builtin_adapters_dir as _builtin_adapters_dir
from kvspec.spec.errors import ConfigError
from kvspec.spec.protocol import (
    ENGINE_VERSION,
    FAMILY_VERSION,
    MAX_REQUEST_BYTES,
    SESSION_FAMILIES,
    EngineRequest,
    ErrorReply,
    HandshakeError,
    HandshakeErrorCode,
    Hello,
    ManagerRequest,
    ProtocolError,
    ProtocolErrorCode,
    RadixOpRequest,
    Ready,
    Refused,
    Request,
    WorkerRequest,
    family_of_hello,
    hello_problem,
    legacy_versions,
)
from kvspec.spec.registry import KVBM_NAME, RADIX

NAME = "kvspec reference model (JSON lines)"


def _capabilities(protocol: int) -> Capabilities:
    """The reference adapter's capabilities; the request level only under a
    version that carries it (version 1 has block operations only)."""
    caps = load_manifest(_builtin_adapters_dir() / "reference").capabilities
    return caps.model_copy(update={"request_level": caps.request_level and protocol >= ENGINE_VERSION})


def _brief(err: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(x) for x in e['loc']) or '(message)'}: {e['msg']}" for e in err.errors(include_url=False)[:4]
    )


def _unknown_family(line: bytes) -> str | None:
    """Why a hello line names a session family this server does not know
    (checked before the model, so that the refusal names the family), or None."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # the model's validation names what is wrong
    family = obj.get("family") if isinstance(obj, dict) else None
    if family is None or family in SESSION_FAMILIES:
        return None
    return f"unknown session family {family!r} in the hello: this child serves {', '.join(SESSION_FAMILIES)}"


class Server:
    """One session: the handshake, then requests until bye or EOF."""

    def __init__(
        self,
        rfile: IO[bytes],
        wfile: IO[bytes],
        *,
        driver_type: type[RequestDriver] = RequestDriver,
        model_type: type[VllmPoolModel] = VllmPoolModel,
    ) -> None:
        self.rfile = rfile
        self.wfile = wfile
        self.driver_type = driver_type
        self.model_type = model_type
        self.sessions = 0

    def send(self, data: bytes) -> None:
        self.wfile.write(data + b"\n")
        self.wfile.flush()

    def read_line(self) -> bytes | None:
        """The next line without its newline; None at EOF. An overlong line is
        consumed to its end and returned truncated past the limit (it fails
        validation with a clear message)."""
        line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
        if not line:
            return None
        if not line.endswith(b"\n") and len(line) > MAX_REQUEST_BYTES:
            while True:  # skip the rest of the overlong line
                more = self.rfile.readline(MAX_REQUEST_BYTES)
                if not more or more.endswith(b"\n"):
                    break
            return b"\x00overlong"
        return line.rstrip(b"\r\n")

    def refuse(self, code: HandshakeErrorCode, message: str) -> int:
        self.send(Refused(type="refused", error=HandshakeError(code=code, message=message)).model_dump_json().encode())
        return 1

    def handshake(self, line: bytes | None) -> Any | None:
        """Answer a hello line; return the new model (an ``EngineSession`` for a
        request-level session), or None after a refusal."""
        if line is None:
            return None
        unknown = _unknown_family(line)
        if unknown is not None:
            self.refuse("unsupported_config", unknown)
            return None
        try:
            hello = Hello.model_validate_json(line)
        except ValidationError as e:
            self.refuse("unsupported_config", f"not a valid hello: {_brief(e)}")
            return None
        family = family_of_hello(hello)
        problem = hello_problem(hello)
        if problem is not None:
            self.refuse("unsupported_config", problem)
            return None
        # a version-6 hello names its family; an older hello's fields select the one version of its kind
        speaks = [*legacy_versions(family, hello.workers or 1), *([FAMILY_VERSION] if hello.family else [])]
        common = set(hello.versions) & set(speaks)
        if not common:
            what = "request-level sessions in versions" if hello.engine is not None else "versions"
            self.refuse("unsupported_version", f"speaks {what} {speaks}, offered {hello.versions}")
            return None
        self.sessions += 1
        try:
            if hello.workers is not None:
                if hello.manager is not None or hello.engine is not None or hello.radix is not None:
                    raise ConfigError("a process session's hello carries workers alone (no manager, engine, radix)")
                if hello.config.profile != KVBM_NAME:
                    raise ConfigError(f"several workers run the kvbm profile only, not {hello.config.profile}")
                model: Any = Process(hello.config, hello.workers)
            elif hello.radix is not None:
                if hello.manager is not None or hello.engine is not None:
                    raise ConfigError("a radix session's hello carries radix alone (no manager, no engine)")
                if hello.config.profile != RADIX:
                    raise ConfigError(f"radix config but config.profile {hello.config.profile}")
                model = RadixModel(hello.radix)
            elif hello.config.profile == RADIX:
                raise ConfigError("the radix profile is served only in a version-4 session (a hello with radix)")
            elif hello.manager is not None:
                if hello.manager.kind != hello.config.profile:
                    raise ConfigError(f"manager {hello.manager.kind} but config.profile {hello.config.profile}")
                model = ModelManager(hello.manager)
            elif hello.engine is not None:
                model = EngineSession(
                    hello.config,
                    hello.engine,
                    salt=self.sessions,
                    driver_type=self.driver_type,
                    model_type=self.model_type,
                )
            else:
                model = make_model(hello.config)
        except ConfigError as e:
            self.refuse("unsupported_config", str(e))
            return None
        except Exception as e:  # reported to the parent, with the traceback on stderr
            traceback.print_exc()
            self.refuse("internal_error", f"cannot build the model: {type(e).__name__}: {e}")
            return None
        protocol = max(common)
        ready = Ready(
            type="ready",
            name=NAME,
            protocol=protocol,
            family=family if protocol >= FAMILY_VERSION else None,
            profile=hello.config.profile,
            capabilities=_capabilities(protocol),
            multi_session=True,
        )
        self.send(ready.model_dump_json(exclude_none=True).encode())
        return model

    def error(self, rid: Any, code: ProtocolErrorCode, message: str) -> None:
        rid = rid if type(rid) is int and rid >= 1 else None
        reply = ErrorReply(id=rid, error=ProtocolError(code=code, message=message))
        self.send(reply.model_dump_json().encode())

    def serve(self) -> int:
        model = self.handshake(self.read_line())
        if model is None:
            return 1
        while True:
            line = self.read_line()
            if line is None:
                return 0
            if isinstance(model, Process):
                other = self._worker_request(model, line)
            elif isinstance(model, ModelManager):
                other = self._manager_request(model, line)
            elif isinstance(model, RadixModel):
                other = self._radix_request(model, line)
            elif isinstance(model, EngineSession):
                other = self._engine_request(model, line)
            else:
                other = self._block_request(model, line)
            if other == "bye":
                return 0
            if other == "hello":  # a new session: a fresh manager (we announce multi_session)
                model = self.handshake(line)
                if model is None:
                    return 1

    def _block_request(self, model: Any, line: bytes) -> str | None:
        """Answer one line of a block-level session; "bye" or "hello" if it is one."""
        try:
            req = Request.model_validate_json(line)
        except ValidationError as e:
            return self._other_message(line, e, engine=False)
        try:
            outcome = outcome_of(model, req.op)
        except Exception as e:  # a model bug, not a spec verdict
            traceback.print_exc()
            self.error(req.id, "internal_error", f"{type(e).__name__}: {e}")
            return None
        # null and absent mean the same in every optional field: leave them out
        self.send(b'{"id":%d,"outcome":%s}' % (req.id, outcome.model_dump_json(exclude_none=True).encode()))
        return None

    def _worker_request(self, process: Process, line: bytes) -> str | None:
        """Answer one line of a process session (version 5): the worker's
        outcome and what the other workers published."""
        try:
            req = WorkerRequest.model_validate_json(line)
        except ValidationError as e:
            return self._other_message(line, e, engine=False)
        if req.worker >= len(process.workers):
            self.error(req.id, "malformed_request", f"worker {req.worker}: the session has {len(process.workers)}")
            return None
        try:
            out = process_outcome_of(process, req.worker, req.op)
        except Exception as e:  # a model bug, not a spec verdict
            traceback.print_exc()
            self.error(req.id, "internal_error", f"{type(e).__name__}: {e}")
            return None
        others = b",".join(o.model_dump_json(exclude_none=True).encode() for o in out.others)
        body = out.outcome.model_dump_json(exclude_none=True).encode()
        self.send(b'{"id":%d,"outcome":%s,"others":[%s]}' % (req.id, body, others))
        return None

    def _manager_request(self, manager: ModelManager, line: bytes) -> str | None:
        """Answer one line of an allocator-level session (version 3)."""
        return self._op_request(ManagerRequest, manager.step, line)

    def _radix_request(self, model: RadixModel, line: bytes) -> str | None:
        """Answer one line of a radix session (version 4)."""
        return self._op_request(RadixOpRequest, model.step, line)

    def _op_request(self, request: type[ManagerRequest] | type[RadixOpRequest], step: Any, line: bytes) -> str | None:
        """One ``{"id", "op"}`` line of a version 3 or 4 session: parse it as
        ``request``, apply its operation with ``step`` and answer the outcome
        (or the error); a ``bye`` or ``hello`` line is returned to the loop."""
        try:
            req = request.model_validate_json(line)
        except ValidationError as e:
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as je:
                self.error(None, "malformed_request", f"not valid JSON: {je}")
                return None
            if isinstance(obj, dict) and obj.get("type") in ("bye", "hello"):
                return str(obj["type"])
            self.error(obj.get("id") if isinstance(obj, dict) else None, "malformed_request", _brief(e))
            return None
        try:
            outcome = step(req.op)
        except Exception as e:  # a model bug, not a spec verdict
            traceback.print_exc()
            self.error(req.id, "internal_error", f"{type(e).__name__}: {e}")
            return None
        self.send(b'{"id":%d,"outcome":%s}' % (req.id, outcome.model_dump_json().encode()))
        return None

    def _engine_request(self, session: EngineSession, line: bytes) -> str | None:
        """Answer one line of a request-level session; "bye" or "hello" if it is one."""
        try:
            req = EngineRequest.model_validate_json(line)
        except ValidationError as e:
            return self._other_message(line, e, engine=True)
        try:
            outcome = session.apply(req.op)
        except ConfigError as e:  # an id already in use: the request cannot be applied
            self.error(req.id, "malformed_request", str(e))
            return None
        except Exception as e:  # a model bug, not a spec verdict
            traceback.print_exc()
            self.error(req.id, "internal_error", f"{type(e).__name__}: {e}")
            return None
        self.send(b'{"id":%d,"outcome":%s}' % (req.id, outcome.model_dump_json(exclude_none=True).encode()))
        return None

    def _other_message(self, line: bytes, err: ValidationError, *, engine: bool) -> str | None:
        """A line that is not a request of this session: "bye", "hello", or
        None after answering a protocol error."""
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            self.error(None, "malformed_request", f"not valid JSON: {e}")
            return None
        if isinstance(obj, dict) and obj.get("type") in ("bye", "hello"):
            return str(obj["type"])
        if isinstance(obj, dict) and "type" in obj:
            self.error(None, "unexpected_message", f"unexpected {obj['type']!r} message after the handshake")
            return None
        rid = obj.get("id") if isinstance(obj, dict) else None
        other = Request if engine else EngineRequest
        try:
            wrong = other.model_validate(obj)
        except ValidationError:
            self.error(rid, "malformed_request", _brief(err))
            return None
        if engine:
            why = f"block operation {wrong.op.op!r} in a request-level session (its hello carried engine)"
        else:
            why = f"request-level operation {wrong.op.op!r} in a block-level session (its hello carried no engine)"
        self.error(rid, "unexpected_message", why)
        return None


def _engine_types(mutant: str | None) -> tuple[type[RequestDriver], type[VllmPoolModel]]:
    if mutant is None:
        return RequestDriver, VllmPoolModel
    from kvspec.adapters.mutants.request_bugs import engine_types

    return engine_types(mutant)


def main(argv: list[str] | None = None) -> int:
    """Serve stdin/stdout. ``argv`` holds the options (none when a wrapper
    script calls ``main()`` with a command line of its own)."""
    parser = argparse.ArgumentParser(prog="python -m kvspec.adapters.reference_jsonl.server", description=__doc__)
    parser.add_argument("--mutant", default=None, help="run this request-level mutant's driver (mutant campaign)")
    args = parser.parse_args(argv or [])
    try:
        driver_type, model_type = _engine_types(args.mutant)
    except ConfigError as e:
        print(f"reference_jsonl server: {e}", file=sys.stderr)
        return 2
    # Keep the protocol channel clean: fd 1 becomes stderr for anything that
    # prints, and the protocol writes to a private duplicate of the real stdout.
    proto_out = os.fdopen(os.dup(1), "wb", buffering=65536)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        return Server(sys.stdin.buffer, proto_out, driver_type=driver_type, model_type=model_type).serve()
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
