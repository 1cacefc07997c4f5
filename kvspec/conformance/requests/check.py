"""The request-level checks: what one workload's run is held to.

For every run (``check_run``):

1. **Protocol** — the whole stream goes through the router view in
   ``copies`` mode (one view per worker and dp_rank, per storage tier), with
   PARENT-ANCHOR checked on the device and host tiers: EVENT-ID,
   EVENT-SOURCE, PARENT-ANCHOR, REMOVE-COPY as a router sees them.
2. **Differential** (sequential runs only) — the reference model runs the
   same requests through the request driver (``reference.requests``) and
   each request's cached-token count and events must equal the
   implementation's exactly: ids, tiers, kinds, hashes, parents, order.
   Decode blocks are hashed over tokens nobody outside the engine sees (the
   Dynamo mocker appends hidden random tokens), so for them the model follows
   the implementation (``DecodeFollower``): when the driver needs the hash of
   a decode-filled block, it takes the implementation's next unclaimed device
   Stored of that request that names exactly one block, chained to the
   expected parent, and not a prompt block. Everything else about that Stored
   is still compared exactly: that there is one, where it stands in the
   stream relative to the Removed events, its parent (the previous block's
   hash, adopted or computed), its single block; and (check 3) its
   block_hash must chain from that parent and its tokens_hash.
   A divergence is attributed to a rule (``attribute``) by looking it up in
   the model's labels of the expected events (``reference.labels``). When the rule is one
   an implementation can depart from in a known way (``reference.vllm_pool.PoolVariant``:
   EVENT-ID's first id, STORE-COPY / REMOVE-COPY's per-copy events, G2-EVICT's
   order inside a host batch, the host write-through of device hits), the departure is recorded as a finding and
   the comparison starts again with the model following it, so the rest of
   the run is still compared exactly. Such a finding carries the named
   condition (``kvspec.spec.deviations.CONDITIONS``) of the departure the
   checker followed (``FOLLOWED``), which is what a manifest scopes its
   deviation by; a second departure under the same rule, which following
   does not explain, carries none.
3. **Hashes** — every stored block is checked against kvspec's own hashing:
   a prompt block's tokens_hash is the local hash of its tokens (HASH-LOCAL)
   and every block_hash is the sequence hash of its parent and its
   tokens_hash (HASH-SEQUENCE). In a sequential run, host blocks and blocks
   of a multi-block device Stored must be prompt blocks (decode blocks are
   stored one per step and never written to the host).

Findings carry the rule id, the workload and a readable report.
"""

from __future__ import annotations

import itertools
import struct
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import xxhash

from kvspec.conformance.block.diff import Divergence
from kvspec.conformance.requests.api import STALLED, ConcurrentRun, RequestOutcome
from kvspec.conformance.requests.workloads import Workload
from kvspec.reference.labels import EventLabel, StepLabels, default_label
from kvspec.reference.requests import PoolSetup, RequestResult, RequestSpec, make_driver, run_to_end
from kvspec.reference.router_view import RouterView
from kvspec.reference.vllm_pool import SPEC_VARIANT, PoolVariant, VllmPoolModel, removed_label
from kvspec.spec.deviations import Site
from kvspec.spec.hashing import block_hashes, sequence_hash
from kvspec.spec.profiles import VLLM
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Removed, Stored, event_to_json

R = RuleId

#: the rules this layer checks, and reports one by one
LAYER_RULES: tuple[RuleId, ...] = (
    R.EVENT_ID,
    R.EVENT_SOURCE,
    R.EVENT_ORDER,
    R.PARENT_ANCHOR,
    R.STORE_NEW_ONLY,
    R.STORE_TOKENS_HASH,
    R.STORE_COPY,
    R.REMOVE_COPY,
    R.USE_CAPACITY,
    R.VLLM_PREFIX_HIT,
    R.VLLM_FREE_ORDER,
    R.VLLM_LAZY_REMOVE,
    R.G2_EVICT,
    R.G2_STORE_ON_COMPLETE,
    R.HASH_LOCAL,
    R.HASH_SEQUENCE,
)

