"""``kvspec prove --profile legacy``: the hash cache of dynamo-mocker 1.0.2.

The legacy manager (``reference/legacy.py``; ai-dynamo/dynamo
``lib/mocker/src/kv_manager.rs``, ``KvManager::process_use``) keeps one cache
of full and partial entries, active (owner count) or inactive (LRU). Its
batch semantics differ from kvbm's: each eviction publishes its Removed at
once, the batch's one Stored comes at the end, and a Use that runs out of
room returns false *keeping* what it placed, with no Stored: those blocks
stay registered and unannounced until they leave the cache (``STORE-NEW-ONLY``
and ``REMOVE-EXACT`` known breaks).

- ``INV-LEGACY-ANNOUNCED``: between operations, for every block hash, the
  router's device view holds it iff it is a registered full entry not placed
  by a failed Use; an entry that leaves the cache is announced again (a
  later registration is an ordinary one). Inside a Use, the blocks it placed
  are pending: registered, owned, announced, not yet in the view.
- ``INV-CONSERVE``: the entries (active and inactive, full and partial) never
  exceed the capacity (the model's free count, capacity minus entries, is
  never negative): a new entry takes room or evicts an inactive one.

Steps: ``use(begin)``, ``use(full)``, ``use(partial)`` (hit, reactivate, new
with room, new evicting an inactive full or partial entry, fail), ``use(close)``,
``deref(full)``/``deref(partial)`` (a Deref of what is not active is ignored),
``destroy(full)``/``destroy(partial)``, ``promote``. The LRU order is not
encoded: any inactive victim is allowed, which covers the model's.
"""

from __future__ import annotations

import z3

from kvspec.reference.smt.blocks import kvbm as kv
from kvspec.reference.smt.blocks.encoding import IDLE, PLACE, STOPPED, BState, BStep, ProfileEncoding
from kvspec.spec.registry import LEGACY_NAME

K_FALSE = kv.K_FALSE


def entries(S: BState) -> z3.ArithRef:
    c = S.c
    return c["act"] + c["inact"] + c["pact"] + c["pinact"]


def _make_room(
    S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]
) -> tuple[BState, dict[str, z3.BoolRef], list[z3.BoolRef]]:
    """Room for one more entry: there is some, or the LRU inactive entry (full
    ``v`` or partial ``w``, as ``vp`` says) is evicted, a full one's Removed
    published at once; or there is none (the Use fails)."""
    v, w, vp = i["v"], i["w"], i["vp"]
    room = entries(S) < S.v["cap"]
    if "ignores-capacity" in tw:
        room = z3.BoolVal(True)
    pool = S.c["inact"] + S.c["pinact"]
    evict = z3.And(z3.Not(room), pool >= 1)
    full_victim = z3.And(evict, z3.Not(vp))
    gone = {"reg": z3.BoolVal(False), "own": z3.IntVal(0)}
    if "evict-keeps-unannounced" not in tw:
        gone["unann"] = z3.BoolVal(False)
    T = S.write("h", v, full_victim, **gone)
    if "evict-silent" not in tw:
        T = T.but(dev=z3.If(full_victim, z3.Store(S.a["dev"], v, z3.BoolVal(False)), S.a["dev"]))
    T = T.write("u", i["w"], z3.And(evict, vp), preg=z3.BoolVal(False), pown=z3.IntVal(0))
    choice = z3.Implies(
        evict, z3.If(vp, z3.And(S.a["preg"][w], S.a["pown"][w] == 0), z3.And(S.a["reg"][v], S.a["own"][v] == 0))
    )
    return T, {"room": room, "evict": evict, "stop": z3.And(z3.Not(room), pool == 0)}, [choice]


