"""REACHABLE at ``prove``'s cost for any ``reach.System``: recorded traces, checked again pinned.

``reach.cover`` searches every goal of a system from its initial state; for
the deeper systems (vllm's operation level, kvbm-offload's operations) that
search gives up or costs minutes of CPU, too much for every ``kvspec
prove``. So a search runs offline (``scripts/gen_reach_traces.py``: a
shallow ``cover``, then ``attribute`` over the scenarios a guide proposes)
and keeps, per system (``to_json``, ``save``), a few traces (each goal on the longest recorded trace it is a
prefix of, every input pinned, the initial state's free parameters too).
``check`` replays each trace in the encoding as it is now, pinned
(``reach._Unrolling.pin``), and asks z3 for each goal at its step: a pinned
trace is a concrete run, so each question is cheap. Every system checked
this way (the block profiles' step level too) is listed in
``reach_recordings.RECORDINGS``.

A guard narrowed since the recording makes its trace infeasible or the goal
false at its step: the row fails naming the transition and the case (a
false alarm when another trace would still reach the case: record again,
and the new search decides). A goal the encoding has now and the recording
lacks (a new rule or case), or one the recording did not reach, fails the
row too. A goal z3 gives up on (a timeout on a busy machine) is neither: it
is *unknown*, with z3's reason, and the row says ``unknown (...)`` instead of
``ok`` (``Checked.verdict``): a timeout never reads as a narrowed guard, and
never as a case reached. ``check`` also re-checks the phase table (``System.phase_problems``,
one query per transition); the goals listed as impossible by design were
checked unreached when recording (``cover``'s stale check), not here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.reach import Coverage, ReachStep, ReachTrace, System, _Unrolling

#: per solver call of the pinned checks
TIMEOUT_MS = 30_000


def to_json(cov: Coverage) -> dict[str, Any]:
    """What ``check`` needs of a finished search: the fewest traces holding every reached goal."""
    chosen: list[ReachTrace] = []
    goals: list[list[list[Any]]] = []
    for (t, g), tr in sorted(cov.reached.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        for n, c in enumerate(chosen):
            if c.params == tr.params and [str(s) for s in c.steps[: len(tr)]] == [str(s) for s in tr.steps]:
                goals[n].append([t, g, len(tr)])
                break
        else:
            chosen.append(tr)
            goals.append([[t, g, len(tr)]])
    return {
        "bound": cov.system.bound,
        "depth": cov.system.depth,
        "traces": [
            {"params": c.params, "steps": [[s.transition, s.inputs] for s in c.steps], "goals": gs}
            for c, gs in zip(chosen, goals, strict=True)
        ],
        "not_reached": [list(g) for g in cov.missing],
        "problems": cov.problems(),
    }


def save(path: Path, key: str, data: dict[str, Any]) -> None:
    """Store one system's recording under ``key`` in ``path`` (a JSON object of recordings)."""
    whole = json.loads(path.read_text()) if path.is_file() else {}
    whole[key] = data
    path.write_text(json.dumps(whole, indent=1, sort_keys=True) + "\n")


def load(path: Path, key: str) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    out: dict[str, Any] | None = json.loads(path.read_text()).get(key)
    return out


@dataclass
class Checked:
    reached: int
    goals: int
    deepest: int
    problems: list[str]
    excluded: int = 0
    #: goals z3 gave up on ("TRANSITION: GOAL (REASON)"): neither reached nor shown unreached
    unknown: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """The row's verdict: FAILED on any problem, else unknown while a goal is undecided, else ok."""
        if self.problems:
            return "FAILED"
        if self.unknown:
            return f"unknown ({len(self.unknown)} goals undecided: {self.unknown[0]})"
        return "ok"

    def summary(self) -> str:
        left = f", {self.excluded} impossible by design" if self.excluded else ""
        return f"{self.reached}/{self.goals} cases reached in <= {self.deepest} steps{left} (recorded traces, pinned)"


class _Shared(_Unrolling[Any]):
    """An unrolling of ``depth`` steps built once, its steps linked only on
    demand (``upto``): each recorded trace is checked in a solver scope of its
    own over the same terms, instead of building every step of every
    transition again per trace (the costly part for the operation-level
    encodings). Steps past a trace's end are left unlinked, so a state where
    nothing is enabled does not make a shorter trace infeasible."""

    def __init__(self, system: System[Any], solver: z3.Solver, depth: int) -> None:
        super().__init__(system, solver)
        self.links: list[z3.BoolRef] = []
        ts = system.transitions
        for d in range(1, depth + 1):
            pre = self.states[-1]
            c = z3.Int(f"reach_c{d}")
            ms = {t: system.move(t, pre, f"r{d}_{i}_") for i, t in enumerate(ts)}
            post = self.fresh(f"reach_s{d}_")
            link = [c >= 0, c < len(ts)]
            link += [
                z3.Implies(c == i, z3.And(ms[t].enabled, system.equal(post, ms[t].post))) for i, t in enumerate(ts)
            ]
            self.links.append(z3.And(link))
            self.states.append(post)
            self.choice.append(c)
            self.moves.append(ms)

    def upto(self, n: int) -> z3.BoolRef:
        return z3.And(self.links[:n] or [z3.BoolVal(True)])