#: rules whose known departures the model can follow, and how
FOLLOWABLE = {R.EVENT_ID, R.STORE_COPY, R.REMOVE_COPY, R.G2_EVICT, R.G2_STORE_ON_COMPLETE, R.VLLM_PREFIX_HIT}

#: the named condition of each followed departure (kvspec.spec.deviations)
FOLLOWED = {
    R.STORE_COPY: "copy_store_unannounced",
    R.REMOVE_COPY: "copy_remove_unreported",
    R.G2_EVICT: "host_batch_hash_order",
    R.VLLM_PREFIX_HIT: "full_prompt_hit",
}


def is_full_prompt_hit(prompt_len: int, block_size: int, reported: int, due: int) -> bool:
    """Condition ``full_prompt_hit``: the whole block-aligned prompt reported
    cached where the capped hit is exactly one block short of it."""
    return prompt_len % block_size == 0 and reported == prompt_len and due == prompt_len - block_size


@dataclass(slots=True)
class Finding:
    """One broken rule in one run."""

    rule: RuleId
    summary: str
    workload: Workload
    request: int | None = None
    detail: str = ""
    #: the named conditions the checker established for this finding
    conditions: frozenset[str] = frozenset()
    #: the profile the run was checked against
    profile: str = VLLM.name

    def site(self) -> Site:
        """The finding as a deviation scope sees it (request level: no
        scenario, no operation kind)."""
        conds = set(self.conditions)
        if self.workload.setup.host_blocks is not None:
            conds.add("host_tier")
        if self.workload.concurrent:
            conds.add("concurrent_run")
        return Site(rule=self.rule, conditions=frozenset(conds), profile=self.profile)

    def size(self) -> int:
        return sum(len(r.prompt) + r.max_tokens for r in self.workload.requests)

    def report(self) -> str:
        where = f" (request {self.request})" if self.request is not None else ""
        text = f"[{self.rule}] {self.summary}{where}\n{self.workload.describe()}"
        if self.workload.note:
            text += f"\n  note: {self.workload.note}"
        if self.detail:
            text += "\n" + self.detail
        return text


@dataclass(slots=True)
class RunCheck:
    """Everything checking one run produced."""

    findings: list[Finding] = field(default_factory=list)
    exercised: Counter[RuleId] = field(default_factory=Counter)
    #: the model variant the differential ended on (what it had to follow)
    variant: PoolVariant = SPEC_VARIANT
    #: declared stalls followed by running the requests after them on a fresh engine (``replay.run_workload``)
    followed_stalls: int = 0

    def add(self, finding: Finding) -> None:
        """Keep the first finding per rule and conditions (a departure the
        checker followed does not hide a different one under its rule)."""
        if all((f.rule, f.conditions) != (finding.rule, finding.conditions) for f in self.findings):
            self.findings.append(finding)


# ------------------------------------------------------------ 1. protocol


def check_protocol(workload: Workload, events: Sequence[KvEvent], tiers: Sequence[str], out: RunCheck) -> None:
    ids_from_1 = _event_ids_from_1(workload, events)
    view = RouterView(
        mode="copies",
        strict=False,
        first_event_id=0,
        expect_dp_rank=workload.setup.manager.dp_rank,
        anchored_tiers=("device", "host_pinned"),
    )
    for i, ev in enumerate(events):
        if ev.storage_tier not in tiers:
            out.add(
                Finding(
                    R.EVENT_SOURCE,
                    f"event in tier {ev.storage_tier!r}, which the adapter does not declare",
                    workload,
                    detail=f"  event {i}: {ev.brief()}",
                )
            )
        for v in view.apply(ev):
            conds = {"event_ids_from_1"} if v.rule == R.EVENT_ID and ids_from_1 else set()
            if ev.storage_tier == "host_pinned":
                conds.add("host_tier_event")
                if v.rule == R.PARENT_ANCHOR and i > 0 and _evicts_parent(events[i - 1], ev):
                    conds.add("host_evicts_batch_parent")
            out.add(
                Finding(
                    v.rule,
                    f"router view: {v.message}",
                    workload,
                    detail=f"  stream index {i}: {ev.brief()}\n"
                    + _context(events, i)
                    + "".join(f"\n  {k}: {val}" for k, val in v.context.items()),
                    conditions=frozenset(conds),
                )
            )
    _exercise_stream(events, out)


