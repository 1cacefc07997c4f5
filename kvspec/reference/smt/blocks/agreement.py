"""The kvbm, legacy and atomic encodings against the Python model, operation by operation.

A proof about an encoding that has drifted from the model proves nothing. So
this runs sampled operations through the model (``reference/g1.py`` without
offload, ``reference/legacy.py``) and, for each operation the model accepts,
asks z3 whether the encoding can make the same move: from the model's
pre-state (as an encoding state: registry, owners, announced marks, held
partials, free counter, and the router's view built from the model's own
events), the operation's steps (``use(begin)``, one per block, ``use(close)``;
one per block for Deref, Destroy; Promote) with their victims left free must
all be enabled and end in the model's post-state (the same fields, the
censuses equal to the model's counters, nothing pending). ``sat`` means the
model's behaviour is one the encoding allows, so what is proven about every
behaviour of the encoding holds for the model. A mismatch names the
operation.

The eviction order is not part of the encodings (any inactive victim is
allowed), so every policy of the model is run (lineage, lru, multi_lru,
unordered for kvbm and atomic; lru for legacy).
"""

from __future__ import annotations

import contextlib
import copy
import random
from dataclasses import dataclass

import z3

from kvspec.reference import make_model
from kvspec.reference.legacy import LegacyModel
from kvspec.reference.outcome import Step
from kvspec.reference.smt import solving
from kvspec.reference.smt.blocks.catalogue import block_encoding
from kvspec.reference.smt.blocks.encoding import CENSUS, IDLE, NONE, BState, ProfileEncoding, inputs
from kvspec.reference.smt.blocks.encoding_mutants import patched, profile_encoding_mutants
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.profiles import block_semantics
from kvspec.spec.profiles import profile as profile_rules
from kvspec.spec.wire import Deref, Destroy, FullBlock, KvEvent, Operation, PartialBlock, Plh, Promote, Stored, Use

HASHES, UUIDS = 6, 3


def policies(profile: str) -> tuple[str, ...]:
    """The eviction policies the sampled agreement runs ``profile``'s model under: every one it has
    (``spec.profiles.Profile.policies``; EVICT-POLICY)."""
    return profile_rules(profile).policies


def pool_policy(profile: str) -> str:
    """The policy to build ``profile``'s model with where the order of its pool is not what is checked
    (the exhaustive check tries every order; a counterexample's replay lets any victim go):
    ``unordered`` where the profile has it, else its first policy (legacy's only one, lru)."""
    have = policies(profile)
    return "unordered" if "unordered" in have else have[0]


def _plh(h: int) -> Plh:
    """One fixed lineage hash per block hash (a root at position h): identities stay consistent."""
    return Plh(hash=h, parent=None, position=h)


def random_op(rng: random.Random, profile: str, pre: Abstract, cap: int, model: object | None = None) -> Operation:
    """A small operation over hashes 0..5 and uuids u0..u2, biased to what
    finds bugs: Uses that name a block twice (kvbm: evicted, then registered
    again in the same batch), Derefs and Destroys of what is held (the model
    rejects some operations: they are skipped), *pressure* Uses
    (``_pressure``), for kvbm and atomic, Derefs of everything held, and
    now and then an operation aimed at a state two seeded bugs need
    (``_aimed``)."""
    registered = {h for h in range(HASHES) if pre.reg[h]}
    held: list[FullBlock | PartialBlock] = [FullBlock(full=h) for h in range(HASHES) if pre.own[h] >= 1]
    held += [PartialBlock(partial=f"u{u}") for u in range(UUIDS) if pre.preg[u] and pre.pown[u] >= 1]
    traits = block_semantics(profile)
    aimed = _aimed(rng, profile, pre, cap, model)
    if aimed is not None:
        return aimed
    k = rng.random()
    if k < 0.15:
        # evicted and named again in one batch matters where the batch's Removed comes after its Stored
        return _pressure(rng, profile, pre, cap, model if traits.removed_per_use else None)
    if k < 0.2 and traits.stored_parents and registered:
        # a reused block between two new ones: the Stored group splits there
        fresh = [h for h in range(HASHES) if not pre.reg[h]]
        if len(fresh) >= 2:
            a, b = rng.sample(fresh, 2)
            return _use([FullBlock(full=x) for x in (a, rng.choice(sorted(registered)), b)])
    if k < 0.25 and held and traits.removed_per_use:
        # drop one owner of everything held: inactive blocks for the next pressure Use to evict
        # (a profile that publishes each Removed at once, legacy, reaches its states without it)
        return Deref(blocks=held)
    if k < 0.5:
        refs: list[FullBlock | PartialBlock] = []
        for _ in range(rng.randint(1, 4)):
            if refs and rng.random() < 0.25:
                refs.append(rng.choice(refs))
            elif rng.random() < 0.8:
                refs.append(FullBlock(full=rng.randrange(HASHES)))
            else:
                refs.append(PartialBlock(partial=f"u{rng.randrange(UUIDS)}"))
        parent = None
        if traits.use_parent and registered and rng.random() < 0.5:
            parent = FullBlock(full=rng.choice(sorted(registered)))
        return _use(refs, parent)
    if k < 0.85:
        n = rng.randint(1, 3)
        if held and rng.random() < 0.8:
            refs = rng.sample(held, min(n, len(held)))
        else:
            refs = [FullBlock(full=rng.randrange(HASHES)) for _ in range(n)]
        if traits.destroy and rng.random() < 0.3:
            return Destroy(blocks=refs)
        return Deref(blocks=refs)
    h = rng.randrange(HASHES)
    above = rng.choice(sorted(registered)) if registered and rng.random() < 0.5 else None
    return Promote(uuid=f"u{rng.randrange(UUIDS)}", seq_hash=h, parent_hash=above, local_hash=h + 100, plh=_plh(h))


