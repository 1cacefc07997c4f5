"""The offload tier of the reference model (G1Model with an OffloadConfig).

Why these tests: the model's offload code decides what every offload-capable
implementation is checked against, and its accounting (quarantined slots,
reserved swap-in slots, transfer deadlines, two event tiers) is exactly the
kind that drifts silently. So the state machine below keeps its own ledger,
computed from what an outside observer sees (results and events) plus the
timing formula of the spec (one link per direction, FIFO, ``transfer_ms``
per block), and checks the model's counters, deadlines and tiers against it
after every operation:

- quarantined slots equal the offloads the ledger still has pending, and a
  Use or SwapIn never allocates more slots than were free before it (with an
  offload tier an eviction never yields a slot): QUARANTINE-HOLD;
- a tick releases exactly the slots whose transfers are due, once:
  QUARANTINE-RELEASE;
- active + inactive + free = capacity, and active = the blocks the requests
  hold + quarantined + reserved (COUNTERS, INV-CONSERVE);
- G2 never holds more than its capacity (G2-EVICT);
- a router view fed the model's events holds, per tier, exactly what the
  model announced (device) and holds in G2 (host pinned), with no violation,
  timing included (INV-ROUTER-MATCH, G2-STORE-ON-COMPLETE);
- a tick backwards changes nothing at all (TIME-MONOTONIC, by fingerprint),
  and the earliest deadline is the minimum of the ledger's pending ones.

The golden offload scenarios are also run against the model here with the
expectations the suite's runner does not check (G2 contents, exact active
and inactive blocks), and each offload mutant of the catalogue must fail at
least one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvspec.reference import G1Model, RouterView
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.rules import RuleId
from kvspec.spec.scenario import SCENARIO_DIR, Scenario, all_scenarios
from kvspec.spec.wire import (
    BlockRef,
    Deref,
    FullBlock,
    KvEvent,
    Operation,
    PartialBlock,
    Plh,
    SwapIn,
    SwapInBlock,
    Tick,
    Use,
)

BS = 4
#: the block universe: node -> parent (None: a root); node k has sequence hash
#: k, local hash 100 + k and tokens [k] * BS
PARENT: dict[int, int | None] = {1: None, 2: 1, 3: 2, 4: 3, 5: 1, 6: 5, 7: None, 8: 7, 9: 8, 10: 2}


def path(node: int) -> list[int]:
    out: list[int] = []
    cur: int | None = node
    while cur is not None:
        out.append(cur)
        cur = PARENT[cur]
    return out[::-1]


def plh(node: int) -> Plh:
    return Plh(hash=node, parent=PARENT[node], position=len(path(node)) - 1)


@dataclass
class Request:
    fulls: list[int] = field(default_factory=list)
    partial: str | None = None
    #: the deadline of the swap-in anchored to this request's blocks: the
    #: scheduler keeps the request (and so the anchor) until it completes
    waits_until: float | None = None


@dataclass
class Ledger:
    """Transfers as an observer derives them from results and events."""

    transfer_ms: float
    now: float = 0.0
    link: dict[str, float] = field(default_factory=lambda: {"offload": 0.0, "onboard": 0.0})
    g2_capacity: int = 1
    #: (deadline, kind, blocks moved, the swap-in's parent), in the order queued
    pending: list[tuple[float, str, list[int], int | None]] = field(default_factory=list)
    #: G2's blocks, least recently used first
    g2: list[int] = field(default_factory=list)

    def queue(self, kind: str, blocks: list[int], parent: int | None = None) -> float:
        start = max(self.now, self.link[kind])
        deadline = start + self.transfer_ms * len(blocks)
        self.link[kind] = deadline
        self.pending.append((deadline, kind, blocks, parent))
        return deadline

    def offloads(self) -> int:
        return sum(1 for _, k, _, _ in self.pending if k == "offload")

    def reserved(self) -> int:
        return sum(len(b) for _, k, b, _ in self.pending if k == "onboard")

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            self.g2.remove(b)
            self.g2.append(b)

    def advance(self, now: float) -> tuple[int, list[tuple[str, int]]]:
        """Complete what is due by ``now`` (earliest deadline first, queue
        order on a tie); returns how many transfers completed and the
        host-pinned events they must publish, as (kind, block)."""
        self.now = now
        due = sorted((p for p in self.pending if p[0] <= now), key=lambda p: p[0])
        self.pending = [p for p in self.pending if p[0] > now]
        host: list[tuple[str, int]] = []
        for _, kind, blocks, _ in due:
            if kind != "offload":
                continue
            (b,) = blocks
            if b in self.g2:
                self.touch([b])
                continue
            if len(self.g2) >= self.g2_capacity:
                host.append(("removed", self.g2.pop(0)))
            self.g2.append(b)
            host.append(("stored", b))
        return len(due), host


def device_removed(events: list[KvEvent]) -> list[int]:
    return [h for e in events if e.kind == "removed" and e.storage_tier == "device" for h in e.hashes()]


class OffloadModelMachine(RuleBasedStateMachine):
    """Requests over a small block tree, ticks and swap-ins, against a ledger."""

    def __init__(self) -> None:
        super().__init__()
        self.model: G1Model | None = None

    @initialize(
        capacity=st.integers(2, 8),
        g2=st.sampled_from([1, 1, 2, 2, 3, 4]),
        size=st.sampled_from([None, 0, 1_000_000, 3_000_000]),
        bandwidth=st.sampled_from([1.0, 2.0]),
        policy=st.sampled_from(["lineage", "lru", "multi_lru"]),
    )
    def setup(self, capacity: int, g2: int, size: int | None, bandwidth: float, policy: str) -> None:
        off = OffloadConfig.legacy(num_g2_blocks=g2, block_size_bytes=size, bandwidth_gbps=bandwidth)
        self.config = ManagerConfig(capacity=capacity, block_size=BS, eviction=policy, offload=off)  # type: ignore[arg-type]
        self.model = G1Model(self.config)
        self.ledger = Ledger(off.transfer_ms(), g2_capacity=g2)
        self.view = RouterView(expect_dp_rank=0)
        self.view.enable_timing(off.transfer_ms())
        self.requests: list[Request] = []
        self.uuids = 0

    @property
    def m(self) -> G1Model:
        assert self.model is not None
        return self.model

    def apply(self, op: Operation) -> Any:
        before = self.m.counters()
        step = self.m.apply(op)
        self.violations = self.view.apply_batch(step.events, stored_first=True)
        assert not self.violations, "\n".join(map(str, self.violations))
        if not isinstance(op, Tick):
            for b in device_removed(step.events):
                self.ledger.queue("offload", [b])
        return before, step

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: self.model is not None and len(self.requests) < 3)
    @rule(
        node=st.sampled_from(sorted(PARENT)),
        partial=st.booleans(),
        tokens=st.booleans(),
        wait=st.booleans(),
        race=st.booleans(),
    )
    def use(self, node: int, partial: bool, tokens: bool, wait: bool, race: bool) -> None:
        """A request's Use of a path from the root; with ``wait``, a Use
        blocked on offload waits for the transfer (a tick to the earliest
        deadline) and the request continues from where it stopped. With
        ``race``, the path ends at a block a pending swap-in is bringing
        back (another request computed it meanwhile: SWAPIN-SKIP-PRESENT)."""
        inflight = [b for _, k, blocks, _ in self.ledger.pending if k == "onboard" for b in blocks]
        if race and inflight:
            node = inflight[node % len(inflight)]
        p = path(node)
        req, status = self._place(p, partial, tokens)
        if wait and status == "blocked_on_offload":
            self._tick(self.m.earliest_deadline())  # type: ignore[arg-type]
            self._place(p, partial, tokens, req)

    def _place(self, fulls: list[int], partial: bool, tokens: bool, req: Request | None = None) -> tuple[Request, str]:
        """A Use of what ``req`` does not hold yet of ``fulls`` (a path from
        the root), anchored to its last block, and maybe a partial block;
        the request holds what was placed."""
        held = len(req.fulls) if req is not None else 0
        todo = fulls[held:]
        blocks: list[BlockRef] = [FullBlock(full=s) for s in todo]
        uuid = None
        if partial and (req is None or req.partial is None):
            self.uuids += 1
            uuid = f"p{self.uuids}"
            blocks.append(PartialBlock(partial=uuid))
        op = Use(
            blocks=blocks,
            local_hashes=[100 + s for s in todo],
            plhs=[plh(s) for s in todo],
            token_ids=[[s] * BS for s in todo] if tokens else None,
            parent=FullBlock(full=fulls[held - 1]) if held else None,
        )
        registered = self.m.registered()
        before, step = self.apply(op)
        placed = step.result.value
        assert step.result.status in ("ok", "capacity", "blocked_on_offload")
        assert (placed < len(blocks)) == (step.result.status != "ok")
        new_slots = sum(1 for s in todo[:placed] if s not in registered) + (1 if uuid and placed == len(blocks) else 0)
        # QUARANTINE-HOLD: only free slots can be allocated; an eviction blocks
        assert new_slots <= before.free_blocks, (new_slots, before)
        if device_removed(step.events):
            assert step.result.status == "blocked_on_offload"
        if req is None:
            req = Request()
            self.requests.append(req)
        req.fulls.extend(todo[:placed])
        if uuid and placed == len(blocks):
            req.partial = uuid
        return req, step.result.status

    def finishable(self) -> list[Request]:
        # ASSUME-SWAPIN-PARENT-HELD: a request anchoring a swap-in is held until the onboard has
        # completed, not merely until its deadline passed (an instant one completes at the next tick)
        anchoring = {parent for _, kind, _, parent in self.ledger.pending if kind == "onboard"}
        return [r for r in self.requests if r.waits_until is None or not anchoring & set(r.fulls)]

    @precondition(lambda self: self.model is not None and bool(self.finishable()))
    @rule(i=st.integers(0, 63), reverse=st.booleans())
    def finish(self, i: int, reverse: bool) -> None:
        done = self.finishable()
        req = done[i % len(done)]
        self.requests.remove(req)
        refs: list[BlockRef] = [FullBlock(full=s) for s in req.fulls]
        if req.partial is not None:
            refs.append(PartialBlock(partial=req.partial))
        if reverse:
            refs.reverse()
        if refs:
            _, step = self.apply(Deref(blocks=refs))
            assert step.events == []

    @precondition(lambda self: self.model is not None and self.m.earliest_deadline() is not None)
    @rule()
    def tick_to_next_deadline(self) -> None:
        self._tick(self.m.earliest_deadline())  # type: ignore[arg-type]

    @precondition(lambda self: self.model is not None)
    @rule(delta=st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 2.5, 7.0]))
    def tick_forward(self, delta: float) -> None:
        self._tick(self.ledger.now + delta)

    @precondition(lambda self: self.model is not None and self.ledger.now > 0)
    @rule(back=st.sampled_from([0.1, 0.5, 1.0, 100.0]))
    def tick_backward(self, back: float) -> None:
        """TIME-MONOTONIC: nothing changes at all."""
        fp = self.m.fingerprint()
        _, step = self.apply(Tick(now_ms=max(0.0, self.ledger.now - back)))
        assert step.result.value == 0 and step.events == []
        assert self.m.fingerprint() == fp

    def _tick(self, now: float) -> None:
        before_q = self.ledger.offloads()
        # SWAPIN-ANCHOR: each swapped-in block's Stored group anchors to the
        # block before it in the swap-in (the swap-in's parent for the first)
        anchors: dict[int, int | None] = {}
        for deadline, kind, blocks, parent in self.ledger.pending:
            if kind == "onboard" and deadline <= now:
                prev = parent
                for b in blocks:
                    anchors[b] = prev
                    prev = b
        self.view.expected_parents.update(anchors)
        n_due, host_expected = self.ledger.advance(now)
        released = before_q - self.ledger.offloads()
        self.view.observe_time(now)
        before, step = self.apply(Tick(now_ms=now))
        assert step.result.value == n_due
        # QUARANTINE-RELEASE: exactly the due transfers give their slot back
        assert self.m.counters().quarantined_blocks == before.quarantined_blocks - released
        assert self.m.counters().free_blocks >= before.free_blocks + released
        # G2-STORE-ON-COMPLETE, G2-EVICT (LRU): the host-pinned events, in order
        host = [(e.kind, h) for e in step.events if e.storage_tier == "host_pinned" for h in e.hashes()]
        assert host == host_expected
        for b in anchors:
            del self.view.expected_parents[b]

    @precondition(
        lambda self: self.model is not None and len(self.requests) < 4 and bool(self.m.registered("host_pinned"))
    )
    @rule(
        pick=st.integers(0, 63),
        node=st.sampled_from(sorted(PARENT)),
        shift=st.sampled_from([0, 0, 1, -1]),
        from_g2=st.sampled_from([True, True, False]),
    )
    def swap_in(self, pick: int, node: int, shift: int, from_g2: bool) -> None:
        """Swap in a suffix of a path, anchored to the block before it: from a
        block G2 holds, or from what G1 lacks of the path (as a scheduler
        does), sometimes one block earlier or later."""
        if from_g2:
            g2 = sorted(self.m.registered("host_pinned"))
            b = g2[pick % len(g2)]
            below = [n for n in sorted(PARENT) if b in path(n)]
            p = path(below[(pick // 7) % len(below)])
            first = p.index(b)
        else:
            p = path(node)
            g1 = self.m.registered()
            first = next((i for i, s in enumerate(p) if s not in g1), len(p) - 1)
        start = min(max(0, first + shift), len(p) - 1)
        anchor_req = None
        if start:  # the scheduler pins the prefix in G1 first (a request holds it)
            anchor_req, _ = self._place(p[:start], False, False)
            if len(anchor_req.fulls) < start:
                return
        op = SwapIn(
            blocks=[SwapInBlock(seq_hash=s, plh=plh(s)) for s in p[start:]], parent=p[start - 1] if start else None
        )
        in_g2 = set(self.m.registered("host_pinned"))
        hits = 0
        for s in p[start:]:
            if s not in in_g2:
                break
            hits += 1
        fp = self.m.fingerprint()
        before, step = self.apply(op)
        res = step.result
        if hits == 0:
            assert (res.value, res.status, step.events) == (0, "no_hits", [])
            assert self.m.fingerprint() == fp
        elif res.status == "scheduled":
            assert res.value == hits <= before.free_blocks  # SWAPIN-RESERVE: free slots only
            prefix = p[start : start + hits]
            deadline = self.ledger.queue("onboard", prefix, op.parent)
            if anchor_req is not None:
                anchor_req.waits_until = deadline
            self.ledger.touch(prefix)  # copying a block back is a use of it in G2
        else:
            assert res.value == 0 and res.status in ("blocked_on_offload", "no_hits")
            assert (res.status == "blocked_on_offload") == bool(device_removed(step.events))

    # ------------------------------------------------------------- invariants
    @invariant()
    def ledger_matches(self) -> None:
        if self.model is None:
            return
        c = self.m.counters()
        cap = self.config.capacity
        assert c.active_blocks + c.inactive_blocks + c.free_blocks == cap
        assert c.quarantined_blocks == self.ledger.offloads()
        held_full = {s for r in self.requests for s in r.fulls}
        partials = sum(1 for r in self.requests if r.partial is not None)
        assert c.active_blocks == len(held_full) + partials + c.quarantined_blocks + self.ledger.reserved()
        assert c.active_refs == sum(len(r.fulls) for r in self.requests) + partials
        deadlines = [d for d, _, _, _ in self.ledger.pending]
        assert set(self.ledger.g2) == self.m.registered("host_pinned")
        assert self.m.earliest_deadline() == (min(deadlines) if deadlines else None)

    @invariant()
    def tiers_match_router_view(self) -> None:
        if self.model is None:
            return
        off = self.config.offload
        assert off is not None
        g2 = self.m.registered("host_pinned")
        assert len(g2) <= off.num_g2_blocks
        assert self.view.stored("device") == self.m.announced("device")
        assert self.view.stored("host_pinned") == g2


TestOffloadModel = OffloadModelMachine.TestCase
TestOffloadModel.settings = settings(max_examples=80, stateful_step_count=60, deadline=None)


# ------------------------------------------------------------- golden scenarios
OFFLOAD_SCENARIOS = [(p, s) for p, s in all_scenarios(SCENARIO_DIR / "offload")]


def _run_on_model(model: Any, s: Scenario) -> str | None:
    """Run ``s`` on ``model`` and return the first mismatch (None: all match),
    checking also what the suite's runner does not: G2, active and inactive."""
    for i, stp in enumerate(s.steps):
        try:
            out = model.apply(stp.op)
        except InvalidOperation as e:
            if stp.expect.error == e.rule:
                continue
            return f"step {i}: rejected [{e.rule}] {e.message}"
        exp = stp.expect
        where = f"step {i} ({stp.note or type(stp.op).__name__})"
        if exp.result is not None and out.result.value != exp.result:
            return f"{where}: result {out.result.value} != {exp.result}"
        if exp.status is not None and out.result.status != exp.status:
            return f"{where}: status {out.result.status} != {exp.status}"
        if exp.events is not None and [e.model_dump() for e in out.events] != [e.model_dump() for e in exp.events]:
            return f"{where}: events {[e.brief() for e in out.events]} != {[e.brief() for e in exp.events]}"
        got_c = model.counters().model_dump()
        for k, v in (exp.counters or {}).items():
            if got_c[k] != v:
                return f"{where}: counter {k} {got_c[k]} != {v}"
        if exp.g2 is not None and model.registered("host_pinned") != set(exp.g2):
            return f"{where}: G2 {sorted(model.registered('host_pinned'))} != {sorted(exp.g2)}"
        if exp.inactive is not None and sorted(model.inactive()) != sorted(exp.inactive):
            return f"{where}: inactive {sorted(model.inactive())} != {sorted(exp.inactive)}"
        if exp.active is not None and model.owners() != {int(k): v for k, v in exp.active.items()}:
            return f"{where}: active {model.owners()} != {exp.active}"
        if exp.earliest_deadline_ms is not None and model.earliest_deadline() != exp.earliest_deadline_ms:
            return f"{where}: earliest deadline {model.earliest_deadline()} != {exp.earliest_deadline_ms}"
    return None


