"""kvbm, legacy, atomic: the step encodings and the models have the same successors.

Every state the model (``reference/g1.py`` without offload,
``reference/legacy.py``) reaches from an empty cache of ``capacity`` slots
within the explored depth, over an alphabet of every Use of one or two
blocks (full blocks of ``hashes`` hashes, the partial block ``u0``; parent
none or a registered block, legacy none), every Deref (and legacy Destroy) of
one or two blocks, known or not, and every Promote of ``u0``. In each state,
for each operation, the two outcome sets must be equal
(``smt/equivalence.py``).

The encodings allow any inactive block as a victim; the model is asked
every way (its pool is run in every order, under the ``unordered`` policy
for kvbm and atomic: the order of the pool is not part of the encoding and
not compared). An outcome is the state as the encoding has it
(``blocks/agreement.abstract``: registry, owners, kvbm's announced marks,
legacy's unannounced set, the partials, the free counter, the slot counts
and the router's device view built from the published events), the hashes
the Use's Removed names (kvbm, atomic) and the Stored parents in order
(atomic). The operation's result (how many blocks a Use placed) is not in
the encoding and not compared.

The encoding side: the model's pre-state as an encoding state
(``agreement.encode``), then the operation's steps (``agreement.steps_of``:
begin, one per block, close; atomic: the declares and the check, then either
nothing more, the check having undone the pins, or the places and close) with
the victims free, ending idle; z3 enumerates every outcome.
"""

from __future__ import annotations

import copy
import itertools
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from kvspec.reference import make_model
from kvspec.reference.legacy import LegacyModel
from kvspec.reference.smt.blocks.agreement import (
    HASHES,
    UUIDS,
    Abstract,
    _plh,
    _use,
    abstract,
    encode,
    pool_policy,
    steps_of,
)
from kvspec.reference.smt.blocks.catalogue import block_encoding
from kvspec.reference.smt.blocks.encoding import IDLE, NONE, ProfileEncoding
from kvspec.reference.smt.blocks.encoding_mutants import patched
from kvspec.reference.smt.equivalence import all_values
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.profiles import BlockSemantics, block_semantics
from kvspec.spec.wire import Deref, Destroy, FullBlock, Operation, PartialBlock, Promote, Stored


@dataclass
class BNode:
    """A model state and the router's device view built from its events."""

    model: Any
    dev: set[int] = field(default_factory=set)


def _freeze(A: Abstract, traits: BlockSemantics) -> tuple:
    """What the encoding holds of a state, as the sampled agreement compares it."""
    hs = []
    for h in range(HASHES):
        reg = A.reg[h]
        hs.append(
            (
                reg,
                A.own[h] if reg else 0,
                A.ann[h] if reg and traits.announced_mark else False,
                A.unann[h] if traits.unannounced_set else False,
                A.dev[h],
            )
        )
    us = tuple((A.preg[u], A.pown[u] if traits.partial_owners and A.preg[u] else 0) for u in range(UUIDS))
    free = A.free if traits.free_counter else 0
    return tuple(hs), us, free, tuple(sorted(A.counts.items()))


@dataclass(frozen=True)
class _BuiltStep:
    """One step built from a state: the state after it, and what it adds to the sequence's
    requirements, Stored events and Removed hashes."""

    post: Any
    requires: list[z3.BoolRef]
    stored: list[tuple[z3.BoolRef, z3.ExprRef]]
    removed: z3.ArrayRef | None