def _aimed(rng: random.Random, profile: str, pre: Abstract, cap: int, model: object | None) -> Operation | None:
    """An operation aimed at a state uniform traffic reaches too rarely to
    catch two seeded bugs at every seed (their kill rates: benchmarks/profile_agreement_kills.py),
    or None (most of the time: the rest of the traffic stays as it was).

    A Promote of a held partial onto a registered hash (PROMOTE-EXISTING: the
    block gains an owner), and now and then a Use of one partial to have one. For kvbm, the states a Removed of an
    *unannounced* block needs: a block evicted and registered again in one
    Use is left unannounced; released (a Deref), it is evicted again by a
    later Use that names it once more, whose Removed must name it
    (``_evict_then_rename``)."""
    held_partials = [u for u in range(UUIDS) if pre.preg[u] and pre.pown[u] == 1]  # legacy: exactly one owner
    registered = [h for h in range(HASHES) if pre.reg[h]]
    room = cap - len(registered) - sum(pre.preg.values())
    inactive = [h for h in registered if pre.own[h] == 0]
    if not held_partials and registered and (room > 0 or inactive) and rng.random() < 0.1:  # one to promote later
        return _use([PartialBlock(partial=f"u{rng.randrange(UUIDS)}")])
    if held_partials and registered and rng.random() < 0.3:
        h = rng.choice(registered)
        return Promote(
            uuid=f"u{rng.choice(held_partials)}", seq_hash=h, parent_hash=None, local_hash=h + 100, plh=_plh(h)
        )
    if not block_semantics(profile).announced_mark or model is None:
        return None
    unann = [h for h in registered if not pre.ann[h]]
    unann_held = [h for h in unann if pre.own[h] >= 1]
    if unann_held and rng.random() < 0.3:
        return Deref(blocks=[FullBlock(full=h) for h in unann_held])
    if len(inactive) >= 2 and rng.random() < 0.2:
        targets = [h for h in inactive if not pre.ann[h]] or inactive
        return _evict_then_rename(rng, rng.choice(targets), inactive, model)
    return None


def _evict_then_rename(rng: random.Random, target: int, inactive: list[int], model: object) -> Use | None:
    """A Use of new blocks until one of them evicts ``target`` (asked of a
    copy of the model, one block at a time), then ``target`` again (it takes
    the slot of another inactive block, named after it), or None if the new
    blocks never evict it."""
    fresh = [h for h in range(HASHES) if h not in model.blocks]  # type: ignore[attr-defined]
    rng.shuffle(fresh)
    trial = copy.deepcopy(model)
    placed: list[int] = []
    for h in fresh:
        try:
            trial.apply(_use([FullBlock(full=h)]))  # type: ignore[attr-defined]
        except InvalidOperation:
            return None
        placed.append(h)
        if target not in trial.blocks:  # type: ignore[attr-defined]
            others = [x for x in inactive if x != target]
            return _use([FullBlock(full=x) for x in [*placed, target, *others]])
    return None