def test_offload_scenarios_exist() -> None:
    names = {s.name for _, s in OFFLOAD_SCENARIOS}
    assert len(names) >= 12
    covered = {r for _, s in OFFLOAD_SCENARIOS for r in s.rules}
    offload_rules = {
        RuleId.QUARANTINE_HOLD,
        RuleId.QUARANTINE_RELEASE,
        RuleId.OFFLOAD_BLOCKS_USE,
        RuleId.G2_STORE_ON_COMPLETE,
        RuleId.G2_EVICT,
        RuleId.DEVICE_REMOVE_IMMEDIATE,
        RuleId.TIME_MONOTONIC,
        RuleId.SWAPIN_RESERVE,
        RuleId.SWAPIN_SKIP_PRESENT,
        RuleId.SWAPIN_ANCHOR,
    }
    assert offload_rules <= covered, offload_rules - covered
    for _, s in OFFLOAD_SCENARIOS:
        uses_swap = any(isinstance(st_.op, SwapIn) for st_ in s.steps)
        assert ("swap_in" in s.requires) == uses_swap, s.name
        assert ("offload" in s.requires) == (s.config.offload is not None), s.name


@pytest.mark.parametrize(("path_", "scenario"), OFFLOAD_SCENARIOS, ids=[p.stem for p, _ in OFFLOAD_SCENARIOS])
def test_offload_scenario_on_model(path_: Any, scenario: Scenario) -> None:
    mismatch = _run_on_model(G1Model(scenario.config), scenario)
    assert mismatch is None, f"{scenario.name}: {mismatch}"