def _evicts_parent(removed: KvEvent, stored: KvEvent) -> bool:
    """A host Removed naming the parent of the host Stored right after it."""
    return (
        removed.storage_tier == stored.storage_tier == "host_pinned"
        and isinstance(removed.data, Removed)
        and isinstance(stored.data, Stored)
        and stored.data.stored.parent_hash is not None
        and stored.data.stored.parent_hash in removed.data.removed.block_hashes
    )


def _event_ids_from_1(workload: Workload, events: Sequence[KvEvent]) -> bool:
    """Condition ``event_ids_from_1``: with a first id of 1 the stream has no
    EVENT-ID departure at all."""
    view = RouterView(
        mode="copies",
        strict=False,
        first_event_id=1,
        expect_dp_rank=workload.setup.manager.dp_rank,
        anchored_tiers=("device", "host_pinned"),
    )
    return bool(events) and not any(v.rule == R.EVENT_ID for ev in events for v in view.apply(ev))


def _context(events: Sequence[KvEvent], i: int, before: int = 6) -> str:
    lo = max(0, i - before)
    hi = min(i + 2, len(events))
    return "\n".join(f"  {'>' if j == i else ' '} {j:>4}: {events[j].brief()}" for j in range(lo, hi))


def _exercise_stream(events: Sequence[KvEvent], out: RunCheck) -> None:
    for ev in events:
        out.exercised[R.EVENT_ID] += 1
        out.exercised[R.EVENT_SOURCE] += 1
        if isinstance(ev.data, Stored):
            out.exercised[R.HASH_SEQUENCE] += len(ev.data.stored.blocks)
            if ev.data.stored.parent_hash is not None:
                out.exercised[R.PARENT_ANCHOR] += 1
            if ev.storage_tier == "host_pinned":
                out.exercised[R.G2_STORE_ON_COMPLETE] += 1
        elif isinstance(ev.data, Removed):
            if ev.storage_tier == "host_pinned":
                out.exercised[R.G2_EVICT] += 1
            else:
                out.exercised[R.REMOVE_COPY] += 1


# -------------------------------------------------------------- 3. hashes


def prompt_blocks(workload: Workload) -> dict[int, tuple[int, int | None]]:
    """Every prompt block of the workload: sequence hash -> (local hash, parent)."""
    bs = workload.setup.manager.block_size
    known: dict[int, tuple[int, int | None]] = {}
    for r in workload.requests:
        parent = None
        for seq, local in block_hashes(r.prompt, bs):
            known[seq] = (local, parent)
            parent = seq
    return known