def _use(refs: list[FullBlock | PartialBlock], parent: FullBlock | None = None) -> Use:
    fulls = [r.full for r in refs if isinstance(r, FullBlock)]
    return Use(blocks=refs, plhs=[_plh(h) for h in fulls], local_hashes=[h + 100 for h in fulls], parent=parent)


def _pressure(rng: random.Random, profile: str, pre: Abstract, cap: int, model: object | None = None) -> Use:
    """A Use at the edge of the capacity, the states uniform sampling rarely
    reaches: unregistered blocks first (as many as the cache has room for,
    and one more), then the inactive blocks. The new blocks evict inactive
    ones, which the batch then names again (kvbm: evicted and registered
    again in one batch, left unannounced; a second such Use evicts an
    unannounced block), or, with no inactive block left, the Use runs out of
    room (legacy: its placed blocks stay unannounced until evicted)."""
    fresh = [h for h in range(HASHES) if not pre.reg[h]]
    rng.shuffle(fresh)
    inactive = [h for h in range(HASHES) if pre.reg[h] and pre.own[h] == 0]
    rng.shuffle(inactive)
    room = max(0, cap - sum(1 for h in range(HASHES) if pre.reg[h]) - sum(pre.preg.values()))
    if model is not None and room == 0 and fresh and len(inactive) >= 2 and rng.random() < 0.5:
        # the victim of one new block (asked of a copy of the model), named right after it:
        # evicted, then registered again in the same batch (in the slot of another inactive block)
        trial = copy.deepcopy(model)
        with contextlib.suppress(InvalidOperation):
            trial.apply(_use([FullBlock(full=fresh[0])]))  # type: ignore[attr-defined]
        gone = [h for h in inactive if h not in abstract(trial, profile, set(), cap).reg]
        if gone:
            return _use([FullBlock(full=h) for h in [fresh[0], gone[0], *(h for h in inactive if h != gone[0])]])
    fulls = fresh[: min(len(fresh), room + rng.randint(1, 2))] + inactive
    return _use([FullBlock(full=h) for h in fulls])


@dataclass
class Abstract:
    """The model's state as the encoding sees it, on hashes 0..5 and uuids 0..2."""

    reg: dict[int, bool]
    own: dict[int, int]
    ann: dict[int, bool]
    unann: dict[int, bool]
    dev: dict[int, bool]
    preg: dict[int, bool]
    pown: dict[int, int]
    free: int
    counts: dict[str, int]


def abstract(model: object, profile: str, dev: set[int], cap: int) -> Abstract:
    """``model``'s state as the encoding of ``profile`` holds it (what the model keeps depends on its
    class: the hash cache's entries, ``LegacyModel``, or the G1 model's blocks and counters)."""
    hs, us = range(HASHES), range(UUIDS)
    if isinstance(model, LegacyModel):
        act: dict = model.active
        ina = model.inactive
        reg = {h: ("F", h) in act or ("F", h) in ina for h in hs}
        own = {h: act.get(("F", h), 0) for h in hs}
        preg = {u: ("P", f"u{u}") in act or ("P", f"u{u}") in ina for u in us}
        pown = {u: act.get(("P", f"u{u}"), 0) for u in us}
        counts = {
            "act": sum(1 for h in hs if reg[h] and own[h] >= 1),
            "inact": sum(1 for h in hs if reg[h] and own[h] == 0),
            "pact": sum(1 for u in us if preg[u] and pown[u] >= 1),
            "pinact": sum(1 for u in us if preg[u] and pown[u] == 0),
        }
        unann = {h: h in model.unannounced for h in hs}
        return Abstract(reg, own, {h: False for h in hs}, unann, {h: h in dev for h in hs}, preg, pown, 0, counts)
    blocks = model.blocks  # type: ignore[attr-defined]
    reg = {h: h in blocks for h in hs}
    own = {h: blocks[h].owners if h in blocks else 0 for h in hs}
    ann = {h: blocks[h].announced if h in blocks else False for h in hs}
    preg = {u: f"u{u}" in model.partial for u in us}  # type: ignore[attr-defined]
    c = model.counters()  # type: ignore[attr-defined]
    counts = {"act": c.active_blocks - sum(preg.values()), "inact": c.inactive_blocks, "part": sum(preg.values())}
    return Abstract(
        reg,
        own,
        ann,
        {h: False for h in hs},
        {h: h in dev for h in hs},
        preg,
        {u: 1 if preg[u] else 0 for u in us},
        c.free_blocks,
        counts,
    )


