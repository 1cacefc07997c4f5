"""The vllm profile at operation level: whole Uses (any length), their assembled events and parent.

``profile_vllm.py`` proves INV-VLLM-COPIES one block at a time, with every
event applied at once. The model (``reference/vllm_pool.py``) does not
publish per block: a Use pins its prefix hits, checks capacity for the whole
batch (USE-CAPACITY: all or nothing), places every new full block and every
partial block in a free physical block or, with none free, in the slot of an
evicted cached copy (VLLM-LAZY-REMOVE), and only then publishes one Removed
(the evicted copies) followed by one Stored (the new copies) whose parent is
the block before the first stored block: the last prefix hit, else the
caller's parent (PARENT-ANCHOR; vLLM ``vllm/v1/core/block_pool.py``
``BlockPool.cache_full_blocks``: ``block_hashes[num_cached_blocks - 1]``, or
none when nothing of the request was cached before).

So a Use is encoded as a sequence of steps over a state that carries the
batch in progress as ghosts, as ``profile_blocks.py`` does for kvbm, legacy
and atomic: ``begin`` (the caller's parent, the number of fresh blocks),
one ``hit`` per prefix hit, ``check`` (the capacity check, after the pins:
the model's "fresh <= free + evictable - pinned evictable"), one ``new`` or
``partial`` per fresh block (each in a free block, or evicting an unowned
copy when none is free), and ``close`` (publish the Removed, then the
Stored). The pending events are ghosts (``prem``: copies evicted per hash,
``psto``: copies cached per hash), and the invariants hold in every state
inside a batch as well as between operations, so the proofs cover batches
of **any length**, unbounded pool and hashes. A Use that fails the check
changes nothing (the model returns before any pin), so it needs no proof.

Deref has no events and releases block by block after validating the whole
operation (the model's job; the agreement check binds it), so its steps
(``deref(full)``, ``deref(partial)``) cover a Deref of any length; Promote
and Reset are one step each, the Promote's Stored published at once.

Properties (each proven for the initial state and every step):

- INV-VLLM-COPIES, in its batch form: for every hash, the router's count
  (built from the events published so far) minus the pending Removed plus
  the pending Stored equals the cached copies; between operations nothing is
  pending, so the router's count is exact.
- PARENT-ANCHOR: the assembled Stored's parent (a ghost set at the first new
  block to the block before it) is none or a hash the router counts at
  least once when the Stored arrives (after the Use's Removed). Needs the
  caller contract ASSUME-PARENT-REGISTERED in its "the request holds its
  prefix" reading (the caller's parent is a cached copy with an owner): with
  only "registered" the parent's last copy may be the Use's own victim (the
  mutant ``contract-registered-only`` is refuted).
- USE-CAPACITY (all or nothing): a checked Use never runs out of blocks
  mid-batch ("never: stuck" below is unsatisfiable).

Mutants (each refuted by the proofs, and the encoding mutants also caught
by the agreement check ``profile_vllm_agreement.py``): ``parent-moves`` (the
Stored's parent follows the batch to the block before its *last* block),
``store-new-only`` (a new copy of a cached hash gets no Stored),
``remove-last-only`` (an evicted copy gets no Removed while another stays),
``check-before-pins`` (the capacity check counts the prefix hits it pins as
evictable), ``contract-registered-only`` (see above).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.unbounded.models import _expand, _index_terms
from kvspec.reference.smt.vllm.copies import STATES, V_CACHED, V_FREE, V_HELD, Block, VBlockSort
from kvspec.spec.rules import RuleId as R
from kvspec.spec.rules import rid

Int = z3.IntSort()
Bool = z3.BoolSort()
NONE = -1
IDLE, HITS, PLACE = 0, 1, 2
#: the step property ``owner_safe`` proves
OWNER_SAFE = rid("INV-VLLM-OWNER-SAFE")
#: census name -> predicate over (st, own) of one physical block
CENSUS: dict[str, Callable[[z3.ExprRef, z3.ArithRef], z3.BoolRef]] = {
    "free": lambda st, own: st == V_FREE,
    "held": lambda st, own: st == V_HELD,
    "cached": lambda st, own: st == V_CACHED,
    "idle": lambda st, own: z3.And(st == V_CACHED, own == 0),
}
assert set(STATES) <= set(CENSUS)


def _ind(c: z3.BoolRef) -> z3.ArithRef:
    return z3.If(c, 1, 0)


@dataclass(frozen=True)
class VllmOpState:
    """Pool, router view and the batch in progress."""

    st: z3.ArrayRef  # Block -> VBlockState
    hsh: z3.ArrayRef  # Block -> Int
    own: z3.ArrayRef  # Block -> Int
    nb: z3.ArrayRef  # Block -> Bool: cached by the Use in progress (its Stored pending)
    uo: z3.ArrayRef  # Block -> Bool: a promoted block still held by its uuid (one of its owners is the uuid's)
    ccnt: z3.ArrayRef  # ghost Int -> Int: cached copies per hash
    ncnt: z3.ArrayRef  # ghost Int -> Int: cached copies per hash with ``nb``
    view: z3.ArrayRef  # router: Int -> Int, copies per hash from the published events
    prem: z3.ArrayRef  # batch: Int -> Int, the pending Removed (evicted copies per hash)
    psto: z3.ArrayRef  # batch: Int -> Int, the pending Stored (new copies per hash)
    cnt: dict[str, z3.ArithRef]  # census ghosts
    phase: z3.ArithRef
    prev: z3.ArithRef  # the last full block of the batch so far (or the caller's parent)
    pblk: z3.ExprRef  # the physical copy of ``prev`` the request owns
    spar: z3.ArithRef  # the pending Stored's parent
    sblk: z3.ExprRef  # the physical copy of ``spar``
    sopen: z3.BoolRef  # some new full block placed: a Stored is pending
    budget: z3.ArithRef  # fresh blocks still to place
    pins: z3.ArithRef  # ghost: prefix hits of this Use that were unowned (evictable) before

    @staticmethod
    def fresh(p: str) -> VllmOpState:
        return VllmOpState(
            z3.Array(f"{p}st", Block, VBlockSort),
            z3.Array(f"{p}hsh", Block, Int),
            z3.Array(f"{p}own", Block, Int),
            z3.Array(f"{p}nb", Block, Bool),
            z3.Array(f"{p}uo", Block, Bool),
            z3.Array(f"{p}ccnt", Int, Int),
            z3.Array(f"{p}ncnt", Int, Int),
            z3.Array(f"{p}view", Int, Int),
            z3.Array(f"{p}prem", Int, Int),
            z3.Array(f"{p}psto", Int, Int),
            {k: z3.Int(f"{p}cnt_{k}") for k in CENSUS},
            z3.Int(f"{p}phase"),
            z3.Int(f"{p}prev"),
            z3.Const(f"{p}pblk", Block),
            z3.Int(f"{p}spar"),
            z3.Const(f"{p}sblk", Block),
            z3.Bool(f"{p}sopen"),
            z3.Int(f"{p}budget"),
            z3.Int(f"{p}pins"),
        )

    def write(self, b: z3.ExprRef, st: z3.ExprRef, hsh: z3.ArithRef, own: z3.ArithRef, nb: z3.BoolRef) -> VllmOpState:
        """Block ``b`` takes (st, hsh, own, nb); the ghosts move by the point-update identity."""
        oc = _ind(self.st[b] == V_CACHED)
        on = _ind(z3.And(self.st[b] == V_CACHED, self.nb[b]))
        nc = _ind(st == V_CACHED)
        nn = _ind(z3.And(st == V_CACHED, nb))
        c1 = z3.Store(self.ccnt, self.hsh[b], self.ccnt[self.hsh[b]] - oc)
        n1 = z3.Store(self.ncnt, self.hsh[b], self.ncnt[self.hsh[b]] - on)
        cnt = {k: v + _ind(pred(st, own)) - _ind(pred(self.st[b], self.own[b])) for k, (v, pred) in _zip(self.cnt)}
        return replace(
            self,
            st=z3.Store(self.st, b, st),
            hsh=z3.Store(self.hsh, b, hsh),
            own=z3.Store(self.own, b, own),
            nb=z3.Store(self.nb, b, nb),
            ccnt=z3.Store(c1, hsh, c1[hsh] + nc),
            ncnt=z3.Store(n1, hsh, n1[hsh] + nn),
            cnt=cnt,
        )

    def write_own(self, b: z3.ExprRef, own: z3.ArithRef) -> VllmOpState:
        """Only the owner count of ``b`` changes (a hit, a release): the copy
        counts stay, the "idle" census moves."""
        cnt = {
            k: v + _ind(pred(self.st[b], own)) - _ind(pred(self.st[b], self.own[b])) for k, (v, pred) in _zip(self.cnt)
        }
        return replace(self, own=z3.Store(self.own, b, own), cnt=cnt)


def _zip(cnt: dict[str, z3.ArithRef]) -> list[tuple[str, tuple[z3.ArithRef, Callable[..., z3.BoolRef]]]]:
    return [(k, (cnt[k], CENSUS[k])) for k in CENSUS]


def _bump(arr: z3.ArrayRef, h: z3.ArithRef, d: int, when: z3.BoolRef | bool = True) -> z3.ArrayRef:
    return z3.Store(arr, h, arr[h] + z3.If(when, d, 0))


@dataclass
class VllmOpStep:
    name: str
    pre: VllmOpState
    post: VllmOpState
    requires: list[z3.BoolRef] = field(default_factory=list)
    #: rule id -> when it fires in this step (sanity: each satisfiable)
    rules: dict[str, z3.BoolRef] = field(default_factory=dict)
    #: property id -> obligations about the step itself (the Stored's parent when it arrives)
    obligations: dict[str, list[z3.BoolRef]] = field(default_factory=dict)
    #: the Stored the step publishes: (when, parent) (for the agreement check)
    stored: tuple[z3.BoolRef, z3.ArithRef] | None = None
    #: when the step refuses the whole operation, leaving the state as it was
    #: (a Use that does not fit: USE-CAPACITY); None: the step never refuses
    refusal: z3.BoolRef | None = None


#: inputs: a hash, a physical block, the caller's parent and its copy, the fresh count
INPUTS = {"h": Int, "p": Int, "F": Int}


def inputs(p: str = "in_") -> dict[str, z3.ExprRef]:
    out: dict[str, z3.ExprRef] = {k: z3.Const(f"{p}{k}", s) for k, s in INPUTS.items()}
    out["b"] = z3.Const(f"{p}b", Block)
    out["pb"] = z3.Const(f"{p}pb", Block)
    return out


def _held_copy(S: VllmOpState, blk: z3.ExprRef, h: z3.ArithRef) -> z3.BoolRef:
    return z3.And(S.st[blk] == V_CACHED, S.hsh[blk] == h, S.own[blk] >= 1)


def _caller_parent(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> z3.BoolRef:
    """ASSUME-PARENT-REGISTERED, "the request holds its prefix": the caller's
    parent is none or a cached copy the request owns (``pb``)."""
    p, pb = inp["p"], inp["pb"]
    if "contract-registered-only" in tw:
        return z3.Or(p == NONE, z3.And(S.st[pb] == V_CACHED, S.hsh[pb] == p))
    return z3.Or(p == NONE, _held_copy(S, pb, p))


def begin(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> VllmOpStep:
    """A Use starts: the caller's parent is the anchor so far; ``F`` fresh blocks to place."""
    step = VllmOpStep("use(begin)", S, S, [S.phase == IDLE, inp["F"] >= 0, _caller_parent(S, inp, tw)])
    step.rules = {R.PARENT_ANCHOR: inp["p"] != NONE}
    step.post = replace(S, phase=z3.IntVal(HITS), prev=inp["p"], pblk=inp["pb"], budget=inp["F"], pins=z3.IntVal(0))
    return step


