"""Request-level messages (protocol and C ABI version 2), as pydantic models.

Most KV managers are driven by whole requests, not block operations: an
engine admits a request with its token ids, schedules steps (prefill, then
one decode token per step), and frees the request's blocks when it finishes.
Version 2 of the adapter protocol (spec/PROTOCOL.md) and of the C ABI
(spec/ABI.md) carry exactly what kvspec's request-level layer
(``conformance/requests/check.py``) needs from such an engine, so that a
request-level implementation in any language can be checked:

- ``EngineConfig``: what a request-level session is opened with beside the
  ``ManagerConfig`` of its device pool (the host tier);
- the operations ``AddRequest`` (admit), ``EngineStep`` (run one scheduler
  step) and ``ResetPrefixCache``;
- their one reply, ``EngineOutcome``: the requests that finished (with their
  prefix-cache hit and output length), how many are still running or
  waiting, the pool's counters and the KV events published, in order.

WHY steps and not "run this request": the engine decides how a request is
scheduled; the suite only needs to know which events each step published and
when each request finished, and a step that never ends is then a hang the
transport can time out, one call at a time.

Like ``spec.wire``, every model is strict (closed objects, exact integer
types): a malformed message is refused naming the field. The JSON Schemas
(``spec/schema/engine_*.json`` and ``protocol.json``) are generated from
these models by ``kvspec schemas``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Field, TypeAdapter

from kvspec.spec.wire import U32, Count, Counters, KvEvent, Wire

#: largest ``max_tokens`` of one request (the request layer's own limit)
MAX_TOKENS_LIMIT = 4096
#: longest prompt one AddRequest carries: keeps the line well under the
#: protocol's 1 MiB request limit (at most 11 bytes per token id)
MAX_PROMPT_TOKENS = 65536

#: the engine's name for a request: chosen by the parent, unique per session
EngineRequestId = Annotated[str, Field(min_length=1, max_length=64)]


class EngineConfig(Wire):
    """What a request-level session needs beside its ``ManagerConfig``.

    ``host_blocks``: the size of the write-through host tier (storage tier
    ``host_pinned``) in blocks, or null for none."""

    host_blocks: Annotated[int, Field(ge=1, le=1_000_000, strict=True)] | None = None


# --------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------


class AddRequest(Wire):
    """Admit a request: its prompt token ids and how many tokens to generate.

    The engine queues it; it is scheduled by later steps. A request that can
    never fit the pool (``len(prompt) + max_tokens - 1`` tokens above
    ``capacity * block_size``) finishes at once with ``finish_reason``
    ``"rejected"``."""

    op: Literal["add_request"]
    request_id: EngineRequestId
    prompt: Annotated[list[U32], Field(min_length=1, max_length=MAX_PROMPT_TOKENS)]
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT, strict=True)]


class EngineStep(Wire):
    """Run one scheduler step: admit what fits, advance every running request
    by one token (its prefill first), finish the requests that are done."""

    op: Literal["step"]


class ResetPrefixCache(Wire):
    """Drop every cached block (vLLM's ``reset_prefix_cache``; rule CLEAR-ALL):
    succeeds, with one Cleared event, only when no request holds a block."""

    op: Literal["reset_prefix_cache"]


#: a request-level operation (what ``engine_call`` takes)
EngineOp: TypeAlias = AddRequest | EngineStep | ResetPrefixCache
EngineOperation: TypeAlias = Annotated[EngineOp, Field(discriminator="op")]
ENGINE_OPERATION_ADAPTER: TypeAdapter[Any] = TypeAdapter(EngineOperation)

ENGINE_OPS: tuple[str, ...] = ("add_request", "step", "reset_prefix_cache")


def parse_engine_operation(data: Any) -> EngineOp:
    """Validate a decoded JSON object as a request-level operation
    (raises pydantic.ValidationError)."""
    return ENGINE_OPERATION_ADAPTER.validate_python(data)


# --------------------------------------------------------------------------
# The reply
# --------------------------------------------------------------------------

#: ``length``: generated ``max_tokens``; ``rejected``: refused at admission
#: because it can never fit the pool
FinishReason = Literal["length", "rejected"]


class FinishedRequest(Wire):
    """A request that finished during the operation; its blocks are freed."""

    request_id: EngineRequestId
    finish_reason: FinishReason
    #: prompt tokens served from the prefix cache (null: not reported)
    cached_tokens: Count | None = None
    #: tokens it generated
    output_tokens: Count = 0


class EngineOutcome(Wire):
    """The reply to every request-level operation."""

    #: requests that finished during this operation, in the order they finished
    finished: list[FinishedRequest] = Field(default_factory=list)
    #: requests admitted and not finished, after the operation
    running: Count
    #: requests added and not yet admitted, after the operation
    waiting: Count
    #: ResetPrefixCache only: whether the reset happened (null otherwise)
    reset: bool | None = None
    #: the device pool's counters after the operation
    counters: Counters
    #: every event the operation published, in order (all tiers)
    events: list[KvEvent] = Field(default_factory=list)