def encode(A: Abstract, cap: int) -> BState:
    """A concrete encoding state, idle, equal to ``A``."""
    S = BState.fresh("ag_")
    a = {}
    for k, arr in S.a.items():
        dflt = z3.IntVal(0) if arr.range() == z3.IntSort() else z3.BoolVal(False)
        val = z3.K(z3.IntSort(), dflt)
        tables: dict[str, dict[int, bool] | dict[int, int]] = {
            "reg": A.reg,
            "own": A.own,
            "ann": A.ann,
            "unann": A.unann,
            "dev": A.dev,
            "preg": A.preg,
            "pown": A.pown,
        }
        for i, x in tables.get(k, {}).items():
            val = z3.Store(val, i, x)
        a[k] = val
    v = {
        "cap": z3.IntVal(cap),
        "free": z3.IntVal(A.free),
        "phase": z3.IntVal(IDLE),
        "anc": z3.IntVal(NONE),
        "prev": z3.IntVal(NONE),
        "gpar": z3.IntVal(NONE),
        "gopen": z3.BoolVal(False),
    }
    c = {name: z3.IntVal(0) for name in CENSUS}
    S = BState(a, v, c)
    # the censuses are the counts of the state (computed, not trusted from the model)
    for name, (kind, pred) in CENSUS.items():
        rng = range(HASHES) if kind == "h" else range(UUIDS)
        c[name] = z3.simplify(z3.Sum([z3.If(pred(S.rec(kind, z3.IntVal(i))), 1, 0) for i in rng]))
    return BState(a, v, c)


def _uid(ref: PartialBlock | str) -> int:
    s = ref.partial if isinstance(ref, PartialBlock) else ref
    return int(s[1:])


def steps_of(profile: str, op: Operation, result_value: object) -> list[tuple[str, dict[str, int | None]]]:
    """The encoding's steps for one accepted operation (victims left free)."""
    out: list[tuple[str, dict[str, int | None]]] = []
    if isinstance(op, Use):
        parent = op.parent.full if isinstance(op.parent, FullBlock) else NONE
        out.append(("use(begin)", {"p": parent}))
        traits = block_semantics(profile)
        if traits.declares_batch:
            for r in op.blocks:
                out.append(
                    ("use(declare full)", {"h": r.full})
                    if isinstance(r, FullBlock)
                    else ("use(declare partial)", {"u": _uid(r)})
                )
            out.append(("use(check)", {}))
            if result_value == 0:
                return out
            for r in op.blocks:
                out.append(
                    ("use(place full)", {"h": r.full})
                    if isinstance(r, FullBlock)
                    else ("use(place partial)", {"u": _uid(r)})
                )
        else:
            if traits.validates_held_partials:  # USE-VALIDATE: no partial the Use names is held already
                parts = dict.fromkeys(_uid(r) for r in op.blocks if isinstance(r, PartialBlock))
                out += [("use(validate partial)", {"u": u}) for u in parts]
            for r in op.blocks:
                out.append(
                    ("use(full)", {"h": r.full}) if isinstance(r, FullBlock) else ("use(partial)", {"u": _uid(r)})
                )
        out.append(("use(close)", {}))
    elif isinstance(op, Deref | Destroy):
        kind = "deref" if isinstance(op, Deref) else "destroy"
        for r in op.blocks:
            out.append(
                (f"{kind}(full)", {"h": r.full}) if isinstance(r, FullBlock) else (f"{kind}(partial)", {"u": _uid(r)})
            )
    elif isinstance(op, Promote):
        out.append(
            (
                "promote",
                {"u": _uid(op.uuid), "h": op.seq_hash, "p": op.parent_hash if op.parent_hash is not None else NONE},
            )
        )
    return out