def begin(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    step = BStep("use(begin)", S, S.but(phase=z3.IntVal(PLACE)), [S.v["phase"] == IDLE])
    step.rules = {"USE-VALIDATE": z3.BoolVal(True)}
    return step


def validate_partial(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    """USE-VALIDATE, before any block moves: a partial block the Use names is
    not already held (the model refuses the whole Use; one step per partial
    the Use names, right after ``use(begin)``)."""
    u = i["u"]
    active = z3.And(S.a["preg"][u], S.a["pown"][u] >= 1)
    step = BStep("use(validate partial)", S, S, [S.v["phase"] == PLACE, z3.Not(active)])
    step.rules = {"USE-VALIDATE": z3.BoolVal(True)}
    return step


def use_full(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    h = i["h"]
    placing = S.v["phase"] == PLACE
    reg, own = S.a["reg"][h], S.a["own"][h]
    T, case, choice = _make_room(S, i, tw)
    grow = z3.And(placing, z3.Not(reg), z3.Not(case["stop"]))
    T = T.write("h", h, True, reg=z3.BoolVal(True), own=z3.IntVal(1), new=z3.BoolVal(True))
    post = kv._ite(z3.And(placing, reg), S.write("h", h, True, own=own + 1), kv._ite(grow, T, S))
    post = post.but(phase=z3.If(z3.And(placing, z3.Not(reg), case["stop"]), z3.IntVal(STOPPED), S.v["phase"]))
    step = BStep("use(full)", S, post, [kv.in_batch(S), h >= 0, *[z3.Implies(grow, c) for c in choice]])
    step.rules = {
        "USE-HIT-ACTIVE": z3.And(placing, reg, own >= 1),
        "USE-HIT-INACTIVE": z3.And(placing, reg, own == 0),
        "USE-NEW": z3.And(placing, z3.Not(reg), case["room"]),
        "EVICT-POLICY (full victim)": z3.And(grow, case["evict"], z3.Not(i["vp"])),
        "EVICT-POLICY (partial victim)": z3.And(grow, case["evict"], i["vp"]),
        "USE-CAPACITY": z3.And(placing, z3.Not(reg), case["stop"]),
    }
    return step


def use_partial(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    u = i["u"]
    placing = S.v["phase"] == PLACE
    held, pown = S.a["preg"][u], S.a["pown"][u]
    T, case, choice = _make_room(S, i, tw)
    grow = z3.And(placing, z3.Not(held), z3.Not(case["stop"]))
    T = T.write("u", u, True, preg=z3.BoolVal(True), pown=z3.IntVal(1))
    post = kv._ite(z3.And(placing, held), S.write("u", u, True, pown=pown + 1), kv._ite(grow, T, S))
    post = post.but(phase=z3.If(z3.And(placing, z3.Not(held), case["stop"]), z3.IntVal(STOPPED), S.v["phase"]))
    step = BStep("use(partial)", S, post, [kv.in_batch(S), *[z3.Implies(grow, c) for c in choice]])
    step.rules = {
        "USE-PARTIAL (reactivated)": z3.And(placing, held, pown == 0),
        "USE-PARTIAL (new)": z3.And(placing, z3.Not(held), case["room"]),
        "EVICT-POLICY": z3.And(grow, case["evict"]),
        "USE-CAPACITY": z3.And(placing, z3.Not(held), case["stop"]),
    }
    return step


def close(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    """A Use that placed everything publishes one Stored of its new blocks; one
    that failed publishes none and its new blocks stay unannounced."""
    x = z3.Int("xl")
    a = S.a
    ok = S.v["phase"] == PLACE
    dev = z3.If(ok, z3.Lambda([x], z3.Or(a["dev"][x], a["new"][x])), a["dev"])
    unann = a["unann"]
    if "fail-forgets-unannounced" not in tw:
        unann = z3.If(ok, a["unann"], z3.Lambda([x], z3.Or(a["unann"][x], a["new"][x])))
    post = S.but(dev=dev, unann=unann, new=K_FALSE, phase=z3.IntVal(IDLE))
    h = i["h"]
    step = BStep("use(close)", S, post, [kv.in_batch(S)])
    step.rules = {
        "STORE-NEW-ONLY": z3.And(ok, a["new"][h]),
        "STORE-NEW-ONLY (failed Use: unannounced)": z3.And(z3.Not(ok), a["new"][h]),
    }
    return step


def deref_full(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    h = i["h"]
    own = S.a["own"][h]
    held = z3.And(S.a["reg"][h], own >= 1)
    step = BStep("deref(full)", S, S.write("h", h, held, own=own - 1), [S.v["phase"] == IDLE])
    step.rules = {
        "DEREF-OWNER": held,
        "DEREF-OWNER (to inactive)": z3.And(held, own == 1),
        "DEREF-UNKNOWN (ignored)": z3.Not(held),
    }
    return step


def deref_partial(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    u = i["u"]
    pown = S.a["pown"][u]
    held = z3.And(S.a["preg"][u], pown >= 1)
    step = BStep("deref(partial)", S, S.write("u", u, held, pown=pown - 1), [S.v["phase"] == IDLE])
    step.rules = {
        "DEREF-OWNER (partial entry to inactive)": z3.And(held, pown == 1),
        "DEREF-UNKNOWN (ignored)": z3.Not(held),
    }
    return step


def destroy_full(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    h = i["h"]
    post = S.write("h", h, True, reg=z3.BoolVal(False), own=z3.IntVal(0), unann=z3.BoolVal(False))
    if "destroy-silent" not in tw:
        post = post.but(dev=z3.Store(S.a["dev"], h, z3.BoolVal(False)))
    step = BStep("destroy(full)", S, post, [S.v["phase"] == IDLE, h >= 0, S.a["reg"][h], S.a["own"][h] >= 1])
    step.rules = {"DESTROY-ACTIVE": z3.BoolVal(True)}
    return step


def destroy_partial(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    u = i["u"]
    post = S.write("u", u, True, preg=z3.BoolVal(False), pown=z3.IntVal(0))
    step = BStep("destroy(partial)", S, post, [S.v["phase"] == IDLE, S.a["preg"][u], S.a["pown"][u] >= 1])
    step.rules = {"DESTROY-ACTIVE": z3.BoolVal(True)}
    return step


def promote(S: BState, i: dict[str, z3.ExprRef], tw: frozenset[str]) -> BStep:
    u, h = i["u"], i["h"]
    reg = S.a["reg"][h]
    S1 = S.write("u", u, True, preg=z3.BoolVal(False), pown=z3.IntVal(0))
    existing = S1.write("h", h, True, own=S.a["own"][h] + 1)
    new = S1.write("h", h, True, reg=z3.BoolVal(True), own=z3.IntVal(1))
    new = new.but(dev=z3.Store(S.a["dev"], h, z3.BoolVal(True)))  # its Stored
    step = BStep(
        "promote", S, kv._ite(reg, existing, new), [S.v["phase"] == IDLE, S.a["preg"][u], S.a["pown"][u] == 1, h >= 0]
    )
    step.rules = {"PROMOTE-NEW": z3.Not(reg), "PROMOTE-EXISTING": reg}
    return step


def conserve(S: BState) -> list[tuple[str, z3.BoolRef]]:
    return [("entries <= capacity (free >= 0)", entries(S) <= S.v["cap"])]


def announced(S: BState) -> list[tuple[str, z3.BoolRef]]:
    x = z3.Int("xa")
    a, ph = S.a, S.v["phase"]
    reg, unann, dev, new = (a[k][x] for k in ("reg", "unann", "dev", "new"))
    return [
        ("phase is idle, placing or failed", z3.Or(ph == IDLE, ph == PLACE, ph == STOPPED)),
        ("between operations nothing is pending", z3.Implies(ph == IDLE, z3.ForAll([x], z3.Not(new)))),
        (
            "the view is the announced entries, pending Stored aside",
            z3.ForAll([x], z3.Implies(z3.Not(new), dev == z3.And(reg, z3.Not(unann)))),
        ),
        (
            "pending Stored: registered, owned, announced, not in the view",
            z3.ForAll([x], z3.Implies(new, z3.And(reg, a["own"][x] >= 1, z3.Not(unann), z3.Not(dev)))),
        ),
        ("an entry that left the cache is announced again", z3.ForAll([x], z3.Implies(z3.Not(reg), z3.Not(unann)))),
        ("the atomic and kvbm ghosts stay empty", z3.ForAll([x], z3.And(z3.Not(a["pin"][x]), z3.Not(a["ev"][x])))),
    ]


PROFILE = ProfileEncoding(
    name=LEGACY_NAME,
    transitions={
        "use(begin)": begin,
        "use(validate partial)": validate_partial,
        "use(full)": use_full,
        "use(partial)": use_partial,
        "use(close)": close,
        "deref(full)": deref_full,
        "deref(partial)": deref_partial,
        "destroy(full)": destroy_full,
        "destroy(partial)": destroy_partial,
        "promote": promote,
    },
    invariants={"INV-CONSERVE": conserve, "INV-LEGACY-ANNOUNCED": announced},
    initial=kv.initial,
    mutants={
        "fail-forgets-unannounced": ("STORE-NEW-ONLY", "a failed Use's placed blocks are not marked unannounced"),
        "evict-keeps-unannounced": ("REMOVE-EXACT", "an evicted entry stays in the unannounced set"),
        "evict-silent": ("REMOVE-EXACT", "an eviction publishes no Removed"),
        "ignores-capacity": ("USE-CAPACITY", "a new entry is added without room or an eviction"),
        "destroy-silent": ("DESTROY-ACTIVE", "Destroy publishes no Removed"),
    },
)
