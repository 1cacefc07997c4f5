"""Scoped deviations: where a declared departure from a rule applies.

A manifest's ``[[deviations]]`` entry names a rule and a *scope*. A failure
of that rule is expected only inside the scope; the same rule broken
anywhere else fails the run as any undeclared break does. That is what keeps
one honest, narrow declaration from waiving every failure filed under its
rule (a bug of the same rule elsewhere stays visible).

A scope is given by any of (all that are given must match):

- ``scenarios``: golden scenario ids (``FOLDER/NAME``: the scenario file's
  folder under spec/scenarios and its name, as a test id shows it without
  the ``@POLICY`` suffix a scenario run under several policies gets; it
  covers every policy);
- ``operations``: the kinds of operation whose step may diverge (``use``,
  ``deref``, ``destroy``, ``promote``, ``tick``, ``swap_in``, ``reset``);
- ``conditions``: names from ``CONDITIONS`` below, each a fact the checker
  establishes about the failure itself (every one listed must hold).

or by ``scope = "all"``: the whole rule, for departures that really are
rule-wide; the reason must then say why (a manifest loader refuses a
deviation with no scope).

The checkers (``kvspec.conformance``) describe each failure as a ``Site``;
``Scope.covers`` is the whole matching logic, so every checker (goldens,
lockstep, request level) decides the same way.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from kvspec.spec.config import ProfileName
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Wire

R = RuleId

#: operation kinds a scope may name (the ``op`` tag of the wire operations)
OPERATION_KINDS = ("use", "deref", "destroy", "promote", "tick", "swap_in", "reset")


@dataclass(frozen=True)
class Condition:
    """A named fact about a failure that a checker evaluates.

    ``rules``: the rules it can scope (empty: any rule). ``doc``: what it
    means, in the words a manifest author reads."""

    name: str
    doc: str
    rules: frozenset[RuleId] = frozenset()


def _conditions(*cs: Condition) -> dict[str, Condition]:
    return {c.name: c for c in cs}


#: conditions whose evidence depends on timing (never judged "unexpected pass")
NONDETERMINISTIC = frozenset({"concurrent_run"})

#: every named condition; ``kvspec.conformance.run.deviation_scope`` evaluates them
CONDITIONS: dict[str, Condition] = _conditions(
    Condition(
        "event_ids_from_1",
        "the implementation numbers its events from 1 instead of 0 and is otherwise contiguous: "
        "with a first id of 1 the checker finds no other EVENT-ID departure in the run",
        frozenset({R.EVENT_ID}),
    ),
    Condition(
        "copy_store_unannounced",
        "the Stored the implementation left out names only physical copies of hashes that are already "
        "cached and announced (it announces a hash's first resident copy only); the checker followed that "
        "and the rest of the run matched",
        frozenset({R.STORE_COPY}),
    ),
    Condition(
        "copy_remove_unreported",
        "the Removed the implementation left out (or shortened) names only copies whose hash keeps "
        "another cached copy (it reports a hash only when its last copy goes); the checker followed that "
        "and the rest of the run matched",
        frozenset({R.REMOVE_COPY}),
    ),
    Condition(
        "host_batch_hash_order",
        "the host tier evicts the blocks of one newly stored batch in ascending block-hash order instead "
        "of leaf first; the checker followed that order and the rest of the run matched",
        frozenset({R.G2_EVICT}),
    ),
    Condition(
        "host_write_missing",
        "the host tier events the model expects at the failing point (a host_pinned Stored, or the host "
        "Removed that makes room for it) name blocks the implementation wrote to the host tier no event "
        "about in that request: the block was not written through to the host at all; in a sequential run "
        "the checker follows it (the model then writes through only the prompt blocks a request did not hit on "
        "the device, and neither stores nor refreshes its device hits on the host) and compares the rest of the "
        "run exactly (request level)",
        frozenset({R.G2_EVICT, R.G2_STORE_ON_COMPLETE}),
    ),
    Condition(
        "host_evicts_batch_parent",
        "the host tier makes room for a batch by evicting that batch's own parent: a host_pinned Removed "
        "naming the parent comes right before the host_pinned Stored anchored to it, which is then anchored "
        "to a block the host tier no longer holds (request level: the event pair is in the failing request, "
        "or is the failing event and the one before it)",
        frozenset({R.G2_EVICT, R.PARENT_ANCHOR}),
    ),
    Condition(
        "full_prompt_hit",
        "the reported prefix hit is the whole prompt: its length is a whole number of blocks and every one of "
        "them is reported cached, one block over the num_tokens - 1 cap (request level, any run; in a sequential "
        "run the checker follows it, the model then recomputing no last block, and the rest of the run matched)",
        frozenset({R.VLLM_PREFIX_HIT}),
    ),
    Condition(
        "request_stalled",
        "the request that did not generate max_tokens never finished at all: the engine kept it without "
        "progress (no token, no event) until the adapter gave up on it (finish 'stalled', request level; in a "
        "sequential run the requests after it are not sent and are reported stalled too). Followed where "
        "declared: the requests after it run as a workload of their own on a fresh engine and are checked like "
        "any other (an undeclared stall fails the run as it is)",
        frozenset({R.USE_CAPACITY, R.RADIX_CAPACITY}),
    ),
    Condition(
        "request_inserts_in_parts",
        "radix profile, request level: the engine runs a request as a scheduler does, not as one insert: prefill "
        "allocates the prompt's pages (evicting what the free slots lack) and caches its whole pages, then each "
        "decode token that starts a page allocates one (evicting) and each page decode completes is cached, each "
        "part its own insert and Stored (pages found cached give their slots back, the prompt's once the first "
        "decode page is reserved); with the model running the request so (events compared with consecutive ones "
        "of a kind merged, as an event plane batches them), the run gets past the request that differed "
        "(sequential runs; the checker goes on comparing so)",
        frozenset({R.RADIX_INSERT}),
    ),
    Condition(
        "evicts_leaf_suffix",
        "radix profile, request level: an eviction that needs fewer pages than the least recently used leaf holds "
        "removes only that leaf's newest pages (newest first) and keeps the rest of the leaf, where the profile "
        "evicts whole leaves; with the model evicting so, the run gets past the request that differed "
        "(sequential runs; the checker goes on comparing with the model doing so)",
        frozenset({R.RADIX_REMOVE}),
    ),
    Condition(
        "insert_extends_leaf",
        "radix profile, request level: pages an insert adds right after a leaf join that leaf's node instead of "
        "hanging under it as a new node (the Stored still names only the new pages), which shows in what later "
        "evictions take and in which order; with the model inserting so, the run gets past the request that "
        "differed (sequential runs; the checker goes on comparing with the model doing so)",
        frozenset({R.RADIX_INSERT}),
    ),
    Condition(
        "split_keeps_access_time",
        "radix profile, request level: the lower half of a node a match splits keeps its old access time (the "
        "profile stamps every node a match passes, the split one included), which shows in which leaf later "
        "evictions take; with the model doing so, the run gets past the request that differed (sequential runs; "
        "the checker goes on comparing with the model doing so)",
        frozenset({R.RADIX_MATCH}),
    ),
    Condition(
        "prompt_cached_after_first_decode_page",
        "radix profile, request level: the engine announces a request's new prompt pages when prefill allocates "
        "them but puts the prompt in its tree (moving the request's lock down the prompt's path) only after it has "
        "reserved the first decode page, so that reservation's eviction may take the prompt's own cached pages "
        "past the match, unannounced (the request holds copies of them, which the tree takes back unannounced), "
        "or another leaf than the model's; with the model running the request so, the run gets past the request "
        "that differed (sequential runs; the checker goes on comparing with the model doing so)",
        frozenset({R.RADIX_EVICT_LRU}),
    ),
    Condition(
        "prefill_admission_refused",
        "radix profile, request level, sequential runs: the request that stalled is one an SGLang-style prefill "
        "admission never lets in: with the run before it replayed on the model, its prompt past the hit (the "
        "prompt but its last token, cut to pages, that is cached), rounded up to whole pages, plus its max_tokens "
        "is at least the free plus evictable slots at that point, though the model (which charges the tokens a "
        "request caches, not its whole output budget on top of a page-rounded prompt) runs it",
        frozenset({R.RADIX_CAPACITY}),
    ),
    Condition(
        "request_caches_last_token",
        "radix profile, request level: the engine caches a request's last output token too (the model never "
        "computes its KV, so never caches it): with the model taking a slot for it and caching it like every "
        "other token, the run gets past the request that differed (sequential runs; the checker goes on "
        "comparing with the model doing so)",
        frozenset({R.RADIX_INSERT}),
    ),
    Condition(
        "last_token_over_pool",
        "the request that did not generate max_tokens fits the pool only because its last output token is never "
        "cached: prompt + max_tokens is exactly one token more than the pool holds, and the engine reserved room "
        "for that token too (it refused or shortened the request; request level)",
        frozenset({R.USE_CAPACITY}),
    ),
    Condition(
        "decode_tail_in_batch",
        "the device blocks of a Stored batch that are no block of any prompt (decode-filled blocks, hashed over "
        "tokens the engine does not reveal) are the batch's tail, after the request's prompt blocks: the engine "
        "stores a request's decode blocks together with its prompt blocks; their chaining is still checked "
        "(HASH-SEQUENCE; request level, sequential runs)",
        frozenset({R.HASH_LOCAL}),
    ),
    Condition(
        "concurrent_run",
        "the failure comes from a concurrent request-level run, whose event order depends on the "
        "implementation's timing: such evidence is not deterministic, so a deviation scoped by it is never "
        "judged an unexpected pass",
    ),
    Condition(
        "host_tier",
        "the run has a host (G2, host_pinned) tier: an offload tier at block level, a host pool at request level",
    ),
    Condition(
        "host_tier_event",
        "every event the implementation and the model disagree on at the failing step is on the host_pinned tier",
    ),
    Condition(
        "legacy_source_validation",
        "legacy profile, block level: the implementation accepted a Use that kvspec refuses and the Dynamo mocker "
        "1.0.2 source accepts (more local hashes than full blocks, of which the Stored takes the tail; token lists "
        "read by batch position for new blocks only), and the model, validating that Use as the source does, "
        "reproduced its outcome exactly; the lockstep follows it (the model takes that outcome and state) and checks "
        "every rule from the next step on",
        frozenset({R.USE_VALIDATE}),
    ),
    Condition(
        "offload_job_fails_whole",
        "kvbm with an offload tier on a shared link, block level: an offload job (the evictions of one operation) "
        "with more blocks than G2 had room for (its available blocks, less those admitted and not arrived under "
        "at_start) failed whole: none of it was sent or stored in G2, and its source slots stay quarantined for good "
        "(an older kvbm-engine executor's behaviour), where the spec admits what fits and frees the slots when the "
        "job settles; the model, run that way (from the start of the example when the departure showed nothing at "
        "first), reproduced the implementation's outcome exactly, and the lockstep follows it and checks every rule "
        "from the next step on",
        frozenset({R.QUARANTINE_RELEASE}),
    ),
    Condition(
        "write_in_place",
        "paged profile: a write to a block other holders share went into that block (every holder reads the new "
        "value, no block is taken, the block keeps its holders) instead of into a copy, as the ferrum seed's "
        "write_kv does; the model doing so reproduced the implementation's outcome exactly, and the lockstep follows "
        "it and checks every rule from the next step on",
        frozenset({R.PAGED_COW}),
    ),
    Condition(
        "handle_of_free_slot",
        "session profile: the diverging finalize or reset carries a handle whose slot is free and whose "
        "generation is that free slot's own (a handle no lease ever issued, such as a default-constructed one), "
        "or the diverging drain hands out a pending snapshot of such a slot; the lockstep follows it (the handle "
        "acts as the runtime's generation-only check lets it, reference/session.py) and checks the rest",
        frozenset({R.SESSION_FENCE}),
    ),
    Condition(
        "handle_of_another_session",
        "session profile: the diverging finalize or reset carries a current handle of a slot another session "
        "leased, under the caller's name, and acts (keep: the slot is parked idle for the caller; the leasing "
        "session stays in flight with no slot); the lockstep follows it and checks the rest",
        frozenset({R.SESSION_LEASE}),
    ),
    Condition(
        "handle_of_no_slot",
        "session profile: the diverging finalize or reset names no slot and does not act, with no error, or the "
        "diverging snapshot of no slot is queued (a later drain drops it); the lockstep follows it and checks "
        "the rest",
        frozenset({R.SESSION_VALIDATE}),
    ),
)


@dataclass(frozen=True)
class Site:
    """Where a failure happened, as the checker that found it describes it."""

    rule: RuleId
    #: the golden scenario id (``PROFILE/NAME``), if it came from a golden
    scenario: str | None = None
    #: the kind of the diverging operation (None: not an operation's step)
    operation: str | None = None
    #: the named conditions that hold for this failure
    conditions: frozenset[str] = field(default_factory=frozenset)
    #: the spec profile the failing run checked against (None: unknown)
    profile: str | None = None

    def describe(self) -> str:
        parts = [str(self.rule)]
        if self.scenario:
            parts.append(f"scenario {self.scenario}")
        if self.operation:
            parts.append(f"operation {self.operation}")
        parts.append("conditions " + (", ".join(sorted(self.conditions)) or "none"))
        return "; ".join(parts)


class Scope(Wire):
    """Where a deviation applies (see the module doc): every field given must match."""

    scenarios: list[str] = []
    operations: list[Literal["use", "deref", "destroy", "promote", "tick", "swap_in", "reset"]] = []
    conditions: list[str] = []

    @model_validator(mode="after")
    def _not_empty(self) -> Scope:
        if not (self.scenarios or self.operations or self.conditions):
            raise ValueError(
                "an empty scope would cover the whole rule: name scenarios, operations or conditions, "
                'or write scope = "all"'
            )
        unknown = [c for c in self.conditions if c not in CONDITIONS]
        if unknown:
            known = ", ".join(CONDITIONS)
            raise ValueError(f"unknown condition {', '.join(unknown)}; the named conditions are: {known}")
        return self

    def covers(self, site: Site) -> bool:
        if self.scenarios and site.scenario not in self.scenarios:
            return False
        if self.operations and site.operation not in self.operations:
            return False
        return all(c in site.conditions for c in self.conditions)


class Deviation(Wire):
    """A known departure from the spec: rule id, scope, reason."""

    rule: RuleId
    reason: str = Field(min_length=1)
    #: where it applies; ``"all"`` for the whole rule (say why in ``reason``)
    scope: Scope | Literal["all"] | None = None
    link: str | None = None
    #: only for this profile (default: any)
    profile: ProfileName | None = None

    @model_validator(mode="after")
    def _scoped(self) -> Deviation:
        if self.scope is None:
            raise ValueError(
                f"deviation {self.rule} has no scope, so it would waive every failure of the rule. "
                "Scope it where it applies, e.g. scope = { conditions = [...] } with a named condition "
                f"({', '.join(c.name for c in CONDITIONS.values() if not c.rules or self.rule in c.rules)}), "
                'scope = { scenarios = ["PROFILE/NAME"] } or scope = { operations = ["use"] }; '
                'or, if the departure really is rule-wide, scope = "all" with a reason saying why'
            )
        if isinstance(self.scope, Scope):
            for name in self.scope.conditions:
                c = CONDITIONS[name]
                if c.rules and self.rule not in c.rules:
                    raise ValueError(
                        f"condition {name} cannot scope {self.rule}: it applies to {', '.join(sorted(c.rules))}"
                    )
        return self

    def covers(self, site: Site) -> bool:
        """Is the failure at ``site`` this deviation?"""
        if site.rule != self.rule:
            return False
        if self.profile is not None and site.profile is not None and site.profile != self.profile:
            return False
        return self.scope == "all" or (isinstance(self.scope, Scope) and self.scope.covers(site))

    def deterministic(self) -> bool:
        """Is this deviation's evidence deterministic (can "not observed" be judged)?"""
        return not (isinstance(self.scope, Scope) and NONDETERMINISTIC & set(self.scope.conditions))

    def describe_scope(self) -> str:
        if self.scope == "all":
            return "scope all"
        assert isinstance(self.scope, Scope)
        parts = []
        if self.scope.scenarios:
            parts.append("scenarios " + ", ".join(self.scope.scenarios))
        if self.scope.operations:
            parts.append("operations " + ", ".join(self.scope.operations))
        if self.scope.conditions:
            parts.append("conditions " + ", ".join(self.scope.conditions))
        return "; ".join(parts)