def agrees(
    prof: ProfileEncoding,
    pre: BState,
    steps: list[tuple[str, dict[str, int | None]]],
    post: Abstract,
    tw: frozenset[str] = frozenset(),
    parents: list[int] | None = None,
    removed: set[int] | None = None,
) -> bool:
    """Can the encoding's steps, victims free, take ``pre`` to the model's
    ``post``? With ``parents`` (atomic), the Stored events the steps publish
    must also name exactly those parents, in order; with ``removed`` (kvbm,
    atomic), the Removed the steps publish must name exactly those hashes
    (the end state alone lets a different choice of victims hide a wrong
    Removed: kvbm's evicted-and-registered-again block is back either way)."""
    traits = block_semantics(prof.name)
    S = pre
    req: list[z3.BoolRef] = []
    emitted: list[tuple[z3.BoolRef, z3.ExprRef]] = []
    gone: list[z3.ArrayRef] = []
    for n, (name, given) in enumerate(steps):
        inp: dict[str, z3.ExprRef] = {
            "h": z3.IntVal(0),
            "u": z3.IntVal(0),
            "p": z3.IntVal(NONE),
            "v": z3.Int(f"ag_v{n}"),
            "w": z3.Int(f"ag_w{n}"),
            "vp": z3.Bool(f"ag_vp{n}"),
        }
        for k, x in given.items():
            inp[k] = z3.IntVal(x if x is not None else NONE)
        step = prof.transitions[name](S, inp, tw)
        req += step.requires
        emitted += step.stored
        if step.removed is not None:
            gone.append(step.removed)
        req += [z3.And(inp["v"] >= 0, inp["v"] < HASHES, inp["w"] >= 0, inp["w"] < UUIDS)]
        S = step.post
    eq = [S.v["phase"] == IDLE]
    for h in range(HASHES):
        eq += [
            S.a["reg"][h] == post.reg[h],
            S.a["dev"][h] == post.dev[h],
            z3.Not(S.a["new"][h]),
            z3.Not(S.a["ev"][h]),
        ]
        if post.reg[h]:
            eq.append(S.a["own"][h] == post.own[h])
            if traits.announced_mark:
                eq.append(S.a["ann"][h] == post.ann[h])
        if traits.unannounced_set:
            eq.append(S.a["unann"][h] == post.unann[h])
    for u in range(UUIDS):
        eq.append(S.a["preg"][u] == post.preg[u])
        if traits.partial_owners and post.preg[u]:
            eq.append(S.a["pown"][u] == post.pown[u])
    if traits.free_counter:
        eq.append(S.v["free"] == post.free)
    eq += [S.c[k] == val for k, val in post.counts.items()]
    if parents is not None:  # the published Stored events, in order, name the model's parents
        idx: z3.ArithRef = z3.IntVal(0)
        for when, par in emitted:
            at = z3.IntVal(NONE - 1)
            for pos, want in enumerate(parents):
                at = z3.If(idx == pos, z3.IntVal(want), at)
            eq.append(z3.Implies(when, z3.And(idx < len(parents), par == at)))
            idx = idx + z3.If(when, 1, 0)
        eq.append(idx == len(parents))
    if removed is not None:
        for h in range(HASHES):
            eq.append(z3.Or([g[h] for g in gone] or [z3.BoolVal(False)]) == (h in removed))
    s = z3.Solver()
    s.set("timeout", 30_000)
    s.add(*req, *eq)
    return solving.check(s, timeout_ms=30_000).sat


def _parent(ev: KvEvent) -> int:
    data = ev.data
    assert isinstance(data, Stored)
    return data.stored.parent_hash if data.stored.parent_hash is not None else NONE


@dataclass
class AgreementReport:
    profile: str
    checked: int
    rejected: int
    mismatches: list[str]


def agreement_mutants(profile: str) -> list[str]:
    """The seeded encoding bugs the agreement must catch in ``profile``: its
    rule mutants (``ProfileEncoding.mutants``) but those that only drop a caller
    contract (they widen what the caller may do, not what the encoding
    does: the model is still inside it), and its encoding mutants
    (``profile_encoding_mutants.py``)."""
    rule = [m for m, (rid, _what) in block_encoding(profile).mutants.items() if not rid.startswith("ASSUME-")]
    return rule + [m.name for m in profile_encoding_mutants(profile)]


def _agrees_on(
    prof: ProfileEncoding,
    tw: frozenset[str],
    profile: str,
    cap: int,
    model: object,
    dev: set[int],
    pre: Abstract,
    op: Operation,
    step: Step,
) -> bool:
    """Does the encoding agree with the model on one operation the model has
    just applied (``pre``: the abstract state before it)? ``dev`` is the
    router's device view, built only from the model's own events: updated
    here in place. Besides the successor state, an atomic Use's Stored
    parents and every non-legacy Use's Removed hashes must match."""
    for ev in step.events:
        if ev.kind == "stored":
            dev |= set(ev.hashes())
        elif ev.kind == "removed":
            dev -= set(ev.hashes())
    post = abstract(model, profile, dev, cap)
    parents = removed = None
    traits = block_semantics(profile)
    if traits.stored_parents and isinstance(op, Use):
        parents = [_parent(ev) for ev in step.events if ev.kind == "stored"]
    if traits.removed_per_use and isinstance(op, Use):
        removed = {h for ev in step.events if ev.kind == "removed" for h in ev.hashes()}
    steps = steps_of(profile, op, step.result.value)
    return bool(agrees(prof, encode(pre, cap), steps, post, tw, parents, removed))


