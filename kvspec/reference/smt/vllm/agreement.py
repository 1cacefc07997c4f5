"""The vllm operation-level encoding against the Python model, operation by operation.

A proof about an encoding that has drifted from the model proves nothing.
This runs sampled operations through the model (``reference/vllm_pool.py``)
and, for each one, builds the encoding's state from the model's pre-state
(one Block constant per physical block: its state, hash, owners; the copy
counts; the router's counts built from the model's *own published events*)
and runs the operation's steps (``profile_vllm_ops``) with the choices the
model made (which copy a hit pins, which physical block each fresh block
takes: a free one, or the slot of the copy it evicted; which copy a Deref
releases). Every step must be enabled and the steps must end in the model's
post-state, with the router's counts after the model's events and the
assembled Stored's parent equal to the model's. A Use the model refuses
(capacity) must change nothing in the model and be refused by the
encoding's check; a refused Reset likewise. A mismatch names the operation.

Operations whose caller breaks ASSUME-PARENT-REGISTERED (a parent with no
owned copy) are counted, not compared: the encoding does not cover them.

The sampled caller releases a promoted block by its uuid only: the model
does not reject a Deref that names it by its hash as well (the copy's owner
count goes to -1), nor does it forget the uuid of a promoted block released
by its hash and then evicted (a later Reset is refused, a Deref of the uuid
raises KeyError); both are reported, not exercised here.

Encoding mutants (``profile_vllm_ops.MUTANTS`` of each kind: parent, copy
count, all-or-nothing) must be caught: ``first_mismatch`` gives the number
of operations it took (``benchmarks/vllm_agreement.py`` measures it over
seeds).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.vllm import ops as ops
from kvspec.reference.smt.vllm.copies import V_CACHED, V_FREE, V_HELD, Block
from kvspec.reference.vllm_pool import VllmPoolModel
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.registry import VLLM_NAME
from kvspec.spec.wire import (
    Deref,
    FullBlock,
    KvEvent,
    Operation,
    PartialBlock,
    Plh,
    Promote,
    Removed,
    Reset,
    Stored,
    Use,
)

HASHES, UUIDS, CAPACITY = 5, 3, 5
#: operations per seed the tests run unmutated, and the budget in which every
#: agreement mutant was caught on each of seeds 0..9
#: (``benchmarks/vllm_agreement_budget.py``: worst first catch, see its output)
SPEC_OPS, BUDGET = 60, 200
#: prompts the sampled Uses take prefixes of (they share leading blocks, then diverge)
PROMPTS = ((0, 1, 2, 3, 4), (0, 2, 1, 4, 3), (1, 0, 2, 3, 4))
#: the encoding mutants the agreement check must catch (the contract mutant
#: changes what the caller may do, not what the model does: not one of them)
AGREEMENT_MUTANTS = ("parent-moves", "store-new-only", "remove-last-only", "check-before-pins")


@dataclass
class Mirror:
    """The model, its physical blocks' places in the encoding, and a router fed by its events."""

    model: VllmPoolModel
    slot: dict[int, int] = field(default_factory=dict)  # copy id -> block index
    router: Counter[int] = field(default_factory=Counter)

    def free_slots(self) -> list[int]:
        used = set(self.slot.values())
        return [i for i in range(self.model.capacity) if i not in used]

    def feed(self, events: list[KvEvent]) -> None:
        for ev in events:
            d = ev.data
            if ev.storage_tier != "device":
                continue
            if isinstance(d, Stored):
                self.router.update(b.block_hash for b in d.stored.blocks)
            elif isinstance(d, Removed):
                self.router.subtract(d.removed.block_hashes)
            else:
                self.router.clear()


@dataclass(frozen=True)
class Snapshot:
    """What the encoding needs of the model's pre-state."""

    owners: dict[int, int]
    seqs: dict[int, int | None]
    by_hash: dict[int, list[int]]
    inactive: list[int]
    held: dict[str, int]
    free: int
    next_cid: int
    router: dict[int, int]


def snapshot(m: Mirror) -> Snapshot:
    p = m.model
    return Snapshot(
        {c: x.owners for c, x in p.copies.items()},
        {c: x.seq for c, x in p.copies.items()},
        {h: list(ids) for h, ids in p.by_hash.items()},
        list(p.inactive),
        dict(p.held),
        p.free,
        p.next_cid,
        dict(m.router),
    )