#: where the golden scenarios live (every format: block, allocator, radix)
_SCENARIO_DIR = Path(__file__).parent / "scenarios"


@cache
def golden_ids() -> frozenset[str]:
    """Every golden scenario id a scope may name (``FOLDER/NAME``)."""
    return frozenset(f"{p.parent.name}/{p.stem}" for p in _SCENARIO_DIR.rglob("*.json"))


def scope_problems(dev: Deviation, *, profiles: Sequence[str], block_level: bool) -> list[str]:
    """Why ``dev`` could never match a failure of an adapter that runs
    ``profiles`` (block-level operations when ``block_level``): each a
    sentence saying what to write instead. A scope that matches nothing
    would otherwise be accepted and silently do nothing."""
    out: list[str] = []
    where = f"deviation {dev.rule}"
    if dev.profile is not None and dev.profile not in profiles:
        out.append(
            f"{where}: profile = {dev.profile!r} is not a profile this adapter runs ({', '.join(profiles)}); "
            "write one of those, or leave profile out"
        )
    if not isinstance(dev.scope, Scope):
        return out
    known = golden_ids()
    for sid in dev.scope.scenarios:
        if sid in known:
            continue
        base = sid.split("@", 1)[0]
        if "@" in sid and base in known:
            out.append(
                f"{where}: scenario {sid!r} names a policy; a scope names the golden without the @POLICY suffix "
                f"of its test id (it covers every policy the golden runs under): write {base!r}"
            )
            continue
        close = difflib.get_close_matches(base, sorted(known), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        out.append(
            f"{where}: no golden scenario {sid!r} (an id is FOLDER/NAME of a file under kvspec/spec/scenarios, "
            f"e.g. 'kvbm/promote_existing'){hint}"
        )
    if dev.scope.operations:
        if not block_level:
            out.append(
                f"{where}: operations = {dev.scope.operations} never match: the adapter runs no block-level "
                "operations (request-level findings have no operation kind); scope it by conditions instead"
            )
        else:
            from kvspec.spec.profiles import PROFILES

            ops = {o for p in profiles if p in PROFILES for o in PROFILES[p].operations}
            never = [o for o in dev.scope.operations if o not in ops]
            if never and all(p in PROFILES for p in profiles):
                out.append(
                    f"{where}: operation(s) {', '.join(never)} are not operations of the profiles this adapter "
                    f"runs ({', '.join(profiles)}: {', '.join(sorted(ops))}); the scope would match nothing"
                )
    return out


def covering(deviations: list[Deviation], site: Site) -> int | None:
    """The index of the first deviation that covers ``site`` (None: none does)."""
    return next((i for i, d in enumerate(deviations) if d.covers(site)), None)


__all__ = [
    "CONDITIONS",
    "NONDETERMINISTIC",
    "OPERATION_KINDS",
    "Condition",
    "Deviation",
    "Scope",
    "Site",
    "covering",
    "golden_ids",
    "scope_problems",
]