def check_hashes(workload: Workload, events: Sequence[KvEvent], out: RunCheck, *, sequential: bool) -> None:
    known = prompt_blocks(workload)
    for i, ev in enumerate(events):
        if not isinstance(ev.data, Stored):
            continue
        data = ev.data.stored
        prev = data.parent_hash
        # condition decode_tail_in_batch: the blocks no prompt has are the batch's tail
        unknown = [known.get(b.block_hash) is None for b in data.blocks]
        tail = frozenset({"decode_tail_in_batch"}) if True in unknown and all(unknown[unknown.index(True) :]) else None
        for b in data.blocks:
            k = known.get(b.block_hash)
            if k is not None:
                out.exercised[R.HASH_LOCAL] += 1
                if k[0] != b.tokens_hash:
                    out.add(
                        Finding(
                            R.HASH_LOCAL,
                            f"block {b.block_hash}: tokens_hash {b.tokens_hash} is not the "
                            f"local hash {k[0]} of its prompt tokens",
                            workload,
                            detail=f"  stream index {i}: {ev.brief()}",
                        )
                    )
            elif sequential and (ev.storage_tier == "host_pinned" or len(data.blocks) > 1):
                out.add(
                    Finding(
                        R.HASH_LOCAL,
                        f"block {b.block_hash} is no block of any prompt (by kvspec's hashing) "
                        f"but is stored {'on the host' if ev.storage_tier == 'host_pinned' else 'with others'}",
                        workload,
                        detail=f"  stream index {i}: {ev.brief()}",
                        conditions=tail if tail is not None and ev.storage_tier != "host_pinned" else frozenset(),
                    )
                )
            if sequence_hash(prev, b.tokens_hash) != b.block_hash:
                out.add(
                    Finding(
                        R.HASH_SEQUENCE,
                        f"block_hash {b.block_hash} is not the sequence hash of parent "
                        f"{prev} and tokens_hash {b.tokens_hash} ({sequence_hash(prev, b.tokens_hash)})",
                        workload,
                        detail=f"  stream index {i}: {ev.brief()}",
                    )
                )
            prev = b.block_hash


def last_token_over_pool(setup: PoolSetup, req: RequestSpec) -> bool:
    """Condition ``last_token_over_pool``: prompt + max_tokens is one token
    more than the pool holds (the request fits only because its last output
    token is never cached)."""
    return len(req.prompt) + req.max_tokens > setup.pool_tokens


def _short_conditions(workload: Workload, req: RequestSpec, o: RequestOutcome) -> frozenset[str]:
    """The named conditions of a request that did not generate max_tokens."""
    if o.finish == STALLED:
        return frozenset({"request_stalled"})
    if last_token_over_pool(workload.setup, req):
        return frozenset({"last_token_over_pool"})
    return frozenset()


def check_cached_bounds(workload: Workload, outcomes: Sequence[RequestOutcome], out: RunCheck) -> None:
    """Whole blocks only, at most num_tokens - 1 tokens (any run)."""
    bs = workload.setup.manager.block_size
    for i, (r, o) in enumerate(zip(workload.requests, outcomes, strict=True)):
        out.exercised[R.USE_CAPACITY] += 1
        if o.finish != "length":
            out.add(
                Finding(
                    R.USE_CAPACITY,
                    f"a request that fits the pool ended with {o.finish!r} instead of generating max_tokens",
                    workload,
                    request=i,
                    conditions=_short_conditions(workload, r, o),
                )
            )
        if o.cached_tokens is None:
            continue
        out.exercised[R.VLLM_PREFIX_HIT] += 1
        limit = (len(r.prompt) - 1) // bs * bs
        if o.cached_tokens % bs or o.cached_tokens > limit:
            # condition full_prompt_hit: the whole block-aligned prompt, one block over the cap
            full = o.cached_tokens == len(r.prompt) and len(r.prompt) % bs == 0
            out.add(
                Finding(
                    R.VLLM_PREFIX_HIT,
                    f"{o.cached_tokens} cached tokens: not whole blocks of {bs} within "
                    f"num_tokens - 1 = {len(r.prompt) - 1} (at most {limit})",
                    workload,
                    request=i,
                    conditions=frozenset({"full_prompt_hit"}) if full else frozenset(),
                )
            )


# -------------------------------------------------------- 2. differential