def run_agreement(
    profile: str, ops: int = 40, seed: int = 0, mutant: str | None = None, first: bool = False
) -> AgreementReport:
    """``ops`` sampled operations per policy through the model and the
    encoding (with ``mutant``, a rule mutant or an encoding mutant of it;
    ``first``: stop at the first mismatch)."""
    prof = block_encoding(profile)
    tw: frozenset[str] = frozenset()
    if mutant in prof.mutants:
        tw = frozenset({mutant})
    elif mutant is not None:
        prof = patched(prof, mutant)
    rng = random.Random(seed)
    checked = rejected = 0
    bad: list[str] = []
    for policy in policies(profile):
        cap = rng.randint(2, 4)
        model = make_model(ManagerConfig(profile=profile, capacity=cap, eviction=policy))  # type: ignore[arg-type]
        dev: set[int] = set()
        for _ in range(ops):
            pre = abstract(model, profile, dev, cap)
            op = random_op(rng, profile, pre, cap, model)
            try:
                step = model.apply(op)
            except InvalidOperation:
                rejected += 1
                continue
            checked += 1
            if not _agrees_on(prof, tw, profile, cap, model, dev, pre, op, step):
                bad.append(f"{profile}/{policy}: {op!r}")
                if first:
                    return AgreementReport(profile, checked, rejected, bad)
    return AgreementReport(profile, checked, rejected, bad)


def _variant(profile: str, mutant: str | None) -> tuple[ProfileEncoding, frozenset[str]]:
    """The profile's encoding with ``mutant`` in force: (transitions, the mutants switched on)."""
    prof = block_encoding(profile)
    if mutant is None:
        return prof, frozenset()
    if mutant in prof.mutants:
        return prof, frozenset({mutant})
    return patched(prof, mutant), frozenset()


def changed_steps(profile: str, mutant: str) -> list[str]:
    """The kinds of step ``mutant`` changes: those where z3 finds a state and
    inputs on which the mutated step differs from the right one (what it
    requires, the post-state, or the events it publishes)."""
    good, _ = _variant(profile, None)
    bad, tw = _variant(profile, mutant)
    out = []
    for name in good.transitions:
        S, i = BState.fresh("d_"), inputs("d_")
        a, b = good.transitions[name](S, i, frozenset()), bad.transitions[name](S, i, tw)
        diff = [z3.And(a.requires) != z3.And(b.requires)]
        diff += [a.post.a[k] != b.post.a[k] for k in a.post.a]
        diff += [a.post.v[k] != b.post.v[k] for k in a.post.v]
        diff += [a.post.c[k] != b.post.c[k] for k in a.post.c]
        if a.removed is not None and b.removed is not None:
            diff.append(a.removed != b.removed)
        if len(a.stored) != len(b.stored):
            diff.append(z3.BoolVal(True))
        for (wa, pa), (wb, pb) in zip(a.stored, b.stored, strict=False):
            diff.append(z3.Or(wa != wb, z3.And(wa, pa != pb)))
        s = z3.Solver()
        s.set("timeout", 20_000)
        s.add(z3.And(b.requires) if not a.requires else z3.Or(z3.And(a.requires), z3.And(b.requires)), z3.Or(diff))
        if not solving.check(s, timeout_ms=20_000).unsat:  # a difference, or none shown: not equal
            out.append(name)
    return out


def replay(
    profile: str, cap: int, policy: str, ops: list[Operation], mutant: str | None = None
) -> tuple[int, list[str]]:
    """Given operations (a scenario, not sampled) through the model and the
    encoding, as ``run_agreement`` does: (operations checked, mismatches)."""
    prof, tw = _variant(profile, mutant)
    model = make_model(ManagerConfig(profile=profile, capacity=cap, eviction=policy))  # type: ignore[arg-type]
    dev: set[int] = set()
    checked, bad = 0, []
    for op in ops:
        pre = abstract(model, profile, dev, cap)
        step = model.apply(op)
        checked += 1
        if not _agrees_on(prof, tw, profile, cap, model, dev, pre, op, step):
            bad.append(f"{profile}/{policy}: {op!r}")
    return checked, bad
