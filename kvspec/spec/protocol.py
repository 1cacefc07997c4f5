"""The JSON-lines adapter protocol: every message, as pydantic models.

An implementation in any language can be tested by running it as a child
process that speaks this protocol over its stdin/stdout (spec/PROTOCOL.md is
the prose; ``spec/schema/protocol.json`` is generated from these models and a
test keeps the checked-in file current). The models are the single definition
both sides use: the parent (``conformance.transport.jsonl``) validates every
reply against them, and the reference server
(``adapters/reference_jsonl/server.py``) validates every request.

Messages, one JSON object per line:

    parent -> child   Hello, Request (or, version 2, EngineRequest; version 3,
                      ManagerRequest; version 4, RadixOpRequest), Bye
    child  -> parent  Ready or Refused (answering Hello), then per Request
                      an OutcomeReply (per EngineRequest an EngineOutcomeReply,
                      per ManagerRequest a ManagerOutcomeReply, per
                      RadixOpRequest a RadixOutcomeReply) or an ErrorReply

Version 2 adds request-level sessions (``spec.engine_wire``): a ``hello``
carrying ``engine`` opens one, and its requests are whole-request operations
(add a request, run a scheduler step, reset the prefix cache). Everything
version 1 defines is unchanged, so a version-1 child keeps working: the
parent offers both versions for block-level sessions and only version 2 for
request-level ones.

Two kinds of errors are kept apart on purpose. An operation the *spec*
rejects is an ordinary outcome: ``OutcomeReply.outcome.error`` carries the
rule id (spec.wire.StepOutcome has a result xor an error), and the suite
checks it like any other result. A *protocol* error (a request the child
could not parse, an operation kind it does not implement) is an
``ErrorReply`` with a ``code`` from ``ProtocolErrorCode``; the parent treats
it as a broken adapter, never as a spec verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic.json_schema import models_json_schema

from kvspec.spec.config import ManagerConfig, ProfileName
from kvspec.spec.engine_wire import EngineConfig, EngineOperation, EngineOutcome
from kvspec.spec.manager_wire import ManagerConfigKind, PagedOp, PagedOutcome, SessionOp, SessionOutcome
from kvspec.spec.manifest import Capabilities
from kvspec.spec.radix_wire import RadixConfig, RadixOp, RadixOutcome
from kvspec.spec.wire import Operation, ProcessOutcome, StepOutcome, Wire, WorkerEvents

#: The newest protocol version this module describes (an integer; see
#: PROTOCOL.md "Versions"). Any change to a message's shape makes a new version.
PROTOCOL_VERSION = 2
#: Every version this package can speak, oldest first.
SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2)
#: The first version with request-level sessions (``Hello.engine``).
ENGINE_VERSION = 2
#: Version 3: allocator-level sessions (``Hello.manager``, profiles paged and
#: session; PROTOCOL.md section 10). Offered alone, only for such a session,
#: so block- and request-level hellos are unchanged.
MANAGER_VERSION = 3
#: Version 4: radix sessions (``Hello.radix``, profile radix; PROTOCOL.md
#: section 11). Offered alone, only for such a session, like version 3.
RADIX_VERSION = 4
#: Version 5: process sessions, several kvbm workers sharing G3/G4
#: (``Hello.workers``; PROTOCOL.md section 12). Offered alone, only for a
#: session of more than one worker, so a one-worker hello is unchanged.
WORKERS_VERSION = 5

#: Largest request line (bytes, without the newline) a parent may send; a
#: child must accept lines up to this size.
MAX_REQUEST_BYTES = 1024 * 1024

#: Request ids are positive integers the parent counts up from 1.
RequestId = Annotated[int, Field(ge=1, le=2**53 - 1, strict=True)]

#: where ``kvspec schemas`` (``spec/schema_export.py``) writes ``protocol_schema()``
SCHEMA_PATH = Path(__file__).parent / "schema" / "protocol.json"


# --------------------------------------------------------------------------
# Handshake
# --------------------------------------------------------------------------


class Hello(Wire):
    """First line the parent writes: the versions it speaks and the config."""

    type: Literal["hello"]
    #: protocol versions the parent speaks (non-empty, any order)
    versions: Annotated[list[Annotated[int, Field(ge=1, strict=True)]], Field(min_length=1)]
    #: the manager to build (spec/config.py)
    config: ManagerConfig
    #: version 2: present only in a request-level session (the parent then
    #: offers only versions >= 2); the parent leaves it out otherwise, so a
    #: block-level hello is byte for byte the version-1 one
    engine: EngineConfig | None = None
    #: version 3: present only in an allocator-level session (paged, session);
    #: ``config.profile`` then names the same profile
    manager: ManagerConfigKind | None = None
    #: version 4: present only in a radix session; ``config.profile`` is then
    #: ``"radix"`` (its capacity and block_size repeat the radix config's)
    radix: RadixConfig | None = None
    #: version 5: present only in a process session, the number of workers
    #: (2..64) sharing G3/G4; requests then name their worker
    workers: Annotated[int, Field(ge=2, le=64, strict=True)] | None = None


class Ready(Wire):
    """The child accepts: who it is, the version chosen, what it can do."""

    type: Literal["ready"]
    #: the implementation's name (free text, shown in reports)
    name: Annotated[str, Field(min_length=1, max_length=200)]
    #: the version the child chose; must be one of Hello.versions
    protocol: Annotated[int, Field(ge=1, strict=True)]
    #: the profile the child runs (must equal Hello.config.profile)
    profile: ProfileName
    #: same fields as the manifest's [capabilities] table
    capabilities: Capabilities
    #: the implementation's own version string, if it has one
    implementation_version: Annotated[str, Field(max_length=200)] | None = None
    #: the child accepts a later ``hello`` in place of ``bye``: it discards its
    #: manager and starts a new session (PROTOCOL.md "Sessions"), so the
    #: parent may reuse the process instead of starting a new one
    multi_session: bool = False


HandshakeErrorCode = Literal["unsupported_version", "unsupported_config", "internal_error"]


class HandshakeError(Wire):
    code: HandshakeErrorCode
    message: Annotated[str, Field(max_length=65536)]


class Refused(Wire):
    """The child refuses the handshake (and then exits)."""

    type: Literal["refused"]
    error: HandshakeError


# --------------------------------------------------------------------------
# Requests and replies
# --------------------------------------------------------------------------


class Request(Wire):
    """One operation. The parent waits for its reply before the next one."""

    id: RequestId
    op: Operation


class OutcomeReply(Wire):
    """The child applied (or, per the spec, rejected) the operation."""

    id: RequestId
    outcome: StepOutcome


class EngineRequest(Wire):
    """Version 2: one request-level operation of a request-level session."""

    id: RequestId
    op: EngineOperation


class EngineOutcomeReply(Wire):
    """Version 2: the child applied a request-level operation."""

    id: RequestId
    outcome: EngineOutcome


class ManagerRequest(Wire):
    """Version 3: one operation of an allocator-level session."""

    id: RequestId
    op: PagedOp | SessionOp


class ManagerOutcomeReply(Wire):
    """Version 3: the child applied (or, per the spec, rejected) the operation."""

    id: RequestId
    outcome: PagedOutcome | SessionOutcome


class RadixOpRequest(Wire):
    """Version 4: one operation of a radix session (``spec.radix_wire``)."""

    id: RequestId
    op: RadixOp


class RadixOutcomeReply(Wire):
    """Version 4: the child applied (or, per the spec, rejected) the operation."""

    id: RequestId
    outcome: RadixOutcome


class WorkerRequest(Wire):
    """Version 5: one block operation on one worker of a process session."""

    id: RequestId
    #: the worker (0 .. hello.workers - 1); absent: worker 0
    worker: Annotated[int, Field(ge=0, le=63, strict=True)] = 0
    op: Operation


class WorkerOutcomeReply(Wire):
    """Version 5: the worker's outcome, and what the other workers published during it."""

    id: RequestId
    outcome: StepOutcome
    #: the events other workers published in this step (worker order, each at most once)
    others: list[WorkerEvents] = []

    def process_outcome(self) -> ProcessOutcome:
        return ProcessOutcome(outcome=self.outcome, others=self.others)