class DecodeFollower:
    """The model's ``DecodeHashes`` during a comparison: adopt the
    implementation's hash of each decode-filled block (see module docstring)."""

    def __init__(self, outcomes: Sequence[RequestOutcome], prompt_hashes: set[int]) -> None:
        self.outcomes = outcomes
        self.prompt_hashes = prompt_hashes
        self.claimed: set[tuple[int, int]] = set()
        self.adopted: list[tuple[int, int, int]] = []  # (request, block index, hash)
        self.missing: list[tuple[int, int]] = []

    def __call__(self, request: int, block: int, parent: int | None, known: Sequence[int]) -> tuple[int, int]:
        events = self.outcomes[request].events if request < len(self.outcomes) else []
        for j, ev in enumerate(events):
            if (request, j) in self.claimed or ev.storage_tier != "device" or not isinstance(ev.data, Stored):
                continue
            d = ev.data.stored
            if d.parent_hash != parent or len(d.blocks) != 1 or d.blocks[0].block_hash in self.prompt_hashes:
                continue
            self.claimed.add((request, j))
            self.adopted.append((request, block, d.blocks[0].block_hash))
            return d.blocks[0].block_hash, d.blocks[0].tokens_hash
        # nothing to follow: a placeholder no implementation can have published
        self.missing.append((request, block))
        local = xxhash.xxh3_64_intdigest(struct.pack("<QQQ", 0x6B76737065630A, request, block))
        return sequence_hash(parent, local), local


def _strip(ev: KvEvent) -> dict[str, Any]:
    out = event_to_json(ev)
    out.pop("event_id", None)
    out.pop("block_token_ids", None)
    return out


def request_labels(expected: Sequence[KvEvent], event_labels: Mapping[int, EventLabel]) -> StepLabels:
    """The model's labels of one request's expected events (by event id).
    An event the model did not label gets its tier and kind's default, a
    device Removed the pool's (VLLM-LAZY-REMOVE); an unexpected device
    Removed breaks VLLM-LAZY-REMOVE (the pool removes only what it reuses)."""
    out = StepLabels(silent={("device", "removed"): R.VLLM_LAZY_REMOVE})
    for ev in expected:
        lab = event_labels.get(ev.event_id)
        if lab is None:
            device_removed = ev.storage_tier == "device" and ev.kind == "removed"
            lab = removed_label(ev.hashes(), set()) if device_removed else default_label(ev.storage_tier, ev.kind)
        out.events.append(lab)
    return out