@dataclass
class BlocksSubject:
    """One block-level profile at one bound (``mutant``: a rule or encoding mutant in force)."""

    profile: str
    capacity: int = 2
    hashes: int = 3
    mutant: str | None = None
    #: a model class to run instead of the profile's own (a seeded model bug)
    model_class: Any = None
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or self.profile
        #: the encoded pre-state of the abstract state last met (``_encoded``: ``explore`` asks for
        #: every operation of a state in a row, and never for a state again), and the steps built
        #: from it by their sequence so far (``_run``); one state's worth, so memory stays bounded at
        #: any depth
        self._pre_key: tuple[Any, ...] | None = None
        self._pre: Any = None
        self._built: dict[tuple[Any, ...], _BuiltStep] = {}
        self.traits = block_semantics(self.profile)
        prof = block_encoding(self.profile)
        self.tw: frozenset[str] = frozenset()
        if self.mutant in prof.mutants:
            self.tw = frozenset({self.mutant})
        elif self.mutant is not None:
            prof = patched(prof, self.mutant)
        self.prof: ProfileEncoding = prof

    def initial(self) -> list[BNode]:
        cfg = ManagerConfig(profile=self.profile, capacity=self.capacity, eviction=pool_policy(self.profile))  # type: ignore[arg-type]
        m = self.model_class(cfg) if self.model_class is not None else make_model(cfg)
        return [BNode(m)]

    def _abstract(self, n: BNode) -> Abstract:
        return abstract(n.model, self.profile, n.dev, self.capacity)

    def key(self, n: BNode) -> Hashable:
        return _freeze(self._abstract(n), self.traits)

    def alphabet(self, n: BNode) -> Sequence[Operation]:
        A = self._abstract(n)
        refs: list[FullBlock | PartialBlock] = [FullBlock(full=h) for h in range(self.hashes)]
        refs.append(PartialBlock(partial="u0"))
        registered = [h for h in range(self.hashes) if A.reg[h]]
        out: list[Operation] = []
        for k in (1, 2):
            for seq in itertools.permutations(refs, k):
                for par in [None, *registered] if self.traits.use_parent else [None]:
                    out.append(_use(list(seq), None if par is None else FullBlock(full=par)))
        for k in (1, 2):
            for sub in itertools.combinations(refs, k):
                out.append(Deref(blocks=list(sub)))
                if self.traits.destroy:
                    out.append(Destroy(blocks=list(sub)))
        for h in range(self.hashes):
            for par in [None, *registered]:
                out.append(Promote(uuid="u0", seq_hash=h, parent_hash=par, local_hash=h + 100, plh=_plh(h)))
        return out

    # ------------------------------------------------------------------ model
    def _orders(self, m: Any) -> list[Any]:
        """The model in every order of its pool of inactive blocks (every victim sequence): the hash
        cache's (``LegacyModel``) inactive entries, or the G1 model's policy order."""
        if isinstance(m, LegacyModel):
            keys = list(m.inactive)
            out = []
            for perm in itertools.permutations(keys):
                c = copy.deepcopy(m)
                c.inactive = OrderedDict((k, None) for k in perm)
                out.append(c)
            return out
        order = list(m.policy._order)
        out = []
        for perm in itertools.permutations(order):
            c = copy.deepcopy(m)
            c.policy._order = OrderedDict((k, None) for k in perm)
            out.append(c)
        return out

    def model_outcomes(self, n: BNode, op: Operation) -> list[tuple[Hashable, BNode]]:
        out: dict[Hashable, BNode] = {}
        for m in self._orders(n.model):
            try:
                step = m.apply(op)
            except InvalidOperation:
                continue
            dev = set(n.dev)
            for ev in step.events:
                if ev.kind == "stored":
                    dev |= set(ev.hashes())
                elif ev.kind == "removed":
                    dev -= set(ev.hashes())
            nxt = BNode(m, dev)
            removed: tuple[int, ...] | None = None
            parents: tuple[int, ...] | None = None
            if self.traits.removed_per_use and op.op == "use":
                removed = tuple(sorted({h for ev in step.events if ev.kind == "removed" for h in ev.hashes()}))
            if self.traits.stored_parents and op.op == "use":
                parents = tuple(_parent(ev.data) for ev in step.events if ev.kind == "stored")
            out.setdefault((self.key(nxt), removed, parents), nxt)
        return list(out.items())

    def progress(
        self, n: BNode, seen: list[tuple[Operation, list[tuple[Hashable, BNode]]]]
    ) -> list[tuple[str, str | None]]:
        """PROGRESS-NO-DEADLOCK: while a block is held (an owner, or a held partial), some Deref
        of the alphabet is accepted (bounded: the states of the walk)."""
        A = self._abstract(n)
        held = any(A.reg[h] and A.own[h] > 0 for h in range(HASHES)) or any(A.preg[u] for u in range(UUIDS))
        if not held:
            return []
        released = any(isinstance(op, Deref) and outs for op, outs in seen)
        return [("PROGRESS-NO-DEADLOCK", None if released else "something is held and no Deref is accepted")]

    # --------------------------------------------------------------- encoding
    def encoding_outcomes(self, n: BNode, op: Operation) -> set[Hashable]:
        A = self._abstract(n)
        pre = self._encoded(A)
        out: set[Hashable] = set()
        for steps in self._families(op):
            out |= self._run(pre, steps, op)
        return out

    def _encoded(self, A: Abstract) -> Any:
        """``encode(A, capacity)``, built once per state: every operation of the alphabet starts
        from it (half the check's time went to building the same pre-state for each one); the
        state is immutable (a step returns a new one), so sharing it changes no outcome. Only
        the last state's is kept (see ``__post_init__``)."""
        tables = (A.reg, A.own, A.ann, A.unann, A.dev, A.preg, A.pown)
        key: tuple[Any, ...] = (*(tuple(sorted(d.items())) for d in tables), A.free)
        if key != self._pre_key:
            self._pre_key, self._pre, self._built = key, encode(A, self.capacity), {}
        return self._pre

    def _families(self, op: Operation) -> list[list[tuple[str, dict[str, int | None]]]]:
        """The step sequences the encoding may take for ``op`` (a profile that declares its batch,
        atomic: the check fails or passes)."""
        if self.traits.declares_batch and op.op == "use":
            return [steps_of(self.profile, op, 0), steps_of(self.profile, op, 1)]
        return [steps_of(self.profile, op, None)]

    def _run(self, pre: Any, steps: list[tuple[str, dict[str, int | None]]], op: Operation) -> set[Hashable]:
        S = pre
        req: list[z3.BoolRef] = []
        emitted: list[tuple[z3.BoolRef, z3.ExprRef]] = []
        gone: list[z3.ArrayRef] = []
        # the operations of the alphabet share step prefixes (a Use's begin and first blocks, atomic's
        # declares and check in both families): each prefix is built once from this pre-state (its
        # inputs are named by the step's index, so a prefix's terms are the same whoever asks)
        built: dict[tuple[Any, ...], _BuiltStep] = self._built if pre is self._pre else {}
        prefix: tuple[Any, ...] = ()
        for i, (name, given) in enumerate(steps):
            if name not in self.prof.transitions:
                return set()  # no such step in this profile: the encoding refuses
            prefix += ((name, tuple(sorted(given.items()))),)
            b = built.get(prefix)
            if b is None:
                b = built[prefix] = self._step(S, i, name, given)
            req += b.requires
            emitted += b.stored
            if b.removed is not None:
                gone.append(b.removed)
            S = b.post
        req.append(S.v["phase"] == IDLE)
        terms: list[z3.ExprRef] = []
        for h in range(HASHES):
            terms += [S.a["reg"][h], S.a["own"][h], S.a["ann"][h], S.a["unann"][h], S.a["dev"][h]]
        for u in range(UUIDS):
            terms += [S.a["preg"][u], S.a["pown"][u]]
        counts = sorted(S.c)
        terms += [S.v["free"], *(S.c[k] for k in counts)]
        track_removed = self.traits.removed_per_use and op.op == "use"
        if track_removed:
            terms += [z3.Or([g[h] for g in gone] or [z3.BoolVal(False)]) for h in range(HASHES)]
        track_parents = self.traits.stored_parents and op.op == "use"
        if track_parents:
            for when, par in emitted:
                terms += [when, par]
        out: set[Hashable] = set()
        for vals in all_values(req, terms):
            it = iter(vals)
            reg, own, ann, unann, dev = {}, {}, {}, {}, {}
            for h in range(HASHES):
                reg[h], own[h], ann[h], unann[h], dev[h] = (next(it) for _ in range(5))
            preg, pown = {}, {}
            for u in range(UUIDS):
                preg[u], pown[u] = next(it), next(it)
            free = next(it)
            cvals = {k: next(it) for k in counts}
            A = Abstract(reg, own, ann, unann, dev, preg, pown, free, cvals)
            removed = tuple(h for h in range(HASHES) if next(it)) if track_removed else None
            parents: tuple[int, ...] | None = None
            if track_parents:
                ps = []
                for _ in emitted:
                    when, par = next(it), next(it)
                    if when:
                        ps.append(par)
                parents = tuple(ps)
            out.add((self._freeze_enc(A), removed, parents))
        return out

    def _step(self, S: Any, i: int, name: str, given: dict[str, int | None]) -> _BuiltStep:
        """Step ``i`` of a sequence, ``name`` with the inputs ``given`` (the rest free), from ``S``."""
        inp: dict[str, z3.ExprRef] = {
            "h": z3.IntVal(0),
            "u": z3.IntVal(0),
            "p": z3.IntVal(NONE),
            "v": z3.Int(f"eq_v{i}"),
            "w": z3.Int(f"eq_w{i}"),
            "vp": z3.Bool(f"eq_vp{i}"),
        }
        for k, x in given.items():
            inp[k] = z3.IntVal(x if x is not None else NONE)
        step = self.prof.transitions[name](S, inp, self.tw)
        domain = z3.And(inp["v"] >= 0, inp["v"] < HASHES, inp["w"] >= 0, inp["w"] < UUIDS)
        return _BuiltStep(step.post, [*step.requires, domain], list(step.stored), step.removed)

    def _freeze_enc(self, A: Abstract) -> tuple:
        """The encoding's censuses are named as the model's counts (``abstract`` names them per profile)."""
        want = set(self._abstract(BNode(self.initial()[0].model)).counts)
        return _freeze(Abstract(A.reg, A.own, A.ann, A.unann, A.dev, A.preg, A.pown, A.free,
                                {k: v for k, v in A.counts.items() if k in want}), self.traits)  # fmt: skip


def _parent(data: Any) -> int:
    assert isinstance(data, Stored)
    return data.stored.parent_hash if data.stored.parent_hash is not None else NONE
