"""The G1 block manager model of the ``kvbm`` and ``atomic`` profiles.

One instance is one manager (one dp_rank): a fixed number of G1 slots, each
free, partial (a mutable block owned by one request, keyed by a uuid), active
(a registered full block with owners), inactive (registered, no owner, in the
eviction policy's pool), quarantined (evicted, held until its offload to G2
completes) or reserved (a swap-in destination). Blocks are named by sequence
hash; the positional lineage hash (position, hash, parent) keys the registry
and links the lineage forest.

Every operation is validated in full before anything changes; an invalid one
raises ``InvalidOperation`` with the rule id and the state is untouched. The
model is pure: no I/O, no clock (time enters through ``Tick``), no randomness.

Where the profiles differ (see spec/SPEC.md, "Profiles"):

- ``kvbm`` (the kvbm mocker seed): a Use places blocks in order and stops at
  the first one without a slot, keeping what it placed; one Stored per Use,
  its parent the last reused full block of the batch (wherever it stands) or
  the caller's parent; Removed after Stored. With an offload tier attached,
  an eviction quarantines its slot and the Use stops (blocked on offload).
- ``atomic`` (the newest generation): a Use that cannot place every block
  changes nothing; inactive hits of the batch are pinned before any eviction;
  each reused block in the batch closes the current Stored group and anchors
  the next; two full blocks at one position are rejected.

The rules are transitions (``reference.transitions``, block operations): per
operation an effect (``OPERATIONS``), per block the first transition of a
table whose guard holds (``HIT``, ``PLACE``, ``DEREF``, ``EVICTION``, ...,
at the end of the module); each event is published with the label of the
transition that decided its blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvspec.reference.g2_tier import G2Entry, G2Tier
from kvspec.reference.labels import label
from kvspec.reference.lower_tiers import TIER_EVENTS, LowerTiers
from kvspec.reference.offload_link import SharedLink
from kvspec.reference.outcome import Step
from kvspec.reference.policies import Frequency, LineagePolicy, Policy, make_policy
from kvspec.reference.transitions import BlockModel, BlockOperation, Transition, always
from kvspec.reference.validation import check_use_shape
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.errors import ConfigError, InvalidOperation
from kvspec.spec.registry import ATOMIC_NAME, KVBM_NAME
from kvspec.spec.rules import RuleId, RuleName, rid
from kvspec.spec.wire import (
    BlockRef,
    Counters,
    Deref,
    Destroy,
    FullBlock,
    KvEvent,
    Operation,
    OpResult,
    PartialBlock,
    Plh,
    Promote,
    Reset,
    Status,
    StorageTier,
    SwapIn,
    Tick,
    Use,
    make_removed,
    make_stored,
)

PlhId = tuple[int, int, int | None]  # (position, hash, parent): the registry key
#: a Use's or a Promote's Stored: the newly registered blocks, anchored to the block before them
_STORED = label("STORE-NEW-ONLY", parent="PARENT-ANCHOR", tokens="STORE-TOKENS-HASH")
#: the Stored of swapped-in blocks: the ones not already in G1, anchored to the prefix
#: the device Removed of evicted blocks: exactly those, the victims the policy chose; with an
#: offload tier published at eviction
_EVICTED = label("REMOVE-EXACT", choice="EVICT-POLICY")
_EVICTED_OFFLOAD = label("DEVICE-REMOVE-IMMEDIATE", "REMOVE-EXACT", choice="EVICT-POLICY")
#: G2's Removed of a victim, and the host-pinned Stored of a block that reached G2
_G2_EVICTED = label("G2-EVICT")
#: a G2 eviction that makes room for a block staged back from G3/G4: missing
#: when the staging skipped G2 (TIER-ONBOARD); which victim is G2's policy
_STAGED_EVICTED = label("TIER-ONBOARD", choice="G2-EVICT")
_G2_STORED = label("G2-STORE-ON-COMPLETE", parent="G2-STORE-ON-COMPLETE", tokens="G2-STORE-ON-COMPLETE")
_ONBOARDED = label("SWAPIN-SKIP-PRESENT", parent="SWAPIN-ANCHOR", tokens="STORE-TOKENS-HASH")
_NO_VALUE = OpResult(value=None)


def plh_id(p: Plh) -> PlhId:
    return (p.position, p.hash, p.parent)


@dataclass(slots=True)
class Block:
    """A registered G1 block and the metadata its events carry."""

    seq: int
    plh: Plh
    parent_hash: int | None  # the block before it when it was registered
    local_hash: int
    token_ids: list[int] | None
    owners: int = 0
    #: False when a router was told it is gone although it is still here (the
    #: kvbm seed drops the metadata of a block evicted and re-registered in
    #: one batch); its later eviction then publishes no Removed.
    announced: bool = True
    #: the registry key, ``plh_id(plh)``, computed once
    pid: PlhId = (0, 0, None)

    def __post_init__(self) -> None:
        self.pid = plh_id(self.plh)


@dataclass(slots=True, order=True)
class Transfer:
    """A pending copy on a link: G1->G2 (offload) or G2->G1 (onboard)."""

    deadline: float
    order: int
    kind: str = field(compare=False)  # "offload" | "onboard"
    payload: Any = field(compare=False)


@dataclass(slots=True)
class _Onboard:
    #: the G2 prefix as the caller named it, with G2's metadata read when the
    #: swap-in started (a later G2 eviction cannot change what is copied in)
    blocks: list[tuple[int, Plh, G2Entry]]
    parent: int | None
    slots: int  # reserved destination slots
    #: staging transfers (G3->G2, G4->G2) still to land before the G2->G1 copy
    stages: int = 0


@dataclass(slots=True)
class _OffloadJob:
    """One enqueue of G1 evictions on a shared link (one blocked Use or
    swap-in): its source slots are held until every block it sends has
    arrived (or failed), then all go back to free together."""

    slots: int
    left: int = 0  # blocks sent and not yet settled


@dataclass(slots=True)
class _Batch:
    """Up to ``batch_size`` blocks of one job, copied as one transfer."""

    job: _OffloadJob
    entries: list[G2Entry]
    #: destinations reserved in G2 when the transfer started (at_start)
    reserved: int = 0


@dataclass(slots=True)
class _UseWalk:
    """A Use in progress: what the transitions of its blocks read and extend."""

    op: Use
    prefer: Collection[int]
    #: the parent the next newly registered block records (the block before it)
    meta_parent: int | None
    #: the newly registered blocks of the current Stored group, and their metadata
    new_seqs: list[int] = field(default_factory=list)
    new_meta: list[Block] = field(default_factory=list)


@dataclass(slots=True)
class _Slot:
    """A block of a Use that needed a slot, and what taking one gave (a partial block the Use's
    request already holds keeps its slot: ``got``, no victim)."""

    walk: _UseWalk
    ref: BlockRef
    #: its index among the Use's full blocks
    idx: int
    got: bool
    victim: int | None


@dataclass(slots=True)
class _Evicted:
    """A victim of one operation, when its Removed is published (``_publish_evictions``)."""

    seq: int
    meta: Block
    handled: set[int]
    #: what goes to G2 on a shared link (the operation's one offload job)
    sent: list[G2Entry]


@dataclass(slots=True)
class _Reservation:
    """A swap-in that reserved a G1 slot for every block of its run."""

    op: SwapIn
    prefix: list[tuple[int, Plh, G2Entry]]
    staged: list[tuple[str, G2Entry]]
    seqs: list[int]
    evicted: list[int]
    reserved: int
    lineage: bool


@dataclass(slots=True)
class _Landing:
    """One block of a completed onboard, and the Stored group being built."""

    seq: int
    plh: Plh
    meta: G2Entry
    group: list[int]
    group_meta: list[Block]
    #: [anchor of the current group, parent of the next registered block]
    links: list[int | None]


def _holds_owner(m: object, item: tuple[BlockRef, Block | None]) -> bool:
    return item[1] is not None


def _staging(m: object, item: tuple[int, bool]) -> bool:
    return item[1]


# ---------------------------------------------------------------- the tables
#: an owner joins a registered block
HIT: tuple[Transition[Any, Any], ...] = (
    Transition("USE-HIT-INACTIVE", Block, "_inactive", "_join_inactive"),
    Transition("USE-HIT-ACTIVE", Block, always, "_join_active"),
)
#: an atomic Use pins its inactive hits before any allocation
PIN: tuple[Transition[Any, Any], ...] = (Transition("USE-HIT-INACTIVE", Block, always, "_pin"),)
#: a block of a Use that needed a slot (or a partial block already held): placed, or the Use stops
USE_NEW: Transition[Any, Any] = Transition("USE-NEW", _Slot, "_slot_for_full", "_place_new", publishes=_STORED)
PLACE: tuple[Transition[Any, Any], ...] = (
    USE_NEW,
    Transition("USE-PARTIAL", _Slot, "_slot_got", "_place_partial"),
    Transition("OFFLOAD-BLOCKS-USE", _Slot, "_slot_quarantined", "_blocked", result=True),
    Transition("USE-CAPACITY", _Slot, always, "_out_of_slots"),
)
#: an atomic Use that cannot place every block changes nothing
REFUSE: tuple[Transition[Any, Any], ...] = (Transition("USE-CAPACITY", Use, always, "_refuse_whole"),)
#: the policy's victim leaves the pool and the registry (its Removed: with an offload tier, at once)
EVICTION: tuple[Transition[Any, Any], ...] = (
    Transition("EVICT-POLICY", int, "_untiered", "_evict_block", publishes=_EVICTED),
    Transition("EVICT-POLICY", int, always, "_evict_block", publishes=_EVICTED_OFFLOAD),
)
#: an operation's victims are published after its Stored
EVICTIONS_OUT: tuple[Transition[Any, Any], ...] = (Transition("EVENT-ORDER", list, always, "_publish_evicted"),)
#: with an offload tier, a victim's slot is held until its copy has landed
QUARANTINE: tuple[Transition[Any, Any], ...] = (Transition("QUARANTINE-HOLD", _Evicted, always, "_quarantine"),)
RELEASE: tuple[Transition[Any, Any], ...] = (Transition("QUARANTINE-RELEASE", int, always, "_give_back_slots"),)
#: one Deref'd block of a validated Deref
DEREF: tuple[Transition[Any, Any], ...] = (
    Transition("DEREF-OWNER", tuple, _holds_owner, "_drop_owner"),
    Transition("DEREF-PARTIAL", tuple, always, "_drop_partial"),
)
PROMOTE_NEW: Transition[Any, Any] = Transition("PROMOTE-NEW", Promote, always, "_promote_new", publishes=_STORED)
PROMOTE: tuple[Transition[Any, Any], ...] = (
    Transition("PROMOTE-EXISTING", Promote, "_promotes_registered", "_promote_existing", result=True),
    PROMOTE_NEW,
)
TICK: tuple[Transition[Any, Any], ...] = (Transition("TIME-MONOTONIC", Tick, always, "_advance"),)
#: a G2 victim (seq, made room for a block staged from G3/G4)
G2_EVICTION: tuple[Transition[Any, Any], ...] = (
    Transition("G2-EVICT", tuple, _staging, "_g2_removed", publishes=_STAGED_EVICTED),
    Transition("G2-EVICT", tuple, always, "_g2_removed", publishes=_G2_EVICTED),
)
G2_STORE: tuple[Transition[Any, Any], ...] = (
    Transition("G2-STORE-ON-COMPLETE", G2Entry, always, "_g2_store", publishes=_G2_STORED),
)
RESERVE: tuple[Transition[Any, Any], ...] = (Transition("SWAPIN-RESERVE", _Reservation, always, "_reserved"),)
#: one block of a completed onboard
SWAPIN_ANCHOR: Transition[Any, Any] = Transition(
    "SWAPIN-ANCHOR", _Landing, always, "_land_onboarded", publishes=_ONBOARDED
)
ONBOARD: tuple[Transition[Any, Any], ...] = (
    Transition("SWAPIN-SKIP-PRESENT", _Landing, "_present", "_skip_present"),
    SWAPIN_ANCHOR,
)


def _rejected(rule: RuleName, why: str) -> Any:
    def effect(m: object, op: Operation, prefer: Collection[int]) -> Step:
        raise InvalidOperation(rid(rule), why)

    return effect


#: the operations: the effect that walks each through the tables, and the rule of its result
OPERATIONS: tuple[BlockOperation, ...] = (
    BlockOperation(Use, lambda m, op, prefer: m._use(op, prefer), "USE-CAPACITY"),
    BlockOperation(Deref, lambda m, op, prefer: m._deref(op), "DEREF-OWNER"),
    BlockOperation(Promote, lambda m, op, prefer: m._promote(op), "PROMOTE-NEW"),
    BlockOperation(
        Tick,
        lambda m, op, prefer: m._tick(op),
        "TIME-MONOTONIC",
        silent=(("device", "stored", "SWAPIN-SKIP-PRESENT"), ("device", "removed", "DEVICE-REMOVE-IMMEDIATE")),
    ),
    BlockOperation(SwapIn, lambda m, op, prefer: m._swap_in(op, prefer), "SWAPIN-RESERVE"),
    BlockOperation(
        Destroy, _rejected("DESTROY-ACTIVE", "Destroy is an operation of the legacy profile only"), "DESTROY-ACTIVE"
    ),
    BlockOperation(
        Reset, _rejected("CLEAR-ALL", "a prefix-cache reset is an operation of the vllm profile only"), "CLEAR-ALL"
    ),
    BlockOperation(object, lambda m, op, prefer: m._unknown(op), "USE-VALIDATE"),
)


class G1Model(BlockModel):
    """Reference model of one G1 manager (profiles kvbm and atomic)."""

    OPERATIONS: ClassVar[Sequence[BlockOperation]] = OPERATIONS
    TABLES: ClassVar[Sequence[Sequence[Transition[Any, Any]]]] = (
        HIT,
        PIN,
        PLACE,
        REFUSE,
        EVICTION,
        EVICTIONS_OUT,
        QUARANTINE,
        RELEASE,
        DEREF,
        PROMOTE,
        TICK,
        G2_EVICTION,
        G2_STORE,
        RESERVE,
        ONBOARD,
    )

    #: the lockstep's follow modes (``conformance/block/follow.py``):
    #: condition -> (the rule departed from, the switch that runs it)
    FOLLOW: dict[str, tuple[RuleId, str]] = {"offload_job_fails_whole": (RuleId.QUARANTINE_RELEASE, "job_fails_whole")}
    #: an offload job with more blocks than G2 has room for fails whole:
    #: none of it is sent and its source slots stay quarantined for good (an
    #: older kvbm-engine executor's behaviour, where Dynamo's capacity policy
    #: admits what fits; shared link only). Off in the spec; the lockstep
    #: turns it on to follow an implementation that does this
    #: (``_enqueue_offload``).
    job_fails_whole: bool = False

    next_event_id: int
    free: int
    now: float

    def __init__(self, config: ManagerConfig, *, worker: int = 0, tiers: LowerTiers | None = None) -> None:
        if config.profile not in (KVBM_NAME, ATOMIC_NAME):
            raise ConfigError(f"G1Model runs the kvbm and atomic profiles, not {config.profile!r}")
        self.config = config
        self.atomic = config.profile == ATOMIC_NAME
        self.capacity = config.capacity
        self.block_size = config.block_size
        self.dp_rank = config.dp_rank
        self.policy: Policy = make_policy(config.eviction)
        self.partial: dict[str, None] = {}
        self.blocks: dict[int, Block] = {}
        self.by_plh: dict[PlhId, int] = {}
        #: multi-LRU touch counts, per lineage hash (``touches[seq]`` reads a
        #: registered block's count)
        self.freq = Frequency(config.capacity)
        self.touches = _TouchView(self)
        self.next_event_id: int = 0
        self.free: int = config.capacity
        self.active_full = 0
        self.refs = 0
        # offload tier
        self.offload: OffloadConfig | None = config.offload
        self.now: float = 0.0
        self.quarantined = 0
        self.reserved = 0
        off = config.offload
        self.g2tier = G2Tier(off.num_g2_blocks if off else 0, off.g2_eviction if off else "lru")
        #: registered G2 blocks by sequence hash (the tier's own map)
        self.g2: OrderedDict[int, G2Entry] = self.g2tier.blocks
        self.shared = off is not None and off.link == "shared"
        # link = "fifo": transfers queued one after another per direction
        self.pending: list[Transfer] = []
        self._transfer_seq = 0
        self._link_free = {"offload": 0.0, "onboard": 0.0}
        # link = "shared": processor-sharing links, transfers by id
        bw = off.bandwidth_gbps if off else 1.0
        self.links = {"offload": SharedLink.for_bandwidth(bw), "onboard": SharedLink.for_bandwidth(bw)}
        self.transfers: dict[int, _Batch | _Onboard] = {}
        self.waiting: list[_Batch] = []  # batches waiting for a transfer slot
        self.inflight: dict[PlhId, int] = {}  # lineage hashes on their way to G2 (dedup)
        self._evicted_meta: dict[int, Block] = {}
        self.begin_step()
        # the lower tiers (G3, G4): shared with the other workers of the
        # process when a ``process.Process`` passes them in
        self.worker = worker
        if tiers is None and off is not None and off.lower_tiers():
            tiers = LowerTiers(off)
        self.tiers = tiers
        if tiers is not None:
            tiers.workers[worker] = self
        #: lower-tier events this worker publishes, not numbered yet:
        #: (storage tier, "stored" | "removed", sequence hash, metadata)
        self.outbox: list[tuple[StorageTier, str, int, G2Entry | None]] = []
        #: host-pinned events of G2 evictions made room for staged blocks
        self._pending_tier_g2_events: list[KvEvent] = []

    # ------------------------------------------------------------------ queries
    def counters(self) -> Counters:
        held = self.quarantined + self.reserved
        return Counters(
            active_blocks=len(self.partial) + self.active_full + held,
            active_refs=len(self.partial) + self.refs,
            inactive_blocks=len(self.policy),
            free_blocks=self.free,
            quarantined_blocks=self.quarantined,
        )

    def registered(self, tier: str = "device") -> set[int]:
        if tier == "host_pinned":
            return set(self.g2)
        return set(self.blocks)

    def announced(self, tier: str = "device") -> set[int]:
        if tier == "host_pinned":
            return set(self.g2)
        return {s for s, b in self.blocks.items() if b.announced}

    def owners(self) -> dict[int, int]:
        return {s: b.owners for s, b in self.blocks.items() if b.owners > 0}

    def inactive(self) -> list[int]:
        return list(self.policy)

    def allowed_victims(self) -> list[int]:
        return self.policy.allowed()

    def earliest_deadline(self) -> float | None:
        if self.shared:
            times = [t for t in (link.earliest() for link in self.links.values()) if t is not None]
            if self.tiers is not None:
                lower = self.tiers.earliest(self.worker)
                if lower is not None:
                    times.append(lower)
            return min(times, default=None)
        return min((t.deadline for t in self.pending), default=None)

    def onboards(self) -> list[tuple[float, _Onboard]]:
        """The swap-ins in flight, each with the time it completes if nothing
        else starts (a scheduler waiting for one ticks to it)."""
        if self.shared:
            link = self.links["onboard"]
            out = []
            for ident, job in self.transfers.items():
                if isinstance(job, _Onboard):
                    at = link.deadline_for(ident)
                    assert at is not None
                    out.append((at, job))
            return out
        return [(t.deadline, t.payload) for t in self.pending if t.kind == "onboard"]

    def fingerprint(self) -> Any:
        pol = self.policy
        pol_state: Any = (
            sorted((k, n.seq, n.tick, n.parent, n.children) for k, n in pol._nodes.items())
            if isinstance(pol, LineagePolicy)
            else list(pol)
        )
        return (
            tuple(self.partial),
            tuple(
                (s, b.owners, plh_id(b.plh), b.parent_hash, b.local_hash, b.announced)
                for s, b in sorted(self.blocks.items())
            ),
            pol_state,
            self.next_event_id,
            self.counters(),
            self.freq.state(),
            self.now,
            tuple(_entry_key(e) for e in self.g2.values()),
            tuple((t.deadline, t.order, t.kind, _payload_key(t)) for t in sorted(self.pending)),
            tuple(sorted(self._link_free.items())),
            self.g2tier.state(),
            tuple((k, link.state()) for k, link in sorted(self.links.items())),
            tuple((i, _batch_key(t)) for i, t in sorted(self.transfers.items())),
            tuple(_batch_key(b) for b in self.waiting),
            tuple(sorted(self.inflight.items())),
            self.tiers.state() if self.tiers is not None else None,
            tuple(self.outbox),
        )

    # --------------------------------------------------------------- dispatch
    def step(self, op: Operation) -> Step:
        """``apply`` with no eviction preference: the one model protocol (``spec.model.ProfileModel``)."""
        return self.apply(op)

    def apply(self, op: Operation, *, prefer: Collection[int] = ()) -> Step:
        self.begin_step()
        if self.tiers is not None:
            self.tiers.did = self.applied
        step: Step = self.run_operation(op, prefer)
        if self.outbox:
            step.events = [*step.events, *self.drain_outbox()]
        step.labels = self.step_labels(step.events)
        return step

    # ------------------------------------------------------ lower tiers (G3/G4)
    def drain_outbox(self) -> list[KvEvent]:
        """Number and publish the lower-tier events this worker owes, in the
        order they happened (after the step's own G1 and G2 events)."""
        out: list[KvEvent] = []
        for tier, kind, seq, e in self.outbox:
            if kind == "removed":
                ev = self._removed([seq], tier)
            else:
                assert e is not None
                ev = make_stored(
                    self.next_event_id,
                    [seq],
                    [e.local_hash],
                    e.parent_hash,
                    dp_rank=self.dp_rank,
                    tier=tier,
                    token_ids=[e.token_ids] if e.token_ids is not None else None,
                )
                self.next_event_id += 1
            out.append(self.publish(ev, TIER_EVENTS))
        self.outbox = []
        return out

    def tier_event(self, tier: StorageTier, kind: str, seq: int, entry: G2Entry | None) -> None:
        self.outbox.append((tier, kind, seq, entry))

    def tier_pin(self, seqs: list[int]) -> list[int]:
        """A lower-tier copy pins its G2 source blocks (those G2 holds)."""
        held = [s for s in seqs if s in self.g2tier]
        self.g2tier.pin(held)
        return held

    def tier_unpin(self, seqs: list[int]) -> None:
        self.g2tier.unpin(seqs)

    def tier_staged(self, job: Any, entries: list[G2Entry]) -> None:
        """TIER-ONBOARD: staged blocks land in G2 (silently: Dynamo has no
        router metadata for them), pinned for the swap-in; when the last
        staging transfer has landed the G2->G1 copy of the whole run starts."""
        assert isinstance(job, _Onboard)
        self.g2tier.admitted -= len(entries)
        for e in entries:
            if e.seq not in self.g2tier:
                got, victims = self.g2tier.make_room()
                self._pending_tier_g2_events.extend(self._g2_evicted(victims, staged=True))
                if not got:
                    continue
                self.g2tier.register(e)
                self.g2tier.silent.add(e.seq)
            self.g2tier.pin([e.seq])
        job.stages -= 1
        if job.stages == 0:
            self._start_transfer("onboard", job, job.slots)

    def _unknown(self, op: Operation) -> Step:
        raise InvalidOperation(rid("USE-VALIDATE"), f"unknown operation {type(op).__name__}")

    # ------------------------------------------------------------- validation
    def _check_identity(self, seq: int, plh: Plh, pid: PlhId | None = None) -> None:
        """A sequence hash names one lineage hash and the other way round."""
        if pid is None:
            pid = plh_id(plh)
        b = self.blocks.get(seq)
        if b is not None and b.pid != pid:
            raise InvalidOperation(
                rid("USE-VALIDATE"), f"block {seq} is registered with lineage hash {b.pid}, not {pid}"
            )
        other = self.by_plh.get(pid)
        if other is not None and other != seq:
            raise InvalidOperation(rid("USE-VALIDATE"), f"lineage hash {pid} belongs to block {other}, not {seq}")

    def _validate_use(self, op: Use) -> None:
        fulls = check_use_shape(op, self.block_size)
        seen_pos: set[int] = set()
        batch_ids: dict[PlhId, int] = {}
        for seq, plh in zip(fulls, op.plhs, strict=True):
            pid = (plh.position, plh.hash, plh.parent)
            self._check_identity(seq, plh, pid)
            if batch_ids.setdefault(pid, seq) != seq:
                raise InvalidOperation(
                    rid("USE-VALIDATE"), f"blocks {batch_ids[pid]} and {seq} share lineage hash {pid} in one batch"
                )
            if self.atomic:
                if plh.position in seen_pos:
                    raise InvalidOperation(
                        rid("USE-VALIDATE"), f"two full blocks at position {plh.position} in one batch"
                    )
                seen_pos.add(plh.position)

    # ------------------------------------------------------------ slot taking
    def _take_slot(self, prefer: Collection[int]) -> tuple[bool, int | None]:
        """Take one slot: a free one first, else evict one inactive block.

        Returns (got_slot, evicted_seq). With an offload tier an eviction does
        not yield a usable slot: the victim's slot is quarantined instead and
        the caller must stop (OFFLOAD-BLOCKS-USE)."""
        if self.free:
            self.free -= 1
            return True, None
        victim = self._pick_victim(prefer)
        if victim is None:
            return False, None
        self._evict(victim)
        if self.offload is not None:
            return False, victim
        return True, victim

    def _pick_victim(self, prefer: Collection[int]) -> int | None:
        """The policy's victim, or the first allowed one the caller prefers.
        Every eviction goes through here (mutants override it)."""
        if not prefer:
            return self.policy.victim()
        allowed = self.policy.allowed()
        if not allowed:
            return None
        if prefer:
            for seq in allowed:
                if seq in prefer:
                    return seq
        return allowed[0]

    def _evict(self, seq: int) -> None:
        """Take ``seq`` out of the pool and the registry (its slot is reused): EVICT-POLICY."""
        self.take(EVICTION, seq)

    def _untiered(self, seq: int) -> bool:
        return self.offload is None

    def _evict_block(self, seq: int) -> None:
        self.policy.evict(seq)
        b = self.blocks.pop(seq)
        del self.by_plh[b.pid]
        self._evicted_meta[seq] = b

    # ---------------------------------------------------------------- events
    def _stored(self, seqs: list[int], metas: list[Block], parent: int | None) -> KvEvent:
        known = [m.token_ids for m in metas if m.token_ids is not None]
        tokens = known if len(known) == len(metas) else None
        ev = make_stored(
            self.next_event_id,
            seqs,
            [m.local_hash for m in metas],
            parent,
            dp_rank=self.dp_rank,
            token_ids=tokens,
        )
        self.next_event_id += 1  # EVENT-ID
        return ev

    def _removed(self, seqs: list[int], tier: StorageTier = "device") -> KvEvent:
        ev = make_removed(self.next_event_id, seqs, dp_rank=self.dp_rank, tier=tier)
        self.next_event_id += 1  # EVENT-ID
        return ev

    def _register(self, seq: int, plh: Plh, parent: int | None, local: int, toks: list[int] | None) -> Block:
        b = Block(seq, plh, parent, local, toks, owners=1)
        self.blocks[seq] = b
        self.by_plh[b.pid] = seq
        self.active_full += 1
        self.refs += 1
        self.freq.touch(b.pid)  # a new registration is a touch
        return b

    def _hit(self, b: Block) -> None:
        """An owner joins ``b``.

        Only an inactive hit is a touch: it is matched by lineage hash in the
        block manager (``BlockManager::match_blocks``), which counts it. An
        active hit clones the handle the mocker already holds in its own map
        (``KvManager::process_use``, ``active_full``) and never reaches the
        block manager."""
        self.take(HIT, b)

    def _inactive(self, b: Block) -> bool:
        return b.owners == 0

    def _join_inactive(self, b: Block) -> None:
        self.policy.remove(b.seq)
        self.active_full += 1
        self.freq.touch(b.pid)
        b.owners += 1
        self.refs += 1

    def _join_active(self, b: Block) -> None:
        b.owners += 1
        self.refs += 1

    # -------------------------------------------------- a block that needs a slot
    def _slot(self, walk: _UseWalk, ref: BlockRef, idx: int, evicted: list[int]) -> _Slot:
        """Take a slot for ``ref`` (EVICT-POLICY when none is free): what the PLACE table decides on."""
        got, victim = self._take_slot(walk.prefer)
        if victim is not None:
            evicted.append(victim)
        return _Slot(walk, ref, idx, got, victim)

    def _slot_for_full(self, s: _Slot) -> bool:
        return s.got and type(s.ref) is FullBlock

    def _slot_got(self, s: _Slot) -> bool:
        return s.got

    def _slot_quarantined(self, s: _Slot) -> bool:
        return s.victim is not None

    def _place_new(self, s: _Slot) -> None:
        op, idx, seq = s.walk.op, s.idx, s.ref.full  # type: ignore[union-attr]
        local = op.local_hashes[idx] if op.local_hashes else 0
        toks = op.token_ids[idx] if op.token_ids is not None else None
        s.walk.new_seqs.append(seq)
        s.walk.new_meta.append(self._register(seq, op.plhs[idx], s.walk.meta_parent, local, toks))

    def _place_partial(self, s: _Slot) -> None:
        self.partial[s.ref.partial] = None  # type: ignore[union-attr]  # (held: it keeps its slot)

    def _blocked(self, s: _Slot) -> Status:
        """A Use whose eviction started an offload stops: blocked on it."""
        return "blocked_on_offload"

    def _out_of_slots(self, s: _Slot) -> Status:
        return "capacity"

    # ------------------------------------------------------------------- Use
    def _use(self, op: Use, prefer: Collection[int]) -> Step:
        self._validate_use(op)
        if self.atomic:
            return self._use_atomic(op, prefer)
        self._evicted_meta = {}
        evicted: list[int] = []
        anchor = op.parent.full if isinstance(op.parent, FullBlock) else None
        walk = _UseWalk(op, prefer, anchor)
        placed = 0
        status: Status = "ok"
        fi = 0
        blocks = self.blocks
        for ref in op.blocks:
            if type(ref) is FullBlock:
                seq, idx = ref.full, fi
                fi += 1
                b = blocks.get(seq)
                if b is not None:
                    self._hit(b)
                    anchor = seq
                else:
                    slot = self._slot(walk, ref, idx, evicted)
                    stop = self.take(PLACE, slot)
                    if stop is not None:
                        status = stop
                        if slot.victim is not None:
                            self._extend_quarantine(op.blocks[placed + 1 :], op.plhs[fi:], prefer, evicted)
                        break
                walk.meta_parent = seq
            elif isinstance(ref, PartialBlock) and ref.partial not in self.partial:
                slot = self._slot(walk, ref, fi, evicted)
                stop = self.take(PLACE, slot)
                if stop is not None:
                    status = stop
                    if slot.victim is not None:
                        self._extend_quarantine(op.blocks[placed + 1 :], op.plhs[fi:], prefer, evicted)
                    break
            else:
                self.take(PLACE, _Slot(walk, ref, fi, True, None))
            placed += 1
        events: list[KvEvent] = []
        if walk.new_seqs:
            events.append(self.publish(self._stored(walk.new_seqs, walk.new_meta, anchor), USE_NEW))
        events.extend(self._publish_evictions(evicted))
        return Step(OpResult(value=placed, status=status), events)

    def _pending_allocations(self, rest: list[BlockRef], plhs: list[Plh]) -> int:
        n = 0
        for ref in rest:
            if isinstance(ref, FullBlock):
                if ref.full not in self.blocks:
                    n += 1
            elif ref.partial not in self.partial:
                n += 1
        return n

    def _extend_quarantine(
        self, rest: list[BlockRef], plhs: list[Plh], prefer: Collection[int], evicted: list[int]
    ) -> None:
        """A Use blocked on offload evicts (and quarantines) as many more
        victims as the rest of the batch would need, so that they all offload
        together; it stops early at a free slot or an empty pool."""
        for _ in range(self._pending_allocations(rest, plhs)):
            if self.free:
                return
            victim = self._pick_victim(prefer)
            if victim is None:
                return
            self._evict(victim)
            evicted.append(victim)

    def _publish_evictions(self, evicted: list[int]) -> list[KvEvent]:
        """Device Removed for the evicted blocks (after the Stored: EVENT-ORDER), and with an
        offload tier, quarantine their slots and queue their transfers."""
        if not evicted:
            return []
        out: list[KvEvent] = self.take(EVICTIONS_OUT, evicted)
        return out

    def _publish_evicted(self, evicted: list[int]) -> list[KvEvent]:
        metas = self._evicted_meta
        self._evicted_meta = {}
        gone: list[int] = []
        handled: set[int] = set()
        sent: list[G2Entry] = []
        for seq in evicted:
            meta = metas[seq]
            if self.offload is not None:
                self.take(QUARANTINE, _Evicted(seq, meta, handled, sent))
            if seq in handled:
                continue
            handled.add(seq)
            # The kvbm seed looks an evicted block's metadata up by lineage hash
            # after the batch and drops it: a block evicted and registered again
            # within one batch is reported Removed although it is back, and its
            # later eviction is reported by nobody.
            again = self.blocks.get(seq)
            reregistered = again is not None and again.pid == meta.pid
            if reregistered or meta.announced:
                gone.append(seq)
            if again is not None and reregistered:
                again.announced = False
        events = [self.publish(self._removed(gone), self.which(EVICTION, gone[0]))] if gone else []
        if self.shared:
            events.extend(self._enqueue_offload(sent, len(evicted)))
        return events

    def _quarantine(self, v: _Evicted) -> None:
        """QUARANTINE-HOLD: the victim's slot is held for its copy to G2."""
        self.quarantined += 1
        seq, meta = v.seq, v.meta
        if not self.shared:
            e = G2Entry(seq, meta.plh, meta.parent_hash, meta.local_hash, meta.token_ids)
            self._queue("offload", e)
        elif seq not in v.handled and meta.announced:
            # Dynamo sends what it finds in its metadata map, looked up
            # by lineage hash after the batch: a block registered again
            # in this batch goes with its new metadata; a block whose
            # entry an earlier batch consumed (unannounced) is not sent
            again = self.blocks.get(seq)
            src = again if again is not None and again.pid == meta.pid else meta
            v.sent.append(G2Entry(seq, src.plh, src.parent_hash, src.local_hash, src.token_ids))

    # ------------------------------------------------------------ atomic Use
    def _use_atomic(self, op: Use, prefer: Collection[int]) -> Step:
        missing: set[int] = set()
        pinned: list[Block] = []
        new_partials = {r.partial for r in op.blocks if isinstance(r, PartialBlock) and r.partial not in self.partial}
        for ref in op.blocks:
            if isinstance(ref, FullBlock):
                b = self.blocks.get(ref.full)
                if b is None:
                    missing.add(ref.full)
                elif b.owners == 0 and b not in pinned:
                    pinned.append(b)
        needed = len(missing) + len(new_partials)
        if needed > self.free + len(self.policy) - len(pinned):
            refused: Step = self.take(REFUSE, op)
            return refused
        self._evicted_meta = {}
        # pin the batch's inactive hits first so no allocation evicts them
        for b in pinned:
            self.take(PIN, b)
        evicted: list[int] = []
        events: list[KvEvent] = []
        anchor = op.parent.full if isinstance(op.parent, FullBlock) else None
        walk = _UseWalk(op, prefer, anchor)
        pinned_ids = {b.seq for b in pinned}
        fi = 0
        for ref in op.blocks:
            if isinstance(ref, FullBlock):
                seq, idx = ref.full, fi
                fi += 1
                b = self.blocks.get(seq)
                if b is not None:
                    if seq in pinned_ids:
                        pinned_ids.discard(seq)
                        b.owners += 1
                        self.refs += 1
                        self.freq.touch(b.pid)
                    else:
                        self._hit(b)
                    if walk.new_seqs:
                        events.append(self.publish(self._stored(walk.new_seqs, walk.new_meta, anchor), USE_NEW))
                        walk.new_seqs, walk.new_meta = [], []
                    anchor = seq
                else:
                    slot = self._slot(walk, ref, idx, evicted)
                    assert slot.got, "atomic Use: capacity was checked"
                    self.take(PLACE, slot)
                walk.meta_parent = seq
            elif ref.partial not in self.partial:
                slot = self._slot(walk, ref, fi, evicted)
                assert slot.got, "atomic Use: capacity was checked"
                self.take(PLACE, slot)
            else:
                self.take(PLACE, _Slot(walk, ref, fi, True, None))
        if walk.new_seqs:
            events.append(self.publish(self._stored(walk.new_seqs, walk.new_meta, anchor), USE_NEW))
        events.extend(self._publish_evictions(evicted))
        return Step(OpResult(value=len(op.blocks), status="ok"), events)

    def _refuse_whole(self, op: Use) -> Step:
        return Step(OpResult(value=0, status="capacity"), [])

    def _pin(self, b: Block) -> None:
        self.policy.remove(b.seq)
        self.active_full += 1

    # ----------------------------------------------------------------- Deref
    def _deref(self, op: Deref) -> Step:
        # validate the whole batch first (DEREF-UNKNOWN), then apply it in order
        blocks = self.blocks
        need: dict[int, int] = {}
        resolved: list[Block | None] = []
        seen_partial: set[str] = set()
        for ref in op.blocks:
            if type(ref) is FullBlock:
                seq = ref.full
                n = need[seq] = need.get(seq, 0) + 1
                b = blocks.get(seq)
                owners = b.owners if b is not None else 0
                if n > owners:
                    state = "unknown" if b is None else ("inactive" if owners == 0 else f"held by {owners}")
                    raise InvalidOperation(
                        rid("DEREF-UNKNOWN"), f"Deref of full block {seq} ({state}) drops more owners than it has"
                    )
                resolved.append(b)
            elif isinstance(ref, PartialBlock):
                uuid = ref.partial
                if uuid not in self.partial or uuid in seen_partial:
                    raise InvalidOperation(rid("DEREF-UNKNOWN"), f"Deref of partial block {uuid} that is not held")
                seen_partial.add(uuid)
                resolved.append(None)
        self.refs -= len(op.blocks) - len(seen_partial)
        for item in zip(op.blocks, resolved, strict=True):
            self.take(DEREF, item)
        return Step(_NO_VALUE, [])

    def _drop_owner(self, item: tuple[BlockRef, Block]) -> None:
        b = item[1]
        b.owners -= 1
        if b.owners == 0:
            self.active_full -= 1
            plh = b.plh
            parent_key = None if plh.parent is None or plh.position == 0 else (plh.position - 1, plh.parent)
            self.policy.insert(b.seq, (plh.position, plh.hash), parent_key, self.freq.count(b.pid))

    def _drop_partial(self, item: tuple[PartialBlock, None]) -> None:
        del self.partial[item[0].partial]
        self.free += 1

    # --------------------------------------------------------------- Promote
    def _promote(self, op: Promote) -> Step:
        if op.uuid not in self.partial:
            raise InvalidOperation(rid("PROMOTE-UNKNOWN"), f"Promote of partial block {op.uuid} that is not held")
        if op.token_ids is not None and len(op.token_ids) != self.block_size:
            raise InvalidOperation(
                rid("USE-VALIDATE"),
                f"Promote token_ids has {len(op.token_ids)} tokens; a full block has {self.block_size}",
            )
        self._check_identity(op.seq_hash, op.plh)
        del self.partial[op.uuid]
        step: Step = self.take(PROMOTE, op)
        return step

    def _promotes_registered(self, op: Promote) -> bool:
        return op.seq_hash in self.blocks

    def _promote_existing(self, op: Promote) -> Step:
        self.free += 1  # the partial slot goes back to free
        self._hit(self.blocks[op.seq_hash])
        return Step(OpResult(value=None), [])

    def _promote_new(self, op: Promote) -> Step:
        nb = self._register(op.seq_hash, op.plh, op.parent_hash, op.local_hash, op.token_ids)
        return Step(
            OpResult(value=None), [self.publish(self._stored([op.seq_hash], [nb], op.parent_hash), PROMOTE_NEW)]
        )

    # ----------------------------------------------------------- offload tier
    #
    # Semantics options (OffloadConfig; SPEC.md "Offload semantics options").
    #
    # link = "fifo" (kvspec before the options): one block takes
    # ``block_size_bytes / bandwidth`` on its link. Each direction is one link
    # (G1->G2 "offload", G2->G1 "onboard"), shared by its transfers one after
    # another in the order they were queued: a transfer starts when the link
    # is free and the clock has reached the moment it was queued, and holds
    # the link for its blocks. So n evictions queued together complete at n
    # consecutive deadlines, and an onboard of n blocks completes as one job.
    # Deadlines are fixed when a transfer is queued.
    #
    # link = "shared" (Dynamo): the evictions of one blocked Use (or swap-in)
    # are one job, sent in batches of ``batch_size`` blocks, each batch one
    # transfer; at most ``batch_size`` transfers run at once (later batches
    # wait and start, in order, at the tick that frees a slot); concurrent
    # transfers share the link's bandwidth (offload_link.SharedLink). The
    # job's source slots go back to free together when its last block has
    # arrived. A swap-in is one onboard transfer on the other link.
    #
    # Either way a zero or missing size makes transfers instant: they
    # complete at the next tick (even a tick to the same time).

    def _queue(self, kind: str, payload: G2Entry | _Onboard) -> None:
        assert self.offload is not None
        n = len(payload.blocks) if isinstance(payload, _Onboard) else 1
        start = max(self.now, self._link_free[kind])
        deadline = start + self.offload.transfer_ms() * n
        self._link_free[kind] = deadline
        self.pending.append(Transfer(deadline, self._transfer_seq, kind, payload))
        self._transfer_seq += 1

    def _start_transfer(self, kind: str, payload: _Batch | _Onboard, blocks: int) -> None:
        assert self.offload is not None
        ident = self._transfer_seq
        self._transfer_seq += 1
        self.transfers[ident] = payload
        self.links[kind].start(self.now, ident, blocks * (self.offload.block_size_bytes or 0))

    def _tick(self, op: Tick) -> Step:
        """TIME-MONOTONIC: move the clock to ``now_ms`` and complete every
        transfer due by then (fifo: earliest deadline first, queue order on
        a tie; shared: in the links' completion order, offloads first). A
        tick earlier than the clock changes nothing at all."""
        step: Step = self.take(TICK, op)
        return step

    def _advance(self, op: Tick) -> Step:
        quarantined = self.quarantined
        if op.now_ms < self.now:
            return Step(OpResult(value=self._tick_value(0, 0)), [])
        self.now = op.now_ms
        if self.tiers is not None:
            self.tiers.advance(self.now)
        if self.shared:
            done, events = self._tick_shared()
        else:
            done, events = self._tick_fifo()
        if self.tiers is not None:
            self.tiers.deliver(self.worker)
            events.extend(self._pending_tier_g2_events)
            self._pending_tier_g2_events = []
        return Step(OpResult(value=self._tick_value(done, quarantined - self.quarantined)), events)

    def _tick_value(self, transfers: int, released: int) -> int | None:
        """TIME-MONOTONIC: what a Tick returns, by ``tick_result``: nothing
        (Dynamo's ``KvManager::tick_offload_engine``), the G1 source slots the
        tick gave back (``MockOffloadEngine::tick``), or the transfers it
        completed (kvspec before the option). No offload tier: 0."""
        mode = self.offload.tick_result if self.offload is not None else "transfers"
        if mode == "none":
            return None
        return released if mode == "released_slots" else transfers

    def _tick_fifo(self) -> tuple[int, list[KvEvent]]:
        due = sorted(t for t in self.pending if t.deadline <= self.now)
        if not due:
            return 0, []
        done = {t.order for t in due}
        self.pending = [t for t in self.pending if t.order not in done]
        events: list[KvEvent] = []
        for t in due:
            if t.kind == "offload":
                events.extend(self._complete_offload(t.payload))
            else:
                events.extend(self._complete_onboard(t.payload))
        return len(due), events

    def _tick_shared(self) -> tuple[int, list[KvEvent]]:
        off = self.links["offload"].advance(self.now)
        on = self.links["onboard"].advance(self.now)
        events: list[KvEvent] = []
        for ident in off:
            batch = self.transfers.pop(ident)
            assert isinstance(batch, _Batch)
            events.extend(self._finish_batch(batch))
        while self.waiting and self._offload_slots_free():
            events.extend(self._start_batch(self.waiting.pop(0)))
        for ident in on:
            job = self.transfers.pop(ident)
            assert isinstance(job, _Onboard)
            events.extend(self._complete_onboard(job))
        return len(off) + len(on), events

    def _complete_offload(self, e: G2Entry) -> list[KvEvent]:
        """fifo: one block arrived: QUARANTINE-RELEASE (its source slot goes
        back to free, once), then G2-EVICT and G2-STORE-ON-COMPLETE."""
        self._release_slots(1)
        return self._arrive_in_g2(e)

    def _release_slots(self, n: int) -> None:
        """``n`` source slots go back to free (QUARANTINE-RELEASE)."""
        self.take(RELEASE, n)

    def _give_back_slots(self, n: int) -> None:
        self.quarantined -= n
        self.free += n

    # ------------------------------------------------- shared link: offload
    def _offload_slots_free(self) -> bool:
        assert self.offload is not None
        return len(self.links["offload"].active) < self.offload.batch_size

    def _enqueue_offload(self, entries: list[G2Entry], slots: int) -> list[KvEvent]:
        """One job for the evictions of one operation (``slots`` source slots
        held). Under dedup = "filter" a block G2 holds or that is on its way
        there is not sent (Dynamo's presence filter with its pending
        tracker); under g2_allocation = "at_start" the rest is admitted as
        far as G2 has room for it and the remainder dropped (Dynamo's
        capacity policy, ``G2Tier.admit``); a job with nothing to send frees
        its slots at once."""
        assert self.offload is not None
        if self.offload.dedup == "filter":
            entries = [e for e in entries if e.pid not in self.inflight and not self.g2tier.holds_lineage(e.pid)]
        at_start = self.offload.g2_allocation == "at_start"
        if self.job_fails_whole and len(entries) > self.g2tier.available() - (self.g2tier.admitted if at_start else 0):
            # follow mode offload_job_fails_whole: nothing is sent, and the
            # source slots are never given back
            return []
        if at_start:
            # Dynamo's capacity policy admits the job at enqueue, in order,
            # against what G2 could hand out; what does not fit is dropped
            entries = entries[: self.g2tier.admit(len(entries))]
        job = _OffloadJob(slots)
        if not entries:
            self._release_slots(slots)
            return []
        job.left = len(entries)
        for e in entries:
            self.inflight[e.pid] = self.inflight.get(e.pid, 0) + 1
        events: list[KvEvent] = []
        size = self.offload.batch_size
        for i in range(0, len(entries), size):
            batch = _Batch(job, entries[i : i + size])
            if self._offload_slots_free() and not self.waiting:
                events.extend(self._start_batch(batch))
            else:
                self.waiting.append(batch)
        return events

    def _start_batch(self, batch: _Batch) -> list[KvEvent]:
        """Start one batch's transfer; under g2_allocation = "at_start" its
        G2 destinations are taken now (G2 evicts for them, and publishes it,
        now). A block that finds no destination (every G2 block pinned by a
        swap-in or reserved) is not sent: it fails."""
        assert self.offload is not None
        events: list[KvEvent] = []
        if self.offload.g2_allocation == "at_start":
            kept: list[G2Entry] = []
            for e in batch.entries:
                got, victims = self.g2tier.make_room()
                events.extend(self._g2_evicted(victims))
                if got:
                    self.g2tier.reserved += 1
                    batch.reserved += 1
                    kept.append(e)
                else:
                    self.g2tier.admitted -= 1
                    self._settle(batch.job, e)
            batch.entries = kept
            if not kept:
                return events
        self._start_transfer("offload", batch, len(batch.entries))
        return events

    def _settle(self, job: _OffloadJob, e: G2Entry) -> None:
        """``e`` arrived or failed: it is no longer in flight; the job's
        source slots go back when its last block is settled."""
        n = self.inflight[e.pid] - 1
        if n:
            self.inflight[e.pid] = n
        else:
            del self.inflight[e.pid]
        job.left -= 1
        if job.left == 0:
            self._release_slots(job.slots)

    def _finish_batch(self, batch: _Batch) -> list[KvEvent]:
        events: list[KvEvent] = []
        for e in batch.entries:
            if batch.reserved:
                batch.reserved -= 1
                self.g2tier.reserved -= 1
                self.g2tier.admitted -= 1
                events.extend(self._register_in_g2(e, reserved=True))
            else:
                events.extend(self._arrive_in_g2(e))
        for e in batch.entries:
            self._settle(batch.job, e)
        if self.tiers is not None:
            self.tiers.cascade(self.worker, [e for e in batch.entries if e.seq in self.g2tier])
        return events

    # --------------------------------------------------------- G2 arrivals
    def _g2_evicted(self, victims: list[int], *, staged: bool = False) -> list[KvEvent]:
        """The host-pinned Removed of G2's victims, one per block (``staged``: made room for blocks
        staged back from G3/G4)."""
        out: list[KvEvent] = []
        for v in victims:
            if v in self.g2tier.silent:  # staged from G3/G4: never announced
                self.g2tier.silent.discard(v)
                continue
            out.append(self.take(G2_EVICTION, (v, staged)))
        return out

    def _g2_removed(self, victim: tuple[int, bool]) -> KvEvent:
        return self.publish(self._removed([victim[0]], "host_pinned"), self.which(G2_EVICTION, victim))

    def _arrive_in_g2(self, e: G2Entry) -> list[KvEvent]:
        """G2-EVICT then G2-STORE-ON-COMPLETE for a block whose destination is
        taken on arrival (g2_allocation = "at_completion")."""
        if e.seq in self.g2tier:
            return self._register_in_g2(e, reserved=False)
        got, victims = self.g2tier.make_room()
        events = self._g2_evicted(victims)
        if got:
            events.extend(self._register_in_g2(e, reserved=False))
        return events

    def _register_in_g2(self, e: G2Entry, *, reserved: bool) -> list[KvEvent]:
        """G2-STORE-ON-COMPLETE: host-pinned Stored with the metadata G1
        registered. A block G2 already holds is not stored twice (it only
        becomes G2's most recently used under LRU; a reserved destination
        goes back)."""
        if e.seq in self.g2tier:
            self.g2tier.use(e.seq)
            return []
        return [self.take(G2_STORE, e)]

    def _g2_store(self, e: G2Entry) -> KvEvent:
        self.g2tier.register(e)
        ev = make_stored(
            self.next_event_id,
            [e.seq],
            [e.local_hash],
            e.parent_hash,
            dp_rank=self.dp_rank,
            tier="host_pinned",
            token_ids=[e.token_ids] if e.token_ids is not None else None,
        )
        self.next_event_id += 1
        return self.publish(ev, G2_STORE[0])

    # ------------------------------------------------------------- swap-in
    def _validate_swap_in(self, op: SwapIn) -> None:
        """A swap-in names blocks by (sequence hash, lineage hash); both must
        agree with what G1 and G2 hold, as for a Use (USE-VALIDATE)."""
        for blk in op.blocks:
            self._check_identity(blk.seq_hash, blk.plh)
            g2 = self.g2.get(blk.seq_hash)
            if g2 is not None and plh_id(g2.plh) != plh_id(blk.plh):
                raise InvalidOperation(
                    rid("USE-VALIDATE"),
                    f"block {blk.seq_hash} is held in G2 with lineage hash {plh_id(g2.plh)}, not {plh_id(blk.plh)}",
                )

    def _swap_in(self, op: SwapIn, prefer: Collection[int]) -> Step:
        """SWAPIN-RESERVE: find the longest prefix of ``op.blocks`` held in G2
        and reserve one G1 slot per block before anything else (free slots
        first, then evictions, which with an offload tier block the swap-in
        like a Use); on success queue one onboard transfer for the prefix.
        Under g2_eviction = "lineage" the prefix is pinned in G2 from the
        lookup on, and unpinned when the swap-in fails or completes."""
        self._validate_swap_in(op)
        if self.offload is None:
            return Step(OpResult(value=0, status="no_hits"), [])
        prefix: list[tuple[int, Plh, G2Entry]] = []
        for blk in op.blocks:
            g2 = self.g2.get(blk.seq_hash)
            if g2 is None:
                break
            prefix.append((blk.seq_hash, blk.plh, g2))
        staged = self._lower_tier_run(op, len(prefix))
        if not prefix and not staged:
            return Step(OpResult(value=0, status="no_hits"), [])
        lineage = self.offload.g2_eviction == "lineage"
        seqs = [seq for seq, _plh, _e in prefix]
        if lineage:
            self.g2tier.pin(seqs)
        self._evicted_meta = {}
        reserved = 0
        evicted: list[int] = []
        total = len(prefix) + len(staged)
        while reserved < total:
            got, victim = self._take_slot(prefer)
            if victim is not None:
                evicted.append(victim)
            if not got:
                if victim is None:  # no slot at all: the seed reports no hits
                    self.free += reserved  # the reserved slots are given back
                    self.g2tier.admitted -= len(staged)
                    return Step(OpResult(value=0, status="no_hits"), self._end_unreserved_swap_in(seqs, evicted))
                # blocked on a G1 offload: while the reserved slots are still
                # held, evict (and quarantine) as many more victims as the
                # reservation still lacks, so that they offload together
                for _ in range(total - reserved - 1):
                    if self.free:
                        break
                    v = self._pick_victim(prefer)
                    if v is None:
                        break
                    self._evict(v)
                    evicted.append(v)
                self.free += reserved  # then the reserved slots are given back
                self.g2tier.admitted -= len(staged)
                return Step(OpResult(value=0, status="blocked_on_offload"), self._end_unreserved_swap_in(seqs, evicted))
            reserved += 1
        step: Step = self.take(RESERVE, _Reservation(op, prefix, staged, seqs, evicted, reserved, lineage))
        return step

    def _reserved(self, r: _Reservation) -> Step:
        """SWAPIN-RESERVE: every block of the run has its G1 slot; the onboard starts (or its
        staging from G3/G4)."""
        op, prefix, staged, seqs, evicted, reserved, lineage = (
            r.op,
            r.prefix,
            r.staged,
            r.seqs,
            r.evicted,
            r.reserved,
            r.lineage,
        )
        self.reserved += reserved
        if not lineage:  # copying a block back counts as a use of it in G2
            self.g2tier.pin(seqs)
        job = _Onboard(prefix + [(e.seq, e.plh, e) for _tier, e in staged], op.parent, reserved)
        if staged:
            assert self.tiers is not None
            for tier in ("g3", "g4"):
                part = [e for t, e in staged if t == tier]
                if part:
                    job.stages += 1
                    self.tiers.stage(self.worker, tier, part, job)
        elif self.shared:
            self._start_transfer("onboard", job, reserved)
        else:
            self._queue("onboard", job)
        return Step(OpResult(value=reserved, status="scheduled"), self._publish_evictions(evicted))

    def _lower_tier_run(self, op: SwapIn, start: int) -> list[tuple[str, G2Entry]]:
        """TIER-ONBOARD: past the G2 prefix, the run G3 holds, then the run G4
        holds (Dynamo's planner: tiers in that order, no interleaving). Staged
        only if G2 can take them all now (its staging reservation, all or
        nothing, ``engine.rs`` ``prepare_onboard_prefix``); else nothing."""
        if self.tiers is None:
            return []
        run: list[tuple[str, G2Entry]] = []
        rest = op.blocks[start:]
        for tier in ("g3", "g4"):
            while rest:
                e = self.tiers.lookup(tier, rest[0].seq_hash, plh_id(rest[0].plh))
                if e is None:
                    break
                run.append((tier, e))
                rest = rest[1:]
        if not run or self.g2tier.available() - self.g2tier.admitted < len(run):
            return []
        self.g2tier.admitted += len(run)
        return run

    def _end_unreserved_swap_in(self, seqs: list[int], evicted: list[int]) -> list[KvEvent]:
        """A swap-in that reserved no destination (blocked or no hits) ends:
        its evictions are offloaded first, while the G2 prefix is still
        pinned, and only then is the prefix unpinned. Dynamo holds the
        prefix's G2 blocks from the lookup until ``try_batch_swap_in``
        returns, so under g2_allocation = "at_start" a transfer started by
        the reservation's evictions never evicts the prefix from G2
        (ai-dynamo/dynamo ``lib/mocker/src/kv_manager/kvbm_backend.rs``,
        ``try_batch_swap_in`` and ``reserve_swap_in_destination_slots``;
        finding F6, ``offload/blocked_swap_in_keeps_g2_prefix_pinned``)."""
        events = self._publish_evictions(evicted)
        if self.offload is not None and self.offload.g2_eviction == "lineage":
            self.g2tier.unpin(seqs)
        return events

    def _complete_onboard(self, job: _Onboard) -> list[KvEvent]:
        """SWAPIN-SKIP-PRESENT and SWAPIN-ANCHOR: register the onboarded blocks
        as inactive with the metadata G2 held; a block already in G1 (by
        sequence hash or lineage hash) gives its slot back, closes the current
        Stored group and anchors the next one to itself."""
        events: list[KvEvent] = []
        group: list[int] = []
        group_meta: list[Block] = []
        links: list[int | None] = [job.parent, job.parent]
        slots = job.slots
        self.reserved -= job.slots
        for seq, plh, meta in job.blocks[: job.slots]:
            slots -= 1
            ev = self.take(ONBOARD, _Landing(seq, plh, meta, group, group_meta, links))
            if ev is not None:
                events.append(ev)
        self.free += slots
        if group:
            events.append(self.publish(self._stored(group, group_meta, links[0]), SWAPIN_ANCHOR))
        if self.offload is not None and self.offload.g2_eviction == "lineage":
            self.g2tier.unpin([seq for seq, _plh, _e in job.blocks])
        return events

    def _present(self, x: _Landing) -> bool:
        return x.seq in self.blocks or plh_id(x.plh) in self.by_plh

    def _skip_present(self, x: _Landing) -> KvEvent | None:
        """SWAPIN-SKIP-PRESENT: the block's slot goes back; it closes the current Stored group
        (returned) and anchors the next one."""
        self.free += 1
        ev = None
        if x.group:
            ev = self.publish(self._stored(list(x.group), list(x.group_meta), x.links[0]), SWAPIN_ANCHOR)
            x.group.clear()
            x.group_meta.clear()
        x.links[0] = x.links[1] = x.seq
        return ev

    def _land_onboarded(self, x: _Landing) -> None:
        """SWAPIN-ANCHOR: registered inactive with G2's metadata, after the block before it."""
        seq, plh, meta = x.seq, x.plh, x.meta
        b = Block(seq, plh, x.links[1], meta.local_hash, meta.token_ids, owners=0)
        self.blocks[seq] = b
        self.by_plh[plh_id(plh)] = seq
        self.freq.touch(b.pid)  # registering the onboarded block is a touch
        self.policy.insert(seq, (plh.position, plh.hash), plh.parent_key(), self.freq.count(b.pid))
        x.group.append(seq)
        x.group_meta.append(b)
        x.links[1] = seq


class _TouchView:
    """``model.touches[seq]``: the touch count of registered block ``seq``
    (kept for callers that name blocks by sequence hash)."""

    __slots__ = ("_model",)

    def __init__(self, model: G1Model) -> None:
        self._model = model

    def __getitem__(self, seq: int) -> int:
        m = self._model
        return m.freq.count(m.blocks[seq].pid)


def _tokens_key(toks: list[int] | None) -> tuple[int, ...] | None:
    return None if toks is None else tuple(toks)


def _entry_key(e: G2Entry) -> Any:
    return (e.seq, plh_id(e.plh), e.parent_hash, e.local_hash, _tokens_key(e.token_ids))


def _payload_key(t: Transfer) -> Any:
    """What a pending transfer carries, as a comparable value (fingerprint)."""
    p = t.payload
    if isinstance(p, G2Entry):
        return _entry_key(p)
    return _batch_key(p)


def _batch_key(p: _Batch | _Onboard) -> Any:
    if isinstance(p, _Batch):
        return ("batch", p.job.slots, p.job.left, tuple(_entry_key(e) for e in p.entries), p.reserved)
    return (tuple((seq, plh_id(plh)) for seq, plh, _ in p.blocks), p.parent, p.slots)