def attribute(
    expected: Sequence[KvEvent], actual: Sequence[KvEvent], event_labels: Mapping[int, EventLabel]
) -> tuple[RuleId, int, str] | None:
    """The rule a difference between one request's expected and actual
    events breaks, the index of the first difference, and what differs.
    The rule is looked up in the model's labels of the expected events
    (``event_labels``, by event id: ``VllmPoolModel.event_labels``), which
    also name the hashes an event names as one physical copy among several."""
    labels = request_labels(expected, event_labels)
    exp_s = [_strip(ev) for ev in expected]
    act_s = [_strip(ev) for ev in actual]
    if exp_s == act_s:
        for j, (want, got) in enumerate(zip(expected, actual, strict=True)):
            if want.event_id != got.event_id:
                return R.EVENT_ID, j, f"event id {got.event_id} where {want.event_id} is due"
        return None
    j = next(
        k for k in range(max(len(exp_s), len(act_s))) if k >= len(exp_s) or k >= len(act_s) or exp_s[k] != act_s[k]
    )
    e: KvEvent | None = expected[j] if j < len(expected) else None
    a: KvEvent | None = actual[j] if j < len(actual) else None
    if e is not None and a is not None:
        note = labels.events[j].copies
        if note and set(e.hashes()) <= note:  # an announcement of one copy among several: missing?
            for k in range(1, 4):
                if j + k < len(expected) and _loose(expected[j + k]) == _loose(a):
                    return labels.events[j].published, j, f"missing {e.brief()}"
        if (
            j + 1 < len(expected)
            and j + 1 < len(actual)
            and _loose(expected[j]) == _loose(actual[j + 1])
            and _loose(expected[j + 1]) == _loose(a)
        ):
            return R.EVENT_ORDER, j, f"{a.brief()} comes before {e.brief()}"
        for k in range(1, 4):  # a few events missing from the actual stream, or extra in it
            if j + k < len(expected) and _loose(expected[j + k]) == _loose(a):
                a = None
                break
            if j + k < len(actual) and _loose(actual[j + k]) == _loose(e):
                e = None
                break
        if e is not None and a is not None and (e.kind != a.kind or e.storage_tier != a.storage_tier):
            return R.EVENT_ORDER, j, f"{a.brief()} where {e.brief()} is due"
    if e is None:
        assert a is not None
        return labels.unexpected(a), j, f"unexpected {a.brief()}"
    lab = labels.events[j]
    if a is None:
        return lab.published, j, f"missing {e.brief()}"
    if e.dp_rank != a.dp_rank:
        return R.EVENT_SOURCE, j, f"dp_rank {a.dp_rank} where {e.dp_rank} is due"
    host = e.storage_tier == "host_pinned"
    if isinstance(e.data, Stored) and isinstance(a.data, Stored):
        ed, ad = e.data.stored, a.data.stored
        eh, ah = [b.block_hash for b in ed.blocks], [b.block_hash for b in ad.blocks]
        if eh != ah:
            dropped = list((Counter(eh) - Counter(ah)).elements())
            if dropped and all(h in lab.copies for h in dropped):
                return R.STORE_COPY, j, f"{a.brief()} where {e.brief()} is due: copies {dropped} not announced"
            return lab.blocks, j, f"{a.brief()} where {e.brief()} is due"
        if ed.parent_hash != ad.parent_hash:
            return lab.parent or lab.blocks, j, f"parent {ad.parent_hash} where {ed.parent_hash} is due ({e.brief()})"
        if [b.tokens_hash for b in ed.blocks] != [b.tokens_hash for b in ad.blocks]:
            return (
                lab.tokens or lab.blocks,
                j,
                f"tokens hashes {[b.tokens_hash for b in ad.blocks]} where "
                f"{[b.tokens_hash for b in ed.blocks]} are due",
            )
        return (
            (lab.blocks if host else R.EVENT_SOURCE),
            j,
            f"start_position {ad.start_position} where {ed.start_position} is due",
        )
    if isinstance(e.data, Removed) and isinstance(a.data, Removed):
        eh, ah = e.data.removed.block_hashes, a.data.removed.block_hashes
        if host:
            return lab.blocks, j, f"host Removed {ah} where {eh} is due"
        if sorted(eh) == sorted(ah):
            return lab.choice or lab.blocks, j, f"evicted in the order {ah} where {eh} is due"
        unreported = list((Counter(eh) - Counter(ah)).elements())
        if unreported and all(h in lab.copies for h in unreported):
            return R.REMOVE_COPY, j, f"Removed {ah} where {eh} is due: evicted copies {unreported} not reported"
        return lab.blocks, j, f"evicted {ah} where {eh} is due"
    return lab.blocks, j, f"{a.brief()} where {e.brief()} is due"


def _loose(ev: KvEvent) -> tuple[Any, ...]:
    """What identifies an event when looking for a missing or an extra one:
    tier, kind, the set of hashes and the parent (not ids, not order)."""
    parent = ev.data.stored.parent_hash if isinstance(ev.data, Stored) else None
    return (ev.storage_tier, ev.kind, tuple(sorted(ev.hashes())), parent)


def _show(events: Sequence[KvEvent], mark: int | None = None) -> str:
    if not events:
        return "      (none)"
    return "\n".join(f"    {'>' if k == mark else ' '} {k:>3}: {ev.brief()}" for k, ev in enumerate(events))


