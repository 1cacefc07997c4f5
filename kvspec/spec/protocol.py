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
request-level ones. Versions 3, 4 and 5 were family selectors (allocator,
radix, several workers), each offered alone for its kind of session.

Version 6 makes the number a version again: its ``hello`` names the session's
family (``Hello.family``: block, request, manager or radix) next to the same
per-family parameters, and ``ready`` repeats it, so one number covers every
kind of session and a later change bumps it for all. The parent offers 6
together with the older version of the session's kind, and only to a child
whose manifest says it reads version-6 hellos (``[start] protocol = 6``): a
child written for 1-5 never sees the ``family`` field (PROTOCOL.md section 13).

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
from typing import Annotated, Any, Literal, get_args

from pydantic import Field
from pydantic.json_schema import models_json_schema

from kvspec.spec.config import ManagerConfig, ProfileName
from kvspec.spec.engine_wire import EngineConfig, EngineOperation, EngineOutcome
from kvspec.spec.manager_wire import ManagerConfigKind, PagedOp, PagedOutcome, SessionOp, SessionOutcome
from kvspec.spec.manifest import Capabilities
from kvspec.spec.radix_wire import RadixConfig, RadixOp, RadixOutcome
from kvspec.spec.registry import PROFILES, RADIX_FAMILY, VLLM_NAME
from kvspec.spec.wire import Operation, ProcessOutcome, StepOutcome, Wire, WorkerEvents

#: The newest protocol version this module describes (an integer; see
#: PROTOCOL.md "Versions"). Any change to a message's shape makes a new version.
PROTOCOL_VERSION = 6
#: Every version this package can speak, oldest first.
SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
#: The versions before 6 that carry a one-worker block-level session.
BLOCK_VERSIONS: tuple[int, ...] = (1, 2)
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
#: Version 6: the hello names its session's family (``Hello.family``) and the
#: ready repeats it; one version for every kind of session (PROTOCOL.md
#: section 13). Offered with the older version of the session's kind, to a
#: child whose manifest declares ``[start] protocol = 6``.
FAMILY_VERSION = 6

#: The kinds of session a version-6 hello names: the registry's families that
#: have a wire protocol (``spec.registry.Family`` without ``generic``) and the
#: request level. A block session of several workers is family ``block`` with
#: ``workers`` set.
SessionFamily = Literal["block", "request", "manager", "radix"]
SESSION_FAMILIES: tuple[SessionFamily, ...] = get_args(SessionFamily)

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
    #: version 6: the session's family, present exactly when ``versions``
    #: holds 6; its parameters are the fields below (``engine`` for request,
    #: ``manager``, ``radix``, ``workers`` for a block session of several)
    family: SessionFamily | None = None
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
    #: version 6 only: the family of the session it opened (must equal
    #: Hello.family); absent under the older versions
    family: SessionFamily | None = None
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
# Which versions carry which session (version 6 and the family selectors)
# --------------------------------------------------------------------------


def legacy_versions(family: SessionFamily, workers: int = 1) -> tuple[int, ...]:
    """The versions before 6 that carry a session of ``family``: 1 and 2 for
    one block-level worker, 5 for several, 2 for the request level, 3 for an
    allocator, 4 for a radix cache (each selected what the session was)."""
    if family == "block":
        return BLOCK_VERSIONS if workers <= 1 else (WORKERS_VERSION,)
    return {"request": (ENGINE_VERSION,), "manager": (MANAGER_VERSION,), RADIX_FAMILY: (RADIX_VERSION,)}[family]


def session_versions(family: SessionFamily, workers: int = 1, newest: int | None = None) -> tuple[int, ...]:
    """The versions the parent offers for a session of ``family`` to a child
    whose manifest names ``newest`` (``[start] protocol``; None: a child
    written for versions 1-5, offered exactly what it was offered before)."""
    old = legacy_versions(family, workers)
    if newest is not None and newest >= FAMILY_VERSION:
        return (*old, FAMILY_VERSION)
    return old


def family_of_hello(hello: Hello) -> SessionFamily:
    """The family a hello opens: its ``family`` (version 6), else the one its
    fields imply (``radix``, ``manager``, ``engine``; otherwise block)."""
    if hello.family is not None:
        return hello.family
    if hello.radix is not None:
        return RADIX_FAMILY
    if hello.manager is not None:
        return "manager"
    if hello.engine is not None:
        return "request"
    return "block"


#: the parameter field each family's hello carries, and the fields it must not
_FAMILY_FIELDS: dict[SessionFamily, tuple[str | None, tuple[str, ...]]] = {
    "block": (None, ("engine", "manager", "radix")),
    "request": ("engine", ("manager", "radix", "workers")),
    "manager": ("manager", ("engine", "radix", "workers")),
    RADIX_FAMILY: ("radix", ("engine", "manager", "workers")),
}


def hello_problem(hello: Hello) -> str | None:
    """What is wrong with ``hello`` as a version-6 hello, or None: it names
    its family exactly when it offers 6, carries that family's parameters and
    no other family's, and its ``config.profile`` belongs to the family (the
    registry's family of the profile; the request level runs profile vllm)."""
    offers = FAMILY_VERSION in hello.versions
    if hello.family is None:
        return "a hello offering version 6 names its session's family (family)" if offers else None
    if not offers:
        return f"family {hello.family!r} is a version-6 field, but the hello offers {hello.versions}"
    needs, forbids = _FAMILY_FIELDS[hello.family]
    if needs is not None and getattr(hello, needs) is None:
        return f"a {hello.family} session's hello carries {needs}"
    extra = [f for f in forbids if getattr(hello, f) is not None]
    if extra:
        return f"a {hello.family} session's hello carries no {', '.join(extra)}"
    profile = hello.config.profile
    family = "block" if hello.family == "request" and profile == VLLM_NAME else hello.family
    if PROFILES[profile].family != family:
        return f"profile {profile!r} is not of family {hello.family!r}"
    if hello.manager is not None and hello.manager.kind != profile:
        return f"manager {hello.manager.kind} but config.profile {profile}"
    return None


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