def hit(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> VllmOpStep:
    """VLLM-PREFIX-HIT: a leading full block with a cached copy; that copy gains an owner."""
    h, b = inp["h"], inp["b"]
    step = VllmOpStep("use(hit)", S, S, [S.phase == HITS, h >= 0, S.st[b] == V_CACHED, S.hsh[b] == h])
    step.rules = {R.VLLM_PREFIX_HIT: S.own[b] == 0}
    post = S.write_own(b, S.own[b] + 1)
    step.post = replace(post, prev=h, pblk=b, pins=S.pins + _ind(S.own[b] == 0))
    return step


def check(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> VllmOpStep:
    """USE-CAPACITY, passed: the fresh blocks fit in the free blocks plus the
    unowned copies left after the pins (else the Use changes nothing:
    ``refusal``). VLLM-PREFIX-HIT: the hits are the longest cached prefix, so
    ``h``, the Use's first full block after them (NONE: none), has no cached
    copy; without it a cached block could be stored again as a new copy."""
    room = S.cnt["free"] + S.cnt["idle"] + (S.pins if "check-before-pins" in tw else 0)
    nxt = inp["h"]
    longest = z3.Or(nxt == NONE, S.ccnt[nxt] == 0)
    step = VllmOpStep("use(check)", S, S, [S.phase == HITS, longest, S.budget <= room])
    step.refusal = z3.And(S.phase == HITS, longest, z3.Not(S.budget <= room))
    step.rules = {R.USE_CAPACITY: S.budget == S.cnt["free"] + S.cnt["idle"]}
    step.post = replace(S, phase=z3.IntVal(PLACE))
    return step


def _slot(S: VllmOpState, b: z3.ExprRef, tw: frozenset[str]) -> tuple[list[z3.BoolRef], z3.BoolRef, VllmOpState]:
    """A fresh physical block: a free one, else (none free) an unowned cached
    copy, evicted (VLLM-FREE-ORDER: hashless blocks go first). Returns the
    requirement, "it evicts", and the state with the Removed pending."""
    evicts = S.st[b] == V_CACHED
    unowned = z3.BoolVal(True) if "evict-ignores-owners" in tw else S.own[b] == 0
    req = [S.phase == PLACE, S.budget >= 1, z3.Or(S.st[b] == V_FREE, z3.And(evicts, unowned, S.cnt["free"] == 0))]
    h = S.hsh[b]
    announced = z3.And(evicts, S.ccnt[h] == 1) if "remove-last-only" in tw else evicts
    return req, evicts, replace(S, prem=_bump(S.prem, h, 1, announced), budget=S.budget - 1)


def new(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> VllmOpStep:
    """USE-NEW: a full block after the hits becomes a new cached copy (STORE-COPY: announced even if cached)."""
    h, b = inp["h"], inp["b"]
    req, evicts, S1 = _slot(S, b, tw)
    step = VllmOpStep("use(new)", S, S, [*req, h >= 0])
    step.rules = {R.USE_NEW: z3.BoolVal(True), R.STORE_COPY: S.ccnt[h] >= 1, R.VLLM_LAZY_REMOVE: evicts}
    announced = S.ccnt[h] == 0 if "store-new-only" in tw else z3.BoolVal(True)
    S2 = replace(S1.write(b, V_CACHED, h, z3.IntVal(1), z3.BoolVal(True)), uo=z3.Store(S1.uo, b, z3.BoolVal(False)))
    first = z3.Not(S.sopen)
    moves = z3.BoolVal(True) if "parent-moves" in tw else first
    step.post = replace(
        S2,
        psto=_bump(S2.psto, h, 1, announced),
        prev=h,
        pblk=b,
        sopen=z3.BoolVal(True),
        spar=z3.If(moves, S.prev, S.spar),
        sblk=z3.If(moves, S.pblk, S.sblk),
    )
    return step


def partial(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> VllmOpStep:
    """USE-PARTIAL: a partial block takes a fresh physical block without a hash."""
    b = inp["b"]
    req, evicts, S1 = _slot(S, b, tw)
    step = VllmOpStep("use(partial)", S, S, req)
    step.rules = {R.USE_PARTIAL: z3.BoolVal(True), R.VLLM_LAZY_REMOVE: evicts}
    post = S1.write(b, V_HELD, S.hsh[b], z3.IntVal(0), z3.BoolVal(False))
    step.post = replace(post, uo=z3.Store(S1.uo, b, z3.BoolVal(False)))
    return step


def close(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> VllmOpStep:
    """The Use publishes its Removed (if any copy was evicted), then its Stored (if any new copy)."""
    x = z3.Int("xv")
    step = VllmOpStep("use(close)", S, S, [S.phase == PLACE, S.budget == 0])
    step.rules = {R.EVENT_ORDER: S.sopen}
    after_removed = z3.Lambda([x], S.view[x] - S.prem[x])
    anchored = z3.Or(S.spar == NONE, after_removed[S.spar] >= 1)
    step.obligations = {R.PARENT_ANCHOR: [z3.Implies(S.sopen, anchored)]}
    step.stored = (S.sopen, S.spar)
    zero = z3.K(Int, z3.IntVal(0))
    step.post = replace(
        S,
        view=z3.Lambda([x], S.view[x] - S.prem[x] + S.psto[x]),
        prem=zero,
        psto=zero,
        ncnt=zero,
        nb=z3.K(Block, z3.BoolVal(False)),
        phase=z3.IntVal(IDLE),
        sopen=z3.BoolVal(False),
    )
    return step


def promote(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> VllmOpStep:
    """PROMOTE-NEW: a held partial block becomes a cached copy; one Stored, parent the caller's."""
    h, b = inp["h"], inp["b"]
    step = VllmOpStep("promote", S, S, [S.phase == IDLE, h >= 0, S.st[b] == V_HELD, _caller_parent(S, inp, tw)])
    step.rules = {R.PROMOTE_NEW: z3.BoolVal(True), R.STORE_COPY: S.ccnt[h] >= 1}
    announced = S.ccnt[h] == 0 if "store-new-only" in tw else z3.BoolVal(True)
    step.obligations = {R.PARENT_ANCHOR: [z3.Or(inp["p"] == NONE, S.view[inp["p"]] >= 1)]}
    step.stored = (z3.BoolVal(True), inp["p"])
    post = S.write(b, V_CACHED, h, z3.IntVal(1), z3.BoolVal(False))
    step.post = replace(post, view=_bump(S.view, h, 1, announced), uo=z3.Store(S.uo, b, z3.BoolVal(True)))
    return step


def deref_full(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> VllmOpStep:
    """DEREF-OWNER: one owner of a cached copy released by naming its hash
    (an unowned copy becomes evictable). The owner a promoted block's uuid
    holds is not one of them (DEREF-UNKNOWN: releasing it by hash too would
    free the block twice)."""
    b = inp["b"]
    step = VllmOpStep("deref(full)", S, S, [S.phase == IDLE, S.st[b] == V_CACHED, S.own[b] - _ind(S.uo[b]) >= 1])
    step.rules = {R.DEREF_OWNER: S.own[b] == 1}
    step.post = S.write_own(b, S.own[b] - 1)
    return step


def deref_promoted(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> VllmOpStep:
    """DEREF-OWNER: a promoted block released by its uuid: the uuid's owner goes."""
    b = inp["b"]
    step = VllmOpStep("deref(promoted)", S, S, [S.phase == IDLE, S.st[b] == V_CACHED, S.uo[b]])
    step.rules = {R.DEREF_OWNER: S.own[b] == 1}
    post = S.write_own(b, S.own[b] - 1)
    step.post = replace(post, uo=z3.Store(S.uo, b, z3.BoolVal(False)))
    return step


def deref_partial(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> VllmOpStep:
    """DEREF-PARTIAL: a held block without a hash goes straight back to free."""
    b = inp["b"]
    step = VllmOpStep("deref(partial)", S, S, [S.phase == IDLE, S.st[b] == V_HELD])
    step.rules = {R.DEREF_PARTIAL: z3.BoolVal(True)}
    step.post = S.write(b, V_FREE, S.hsh[b], z3.IntVal(0), S.nb[b])
    return step


def reset(S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str]) -> VllmOpStep:
    """CLEAR-ALL: with nothing held, every block is freed and one Cleared empties the router."""
    x = z3.Const("xr", Block)
    idle = z3.ForAll([x], z3.And(S.st[x] != V_HELD, z3.Implies(S.st[x] == V_CACHED, S.own[x] == 0)))
    step = VllmOpStep("reset", S, S, [S.phase == IDLE, idle])
    step.refusal = z3.And(S.phase == IDLE, z3.Not(idle))
    step.rules = {R.CLEAR_ALL: S.cnt["cached"] >= 1}
    zero = z3.K(Int, z3.IntVal(0))
    cnt = {"free": S.cnt["free"] + S.cnt["cached"], "held": S.cnt["held"], "cached": z3.IntVal(0), "idle": z3.IntVal(0)}
    step.post = replace(S, st=z3.K(Block, V_FREE), ccnt=zero, ncnt=zero, view=zero, cnt=cnt)
    return step


Transition = Callable[[VllmOpState, dict[str, z3.ExprRef], frozenset[str]], VllmOpStep]
TRANSITIONS: dict[str, Transition] = {
    "use(begin)": begin,
    "use(hit)": hit,
    "use(check)": check,
    "use(new)": new,
    "use(partial)": partial,
    "use(close)": close,
    "promote": promote,
    "deref(full)": deref_full,
    "deref(partial)": deref_partial,
    "deref(promoted)": deref_promoted,
    "reset": reset,
}

#: mutant name -> (the rule it breaks, what it changes)
MUTANTS: dict[str, tuple[str, str]] = {
    "parent-moves": (R.PARENT_ANCHOR, "the Stored's parent is the block before its last block, not its first"),
    "store-new-only": (R.STORE_COPY, "a new copy of a hash already cached gets no Stored"),
    "remove-last-only": (R.REMOVE_COPY, "an evicted copy gets no Removed while another copy stays"),
    "check-before-pins": (R.USE_CAPACITY, "the capacity check counts the pinned prefix hits as evictable"),
    "evict-ignores-owners": (OWNER_SAFE, "a fresh block may evict a cached copy that still has owners"),
    "contract-registered-only": (
        R.PARENT_ANCHOR,
        "ASSUME-PARENT-REGISTERED read as 'registered' only: the caller's parent may have no owner",
    ),
}


def invariants(S: VllmOpState) -> dict[str, list[z3.BoolRef]]:
    """Property id -> its conjuncts over a state (all hold in every state, inside a batch too)."""
    x, h = z3.Const("xi", Block), z3.Int("hi")
    idle = S.phase == IDLE
    return {
        rid("INV-VLLM-COPIES"): [
            z3.ForAll([h], S.view[h] - S.prem[h] + S.psto[h] == S.ccnt[h]),
            z3.ForAll([h], S.psto[h] == S.ncnt[h]),
            z3.ForAll([h], z3.And(S.prem[h] >= 0, z3.Implies(idle, z3.And(S.prem[h] == 0, S.psto[h] == 0)))),
            z3.ForAll([x], z3.Implies(S.nb[x], z3.And(S.st[x] == V_CACHED, S.own[x] >= 1))),
            z3.ForAll([x], z3.Implies(S.uo[x], z3.And(S.st[x] == V_CACHED, S.own[x] >= 1, z3.Not(S.nb[x])))),
            z3.ForAll([x], z3.Implies(z3.Not(S.sopen), z3.Not(S.nb[x]))),
            z3.Or(S.phase == IDLE, S.phase == HITS, S.phase == PLACE),
            z3.Implies(S.sopen, S.phase == PLACE),
        ],
        R.PARENT_ANCHOR: [
            z3.Implies(z3.And(z3.Not(idle), S.prev != NONE), _held_copy(S, S.pblk, S.prev)),
            z3.Implies(z3.And(S.sopen, S.spar != NONE), z3.And(_held_copy(S, S.sblk, S.spar), z3.Not(S.nb[S.sblk]))),
        ],
        OWNER_SAFE: [],  # a property of steps (``owner_safe``), none of states
        R.USE_CAPACITY: [
            S.budget >= 0,
            S.pins >= 0,
            z3.Implies(S.phase == PLACE, S.budget <= S.cnt["free"] + S.cnt["idle"]),
        ],
    }


def hypothesis(S: VllmOpState) -> list[z3.BoolRef]:
    return [f for fs in invariants(S).values() for f in fs]


def facts(S: VllmOpState, p: str) -> list[z3.BoolRef]:
    """What the ghosts satisfy in every finite pool where they are the counts
    they stand for (``finite_check`` makes them exact): not negative, at
    least one when some block has the property, a witness when positive, and
    a copy not new in this batch counted in ``ccnt - ncnt``."""
    x, h = z3.Const("xf", Block), z3.Int("hf")
    out = [z3.Sum([S.cnt[k] for k in STATES]) >= 1]
    for name, pred in CENSUS.items():
        out.append(S.cnt[name] >= 0)
        out.append(z3.ForAll([x], z3.Implies(pred(S.st[x], S.own[x]), S.cnt[name] >= 1)))
        w = z3.Const(f"{p}wit_{name}", Block)
        out.append(z3.Implies(S.cnt[name] >= 1, pred(S.st[w], S.own[w])))
    out += [
        S.cnt["idle"] <= S.cnt["cached"],
        z3.ForAll([h], z3.And(S.ncnt[h] >= 0, S.ncnt[h] <= S.ccnt[h])),
        z3.ForAll([x], z3.Implies(S.st[x] == V_CACHED, S.ccnt[S.hsh[x]] >= 1)),
        z3.ForAll(
            [x], z3.Implies(z3.And(S.st[x] == V_CACHED, z3.Not(S.nb[x])), S.ccnt[S.hsh[x]] - S.ncnt[S.hsh[x]] >= 1)
        ),
        z3.ForAll([x], z3.And(S.hsh[x] >= 0, S.own[x] >= 0)),
    ]
    return out


def base(
    name: str, S: VllmOpState, inp: dict[str, z3.ExprRef], tw: frozenset[str], p: str
) -> tuple[VllmOpStep, list[z3.BoolRef]]:
    step = TRANSITIONS[name](S, inp, tw)
    return step, [*facts(S, p), *hypothesis(S), *step.requires]


def owner_safe(pre: VllmOpState, post: VllmOpState) -> z3.BoolRef:
    """INV-VLLM-OWNER-SAFE: a cached copy with an owner is still that cached
    copy after the step (only an unowned copy is ever evicted or reused)."""
    x = z3.Const("xo", Block)
    owned = z3.And(pre.st[x] == V_CACHED, pre.own[x] >= 1)
    return z3.ForAll([x], z3.Implies(owned, z3.And(post.st[x] == V_CACHED, post.hsh[x] == pre.hsh[x])))


def goals(prop: str, step: VllmOpStep) -> list[z3.BoolRef]:
    """What the step must establish for ``prop``: its conjuncts on the post-state and the step's obligations."""
    two_state = [owner_safe(step.pre, step.post)] if prop == OWNER_SAFE else []
    return [*invariants(step.post)[prop], *step.obligations.get(prop, []), *two_state]


def goal(prop: str, step: VllmOpStep) -> z3.BoolRef:
    return z3.And(goals(prop, step))


def stuck(S: VllmOpState) -> list[z3.BoolRef]:
    """A checked Use that still has a block to place and no block to place it in."""
    x = z3.Const("xs", Block)
    no_slot = z3.ForAll([x], z3.Not(z3.Or(S.st[x] == V_FREE, z3.And(S.st[x] == V_CACHED, S.own[x] == 0))))
    return [S.phase == PLACE, S.budget >= 1, no_slot]


def initial(S: VllmOpState) -> list[z3.BoolRef]:
    """An empty pool of any size: every block free, the router empty, no batch."""
    x, h = z3.Const("x0", Block), z3.Int("h0")
    return [
        z3.ForAll([x], z3.And(S.st[x] == V_FREE, z3.Not(S.nb[x]), z3.Not(S.uo[x]), S.own[x] == 0, S.hsh[x] == 0)),
        z3.ForAll([h], z3.And(S.view[h] == 0, S.ccnt[h] == 0, S.ncnt[h] == 0, S.prem[h] == 0, S.psto[h] == 0)),
        S.cnt["free"] >= 1,
        S.cnt["held"] == 0,
        S.cnt["cached"] == 0,
        S.cnt["idle"] == 0,
        S.phase == IDLE,
        z3.Not(S.sopen),
        S.budget == 0,
        S.pins == 0,
    ]


@dataclass
class VllmOpProof:
    prop: str
    transition: str
    verdict: str  # proven | refuted | unknown (REASON)
    seconds: float


def _verdict(s: z3.Solver, timeout_ms: int) -> str:
    """proven | refuted (a model that shows it) | unknown (REASON)."""
    return solving.check(s, timeout_ms=timeout_ms).verdict


def prove_ops(tw: frozenset[str] = frozenset(), timeout_ms: int = 60_000) -> list[VllmOpProof]:
    """Each property holds initially and is kept by every step from any state
    satisfying all of them (any pool size, any hashes, any batch length);
    "never: stuck" has no state at all."""
    out = []
    for prop in invariants(VllmOpState.fresh("i_")):
        t0 = time.perf_counter()
        S0 = VllmOpState.fresh("init_")
        s = z3.Solver()
        s.set("timeout", timeout_ms)
        s.add(*initial(S0), z3.Not(z3.And(invariants(S0)[prop])))
        out.append(VllmOpProof(prop, "initial state", _verdict(s, timeout_ms), time.perf_counter() - t0))
        for name in TRANSITIONS:
            t0 = time.perf_counter()
            step, hyp = base(name, VllmOpState.fresh("pre_"), inputs(), tw, "pre_")
            verdicts = []
            for conj in goals(prop, step):  # one query per conjunct: small queries, stable verdicts
                s = z3.Solver()
                s.set("timeout", timeout_ms)
                s.add(*hyp, z3.Not(conj))
                verdicts.append(_verdict(s, timeout_ms))
            worst = next((v for v in verdicts if v == "refuted"), None)
            worst = worst or next((v for v in verdicts if v.startswith("unknown")), "proven")
            out.append(VllmOpProof(prop, name, worst, time.perf_counter() - t0))
    t0 = time.perf_counter()
    S = VllmOpState.fresh("pre_")
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*facts(S, "pre_"), *hypothesis(S), *stuck(S))
    out.append(
        VllmOpProof(
            f"{R.USE_CAPACITY} (never: stuck)",
            "use(new)/use(partial)",
            _verdict(s, timeout_ms),
            time.perf_counter() - t0,
        )
    )
    return out


def finite_check(build: Callable[[VllmOpState], list[z3.BoolRef]], k: int = 3, H: int = 3) -> z3.CheckSatResult:
    """Satisfiable in a pool of ``k`` distinct blocks and hashes -1..H-1, every ghost exact?"""
    S0 = VllmOpState.fresh("fi_")

    def table(name: str) -> z3.ArrayRef:
        arr = z3.K(Int, z3.IntVal(0))
        for i in range(NONE, H):
            arr = z3.Store(arr, i, z3.Int(f"fi_{name}_{i}"))
        return arr

    S = replace(S0, ccnt=table("ccnt"), ncnt=table("ncnt"), view=table("view"), prem=table("prem"), psto=table("psto"))
    bs = [z3.Const(f"blk{i}", Block) for i in range(k)]
    ints = [z3.IntVal(i) for i in range(NONE - 1, H + 1)]
    memo: dict[int, z3.ExprRef] = {}
    fs = [_expand(f, bs, ints, memo) for f in build(S)]
    exact = [z3.Distinct(*bs)]
    exact += [S.cnt[key] == z3.Sum([_ind(pred(S.st[b], S.own[b])) for b in bs]) for key, pred in CENSUS.items()]
    for h in range(NONE, H):
        exact.append(S.ccnt[h] == z3.Sum([_ind(z3.And(S.st[b] == V_CACHED, S.hsh[b] == h)) for b in bs]))
        exact.append(S.ncnt[h] == z3.Sum([_ind(z3.And(S.st[b] == V_CACHED, S.hsh[b] == h, S.nb[b])) for b in bs]))
    block_terms, idx_terms = _index_terms(fs + exact, Block)
    universe = [z3.Or([t == b for b in bs]) for t in block_terms if not any(t.eq(b) for b in bs)]
    in_range = [z3.And(i >= NONE, i < H) for i in idx_terms]
    s = z3.Solver()
    s.set("timeout", 60_000)
    s.add(*fs, *exact, *universe, *in_range)
    return solving.check(s, timeout_ms=60_000).result


def sanity(tw: frozenset[str] = frozenset(), only: tuple[str, ...] = ()) -> list[str]:
    """Non-vacuity: every step (or the ``only`` ones), and every rule guard of
    it, is enabled in a finite pool satisfying the whole hypothesis; "stuck" is not."""
    problems = []
    for name in only or TRANSITIONS:
        probe = TRANSITIONS[name](VllmOpState.fresh("probe_"), inputs("probe_"), tw)
        for rule in [None, *probe.rules]:

            def build(S: VllmOpState, name: str = name, rule: str | None = rule) -> list[z3.BoolRef]:
                step, hyp = base(name, S, inputs(), tw, "fi_")
                return hyp + ([step.rules[rule]] if rule else [])

            if finite_check(build) != z3.sat:
                problems.append(f"vllm {name}: " + (f"rule {rule} never fires" if rule else "never enabled"))
    if finite_check(lambda S: [*facts(S, "fi_"), *hypothesis(S), *stuck(S)]) != z3.unsat:
        problems.append("vllm: a checked Use can get stuck in a finite pool")
    return problems


def refute(mutant: str) -> str | None:
    """Where the mutant breaks a property in a finite pool: "step (property)", None if not refuted."""
    tw = frozenset({mutant})
    props = list(invariants(VllmOpState.fresh("r_")))

    def broken(name: str, ids: list[str]) -> bool:
        def build(S: VllmOpState) -> list[z3.BoolRef]:
            step, hyp = base(name, S, inputs(), tw, "fi_")
            return [*hyp, z3.Not(z3.And([goal(i, step) for i in ids]))]

        return finite_check(build) == z3.sat

    for name in TRANSITIONS:
        if broken(name, props):
            return f"{name} ({next((i for i in props if broken(name, [i])), '?')})"
    return None