def _offload_mutants() -> list[Any]:
    try:
        from kvspec.adapters.mutants.catalogue import CATALOGUE
    except ImportError:  # pragma: no cover - the mutants live in another package
        return []
    return [m for m in CATALOGUE if "offload" in m.needs and "kvbm" in m.profiles]


@pytest.mark.parametrize("mutant", _offload_mutants(), ids=lambda m: m.id)
def test_offload_scenarios_kill_mutant(mutant: Any) -> None:
    """Each offload mutant of the catalogue diverges from some offload scenario."""
    failures = []
    for _, s in OFFLOAD_SCENARIOS:
        if s.config.offload is None:
            continue
        mismatch = _run_on_model(mutant.model_for(s.config), s)
        if mismatch is not None:
            failures.append(f"{s.name}: {mismatch}")
    assert failures, f"mutant {mutant.id} ({mutant.description}) passes every offload scenario"


def test_mutant_catalogue_has_offload_mutants() -> None:
    ids = {m.id for m in _offload_mutants()}
    assert {
        "slot_released_at_enqueue",
        "g2_stored_at_enqueue",
        "device_removed_at_completion",
        "swapin_registers_present",
        "tick_backwards_applied",
    } <= ids


# ------------------------------------------------------------ swap-in validation
def _offloaded_model(offload: bool = True) -> G1Model:
    """Block 1 in G2 (offloaded from a one-slot G1); block 5 active in G1."""
    off = OffloadConfig.legacy(num_g2_blocks=2, block_size_bytes=0) if offload else None
    m = G1Model(ManagerConfig(capacity=2 if offload else 1, block_size=BS, offload=off))
    if offload:
        m.apply(Use(blocks=[FullBlock(full=1)], plhs=[Plh(hash=1)]))
        m.apply(Deref(blocks=[FullBlock(full=1)]))
        m.apply(Use(blocks=[FullBlock(full=5)], plhs=[Plh(hash=5)]))
        m.apply(Use(blocks=[FullBlock(full=6)], plhs=[Plh(hash=6)]))  # evicts 1: offload
        m.apply(Tick(now_ms=0.0))
        assert m.registered("host_pinned") == {1}
    else:
        m.apply(Use(blocks=[FullBlock(full=5)], plhs=[Plh(hash=5)]))
    return m