def compare_sequential(
    workload: Workload, outcomes: Sequence[RequestOutcome], variant: PoolVariant, *, stop: bool = True
) -> tuple[Divergence | None, list[RequestResult], DecodeFollower]:
    """Run the model request by request (following decode hashes) and find
    the first divergence; the model runs only as far as the comparison
    (to the end with ``stop=False``, which reports no divergence)."""
    follower = DecodeFollower(outcomes, set(prompt_blocks(workload)))
    driver = make_driver(workload.setup, follower, variant, check_contracts=True)
    model: VllmPoolModel = driver.model
    expected: list[RequestResult] = []
    for i, (req, act) in enumerate(zip(workload.requests, outcomes, strict=True)):
        workload.setup.check_fits(i, req)
        if act.finish == STALLED:
            break  # a USE-CAPACITY finding of its own; the engine holds the request: nothing after it compares
        if act.finish != "length" and last_token_over_pool(workload.setup, req):
            # the engine refused or shortened it (a USE-CAPACITY finding of its own,
            # check_cached_bounds): the model runs what the engine ran
            if act.output_tokens == 0:
                expected.append(RequestResult(cached_tokens=act.cached_tokens or 0))
                continue
            req = req.model_copy(update={"max_tokens": min(act.output_tokens, req.max_tokens)})
        exp = run_to_end(driver.steps(i, req), f"request {i}")
        expected.append(exp)
        if not stop:
            continue
        if act.cached_tokens is not None and act.cached_tokens != exp.cached_tokens:
            return (
                Divergence(
                    exp.cached_rule,
                    f"{act.cached_tokens} cached tokens where {exp.cached_tokens} are due",
                    exp.cached_tokens,
                    act.cached_tokens,
                    request=i,
                    detail=_request_detail(exp.events, act.events, None),
                ),
                expected,
                follower,
            )
        found = attribute(exp.events, act.events, model.event_labels)
        if found is not None:
            rule, j, what = found
            div = Divergence(
                rule,
                what,
                exp.events[j].brief() if j < len(exp.events) else "(none)",
                act.events[j].brief() if j < len(act.events) else "(none)",
                request=i,
                detail=_request_detail(exp.events, act.events, j),
            )
            return div, expected, follower
    return None, expected, follower


def _request_detail(expected: Sequence[KvEvent], actual: Sequence[KvEvent], j: int | None) -> str:
    return f"  expected (reference model):\n{_show(expected, j)}\n  actual (implementation):\n{_show(actual, j)}"


def _follow(
    variant: PoolVariant,
    div: Divergence,
    workload: Workload,
    outcomes: Sequence[RequestOutcome],
    expected: Sequence[RequestResult],
) -> PoolVariant | None:
    rule = div.rule
    if rule == R.VLLM_PREFIX_HIT and not variant.full_prompt_hit and div.request is not None:
        i = div.request
        reported, due = outcomes[i].cached_tokens, div.expected
        bs = workload.setup.manager.block_size
        prompt_len = len(workload.requests[i].prompt)
        if isinstance(reported, int) and isinstance(due, int) and is_full_prompt_hit(prompt_len, bs, reported, due):
            return replace(variant, full_prompt_hit=True)
    if rule == R.EVENT_ID:
        first = next((o.events[0].event_id for o in outcomes if o.events), None)
        if first is not None and first != variant.first_event_id:
            return replace(variant, first_event_id=first)
    if rule == R.STORE_COPY and variant.store_copies:
        return replace(variant, store_copies=False)
    if rule == R.REMOVE_COPY and variant.remove_copies:
        return replace(variant, remove_copies=False)
    if _host_write_missing(div, expected, outcomes) and variant.host_writes_hits:
        return replace(variant, host_writes_hits=False)
    if rule == R.G2_EVICT and variant.host_order == "leaf_first":
        return replace(variant, host_order="hash")
    return None


def _host_write_missing(div: Divergence, expected: Sequence[RequestResult], outcomes: Sequence[RequestOutcome]) -> bool:
    """Condition ``host_write_missing`` (``kvspec.spec.deviations``): the
    expected host events from the failing point on name only blocks the
    implementation published no host event about in that request."""
    i = div.request
    if div.rule not in (R.G2_EVICT, R.G2_STORE_ON_COMPLETE) or i is None or i >= len(expected):
        return False
    exp_host = [e for e in expected[i].events if e.storage_tier == "host_pinned"]
    act_host = {h for e in outcomes[i].events if e.storage_tier == "host_pinned" for h in e.hashes()}
    missing = [e for e in exp_host if not set(e.hashes()) & act_host]
    return bool(missing) and any(isinstance(e.data, Stored) for e in missing)


