"""The encoding against the Python model, operation by operation.

Proofs about an encoding that has drifted from the model prove nothing, so
this module runs the same operations through both and compares, after every
operation:

- the abstract state: counters, partial uuids, registered blocks with owners
  and recorded parents, the inactive pool's LRU order, pending transfers in
  queue order (with what they carry), G2's contents in LRU order, and the
  router's views (the model's: a ``RouterView`` fed the model's events);
- the result, the status, the counters and the events, exactly;
- rejections: the model raises ``InvalidOperation`` exactly when the
  encoding's operation is not valid, with the same rule id, and the encoding
  then keeps its state;
- INV-ANCHOR: the router view flags PARENT-ANCHOR exactly when the
  encoding's operation-level anchor check fails;
- the caller contracts: the ASSUME-* ids the encoding's step finds broken are
  those ``reference/caller_contracts.py`` finds on the model (the statement
  the conformance lockstep checks its traffic with).

The encoding's successor is computed from its own concrete state with
canonical choices (lowest free slot; the LRU victim) and must satisfy every
choice constraint of its rules, so the model's successor is a successor of
the transition relation. It is also the only one up to renaming slots: the
LRU ticks and G2 times of a reachable state are distinct, so no rule has a
second victim to choose (checked on every state).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import z3

from kvspec.reference.caller_contracts import broken_contracts, settle
from kvspec.reference.g1 import G1Model
from kvspec.reference.router_view import RouterView
from kvspec.reference.smt.concrete import ConcreteState
from kvspec.reference.smt.offload.events import assemble, concrete_eval
from kvspec.reference.smt.offload.operations_prove import Mutate, Reshape
from kvspec.reference.smt.offload.ops import (
    STATUS_NAMES,
    BlockArg,
    Chooser,
    DerefOp,
    Op,
    PromoteOp,
    SwapInOp,
    TickOp,
    UseOp,
    apply_op,
    counters,
)
from kvspec.reference.smt.offload.state import Rigid, State
from kvspec.reference.smt.terms import first_where
from kvspec.reference.smt.universe import INACTIVE, NONE, Bound
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.registry import KVBM_NAME
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import (
    Deref,
    FullBlock,
    Operation,
    PartialBlock,
    Plh,
    Promote,
    SwapIn,
    SwapInBlock,
    Tick,
    Use,
    event_to_json,
)

#: every eviction policy of the model; the encoding follows the model's
#: victim under each, and checks it is one its rules allow (an inactive block)
PolicyName = Literal["lineage", "lru", "multi_lru", "unordered"]
POLICY_NAMES: tuple[PolicyName, ...] = ("lineage", "lru", "multi_lru", "unordered")


@dataclass(frozen=True)
class Universe:
    """A concrete universe shared by the model and the encoding: ``slots`` G1
    slots (the model's capacity), block hashes 0..len(par)-1 forming the
    forest ``par`` (NONE for a root), G2 capacity ``cap2``, and a policy."""

    slots: int
    par: tuple[int, ...]
    cap2: int
    policy: PolicyName = "lru"

    @property
    def encoding_policy(self) -> Literal["lru", "unordered"]:
        """The encoding's victim rule for this policy: LRU's own, or any
        inactive block (lineage and multi-LRU pick one of those)."""
        return "lru" if self.policy == "lru" else "unordered"

    @property
    def bound(self) -> Bound:
        return Bound(self.slots, len(self.par))

    def config(self) -> ManagerConfig:
        return ManagerConfig(
            profile=KVBM_NAME,
            capacity=self.slots,
            eviction=self.policy,
            # the encoding covers the legacy offload semantics (a serial FIFO
            # link, G2 by LRU, G2 destinations taken on arrival, resend):
            # SPEC.md, "Offload semantics options"
            offload=OffloadConfig.legacy(num_g2_blocks=self.cap2),
        )

    def depth(self, h: int) -> int:
        d = 0
        while self.par[h] != NONE:
            h = self.par[h]
            d += 1
        return d

    def plh(self, h: int) -> Plh:
        p = self.par[h]
        return Plh(hash=h, parent=None if p == NONE else p, position=self.depth(h))

    def chain(self, h: int) -> list[int]:
        """The path from a root to ``h``."""
        out = [h]
        while self.par[out[-1]] != NONE:
            out.append(self.par[out[-1]])
        return out[::-1]

    def initial(self) -> State:
        return State.initial(self.bound, Rigid.concrete(self.cap2, list(self.par)))


def uuid_index(u: str) -> int:
    if not u.startswith("u") or not u[1:].isdigit():
        raise ValueError(f"partial uuids of the encoding are 'u0', 'u1', ...; got {u!r}")
    return int(u[1:])


def _block(ref: FullBlock | PartialBlock) -> BlockArg:
    if isinstance(ref, FullBlock):
        return BlockArg(True, h=ref.full)
    return BlockArg(False, u=uuid_index(ref.partial))


def to_encoding(op: Operation, forward: bool = True) -> Op:
    """The encoding's operation for a wire operation of the model."""
    if isinstance(op, Use):
        parent = op.parent.full if isinstance(op.parent, FullBlock) else NONE
        return UseOp([_block(b) for b in op.blocks], parent)
    if isinstance(op, Deref):
        return DerefOp([_block(b) for b in op.blocks])
    if isinstance(op, Promote):
        return PromoteOp(uuid_index(op.uuid), op.seq_hash, NONE if op.parent_hash is None else op.parent_hash)
    if isinstance(op, Tick):
        return TickOp(forward)
    if isinstance(op, SwapIn):
        return SwapInOp([b.seq_hash for b in op.blocks], NONE if op.parent is None else op.parent)
    raise TypeError(f"the encoding has no operation {type(op).__name__}")


# ---------------------------------------------------------------- wire ops


def use_op(u: Universe, blocks: Sequence[int | str], parent: int | None = None) -> Use:
    refs: list[FullBlock | PartialBlock] = [
        FullBlock(full=b) if isinstance(b, int) else PartialBlock(partial=b) for b in blocks
    ]
    fulls = [b for b in blocks if isinstance(b, int)]
    return Use(blocks=refs, plhs=[u.plh(h) for h in fulls], parent=None if parent is None else FullBlock(full=parent))


def deref_op(blocks: Sequence[int | str]) -> Deref:
    return Deref(blocks=[FullBlock(full=b) if isinstance(b, int) else PartialBlock(partial=b) for b in blocks])


def promote_op(u: Universe, uuid: str, h: int) -> Promote:
    p = u.par[h]
    return Promote(uuid=uuid, seq_hash=h, parent_hash=None if p == NONE else p, local_hash=0, plh=u.plh(h))


def swap_in_op(u: Universe, blocks: Sequence[int], parent: int | None) -> SwapIn:
    return SwapIn(blocks=[SwapInBlock(seq_hash=h, plh=u.plh(h)) for h in blocks], parent=parent)


# ------------------------------------------------------------- abstractions


def _pool_order(m: G1Model) -> list[int]:
    """The inactive pool in the order its blocks entered it. LRU, unordered
    and lineage iterate in that order; multi-LRU iterates level by level, so
    only the set is compared there (its recency is the same pool order, and
    the other policies compare it)."""
    if m.policy.name == "multi_lru":
        return sorted(m.policy)
    return list(m.policy)


def model_abstraction(m: G1Model) -> dict[str, Any]:
    """What the model's state says, in the encoding's terms (slots unnamed)."""
    pending: list[Any] = []
    for t in sorted(m.pending):
        p = t.payload
        if t.kind == "offload":
            pending.append(("offload", p.seq, NONE if p.parent_hash is None else p.parent_hash))
        else:
            pending.append(
                ("onboard", tuple(seq for seq, *_ in p.blocks[: p.slots]), NONE if p.parent is None else p.parent)
            )
    return {
        "free": m.free,
        "quarantined": m.quarantined,
        "reserved": m.reserved,
        "active_full": m.active_full,
        "refs": m.refs,
        "partial": sorted(uuid_index(u) for u in m.partial),
        "blocks": {
            s: (b.owners, NONE if b.parent_hash is None else b.parent_hash) for s, b in sorted(m.blocks.items())
        },
        "unannounced": sorted(s for s, b in m.blocks.items() if not b.announced),
        "lru": _pool_order(m),
        "pending": pending,
        "g2": list(m.g2),
        "g2_parent": {s: NONE if e.parent_hash is None else e.parent_hash for s, e in m.g2.items()},
    }


def encoding_abstraction(c: ConcreteState, policy: str = "lru") -> dict[str, Any]:
    n, v = c.bound.slots, c.values
    pending: list[tuple[int, Any]] = [
        (v["pord"][s], ("offload", v["pblk"][s], v["pmpar"][s])) for s in range(n) if v["pend"][s]
    ]
    for j in c.live_jobs():
        slots = [s for s in range(n) if v["st"][s] == "reserved" and v["jid"][s] == j]
        pending.append((v["jord"][j], ("onboard", tuple(v["blk"][s] for s in slots), v["jpar"][j])))
    g2 = sorted((v["g2t"][h], h) for h in range(c.bound.hashes) if v["g2"][h])
    inactive = sorted((v["itick"][s], v["blk"][s]) for s in range(n) if v["st"][s] == "inactive")
    return {
        "free": v["free_c"],
        "quarantined": v["quar_c"],
        "reserved": v["resv_c"],
        "active_full": v["afull_c"],
        "refs": v["refs_c"],
        "partial": sorted(v["pu"][s] for s in range(n) if v["st"][s] == "partial"),
        "blocks": {
            v["blk"][s]: (v["own"][s], v["mpar"][s])
            for s in sorted(range(n), key=lambda s: v["blk"][s])
            if v["st"][s] in ("active", "inactive")
        },
        "unannounced": [],
        "lru": sorted(h for _t, h in inactive) if policy == "multi_lru" else [h for _t, h in inactive],
        "pending": [p for _o, p in sorted(pending)],
        "g2": [h for _t, h in g2],
        "g2_parent": {h: v["g2par"][h] for _t, h in g2},
    }


def determinism_problems(c: ConcreteState) -> list[str]:
    """Where a rule of the encoding could choose between two outcomes that the
    model orders (equal LRU ticks, equal G2 times, equal queue positions)."""
    n, v = c.bound.slots, c.values
    out: list[str] = []
    ticks = [v["itick"][s] for s in range(n) if v["st"][s] == "inactive"]
    if len(set(ticks)) != len(ticks):
        out.append(f"two inactive blocks share an LRU tick: {ticks}")
    times = [v["g2t"][h] for h in range(c.bound.hashes) if v["g2"][h]]
    if len(set(times)) != len(times):
        out.append(f"two G2 blocks share an LRU time: {times}")
    orders = [v["pord"][s] for s in range(n) if v["pend"][s]] + [v["jord"][j] for j in c.live_jobs()]
    if len(set(orders)) != len(orders):
        out.append(f"two pending transfers share a queue position: {orders}")
    return out


# -------------------------------------------------------------------- runner


@dataclass
class OffloadMismatch:
    index: int
    op: Operation
    what: str
    model: Any
    encoding: Any

    def __str__(self) -> str:
        return (
            f"operation {self.index} ({self.op!r}): {self.what}\n  model:    {self.model}\n  encoding: {self.encoding}"
        )


class _Following(Chooser):
    """Choose the victims the model chose: the first of them the state still
    holds as inactive (each eviction quarantines its victim, so the next call
    moves on to the next)."""

    def __init__(self, victims: list[int]) -> None:
        super().__init__("unordered", free_victims=False)
        self.victims = victims

    def victim(self, S: State) -> z3.ExprRef:
        for h in self.victims:
            slots = [z3.And(S.st[k] == INACTIVE, S.blk[k] == h) for k in S.slots]
            if z3.is_true(z3.simplify(z3.Or(slots))):
                return first_where(slots)
        return z3.IntVal(0)  # no victim needed (the rule's choice is unused)

    def victim_policy(self) -> Any:
        return "unordered"


@dataclass
class EncodingLockstep:
    """The model, a router view of its events, and the encoding's state, side by side."""

    universe: Universe
    model: G1Model = field(init=False)
    view: RouterView = field(init=False)
    state: State = field(init=False)
    now: float = 0.0
    next_event_id: int = 0
    index: int = 0

    #: (operation index, contract id) for every caller contract an operation broke
    contract_breaks: list[tuple[int, str]] = field(default_factory=list)
    #: an operation-level mutant in force on the encoding's side (``op_mutants.py``): its change
    #: to every step an operation takes, and to a whole operation's outcome
    mutate: Mutate | None = None
    reshape: Reshape | None = None

    def _chooser(self, victims: list[int]) -> Chooser:
        """LRU and unordered: the encoding's own LRU victim (the model's pick
        under both), so a wrong LRU order in the encoding shows. Lineage and
        multi-LRU: the model's victims, in order; the encoding's rules must
        allow each (``constraints``: an inactive block)."""
        if self.universe.policy in ("lru", "unordered"):
            return Chooser("lru")
        return _Following(victims)

    def __post_init__(self) -> None:
        self.model = G1Model(self.universe.config())
        self.view = RouterView(anchored_tiers=("device",))
        self.state = self.universe.initial()

    def step(self, op: Operation, prefer: Iterable[int] = ()) -> list[OffloadMismatch]:
        """Apply ``op`` to both; return every difference found (empty: agree).
        Caller contracts the operation breaks are recorded in
        ``contract_breaks`` (a difference only if the caller says it keeps them)."""
        i, self.index = self.index, self.index + 1
        forward = not (isinstance(op, Tick) and op.now_ms < self.now)
        enc_op = to_encoding(op, forward)
        problems: list[OffloadMismatch] = []

        def diff(what: str, a: Any, b: Any) -> None:
            if a != b:
                problems.append(OffloadMismatch(i, op, what, a, b))

        victims: list[int] = []
        pick = self.model._pick_victim

        def recording(prefer: Any) -> int | None:
            v = pick(prefer)
            if v is not None:
                victims.append(v)
            return v

        said = broken_contracts(self.model, op)  # the model-side statement of the contracts
        self.model._pick_victim = recording  # type: ignore[method-assign]
        model_error: InvalidOperation | None = None
        try:
            step = self.model.apply(op, prefer=list(prefer))
        except InvalidOperation as e:
            model_error = e
        finally:
            del self.model._pick_victim
        ch = self._chooser(victims)
        ch.mutate = self.mutate
        out = apply_op(self.state, enc_op, ch, concrete=True)
        if self.reshape is not None:
            out = self.reshape(self.state, enc_op, out)
        valid = concrete_eval(out.valid)
        if model_error is not None:
            diff("rejected (rule id)", str(model_error.rule), out.error if not valid else "(accepted)")
            return problems
        if not valid:
            diff("accepted", "accepted", f"rejected [{out.error}]")
            return problems
        for c in out.constraints:
            if not concrete_eval(c):
                diff("the encoding's choice satisfies its rule", True, str(z3.simplify(c))[:200])
        broken = sorted(cid for cid, c in out.contracts.items() if not concrete_eval(c))
        self.contract_breaks += [(i, cid) for cid in broken]
        diff(
            "caller contracts broken (reference/caller_contracts.py == the encoding's)",
            sorted(b.id for b in settle(said, step.result.status or "ok")),
            broken,
        )
        if forward and isinstance(op, Tick):
            self.now = op.now_ms
        post = ConcreteState.from_terms(out.post)
        events = assemble(out, concrete_eval, self.next_event_id, self.model.dp_rank)
        self.next_event_id += len(events)
        diff("events", [event_to_json(e) for e in step.events], [event_to_json(e) for e in events])
        value = None if out.value is None else concrete_eval(out.value)
        diff(
            "result",
            (step.result.value, step.result.status),
            (value, STATUS_NAMES[concrete_eval(out.status)] if out.value is not None else "ok"),
        )
        diff(
            "counters", self.model.counters().model_dump(), {k: concrete_eval(t) for k, t in counters(out.post).items()}
        )
        diff("state", model_abstraction(self.model), encoding_abstraction(post, self.universe.policy))
        violations = self.view.apply_batch(step.events)
        anchor_broken = any(v.rule == RuleId.PARENT_ANCHOR for v in violations)
        diff(
            "INV-ANCHOR (router flags PARENT-ANCHOR <=> encoding's anchor check fails)",
            anchor_broken,
            not concrete_eval(out.anchor_ok),
        )
        diff("router device view == encoding's device view", sorted(self.view.stored("device")), post.view("dev"))
        diff(
            "router host-pinned view == encoding's host-pinned view",
            sorted(self.view.stored("host_pinned")),
            post.view("g2v"),
        )
        for p in determinism_problems(post):
            problems.append(OffloadMismatch(i, op, "determinism", "unique choices", p))
        self.state = post.to_state()
        return problems

    def run(self, ops: Iterable[Any]) -> list[OffloadMismatch]:
        out: list[OffloadMismatch] = []
        for op in ops:
            out += self.step(op)
            if out:
                break
        return out