def check(system: System[Any], data: dict[str, Any] | None, how: str, timeout_ms: int = TIMEOUT_MS) -> Checked:
    """Every recorded goal of ``system`` still reached on its recorded trace,
    and every goal of the system recorded (``how``: the command that records)."""
    where = f"{system.profile} {system.level}"
    if data is None:
        return Checked(0, 0, 0, [f"{where}: no recorded traces (run {how})"])
    excluded = system.excluded()
    missing: dict[str, list[str]] = {}
    seen: set[tuple[str, str]] = set()
    reached, deepest = 0, 0
    undecided: list[str] = []
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    longest = max((len(e["steps"]) for e in data["traces"]), default=1)
    u = _Shared(system, s, max(longest, 1))
    probe = u.moves[0]
    for entry in data["traces"]:
        steps = [ReachStep(t, dict(i)) for t, i in entry["steps"]]
        feasible = all(st.transition in system.transitions for st in steps)
        s.push()
        if feasible:
            s.add(u.upto(len(steps)))
            u.pin(ReachTrace(steps))
            for k, val in entry["params"].items():
                if k in u.params and isinstance(val, int):
                    s.add(u.params[k] == val)
        for t, g, j in entry["goals"]:
            seen.add((t, g))
            known = feasible and t in system.transitions
            known = known and (not g.startswith(("rule ", "case ")) or g in u.moves[j - 1][t].cases)
            answer = solving.check(s, u.goal(j, t, g), timeout_ms=timeout_ms, retry_unknown=True) if known else None
            if answer is not None and answer.sat:
                reached += 1
                deepest = max(deepest, j)
            elif answer is not None and answer.unknown:
                undecided.append(f"{t}: {g} ({answer.reason})")
            else:
                missing.setdefault(t, []).append(g)
        s.pop()
    goals = system.goals(probe)
    for t, g in goals:
        if (t, g) not in seen and (t, g) not in excluded:
            missing.setdefault(t, []).append(f"{g} (not recorded)")
    for t, g in data["not_reached"]:
        missing.setdefault(t, []).append(f"{g} (not reached when recorded)")
    problems = list(system.phase_problems())
    problems += [
        f"{where}: {t}: not reached from the initial state on its recorded trace: {'; '.join(gs)}"
        f" (a contract or guard narrows them; if the encoding changed on purpose, record the traces again: {how})"
        for t, gs in missing.items()
    ]
    total = reached + len(undecided) + sum(len(gs) for gs in missing.values())
    n_excluded = sum(1 for g in goals if g in excluded)
    return Checked(reached, total, deepest, problems, n_excluded, undecided)


def attribute(
    system: System[Any],
    guide: list[ReachTrace],
    reached: dict[tuple[str, str], ReachTrace] | None = None,
    timeout_ms: int = TIMEOUT_MS,
) -> Coverage:
    """The goals reached on traces proposed by a guide (scenarios written for
    the encoding, where the greedy search of ``reach.cover`` is too slow to
    get deep enough): each trace is pinned (transition, and the inputs it
    names; the rest left to z3) and, at each step, each goal of that step's
    transition not reached yet is asked of z3. A trace the encoding refuses is
    a problem (the guide is stale). ``reached`` (from a shallow ``cover``)
    is kept and extended."""
    import time

    t0 = time.process_time()
    out = dict(reached or {})
    excluded = system.excluded()
    probe = _Unrolling(system, z3.Solver())
    probe.extend()
    goals = system.goals(probe.moves[0])
    stale: list[tuple[str, str]] = []
    refused: list[str] = []
    for n, trace in enumerate(guide):
        s = z3.Solver()
        s.set("timeout", timeout_ms)
        u = _Unrolling(system, s)
        u.pin(trace)
        if not solving.check(s, timeout_ms=timeout_ms).sat:
            refused.append(f"{system.profile} {system.level}: guide trace #{n} is not a run of the encoding")
            continue
        for j, step in enumerate(trace.steps, 1):
            for t, g in goals:
                if t != step.transition or (t, g) in out or (t, g) in stale:
                    continue
                found = solving.check(s, u.goal(j, t, g), timeout_ms=timeout_ms)
                if found.model is not None:
                    # the trace as z3 completed it for this goal: every input pinned when recorded
                    m2 = found.model
                    done = u.trace(m2, j)
                    if (t, g) in excluded:
                        stale.append((t, g))
                    else:
                        out[(t, g)] = done
    missing = [g for g in goals if g not in out and g not in excluded]
    cov = Coverage(system, out, missing, stale, time.process_time() - t0)
    cov.excluded = sum(1 for g in goals if g in excluded) - len(stale)
    cov.phase_problems = refused
    return cov
