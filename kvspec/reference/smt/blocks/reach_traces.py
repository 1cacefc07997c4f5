"""REACHABLE for kvbm, legacy and atomic at ``prove``'s cost: recorded traces, checked again pinned.

Searching the block encodings' goals from the initial state
(``blocks/reach.py``: greedy BMC, then the model-guided stage) costs minutes
(legacy: 81 s of CPU), too much for every ``kvspec prove``. So the search
runs offline (``scripts/gen_block_reach_traces.py`` calls ``record``) and
keeps, per profile, a few traces (``reach_traces.json``: each goal on the
longest recorded trace it is a prefix of, every input pinned, victims
included, and the capacity). ``check`` replays each trace in the encoding
as it is now, pinned (``reach._Unrolling.pin``), and asks z3 for each goal
at its step: a pinned trace is a concrete run, so each question is cheap.

A guard narrowed since the recording makes its trace infeasible or its
goal false at that step: the row fails naming the transition and the case
(it may be a false alarm when another trace would still reach the case;
``record`` again then, and the new search decides). A goal the encoding
has now and the recording lacks (a new rule case) fails the row too, as
does a goal the recording did not reach.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.blocks.encoding import ProfileEncoding
from kvspec.reference.smt.reach import ReachStep, ReachTrace, _Unrolling, cover
from kvspec.reference.smt.recorded import Checked
from kvspec.spec.registry import ATOMIC_NAME

DATA = Path(__file__).with_name("reach_traces.json")
#: per solver call of the pinned checks
TIMEOUT_MS = 30_000
#: profile -> why it has no recorded traces (its REACHABLE row says so instead of passing)
NOT_RECORDED: dict[str, str] = {
    ATOMIC_NAME: "its search did not finish in 900 s of CPU on the 2-core machine (z3 gives up at depth 5)",
}


def _load() -> dict[str, Any]:
    return json.loads(DATA.read_text()) if DATA.is_file() else {}


def record(profile: str, timeout_ms: int = 20_000) -> list[tuple[str, str]]:
    """Search every goal of ``profile`` and store the traces (returns the goals not reached)."""
    from kvspec.reference.smt.blocks.catalogue import block_encoding
    from kvspec.reference.smt.blocks.reach import system

    sysm = system(block_encoding(profile))
    cov = cover(dataclasses.replace(sysm, guide=None), timeout_ms)
    reached = dict(cov.reached)
    missing = list(cov.missing)
    if missing and sysm.guide is not None:
        sysm.guide(missing, reached)
        missing = [g for g in missing if g not in reached]
    chosen: list[ReachTrace] = []
    goals: list[list[list[Any]]] = []
    for (t, g), tr in sorted(reached.items(), key=lambda kv: -len(kv[1])):
        for n, c in enumerate(chosen):
            if c.params == tr.params and [str(s) for s in c.steps[: len(tr)]] == [str(s) for s in tr.steps]:
                goals[n].append([t, g, len(tr)])
                break
        else:
            chosen.append(tr)
            goals.append([[t, g, len(tr)]])
    data = _load()
    data[profile] = {
        "traces": [
            {"capacity": c.params.get("capacity"), "steps": [[s.transition, s.inputs] for s in c.steps], "goals": gs}
            for c, gs in zip(chosen, goals, strict=True)
        ],
        "not_reached": [list(g) for g in missing],
    }
    DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return missing


def recorded(profile: str) -> bool:
    return profile in _load()


def check(prof: ProfileEncoding, tw: frozenset[str] = frozenset(), timeout_ms: int = TIMEOUT_MS) -> Checked:
    """Every recorded goal of ``prof`` still reached on its recorded trace, and every goal recorded."""
    from kvspec.reference.smt.blocks.reach import system

    data = _load().get(prof.name)
    where = f"{prof.name} step"
    if data is None:
        return Checked(0, 0, 0, [f"{where}: no recorded traces (run scripts/gen_block_reach_traces.py)"])
    sysm = system(prof, tw, depth=1)
    excluded = sysm.excluded()
    missing: dict[str, list[str]] = {}
    seen: set[tuple[str, str]] = set()
    reached, deepest = 0, 0
    probe: dict[str, Any] | None = None
    for entry in data["traces"]:
        steps = [ReachStep(t, dict(i)) for t, i in entry["steps"]]
        s = z3.Solver()
        s.set("timeout", timeout_ms)
        u = _Unrolling(sysm, s)
        if any(st.transition not in prof.transitions for st in steps):
            u.extend()
            feasible = False
        else:
            u.pin(ReachTrace(steps))
            if "capacity" in u.params and entry["capacity"] is not None:
                s.add(u.params["capacity"] == entry["capacity"])
            feasible = True
        probe = probe or u.moves[0]
        for t, g, j in entry["goals"]:
            seen.add((t, g))
            known = feasible and t in prof.transitions
            known = known and (not g.startswith(("rule ", "case ")) or g in u.moves[j - 1][t].cases)
            if known and solving.check(s, u.goal(j, t, g), timeout_ms=timeout_ms).sat:
                reached += 1
                deepest = max(deepest, j)
            else:
                missing.setdefault(t, []).append(g)
    assert probe is not None
    for t, g in sysm.goals(probe):
        if (t, g) not in seen and (t, g) not in excluded:
            missing.setdefault(t, []).append(f"{g} (not recorded)")
    for t, g in data["not_reached"]:
        missing.setdefault(t, []).append(f"{g} (not reached when recorded)")
    problems = [
        f"{where}: {t}: not reached from the initial state on its recorded trace: {'; '.join(gs)}"
        " (a contract or guard narrows them; if the encoding changed on purpose, record the traces again:"
        " python scripts/gen_block_reach_traces.py)"
        for t, gs in missing.items()
    ]
    total = reached + sum(len(gs) for gs in missing.values())
    return Checked(reached, total, deepest, problems)
