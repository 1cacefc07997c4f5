"""``kvspec prove --profile atomic``: the atomic profile's all-or-nothing Use and grouped Stored events.

The atomic Use (``reference/g1.py``, ``G1Model._use_atomic``; SPEC.md "What
the atomic profile does") is encoded as the model runs it: ``use(begin)``
(the caller's parent), one ``use(declare ...)`` per block of the batch (a
registered block is named and, when inactive, pinned out of the pool; an
unregistered block or an unheld partial is counted as needed), ``use(check)``
(need <= free + the pool: go on; else every pin is undone and nothing else
happened: ``USE-CAPACITY``), one ``use(place ...)`` per block, and
``use(close)``. Full blocks of an atomic batch are distinct (two at one
position are rejected), so each is declared and placed once.

Invariants, for every state inside a Use as well as between operations:

- ``INV-ATOMIC-NO-HALF``: a Use that passed its check places every block. While
  placing, the blocks still needed are at most the free slots plus the pool;
  a block of the batch is never evicted (it is active or pinned). So the step
  ``use(place stuck)`` (a needed block with no free slot and an empty pool) is
  proven never enabled.
- ``INV-ATOMIC-ANCHOR``: every Stored's parent is the block immediately
  before its first block (the last full block placed before the group, or the
  caller's parent) and the router holds it when the Stored arrives (under the
  caller contract that the Use's and the Promote's parent is registered:
  ``ASSUME-PARENT-REGISTERED``).
- ``INV-ROUTER-MATCH``: between operations the router's device view is exactly
  the registered blocks (nothing is ever left unannounced: no block of the
  batch is evicted, so none is registered twice in a batch); inside a Use,
  up to the pending Stored of the open group and the pending Removed.
- ``INV-CONSERVE``: free + partial + active (pinned included) + inactive = capacity.
"""

from __future__ import annotations

import z3

from kvspec.reference.smt.blocks import kvbm as kv
from kvspec.reference.smt.blocks.encoding import DECLARE, IDLE, NONE, PLACE, BState, BStep, ProfileEncoding
from kvspec.spec.registry import ATOMIC_NAME

K_FALSE = kv.K_FALSE


def _take(S: BState, v: z3.ArithRef, tw: frozenset[str]) -> tuple[BState, z3.BoolRef, list[z3.BoolRef]]:
    """A free slot, else the slot of inactive ``v`` (evicted, Removed pending)."""
    free = S.v["free"]
    fresh = free >= 1
    T = S.but(free=z3.If(fresh, free - 1, free))
    T = T.write("h", v, z3.Not(fresh), reg=z3.BoolVal(False), own=z3.IntVal(0), ev=z3.BoolVal(True))
    return T, fresh, [z3.Implies(z3.Not(fresh), kv.inactive(S, v))]