def _state(m: Mirror, snap: Snapshot, bs: list[z3.ExprRef]) -> ops.VllmOpState:
    """The encoding's state of the model (between operations: nothing pending)."""
    st, hsh, own = z3.K(Block, V_FREE), z3.K(Block, z3.IntVal(0)), z3.K(Block, z3.IntVal(0))
    for cid, i in m.slot.items():
        seq = snap.seqs[cid]
        st = z3.Store(st, bs[i], V_HELD if seq is None else V_CACHED)
        hsh = z3.Store(hsh, bs[i], z3.IntVal(seq if seq is not None else 0))
        own = z3.Store(own, bs[i], z3.IntVal(snap.owners[cid] if seq is not None else 0))
    ccnt, view = z3.K(z3.IntSort(), z3.IntVal(0)), z3.K(z3.IntSort(), z3.IntVal(0))
    for h, ids in snap.by_hash.items():
        ccnt = z3.Store(ccnt, h, len(ids))
    for h, n in snap.router.items():
        view = z3.Store(view, h, n)
    cached = [c for c, s in snap.seqs.items() if s is not None]
    zero = z3.K(z3.IntSort(), z3.IntVal(0))
    cnt = {
        "free": z3.IntVal(m.model.capacity - len(m.slot)),
        "held": z3.IntVal(len(snap.seqs) - len(cached)),
        "cached": z3.IntVal(len(cached)),
        "idle": z3.IntVal(sum(1 for c in cached if snap.owners[c] == 0)),
    }
    uo = z3.K(Block, z3.BoolVal(False))
    for cid in snap.held.values():
        if snap.seqs.get(cid) is not None:
            uo = z3.Store(uo, bs[m.slot[cid]], z3.BoolVal(True))
    return ops.VllmOpState(
        st, hsh, own, z3.K(Block, z3.BoolVal(False)), uo, ccnt, zero, view, zero, zero, cnt,
        z3.IntVal(ops.IDLE), z3.IntVal(ops.NONE), bs[0], z3.IntVal(ops.NONE), bs[0], z3.BoolVal(False),
        z3.IntVal(0), z3.IntVal(0),
    )  # fmt: skip


def _inp(h: int = 0, b: z3.ExprRef | None = None, p: int = ops.NONE, pb: z3.ExprRef | None = None, F: int = 0) -> dict:
    return {"h": z3.IntVal(h), "b": b, "p": z3.IntVal(p), "pb": pb, "F": z3.IntVal(F)}


def _owned_copy(snap: Snapshot, h: int | None) -> int | None:
    """A copy of ``h`` with an owner (the caller's parent, held by the request), or None."""
    if h is None:
        return None
    return next((c for c in snap.by_hash.get(h, []) if snap.owners[c] >= 1), None)


class VllmMismatch(Exception):
    """The encoding cannot make the model's move."""


def _run(
    S: ops.VllmOpState, steps: list[tuple[str, dict]], tw: frozenset[str]
) -> tuple[ops.VllmOpState, list[z3.BoolRef], list[tuple[z3.BoolRef, z3.ArithRef]]]:
    reqs: list[z3.BoolRef] = []
    stored = []
    for name, inp in steps:
        step = ops.TRANSITIONS[name](S, inp, tw)
        reqs += step.requires
        if step.stored is not None:
            stored.append(step.stored)
        S = step.post
    return S, reqs, stored


def _enabled(reqs: list[z3.BoolRef], bs: list[z3.ExprRef]) -> z3.ModelRef | None:
    s = z3.Solver()
    s.set("timeout", 20_000)
    s.add(z3.Distinct(*bs), *reqs)
    return solving.check(s, timeout_ms=20_000).model