def check_sequential(workload: Workload, outcomes: Sequence[RequestOutcome], out: RunCheck) -> None:
    variant = SPEC_VARIANT
    for _ in range(len(FOLLOWABLE) + 1):
        div, expected, follower = compare_sequential(workload, outcomes, variant)
        if div is None:
            break
        detail = div.detail
        if variant != SPEC_VARIANT:
            detail += f"\n  (compared with the model following the departures already found: {variant})"
        if follower.missing:
            detail += f"\n  decode blocks with no matching implementation Stored: {follower.missing}"
        nxt = _follow(variant, div, workload, outcomes, expected)
        conds: frozenset[str] = frozenset()
        if nxt is not None:
            name = FOLLOWED.get(div.rule)
            if div.rule == R.EVENT_ID and nxt.first_event_id == 1:
                name = "event_ids_from_1"
            if nxt.host_writes_hits != variant.host_writes_hits:
                name = "host_write_missing"
            conds = frozenset({name}) if name else frozenset()
        elif div.rule == R.G2_EVICT and div.request is not None and div.request < len(outcomes):
            evs = outcomes[div.request].events
            if any(_evicts_parent(a, b) for a, b in itertools.pairwise(evs)):
                conds = frozenset({"host_evicts_batch_parent"})
        out.add(Finding(div.rule, div.what, workload, request=div.request, detail=detail, conditions=conds))
        if nxt is None:
            break
        variant = nxt
    out.variant = variant
    if variant != SPEC_VARIANT:  # count what the spec's own stream exercises
        _, expected, _ = compare_sequential(
            workload,
            [o.model_copy(update={"cached_tokens": None, "events": []}) for o in outcomes],
            SPEC_VARIANT,
            stop=False,
        )
    _exercise_expected(expected, out)


def _exercise_expected(expected: Sequence[RequestResult], out: RunCheck) -> None:
    seen: Counter[int] = Counter()
    for r in expected:
        kinds = {(e.storage_tier, e.kind) for e in r.events}
        if ("device", "removed") in kinds:
            out.exercised[R.VLLM_LAZY_REMOVE] += 1
            out.exercised[R.VLLM_FREE_ORDER] += 1
            if ("device", "stored") in kinds:
                out.exercised[R.EVENT_ORDER] += 1
        for e in r.events:
            if isinstance(e.data, Stored) and e.storage_tier == "device":
                out.exercised[R.STORE_NEW_ONLY] += 1
                out.exercised[R.STORE_TOKENS_HASH] += 1
                for b in e.data.stored.blocks:
                    if seen[b.block_hash] > 0:
                        out.exercised[R.STORE_COPY] += 1
                    seen[b.block_hash] += 1
            elif isinstance(e.data, Removed) and e.storage_tier == "device":
                for h in e.data.removed.block_hashes:
                    seen[h] -= 1


# ---------------------------------------------------------------- entry


def check_run(
    workload: Workload,
    result: Sequence[RequestOutcome] | ConcurrentRun,
    tiers: Sequence[str] = ("device", "host_pinned"),
) -> RunCheck:
    """All checks of one run (see the module docstring)."""
    out = RunCheck()
    if isinstance(result, ConcurrentRun):
        events = list(result.events)
        outcomes = list(result.outcomes)
    else:
        outcomes = list(result)
        events = [e for o in outcomes for e in o.events]
    if len(outcomes) != len(workload.requests):
        raise ValueError(f"{len(outcomes)} outcomes for {len(workload.requests)} requests")
    check_protocol(workload, events, tiers, out)
    check_hashes(workload, events, out, sequential=not workload.concurrent)
    check_cached_bounds(workload, outcomes, out)
    if not workload.concurrent:
        check_sequential(workload, outcomes, out)
    return out
