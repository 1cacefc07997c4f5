"""Wire models of the ``radix`` profile: a radix-tree prefix cache (SGLang's ``RadixCache``).

A radix cache keeps token sequences in a tree whose edges hold runs of token
ids (whole pages of ``page_size`` tokens); a request matches the longest
cached prefix of its prompt, locks the node where the match ends while it
runs, and inserts what it computed when it finishes. It publishes KV events
like a vLLM-style pool (one Stored per new node listing its pages, one
Removed per eviction, a Cleared on reset), so the suite checks both what
it holds (every outcome carries a snapshot of the tree) and what it
publishes (the events, compared with the model's exactly and replayed
through the router view). SPEC.md, "Radix prefix cache", is the prose.

Operations name token lists, never nodes: ``lock`` matches its tokens and
locks the node the match ends at, under a name that ``unlock`` gives back
(what a scheduler does with a request's ``last_node``). ``request`` is one
whole request the way a scheduler runs it (match, lock, take slots,
evicting if needed, insert, unlock).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, TypeAlias

from pydantic import Field, TypeAdapter, model_validator

from kvspec.spec.manager_wire import Name, OpError
from kvspec.spec.registry import RADIX, SCENARIO_ROOT
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import U32, Count, KvEvent, Wire

#: token lists of one operation (a radix key); 4096 bounds the work per op
Tokens = Annotated[list[U32], Field(max_length=4096)]


class RadixConfig(Wire):
    """A radix cache over a KV pool of ``capacity`` token slots, in pages of ``page_size`` tokens."""

    kind: Literal["radix"] = RADIX
    page_size: int = Field(default=1, ge=1, le=64)
    capacity: int = Field(default=64, ge=1, le=1 << 20)


class RadixMatch(Wire):
    """Match the longest cached page-aligned prefix of ``tokens`` (may split a node)."""

    op: Literal["match"] = "match"
    tokens: Tokens


class RadixInsert(Wire):
    """Cache ``tokens`` (cut to whole pages): the caller computed them into fresh slots."""

    op: Literal["insert"] = "insert"
    tokens: Tokens


class RadixLock(Wire):
    """Match ``tokens`` and lock the node the match ends at, under ``name``."""

    op: Literal["lock"] = "lock"
    name: Name
    tokens: Tokens


class RadixUnlock(Wire):
    """Release the lock ``name`` holds."""

    op: Literal["unlock"] = "unlock"
    name: Name


class RadixEvict(Wire):
    """Evict unlocked leaves until at least ``tokens`` tokens are freed (or none is left)."""

    op: Literal["evict"] = "evict"
    tokens: Count


class RadixReset(Wire):
    """Empty the tree; every lock is forgotten."""

    op: Literal["reset"] = "reset"


class RadixRequest(Wire):
    """One request: ``prompt`` prefilled, ``output`` generated (the last output
    token is never computed into the cache), cached when it finishes."""

    op: Literal["request"] = "request"
    prompt: Annotated[list[U32], Field(min_length=1, max_length=4096)]
    output: Annotated[list[U32], Field(min_length=1, max_length=4096)]


RadixOp: TypeAlias = Annotated[
    RadixMatch | RadixInsert | RadixLock | RadixUnlock | RadixEvict | RadixReset | RadixRequest,
    Field(discriminator="op"),
]


class RadixNode(Wire):
    """One node of the tree: its own tokens (whole pages), its lock count, its children
    (ordered by their first token)."""

    tokens: list[U32]
    lock_ref: Count
    children: list[RadixNode] = []


class RadixSnapshot(Wire):
    """The cache's observable state after an operation."""

    #: the root's children (the root holds no tokens and is always locked)
    tree: list[RadixNode]
    #: tokens in unlocked nodes (SGLang's ``evictable_size``)
    evictable: Count
    #: tokens in locked nodes (``protected_size``)
    protected: Count
    #: free token slots of the KV pool
    free: Count
    #: each held lock and the length of the prefix its node ends
    locks: dict[str, Count]


class RadixOutcome(Wire):
    """Exactly one of ``value`` and ``error``; ``events`` is what the op published."""

    value: Count | None = None
    error: OpError | None = None
    events: list[KvEvent] = []
    state: RadixSnapshot

    @model_validator(mode="after")
    def _value_xor_error(self) -> RadixOutcome:
        if (self.value is None) == (self.error is None):
            raise ValueError("a radix outcome carries exactly one of value and error")
        return self


RADIX_OP_ADAPTER: TypeAdapter[RadixOp] = TypeAdapter(RadixOp)


# ------------------------------------------------------------------ goldens


class RadixExpect(Wire):
    """What one golden step must produce; a key left out is not checked."""

    value: int | None = None
    error: RuleId | None = None
    #: the events, as ``[kind, tokens of each page]`` for Stored (with the
    #: parent page's tokens, null at the root), ``[kind, pages]`` for Removed,
    #: ``["cleared"]``: written by hand, without hashes
    events: list[ExpectedEvent] | None = None
    #: the tree as nested ``[tokens, lock_ref, children]``
    tree: list[ExpectedNode] | None = None
    evictable: int | None = None
    protected: int | None = None
    free: int | None = None


class ExpectedEvent(Wire):
    kind: Literal["stored", "removed", "cleared"]
    #: the tokens of each page the event names, in order
    pages: list[list[int]] = []
    #: Stored: the tokens of the parent page (null: anchored at the root)
    parent: list[int] | None = None


class ExpectedNode(Wire):
    tokens: list[int]
    lock_ref: int = 0
    children: list[ExpectedNode] = []


RadixExpect.model_rebuild()


class RadixStep(Wire):
    op: RadixOp
    expect: RadixExpect = RadixExpect()
    note: str | None = None


class RadixScenario(Wire):
    name: str
    description: str
    source: str
    rules: Annotated[list[RuleId], Field(min_length=1)]
    config: RadixConfig
    steps: Annotated[list[RadixStep], Field(min_length=1)]


SCENARIO_DIR = SCENARIO_ROOT / RADIX


def radix_scenarios(root: Path = SCENARIO_DIR) -> list[tuple[Path, RadixScenario]]:
    """Every radix golden scenario, sorted by path."""
    return [(p, RadixScenario.model_validate(json.loads(p.read_text()))) for p in sorted(root.glob("*.json"))]