def compare(m: Mirror, op: Operation, tw: frozenset[str] = frozenset()) -> str:
    """Apply ``op`` to the model and check the encoding makes the same move.
    Returns "ok", "skipped" (the model refused it as invalid, or the caller
    broke the contract); raises VllmMismatch naming the difference."""
    snap = snapshot(m)
    fp = m.model.fingerprint()
    try:
        result = m.model.apply(op)
    except InvalidOperation:
        return "skipped"
    events = list(result.events)
    m.feed(events)
    bs = [z3.Const(f"ag_blk{i}", Block) for i in range(m.model.capacity)]
    pre_slot = dict(m.slot)
    S = _state(m, snap, bs)
    steps: list[tuple[str, dict]] = []
    refused = False
    parent_of_stored: list[int | None] = [
        e.data.stored.parent_hash for e in events if isinstance(e.data, Stored) and e.storage_tier == "device"
    ]
    if isinstance(op, Use):
        fulls = [b.full for b in op.blocks if isinstance(b, FullBlock)]
        parts = [b.partial for b in op.blocks if isinstance(b, PartialBlock)]
        hits = _hits(snap, fulls)
        fresh = len(fulls) - hits + len(parts)
        p = op.parent.full if isinstance(op.parent, FullBlock) else None
        pc = _owned_copy(snap, p)
        if p is not None and pc is None:
            _follow(m, snap)
            return "skipped"
        pb = bs[pre_slot[pc]] if pc is not None else bs[0]
        steps.append(("use(begin)", _inp(p=ops.NONE if p is None else p, pb=pb, F=fresh)))
        steps += [("use(hit)", _inp(h=h, b=bs[pre_slot[snap.by_hash[h][0]]])) for h in fulls[:hits]]
        steps.append(("use(check)", _inp(h=fulls[hits] if hits < len(fulls) else ops.NONE)))
        if result.result.status == "capacity":
            refused = True
        else:
            _follow(m, snap)
            new_cids = list(range(snap.next_cid, m.model.next_cid))
            for j, cid in enumerate(new_cids):
                b = bs[m.slot[cid]]
                if j < len(fulls) - hits:
                    steps.append(("use(new)", _inp(h=fulls[hits + j], b=b)))
                else:
                    steps.append(("use(partial)", _inp(b=b)))
            steps.append(("use(close)", _inp()))
    elif isinstance(op, Promote):
        pc = _owned_copy(snap, op.parent_hash)
        if op.parent_hash is not None and pc is None:
            _follow(m, snap)
            return "skipped"
        par = ops.NONE if op.parent_hash is None else op.parent_hash
        inp = _inp(
            h=op.seq_hash, b=bs[pre_slot[snap.held[op.uuid]]], p=par, pb=bs[pre_slot[pc]] if pc is not None else bs[0]
        )
        steps.append(("promote", inp))
        _follow(m, snap)
    elif isinstance(op, Deref):
        owners = dict(snap.owners)
        for ref in op.blocks:
            if isinstance(ref, FullBlock):
                cid = next(c for c in snap.by_hash[ref.full] if owners[c] > 0)
                owners[cid] -= 1
                steps.append(("deref(full)", _inp(b=bs[pre_slot[cid]])))
            else:
                cid = snap.held[ref.partial]
                name = "deref(partial)" if snap.seqs[cid] is None else "deref(promoted)"
                if name == "deref(promoted)":
                    owners[cid] -= 1
                steps.append((name, _inp(b=bs[pre_slot[cid]])))
        _follow(m, snap)
    elif isinstance(op, Reset):
        steps.append(("reset", _inp()))
        refused = result.result.value is False
        _follow(m, snap)
    else:
        return "skipped"
    post, reqs, stored = _run(S, steps, tw)
    if refused:
        if m.model.fingerprint() != fp or events:
            raise VllmMismatch(f"{op.op}: the model refused it but changed its state or published {len(events)} events")
        if _enabled(reqs, bs) is not None:
            raise VllmMismatch(f"{op.op}: the model refused it (all or nothing) but the encoding's steps are enabled")
        return "ok"
    mdl = _enabled(reqs, bs)
    if mdl is None:
        raise VllmMismatch(f"{op.op}: the encoding cannot make the model's move (a step is not enabled)")
    _same_post(m, mdl, post, bs, op)
    enc_parents = [mdl.eval(par).as_long() for when, par in stored if z3.is_true(mdl.eval(when))]
    model_parents = [ops.NONE if x is None else x for x in parent_of_stored]
    if enc_parents != model_parents:
        raise VllmMismatch(f"{op.op}: Stored parent(s) {model_parents} in the model, {enc_parents} in the encoding")
    return "ok"


def _hits(snap: Snapshot, fulls: list[int]) -> int:
    n = 0
    for h in fulls:
        if h not in snap.by_hash:
            break
        n += 1
    return n


def _follow(m: Mirror, snap: Snapshot) -> None:
    """Place the model's new physical blocks: fresh ones first take free
    blocks (lowest index first), then the slots of the copies they evicted,
    in eviction order; gone blocks free their slot."""
    copies = m.model.copies
    victims = [c for c in snap.inactive if c not in copies]
    gone = [c for c in m.slot if c not in copies]
    victim_slots = [m.slot[c] for c in victims]
    for c in gone:
        del m.slot[c]
    free = sorted(set(range(m.model.capacity)) - set(m.slot.values()) - set(victim_slots))
    for cid in range(snap.next_cid, m.model.next_cid):
        if cid not in copies:
            continue
        m.slot[cid] = free.pop(0) if free else victim_slots.pop(0)


