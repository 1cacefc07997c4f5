"""z3: the shared G3 tier keeps its capacity and holds each block once (bounded).

The encoding is the G3 part of ``reference/lower_tiers.py`` (SPEC.md, "Lower
tiers"), over a fixed universe: ``workers`` workers, ``hashes`` block hashes,
G3 of ``capacity`` blocks. State: which hashes G3 holds, which worker has a
copy of which hash in flight, how many destinations the copies in flight have
taken and how many are admitted. Two transitions, for any worker and hash:

- *send* (TIER-DEDUP, TIER-ADMIT, TIER-EVICT): the presence filter passes a
  hash G3 does not hold and nobody is copying; the capacity policy admits it
  when G3's available blocks (free + held, all evictable here) less the
  admitted ones leave room; the copy takes a destination, a free one or an
  evicted block's (any held block: the lineage choice does not matter here);
- *land* (TIER-OWNER): a copy in flight lands; G3 rejects a duplicate.

Proven by induction (the invariant holds initially, and every transition
from any state satisfying it leads to a state satisfying it):

- ``TIER-ADMIT``: held + destinations taken <= capacity, destinations taken =
  admitted = copies in flight (conservation of the shared tier);
- ``TIER-DEDUP``: per hash, held + copies in flight from all workers <= 1 (no
  duplicate across workers).

Each mutant breaks one guard and must be refuted (a counterexample to the
induction step), and every transition must be enabled in some reachable state
(sanity), so that a proof is not vacuous.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvspec.reference.smt import solving

#: the default universe: two workers, four hashes, G3 of three blocks (more
#: hashes than blocks, so a full G3 can be offered a new one; with
#: fewer than three, admission never lets two copies fly at once: a copy in
#: flight counts twice against the room)
WORKERS, HASHES, CAPACITY = 2, 4, 3
#: mutants: name -> what it breaks
MUTANTS: dict[str, str] = {
    "pending_ignored": "the presence filter ignores copies in flight from other workers (TIER-DEDUP)",
    "take_full_slot": "a copy takes a 'free' destination when G3 has none and evicts nothing (TIER-ADMIT)",
    "evict_keeps_block": "an eviction takes a held block's place without removing it (TIER-EVICT)",
}


@dataclass(frozen=True)
class _SharedTierState:
    held: list[z3.BoolRef]  # per hash
    fly: list[list[z3.BoolRef]]  # per worker, per hash
    dest: z3.ArithRef
    adm: z3.ArithRef


def _state(tag: str, w: int, h: int) -> _SharedTierState:
    return _SharedTierState(
        [z3.Bool(f"{tag}_held_{j}") for j in range(h)],
        [[z3.Bool(f"{tag}_fly_{i}_{j}") for j in range(h)] for i in range(w)],
        z3.Int(f"{tag}_dest"),
        z3.Int(f"{tag}_adm"),
    )


def _n(bs: list[z3.BoolRef]) -> z3.ArithRef:
    return z3.Sum([z3.If(b, 1, 0) for b in bs]) if bs else z3.IntVal(0)


def conserve(s: _SharedTierState, cap: int) -> z3.BoolRef:
    flying = _n([b for row in s.fly for b in row])
    return z3.And(_n(s.held) + s.dest <= cap, s.dest == flying, s.adm == flying, s.dest >= 0)


def no_dup(s: _SharedTierState) -> z3.BoolRef:
    h = len(s.held)
    return z3.And([z3.If(s.held[j], 1, 0) + _n([row[j] for row in s.fly]) <= 1 for j in range(h)])


def _unchanged_except(s: _SharedTierState, t: _SharedTierState, w: int, j: int, victim: int | None) -> list[z3.BoolRef]:
    out: list[z3.BoolRef] = []
    for jj in range(len(s.held)):
        if jj not in (j, victim):
            out.append(t.held[jj] == s.held[jj])
    for ii, row in enumerate(s.fly):
        for jj, b in enumerate(row):
            if (ii, jj) != (w, j):
                out.append(t.fly[ii][jj] == b)
    return out


def transitions(
    s: _SharedTierState, t: _SharedTierState, cap: int, mutant: str | None = None
) -> list[tuple[str, z3.BoolRef]]:
    """Every (name, relation) of one step from ``s`` to ``t``."""
    out: list[tuple[str, z3.BoolRef]] = []
    w, h = len(s.fly), len(s.held)
    room = (cap - _n(s.held) - s.dest) + _n(s.held) - s.adm  # available - admitted
    free = cap - _n(s.held) - s.dest
    for i in range(w):
        for j in range(h):
            filt = z3.Not(s.held[j])
            if mutant != "pending_ignored":
                filt = z3.And(filt, z3.Not(z3.Or([row[j] for row in s.fly])))
            else:
                filt = z3.And(filt, z3.Not(s.fly[i][j]))
            admit = room >= 1
            common = [filt, admit, t.fly[i][j], t.dest == s.dest + 1, t.adm == s.adm + 1]
            # a free destination
            out.append(
                (
                    f"send-free w{i} h{j}",
                    z3.And(
                        *common,
                        free >= 1 if mutant != "take_full_slot" else z3.BoolVal(True),
                        t.held[j] == s.held[j],
                        *_unchanged_except(s, t, i, j, None),
                    ),
                )
            )
            # an evicted block's destination
            for v in range(h):
                if v == j:
                    continue
                gone = t.held[v] == s.held[v] if mutant == "evict_keeps_block" else z3.Not(t.held[v])
                out.append(
                    (
                        f"send-evict w{i} h{j} v{v}",
                        z3.And(*common, s.held[v], gone, t.held[j] == s.held[j], *_unchanged_except(s, t, i, j, v)),
                    )
                )
            # land: registered unless G3 holds it (a duplicate is rejected)
            out.append(
                (
                    f"land w{i} h{j}",
                    z3.And(
                        s.fly[i][j],
                        z3.Not(t.fly[i][j]),
                        t.held[j],
                        t.dest == s.dest - 1,
                        t.adm == s.adm - 1,
                        *_unchanged_except(s, t, i, j, None),
                    ),
                )
            )
    return out


def _init(s: _SharedTierState) -> z3.BoolRef:
    return z3.And(*[z3.Not(b) for b in s.held], *[z3.Not(b) for row in s.fly for b in row], s.dest == 0, s.adm == 0)


@dataclass(frozen=True)
class Row:
    name: str
    ok: bool
    verdict: str
    seconds: float
    detail: str = ""


def _inductive(
    prop: Callable[[_SharedTierState], z3.BoolRef], w: int, h: int, cap: int, mutant: str | None
) -> str | None:
    """None when ``prop`` (with the full invariant as hypothesis) holds
    initially and after every step; else the failing transition's name, or
    ``unknown (REASON) at NAME`` when z3 gives no answer it can show."""
    s, t = _state("s", w, h), _state("t", w, h)
    inv = z3.And(conserve(s, cap), no_dup(s))
    solver = z3.Solver()
    solver.add(_init(s), z3.Not(prop(s)))
    steps = [("init", solver)]
    for name, rel in transitions(s, t, cap, mutant):
        solver = z3.Solver()
        solver.add(inv, rel, z3.Not(prop(t)))
        steps.append((name, solver))
    unknown = None
    for name, solver in steps:
        a = solving.check(solver)
        if a.sat:
            return name
        if a.unknown and unknown is None:
            unknown = f"{a.verdict} at {name}"
    return unknown


def _reachable_kinds(w: int, h: int, cap: int, depth: int) -> set[str]:
    """Which kinds of transition (send-free, send-evict, land) fire within
    ``depth`` steps of the initial state (bounded model checking)."""
    states = [_state(f"k{d}", w, h) for d in range(depth + 1)]
    fired: set[str] = set()
    for d in range(depth):
        for name, rel in transitions(states[d], states[d + 1], cap):
            kind = name.split(" ")[0]
            if kind in fired:
                continue
            solver = z3.Solver()
            solver.add(_init(states[0]))
            for k in range(d):
                solver.add(z3.Or([r for _n, r in transitions(states[k], states[k + 1], cap)]))
            solver.add(rel)
            if solving.check(solver).sat:
                fired.add(kind)
    return fired


def prove_shared_tier(workers: int = WORKERS, hashes: int = HASHES, capacity: int = CAPACITY) -> list[Row]:
    """The rows ``kvspec prove`` prints for the shared tier: the two
    invariants, the sanity check, and one row per mutant (refuted or not)."""
    bound = f"{workers} workers, {hashes} hashes, G3 {capacity}"
    rows: list[Row] = []
    for name, prop in (("TIER-ADMIT", lambda s: conserve(s, capacity)), ("TIER-DEDUP", no_dup)):
        t0 = time.perf_counter()
        bad = _inductive(prop, workers, hashes, capacity, None)
        rows.append(
            Row(
                name,
                bad is None,
                "proven" if bad is None else bad.split(" at ")[0] if bad.startswith("unknown") else "COUNTEREXAMPLE",
                time.perf_counter() - t0,
                bad or bound,
            )
        )
    t0 = time.perf_counter()
    fired = _reachable_kinds(workers, hashes, capacity, depth=capacity + 2)
    missing = {"send-free", "send-evict", "land"} - fired
    rows.append(
        Row(
            "SANITY-TIER-FIRES",
            not missing,
            "ok" if not missing else "FAILED",
            time.perf_counter() - t0,
            f"never enabled: {sorted(missing)}" if missing else bound,
        )
    )
    for m in MUTANTS:
        t0 = time.perf_counter()
        where = {
            n: _inductive(p, workers, hashes, capacity, m)
            for n, p in (("TIER-ADMIT", lambda s: conserve(s, capacity)), ("TIER-DEDUP", no_dup))
        }
        broken = [n for n, w in where.items() if w is not None and not w.startswith("unknown")]
        unknown = [w.split(" at ")[0] for w in where.values() if w is not None and w.startswith("unknown")]
        rows.append(
            Row(
                f"mutant {m}",
                bool(broken),
                f"refuted ({', '.join(broken)})" if broken else unknown[0] if unknown else "NOT REFUTED",
                time.perf_counter() - t0,
                bound,
            )
        )
    return rows
