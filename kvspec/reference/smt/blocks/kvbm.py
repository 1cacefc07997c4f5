"""``kvspec prove --profile kvbm``: the kvbm profile without an offload tier.

Without an offload tier an eviction yields its slot at once, so one batch
can evict a block and register it again further on (``reference/g1.py``,
``G1Model._use`` and ``_publish_evictions``; the kvbm mocker,
ai-dynamo/dynamo ``lib/mocker/src/kv_manager/kvbm_backend.rs``). The batch's
single Stored names it, its single Removed (after the Stored) names it too,
and the block stays registered *unannounced*: the ``STORE-NO-DUP`` known
break. So the router's view is not the registered set (INV-ROUTER-MATCH, the
kvbm-offload row, fails here) but the **announced** set:

``INV-KVBM-ANNOUNCED``: between operations, for every block hash, the router's
device view holds it iff it is registered and still marked announced.

Inside a Use the view lags the batch (its Stored and Removed are pending), and
the invariant is strengthened with what the pending events will do: a block
not evicted by the batch is in the view or pending Stored iff it is
registered and announced; a block evicted and not registered again is in the
view iff it was announced when evicted (the Removed will name it then); a
registered block the batch evicted was registered again by the batch.

``INV-CONSERVE``: free + partial + active + inactive = capacity.

Steps: ``use(begin)``, ``use(full)`` (hit; new in a free slot; new in the
slot of an evicted inactive block; stop when neither exists), ``use(partial)``,
``use(close)`` (the Stored, then the Removed, then unannounced marks),
``deref(full)``, ``deref(partial)``, ``promote``.
"""

from __future__ import annotations

import z3

from kvspec.reference.smt.blocks.encoding import IDLE, NONE, PLACE, STOPPED, BState, BStep, ProfileEncoding
from kvspec.spec.registry import KVBM_NAME

K_FALSE = z3.K(z3.IntSort(), z3.BoolVal(False))
K_ZERO = z3.K(z3.IntSort(), z3.IntVal(0))


def inactive(S: BState, x: z3.ArithRef) -> z3.BoolRef:
    return z3.And(S.a["reg"][x], S.a["own"][x] == 0, z3.Not(S.a["pin"][x]))


def in_batch(S: BState) -> z3.BoolRef:
    return z3.Or(S.v["phase"] == PLACE, S.v["phase"] == STOPPED)


def take_slot(
    S: BState, v: z3.ArithRef, tw: frozenset[str], kvbm: bool = True
) -> tuple[BState, dict[str, z3.BoolRef], list[z3.BoolRef]]:
    """A free slot if there is one, else the slot of inactive block ``v``
    (evicted: its Removed pending), else none. Returns the state after taking
    it, the cases, and what the choice of ``v`` must satisfy."""
    free = S.v["free"]
    fresh = free >= 1
    evict = z3.And(free == 0, S.c["inact"] >= 1)
    stop = z3.And(free == 0, S.c["inact"] == 0)
    S1 = S.but(free=z3.If(fresh, free - 1, free))
    gone = {"reg": z3.BoolVal(False), "own": z3.IntVal(0)}
    if "evict-silent" not in tw:
        gone |= {"ev": z3.BoolVal(True), "evann": S.a["ann"][v]}
    S1 = S1.write("h", v, evict, **gone)
    return S1, {"fresh": fresh, "evict": evict, "stop": stop}, [z3.Implies(evict, inactive(S, v))]