ProtocolErrorCode = Literal["malformed_request", "unsupported_op", "unexpected_message", "internal_error"]


class ProtocolError(Wire):
    """A request the child could not handle at the protocol level."""

    code: ProtocolErrorCode
    message: Annotated[str, Field(max_length=65536)]


class ErrorReply(Wire):
    """Protocol-level failure of one request. ``id`` is null when the
    request was so malformed that its id could not be read."""

    id: RequestId | None
    error: ProtocolError


class Bye(Wire):
    """Last line the parent writes; the child exits with status 0."""

    type: Literal["bye"]


PARENT_MESSAGES: tuple[type[Wire], ...] = (
    Hello,
    Request,
    EngineRequest,
    ManagerRequest,
    RadixOpRequest,
    WorkerRequest,
    Bye,
)
CHILD_MESSAGES: tuple[type[Wire], ...] = (
    Ready,
    Refused,
    OutcomeReply,
    EngineOutcomeReply,
    ManagerOutcomeReply,
    RadixOutcomeReply,
    WorkerOutcomeReply,
    ErrorReply,
)


# --------------------------------------------------------------------------
# JSON Schema
# --------------------------------------------------------------------------


def protocol_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of every protocol message (``$schema`` and
    ``$id`` are added when rendered).

    ``$defs`` holds each message by name; the top level accepts any one of
    them, and ``$defs/ParentMessage`` / ``$defs/ChildMessage`` accept the
    messages of one direction.
    """
    models = [*PARENT_MESSAGES, *CHILD_MESSAGES]
    _, top = models_json_schema([(m, "validation") for m in models], ref_template="#/$defs/{model}")
    defs = top["$defs"]
    # pydantic cannot export StepOutcome's "result xor error" validator; say it in the schema
    defs["StepOutcome"]["oneOf"] = [
        {"required": ["result"], "properties": {"result": {"type": "object"}}},
        {"required": ["error"], "properties": {"error": {"type": "object"}}},
    ]
    # nor RadixOutcome's "value xor error"
    defs["RadixOutcome"]["oneOf"] = [
        {"required": ["value"], "properties": {"value": {"type": "integer"}}},
        {"required": ["error"], "properties": {"error": {"type": "object"}}},
    ]
    # anyOf: a request's kind is the session's (its hello), not the line's shape alone; a
    # radix {"op": "reset"} is also a block-level reset
    defs["ParentMessage"] = {
        "anyOf": [{"$ref": f"#/$defs/{m.__name__}"} for m in PARENT_MESSAGES],
        "description": "a request is read as the session's kind (the hello chose it): shapes may coincide",
    }
    # anyOf too: a version-5 reply without ``others`` has the shape of a version-1 one
    defs["ChildMessage"] = {
        "anyOf": [{"$ref": f"#/$defs/{m.__name__}"} for m in CHILD_MESSAGES],
        "description": "a reply is read as the session's kind (the hello chose it): shapes may coincide",
    }
    return {
        "title": f"kvspec JSON-lines adapter protocol, versions {', '.join(map(str, SUPPORTED_VERSIONS))}",
        "description": "One JSON object per line over the child's stdin/stdout; see spec/PROTOCOL.md.",
        "oneOf": [{"$ref": "#/$defs/ParentMessage"}, {"$ref": "#/$defs/ChildMessage"}],
        "$defs": dict(sorted(defs.items())),
    }