def begin(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    p = i["p"]
    post = S.but(phase=z3.IntVal(DECLARE), anc=p, prev=p, gpar=z3.IntVal(NONE), gopen=z3.BoolVal(False))
    # ASSUME-PARENT-REGISTERED: the caller's parent is none or a registered block
    contract = z3.Or(p == NONE, z3.And(p >= 0, S.a["reg"][p]))
    if "contract-dropped" in tw:
        contract = p >= NONE
    step = BStep("use(begin)", S, post, [S.v["phase"] == IDLE, contract])
    step.rules = {"USE-VALIDATE": z3.BoolVal(True), "PARENT-ANCHOR (caller parent)": p >= 0}
    return step


def declare_full(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    h = i["h"]
    reg = S.a["reg"][h]
    pin = z3.And(reg, S.a["own"][h] == 0)
    if "no-pin" in tw:
        pin = z3.BoolVal(False)
    post = S.write("h", h, True, inb=z3.BoolVal(True), miss=z3.Not(reg), pin=pin)
    step = BStep("use(declare full)", S, post, [S.v["phase"] == DECLARE, h >= 0, z3.Not(S.a["inb"][h])])
    step.rules = {
        "USE-HIT-INACTIVE (pinned)": pin,
        "USE-HIT-ACTIVE": z3.And(reg, S.a["own"][h] >= 1),
        "USE-NEW": z3.Not(reg),
    }
    return step


def declare_partial(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    u = i["u"]
    held = S.a["preg"][u]
    post = S.write("u", u, z3.Not(held), pmiss=z3.BoolVal(True))
    step = BStep("use(declare partial)", S, post, [S.v["phase"] == DECLARE])
    step.rules = {"USE-PARTIAL": z3.Not(held), "USE-PARTIAL (held)": held}
    return step


def check(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    """The capacity check before anything moves: go on, or undo the pins."""
    c = S.c
    room = S.v["free"] + c["inact"] + (c["pin"] if "check-counts-pinned" in tw else 0)
    ok = c["miss"] + c["pmiss"] <= room
    undone = S.but(
        pin=K_FALSE,
        inb=K_FALSE,
        miss=K_FALSE,
        pmiss=K_FALSE,
        c_act=c["act"] - c["pin"],
        c_inact=c["inact"] + c["pin"],
        c_pin=z3.IntVal(0),
        c_miss=z3.IntVal(0),
        c_pmiss=z3.IntVal(0),
        phase=z3.IntVal(IDLE),
    )
    post = kv._ite(ok, S.but(phase=z3.IntVal(PLACE)), undone)
    step = BStep("use(check)", S, post, [S.v["phase"] == DECLARE])
    step.rules = {"USE-CAPACITY (all or nothing)": z3.Not(ok), "USE-CAPACITY (room)": ok}
    return step


def _emit(S: BState, tw: frozenset[str]) -> tuple[BState, list[z3.BoolRef]]:
    """Close the open group: its Stored (the new blocks) reaches the router,
    anchored to ``anc``, which must be the block before the group and held."""
    x = z3.Int("xg")
    a, v = S.a, S.v
    ok = z3.Implies(v["gopen"], z3.And(v["anc"] == v["gpar"], z3.Or(v["anc"] == NONE, a["dev"][v["anc"]])))
    dev = z3.If(v["gopen"], z3.Lambda([x], z3.Or(a["dev"][x], a["new"][x])), a["dev"])
    return S.but(dev=dev, new=K_FALSE, gopen=z3.BoolVal(False)), [ok]


def place_full(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    h, v = i["h"], i["v"]
    a = S.a
    reg = a["reg"][h]
    # a reused block: one owner (a pinned one leaves its pin), closes the group, anchors the next
    hit = S.write("h", h, True, own=a["own"][h] + 1, pin=z3.BoolVal(False), inb=z3.BoolVal(False))
    if "hit-keeps-group" in tw:
        hit_ob: list[z3.BoolRef] = []
    else:
        hit, hit_ob = _emit(hit, tw)
    hit = hit.but(anc=h, prev=h)
    # a new block: a slot, registered with one owner, joins (or opens) the group
    T, fresh, choice = _take(S, v, tw)
    T = T.write(
        "h",
        h,
        True,
        reg=z3.BoolVal(True),
        own=z3.IntVal(1),
        new=z3.BoolVal(True),
        miss=z3.BoolVal(False),
        inb=z3.BoolVal(False),
    )
    T = T.but(gopen=z3.BoolVal(True), gpar=z3.If(S.v["gopen"], S.v["gpar"], S.v["prev"]), prev=h)
    room = z3.Or(S.v["free"] >= 1, S.c["inact"] >= 1)
    step = BStep(
        "use(place full)",
        S,
        kv._ite(reg, hit, T),
        [S.v["phase"] == PLACE, h >= 0, a["inb"][h], z3.Implies(z3.Not(reg), z3.And(room, *choice))],
    )
    step.obligations = {"INV-ATOMIC-ANCHOR": [z3.Implies(reg, ob) for ob in hit_ob]}
    if hit_ob:
        step.stored = [(z3.And(reg, S.v["gopen"]), S.v["anc"])]
    step.rules = {
        "USE-HIT-ACTIVE": z3.And(reg, z3.Not(a["pin"][h])),
        "USE-HIT-INACTIVE (pinned)": z3.And(reg, a["pin"][h]),
        "PARENT-ANCHOR (group split)": z3.And(reg, S.v["gopen"]),
        "USE-NEW": z3.And(z3.Not(reg), fresh),
        "EVICT-POLICY": z3.And(z3.Not(reg), z3.Not(fresh)),
    }
    return step


def place_partial(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    u, v = i["u"], i["v"]
    held = S.a["preg"][u]
    T, fresh, choice = _take(S, v, tw)
    T = T.write("u", u, True, preg=z3.BoolVal(True), pown=z3.IntVal(1), pmiss=z3.BoolVal(False))
    room = z3.Or(S.v["free"] >= 1, S.c["inact"] >= 1)
    step = BStep(
        "use(place partial)",
        S,
        kv._ite(held, S, T),
        [S.v["phase"] == PLACE, z3.Or(held, S.a["pmiss"][u]), z3.Implies(z3.Not(held), z3.And(room, *choice))],
    )
    step.rules = {"USE-PARTIAL": z3.And(z3.Not(held), fresh), "EVICT-POLICY": z3.And(z3.Not(held), z3.Not(fresh))}
    return step


def place_stuck(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    """A needed block with no free slot and an empty pool: the half-applied Use
    the atomic profile must never reach (proven never enabled)."""
    h, u = i["h"], i["u"]
    needed = z3.Or(S.a["miss"][h], S.a["pmiss"][u])
    step = BStep("use(place stuck)", S, S, [S.v["phase"] == PLACE, needed, S.v["free"] == 0, S.c["inact"] == 0])
    step.rules = {"USE-CAPACITY (half-applied)": z3.BoolVal(True)}
    return step


def close(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    """The last group's Stored, then one Removed for every eviction."""
    x = z3.Int("xc")
    a = S.a
    done = z3.ForAll([x], z3.And(z3.Not(a["inb"][x]), z3.Not(a["pmiss"][x])))
    T, ob = _emit(S, tw)
    gone = z3.BoolVal(False) if "removed-keeps-evicted" in tw else a["ev"][x]
    T = T.but(dev=z3.Lambda([x], z3.And(T.a["dev"][x], z3.Not(gone))), ev=K_FALSE, phase=z3.IntVal(IDLE))
    step = BStep("use(close)", S, T, [S.v["phase"] == PLACE, done])
    step.obligations = {"INV-ATOMIC-ANCHOR": ob}
    step.stored = [(S.v["gopen"], S.v["anc"])]
    step.removed = a["ev"]
    h = i["h"]
    step.rules = {"STORE-NEW-ONLY": z3.And(S.v["gopen"], a["new"][h]), "REMOVE-EXACT": a["ev"][h]}
    return step


def promote(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    """As in kvbm; its Stored names the caller's parent (ASSUME-PARENT-REGISTERED)."""
    step = kv.promote(S, i, tw)
    p = i["p"]
    if "contract-dropped" not in tw:
        step.requires.append(z3.Or(p == NONE, z3.And(p >= 0, S.a["reg"][p])))
    step.obligations = {"INV-ATOMIC-ANCHOR": [z3.Implies(z3.Not(S.a["reg"][i["h"]]), z3.Or(p == NONE, S.a["dev"][p]))]}
    return step


def _in_use(S: BState) -> z3.BoolRef:
    return z3.Or(S.v["phase"] == DECLARE, S.v["phase"] == PLACE)


def router_match(S: BState) -> list[tuple[str, z3.BoolRef]]:
    x = z3.Int("xr")
    a, ph = S.a, S.v["phase"]
    reg, dev, new, ev = (a[k][x] for k in ("reg", "dev", "new", "ev"))
    return [
        ("phase is idle, declaring or placing", z3.Or(ph == IDLE, ph == DECLARE, ph == PLACE)),
        ("nothing pending outside placing", z3.Implies(ph != PLACE, z3.ForAll([x], z3.And(z3.Not(new), z3.Not(ev))))),
        (
            "the view is the registered blocks, pending events aside",
            z3.ForAll([x], z3.Implies(z3.And(z3.Not(new), z3.Not(ev)), dev == reg)),
        ),
        (
            "pending Stored: registered, owned, not in the view",
            z3.ForAll([x], z3.Implies(new, z3.And(reg, a["own"][x] >= 1, z3.Not(dev), z3.Not(ev)))),
        ),
        (
            "pending Removed: gone, in the view, not of the batch",
            z3.ForAll([x], z3.Implies(ev, z3.And(z3.Not(reg), dev, z3.Not(a["inb"][x])))),
        ),
    ]


def no_half(S: BState) -> list[tuple[str, z3.BoolRef]]:
    x = z3.Int("xn")
    a, c, ph = S.a, S.c, S.v["phase"]
    reg, inb, miss, pin = (a[k][x] for k in ("reg", "inb", "miss", "pin"))
    return [
        (
            "idle: no batch",
            z3.Implies(ph == IDLE, z3.ForAll([x], z3.And(z3.Not(inb), z3.Not(pin), z3.Not(a["pmiss"][x])))),
        ),
        ("needed: of the batch, not registered", z3.ForAll([x], z3.Implies(miss, z3.And(inb, z3.Not(reg))))),
        ("of the batch and not registered: needed", z3.ForAll([x], z3.Implies(z3.And(inb, z3.Not(reg)), miss))),
        (
            "of the batch and registered: owned or pinned",
            z3.ForAll([x], z3.Implies(z3.And(inb, reg), z3.Or(pin, a["own"][x] >= 1))),
        ),
        (
            "pinned: registered, no owner, of the batch",
            z3.ForAll([x], z3.Implies(pin, z3.And(reg, a["own"][x] == 0, inb))),
        ),
        ("a needed partial is not held", z3.ForAll([x], z3.Implies(a["pmiss"][x], z3.Not(a["preg"][x])))),
        ("placing: needed <= free + pool", z3.Implies(ph == PLACE, c["miss"] + c["pmiss"] <= S.v["free"] + c["inact"])),
    ]


def anchor(S: BState) -> list[tuple[str, z3.BoolRef]]:
    x = z3.Int("xq")
    v, a = S.v, S.a
    return [
        (
            "in a Use the anchor is none or in the view",
            z3.Implies(_in_use(S), z3.Or(v["anc"] == NONE, a["dev"][v["anc"]])),
        ),
        (
            "an open group's anchor is the block before it",
            z3.Implies(v["gopen"], z3.And(v["anc"] == v["gpar"], v["phase"] == PLACE)),
        ),
        (
            "no open group: the anchor is the last full block",
            z3.Implies(z3.And(_in_use(S), z3.Not(v["gopen"])), v["anc"] == v["prev"]),
        ),
        ("no open group: no pending Stored", z3.Implies(z3.Not(v["gopen"]), z3.ForAll([x], z3.Not(a["new"][x])))),
    ]


PROFILE = ProfileEncoding(
    name=ATOMIC_NAME,
    transitions={
        "use(begin)": begin,
        "use(declare full)": declare_full,
        "use(declare partial)": declare_partial,
        "use(check)": check,
        "use(place full)": place_full,
        "use(place partial)": place_partial,
        "use(place stuck)": place_stuck,
        "use(close)": close,
        "deref(full)": kv.deref_full,
        "deref(partial)": kv.deref_partial,
        "promote": promote,
    },
    invariants={
        "INV-CONSERVE": kv.conserve,
        "INV-ROUTER-MATCH": router_match,
        "INV-ATOMIC-NO-HALF": no_half,
        "INV-ATOMIC-ANCHOR": anchor,
    },
    initial=kv.initial,
    mutants={
        "no-pin": ("USE-HIT-INACTIVE", "the batch's inactive hits are not pinned before its allocations"),
        "check-counts-pinned": ("USE-CAPACITY", "the capacity check counts the batch's own pinned hits as evictable"),
        "hit-keeps-group": ("PARENT-ANCHOR", "a reused block does not close the Stored group (kvbm's single Stored)"),
        "deref-partial-keeps-slot": ("DEREF-PARTIAL", "a released partial block's slot is not given back to free"),
        "removed-keeps-evicted": ("REMOVE-EXACT", "the batch's Removed leaves its evicted blocks in the router's view"),
        "contract-dropped": (
            "ASSUME-PARENT-REGISTERED",
            "a caller may name an unregistered parent (shows the contract is needed for the anchor)",
        ),
    },
    unreachable=("use(place stuck)",),
)