def begin(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    step = BStep("use(begin)", S, S.but(phase=z3.IntVal(PLACE)), [S.v["phase"] == IDLE])
    step.rules = {"USE-VALIDATE": z3.BoolVal(True)}
    return step


def use_full(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    h, v = i["h"], i["v"]
    placing = S.v["phase"] == PLACE
    reg = S.a["reg"][h]
    T, case, choice = take_slot(S, v, tw)
    grow = z3.And(placing, z3.Not(reg), z3.Not(case["stop"]))
    T = T.write("h", h, grow, reg=z3.BoolVal(True), own=z3.IntVal(1), ann=z3.BoolVal(True), new=z3.BoolVal(True))
    H = S.write("h", h, True, own=S.a["own"][h] + 1)
    post = _ite(z3.And(placing, reg), H, _ite(grow, T, S))
    post = post.but(phase=z3.If(z3.And(placing, z3.Not(reg), case["stop"]), z3.IntVal(STOPPED), S.v["phase"]))
    step = BStep(
        "use(full)", S, post, [in_batch(S), h >= 0, *[z3.Implies(z3.And(placing, z3.Not(reg)), c) for c in choice]]
    )
    step.rules = {
        "USE-HIT-ACTIVE": z3.And(placing, reg, S.a["own"][h] >= 1),
        "USE-HIT-INACTIVE": z3.And(placing, reg, S.a["own"][h] == 0),
        "USE-NEW": z3.And(placing, z3.Not(reg), case["fresh"]),
        "EVICT-POLICY": z3.And(placing, z3.Not(reg), case["evict"]),
        "USE-CAPACITY": z3.And(placing, z3.Not(reg), case["stop"]),
        "STORE-NO-DUP": z3.And(placing, z3.Not(reg), S.a["ev"][h], z3.Not(case["stop"])),
    }
    return step


def use_partial(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    u, v = i["u"], i["v"]
    placing = S.v["phase"] == PLACE
    held = S.a["preg"][u]
    T, case, choice = take_slot(S, v, tw)
    grow = z3.And(placing, z3.Not(held), z3.Not(case["stop"]))
    T = T.write("u", u, grow, preg=z3.BoolVal(True), pown=z3.IntVal(1))
    post = _ite(grow, T, S)
    post = post.but(phase=z3.If(z3.And(placing, z3.Not(held), case["stop"]), z3.IntVal(STOPPED), S.v["phase"]))
    step = BStep(
        "use(partial)", S, post, [in_batch(S), *[z3.Implies(z3.And(placing, z3.Not(held)), c) for c in choice]]
    )
    step.rules = {
        "USE-PARTIAL": z3.And(placing, z3.Not(held), case["fresh"]),
        "EVICT-POLICY": z3.And(placing, z3.Not(held), case["evict"]),
        "USE-CAPACITY": z3.And(placing, z3.Not(held), case["stop"]),
    }
    return step


def close(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    """The batch's one Stored (the new blocks), then its one Removed (every
    evicted block that was announced or is registered again), then the blocks
    registered again are marked unannounced (the seed consumed their metadata)."""
    x = z3.Int("xk")
    a = S.a
    stored = a["new"][x]
    if "stop-drops-stored" in tw:
        stored = z3.And(stored, S.v["phase"] == PLACE)
    back = z3.BoolVal(False) if "removed-announced-only" in tw else a["reg"][x]
    gone = z3.And(a["ev"][x], z3.Or(back, a["evann"][x]))
    dev = z3.Lambda([x], z3.And(z3.Or(a["dev"][x], stored), z3.Not(gone)))
    ann = (
        a["ann"]
        if "close-keeps-announced" in tw
        else z3.Lambda([x], z3.And(a["ann"][x], z3.Not(z3.And(a["ev"][x], a["reg"][x]))))
    )
    post = S.but(dev=dev, ann=ann, new=K_FALSE, ev=K_FALSE, evann=K_FALSE, phase=z3.IntVal(IDLE))
    h = i["h"]
    step = BStep("use(close)", S, post, [in_batch(S)])
    step.removed = z3.Lambda([x], gone)
    step.rules = {
        "STORE-NEW-ONLY": a["new"][h],
        "REMOVE-EXACT": a["ev"][h],
        "EVENT-ORDER": z3.And(a["new"][h], a["ev"][i["v"]]),
        "STORE-NO-DUP": z3.And(a["ev"][h], a["reg"][h]),
    }
    return step


def deref_full(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    h = i["h"]
    own = S.a["own"][h]
    step = BStep("deref(full)", S, S.write("h", h, True, own=own - 1), [S.v["phase"] == IDLE, S.a["reg"][h], own >= 1])
    step.rules = {"DEREF-OWNER": own >= 2, "DEREF-OWNER (to inactive)": own == 1}
    return step


def deref_partial(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    u = i["u"]
    free = S.v["free"] if "deref-partial-keeps-slot" in tw else S.v["free"] + 1
    post = S.write("u", u, True, preg=z3.BoolVal(False), pown=z3.IntVal(0)).but(free=free)
    step = BStep("deref(partial)", S, post, [S.v["phase"] == IDLE, S.a["preg"][u]])
    step.rules = {"DEREF-PARTIAL": z3.BoolVal(True)}
    return step


def promote(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    u, h = i["u"], i["h"]
    reg = S.a["reg"][h]
    S1 = S.write("u", u, True, preg=z3.BoolVal(False), pown=z3.IntVal(0))
    existing = S1.write("h", h, True, own=S.a["own"][h] + 1).but(free=S.v["free"] + 1)
    new = S1.write("h", h, True, reg=z3.BoolVal(True), own=z3.IntVal(1), ann=z3.BoolVal(True))
    new = new.but(dev=z3.Store(S.a["dev"], h, z3.BoolVal(True)))  # its Stored
    step = BStep("promote", S, _ite(reg, existing, new), [S.v["phase"] == IDLE, S.a["preg"][u], h >= 0])
    step.rules = {"PROMOTE-NEW": z3.Not(reg), "PROMOTE-EXISTING": reg}
    return step


def _ite(c: z3.BoolRef, A: BState, B: BState) -> BState:
    return BState(
        {k: z3.If(c, A.a[k], B.a[k]) for k in A.a},
        {k: z3.If(c, A.v[k], B.v[k]) for k in A.v},
        {k: z3.If(c, A.c[k], B.c[k]) for k in A.c},
    )


def conserve(S: BState) -> list[tuple[str, z3.BoolRef]]:
    """INV-CONSERVE: the model's free counter and the slot censuses add up to the capacity."""
    c = S.c
    return [
        (
            "free + partial + active + inactive = capacity",
            S.v["free"] + c["part"] + c["act"] + c["inact"] == S.v["cap"],
        ),
        ("free >= 0", S.v["free"] >= 0),
    ]


def unused(S: BState) -> list[tuple[str, z3.BoolRef]]:
    """The atomic profile's batch ghosts stay empty in kvbm."""
    x = z3.Int("xu")
    a = S.a
    return [
        (
            "no pins, no declared blocks",
            z3.ForAll(
                [x], z3.And(z3.Not(a["pin"][x]), z3.Not(a["inb"][x]), z3.Not(a["miss"][x]), z3.Not(a["pmiss"][x]))
            ),
        )
    ]


def announced(S: BState) -> list[tuple[str, z3.BoolRef]]:
    """INV-KVBM-ANNOUNCED, strengthened for the states inside a Use."""
    x = z3.Int("xa")
    a, ph = S.a, S.v["phase"]
    reg, ann, dev, new, ev, evann = (a[k][x] for k in ("reg", "ann", "dev", "new", "ev", "evann"))
    return [
        ("phase is idle, placing or stopped", z3.Or(ph == IDLE, ph == PLACE, ph == STOPPED)),
        (
            "between operations nothing is pending",
            z3.Implies(ph == IDLE, z3.ForAll([x], z3.And(z3.Not(new), z3.Not(ev)))),
        ),
        (
            "not evicted: in view or pending Stored iff registered and announced",
            z3.ForAll([x], z3.Implies(z3.Not(ev), (z3.Or(dev, new)) == z3.And(reg, ann))),
        ),
        (
            "evicted, not back: in view iff announced when evicted",
            z3.ForAll([x], z3.Implies(z3.And(ev, z3.Not(reg)), dev == evann)),
        ),
        (
            "pending Stored: registered, announced, owned",
            z3.ForAll([x], z3.Implies(new, z3.And(reg, ann, a["own"][x] >= 1))),
        ),
        ("evicted and registered: registered again by the batch", z3.ForAll([x], z3.Implies(z3.And(ev, reg), new))),
    ]


def initial(cap: z3.ArithRef) -> BState:
    a = {k: (K_ZERO if k in ("own", "pown") else K_FALSE) for k in BState.fresh("i_").a}
    v = {
        "cap": cap,
        "free": cap,
        "phase": z3.IntVal(IDLE),
        "anc": z3.IntVal(NONE),
        "prev": z3.IntVal(NONE),
        "gpar": z3.IntVal(NONE),
        "gopen": z3.BoolVal(False),
    }
    return BState(a, v, {k: z3.IntVal(0) for k in BState.fresh("i_").c})


PROFILE = ProfileEncoding(
    name=KVBM_NAME,
    transitions={
        "use(begin)": begin,
        "use(full)": use_full,
        "use(partial)": use_partial,
        "use(close)": close,
        "deref(full)": deref_full,
        "deref(partial)": deref_partial,
        "promote": promote,
    },
    invariants={
        "INV-CONSERVE": lambda S: conserve(S) + unused(S),
        "INV-KVBM-ANNOUNCED": announced,
    },
    initial=initial,
    mutants={
        "close-keeps-announced": (
            "STORE-NO-DUP",
            "a block evicted and registered again in one batch stays marked announced",
        ),
        "removed-announced-only": (
            "STORE-NO-DUP",
            "the batch's Removed leaves out a block registered again in the batch",
        ),
        "evict-silent": ("REMOVE-EXACT", "an eviction inside a Use records no pending Removed"),
        "stop-drops-stored": ("USE-CAPACITY", "a Use that stops on capacity publishes no Stored for what it placed"),
        "deref-partial-keeps-slot": ("DEREF-PARTIAL", "a released partial block's slot is not given back to free"),
    },
)