def _same_post(m: Mirror, mdl: z3.ModelRef, post: ops.VllmOpState, bs: list[z3.ExprRef], op: Operation) -> None:
    def ev(x: z3.ExprRef) -> z3.ExprRef:
        return mdl.eval(x, model_completion=True)

    where = {i: c for c, i in m.slot.items()}
    for i, b in enumerate(bs):
        cid = where.get(i)
        c = m.model.copies.get(cid) if cid is not None else None
        want = "vfree" if c is None else ("vheld" if c.seq is None else "vcached")
        got = str(ev(post.st[b]))
        if got != want:
            raise VllmMismatch(f"{op.op}: block {i} is {want} in the model, {got} in the encoding")
        if c is not None and c.seq is not None:
            got_h, got_o = ev(post.hsh[b]).as_long(), ev(post.own[b]).as_long()
            if (got_h, got_o) != (c.seq, c.owners):
                raise VllmMismatch(
                    f"{op.op}: block {i} caches {c.seq} x{c.owners} in the model, {got_h} x{got_o} encoded"
                )
    for h in range(HASHES):
        copies = len(m.model.by_hash.get(h, []))
        view, ccnt = ev(post.view[h]).as_long(), ev(post.ccnt[h]).as_long()
        if (view, ccnt) != (m.router[h], copies):
            raise VllmMismatch(
                f"{op.op}: hash {h}: router {m.router[h]} from the model's events and {copies} copies;"
                f" the encoding's router {view}, copies {ccnt}"
            )


def random_op(rng: random.Random, model: VllmPoolModel) -> Operation:
    """A small operation over hashes 0..4 and uuids u0..u2: Uses that hit a
    cached prefix and then store copies of cached hashes, parents the
    request holds, Derefs of what is owned, Promotes, the odd Reset."""
    owned = sorted(h for h, ids in model.by_hash.items() if any(model.copies[c].owners for c in ids))
    k = rng.random()
    if k < 0.45:
        if rng.random() < 0.5:  # a prefix of a shared prompt: hits, then copies of cached blocks
            fulls = list(PROMPTS[rng.randrange(len(PROMPTS))][: rng.randint(2, HASHES)])
        else:
            fulls = [rng.randrange(HASHES) for _ in range(rng.randint(0, 4))]
        refs: list[FullBlock | PartialBlock] = [FullBlock(full=h) for h in fulls]
        if not fulls or rng.random() < 0.4:
            refs.append(PartialBlock(partial=f"u{rng.randrange(UUIDS)}"))
        parent = FullBlock(full=rng.choice(owned)) if owned and rng.random() < 0.4 else None
        plhs = [Plh(hash=h, parent=None, position=i) for i, h in enumerate(fulls)]
        return Use(blocks=refs, plhs=plhs, local_hashes=[h + 100 for h in fulls], parent=parent)
    if k < 0.85:
        # a promoted block is released by its uuid only: naming its hash too
        # is a double release the model does not reject (see the module doc)
        promoted = {model.copies[c].seq for c in model.held.values() if c in model.copies}
        held = [PartialBlock(partial=u) for u, c in model.held.items() if c in model.copies]
        pool: list[FullBlock | PartialBlock] = [FullBlock(full=h) for h in owned if h not in promoted] + held
        if not pool:
            return Reset()
        return Deref(blocks=rng.sample(pool, rng.randint(1, min(4, len(pool)))))
    if k < 0.95:
        unpromoted = [u for u, c in model.held.items() if c in model.copies and model.copies[c].seq is None]
        if unpromoted:
            par = rng.choice(owned) if owned and rng.random() < 0.6 else None
            h = rng.randrange(HASHES)
            plh = Plh(hash=h, parent=None, position=0)
            return Promote(uuid=rng.choice(unpromoted), seq_hash=h, local_hash=7, parent_hash=par, plh=plh)
    return Reset()


def first_mismatch(seed: int, budget: int, tw: frozenset[str] = frozenset()) -> tuple[int | None, Counter[str]]:
    """Run up to ``budget`` operations; the index of the first mismatch (None: none) and the outcome counts."""
    rng = random.Random(seed)
    m = Mirror(VllmPoolModel(ManagerConfig(profile=VLLM_NAME, capacity=CAPACITY, block_size=4, eviction="lru")))
    seen: Counter[str] = Counter()
    for i in range(budget):
        try:
            seen[compare(m, random_op(rng, m.model), tw)] += 1
        except VllmMismatch:
            return i, seen
    return None, seen