@pytest.mark.parametrize("offload", [True, False])
def test_swap_in_conflicting_with_g1_is_rejected_and_changes_nothing(offload: bool) -> None:
    m = _offloaded_model(offload)
    fp = m.fingerprint()
    with pytest.raises(InvalidOperation) as ei:
        m.apply(SwapIn(blocks=[SwapInBlock(seq_hash=5, plh=Plh(hash=5, parent=4, position=1))]))
    assert ei.value.rule == RuleId.USE_VALIDATE
    assert m.fingerprint() == fp


def test_swap_in_conflicting_with_g2_is_rejected_and_changes_nothing() -> None:
    m = _offloaded_model()
    fp = m.fingerprint()
    with pytest.raises(InvalidOperation) as ei:
        m.apply(SwapIn(blocks=[SwapInBlock(seq_hash=1, plh=Plh(hash=1, parent=9, position=1))]))
    assert ei.value.rule == RuleId.USE_VALIDATE
    assert m.fingerprint() == fp
    # the same block under its own lineage hash is swapped in
    assert m.apply(SwapIn(blocks=[SwapInBlock(seq_hash=1, plh=Plh(hash=1))])).result.status == "scheduled"


def test_swap_in_copies_the_g2_metadata_of_when_it_started() -> None:
    """G2 may evict an entry while it is being copied back; the onboard
    registers the metadata it read when the swap-in started."""
    off = OffloadConfig.legacy(num_g2_blocks=1, block_size_bytes=1_000_000)
    m = G1Model(ManagerConfig(capacity=3, block_size=BS, offload=off))

    def use(*seqs: int) -> Any:
        return m.apply(Use(blocks=[FullBlock(full=s) for s in seqs], plhs=[Plh(hash=s) for s in seqs]))

    m.apply(Use(blocks=[FullBlock(full=1)], local_hashes=[101], plhs=[Plh(hash=1)], token_ids=[[1] * BS]))
    m.apply(Deref(blocks=[FullBlock(full=1)]))
    m.apply(Use(blocks=[PartialBlock(partial="a")]))
    use(2)
    assert use(3).result.status == "blocked_on_offload"  # 1 leaves G1, due at 1 ms
    m.apply(Tick(now_ms=1.0))
    m.apply(Deref(blocks=[FullBlock(full=2)]))
    assert use(4, 5).result.status == "blocked_on_offload"  # 2 leaves G1, due at 2 ms
    m.apply(Deref(blocks=[PartialBlock(partial="a")]))
    assert m.apply(SwapIn(blocks=[SwapInBlock(seq_hash=1, plh=Plh(hash=1))])).result.status == "scheduled"
    assert m.earliest_deadline() == 2.0
    step = m.apply(Tick(now_ms=2.0))  # 2's offload (queued first) pushes 1 out of G2, then 1 lands in G1
    assert [(e.storage_tier, e.kind, e.hashes()) for e in step.events] == [
        ("host_pinned", "removed", [1]),
        ("host_pinned", "stored", [2]),
        ("device", "stored", [1]),
    ]
    stored = step.events[-1]
    assert stored.block_token_ids == [[1] * BS]
    assert stored.data.stored.blocks[0].tokens_hash == 101  # type: ignore[union-attr]
