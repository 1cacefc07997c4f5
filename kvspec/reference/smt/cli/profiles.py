"""``kvspec prove --profile P``: the rows of one profile's proofs (vllm; kvbm, legacy, atomic)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from kvspec.reference.smt.blocks.catalogue import block_encoding
from kvspec.reference.smt.blocks.encoding import ProfileEncoding
from kvspec.reference.smt.blocks.encoding import prove as prove_blocks
from kvspec.reference.smt.blocks.encoding import refute as refute_blocks
from kvspec.reference.smt.blocks.encoding import sanity as sanity_blocks
from kvspec.reference.smt.cli import summary
from kvspec.reference.smt.vllm.copies import INVARIANT_ID, MUTANTS, prove_vllm, refute, sanity
from kvspec.spec import registry

WIDTHS = [44, 18, 50, 9]


def _row(cols: list[str]) -> str:
    """A table row, its verdict filed in the run's summary (``cli/summary.py``)."""
    return summary.row(cols, WIDTHS)


def cover_row(
    rows: list[str], wheres: list[str], label: str = "MUTANTS-COVER", fmt: Callable[[list[str]], str] | None = None
) -> list[str]:
    """MUTANTS-COVER: each row is the one some refuted mutant breaks (``wheres``:
    "transition (row)" as ``refute`` gives them)."""
    hit = {w.rsplit("(", 1)[-1].rstrip(")") for w in wheres}
    lone = [r for r in rows if r not in hit]
    scope = "every row broken by a mutant" if not lone else "no mutant breaks " + ", ".join(lone)
    print((fmt or _row)([label, "ok" if not lone else "FAILED", scope, ""]))
    return [f"{r}: no seeded bug (mutant) breaks it, so nothing shows the row can fail" for r in lone]


def _refute_row(
    profile: str, name: str, rule: str, refute_it: Callable[[], str | None], problems: list[str]
) -> str | None:
    """Refute one mutant (``refute_it`` gives where its counterexample is, or
    None), print its row and file a problem if it was not refuted; return where."""
    t1 = time.perf_counter()
    where = refute_it()
    verdict = "refuted" if where else "NOT REFUTED"
    scope = f"{rule} at {where}" if where else rule
    print(_row([f"  refutes {name}", verdict, scope, f"{time.perf_counter() - t1:.2f}s"]))
    if where is None:
        problems.append(f"the {profile} mutant {name} was not refuted")
    return where


def run_vllm(mutant: str | None = None, timeout_s: float | None = None, counterexamples: Path | None = None) -> int:
    """INV-VLLM-COPIES for any pool size and hashes, its sanity check, and one
    refuted mutant per copy rule; then the operation level. Exit 1 on any
    failure. With ``mutant``: the proofs of that broken variant. With
    ``counterexamples``: a text file per refuted row (``_vllm_statement``)."""
    timeout_ms = int(timeout_s * 1000) if timeout_s else 60_000
    summary.set_timeout(timeout_ms / 1000)
    if mutant is not None:
        code = _vllm_mutant(mutant, timeout_ms)
        if counterexamples is not None and code == 1:
            _vllm_statement(counterexamples, mutant)
        return code
    print("kvspec prove --profile vllm: copy counting, any pool size, any number of block hashes")
    print(_row(["invariant", "result", "scope", "time"]))
    print(_row(["-" * w for w in WIDTHS]))
    problems: list[str] = []
    t0 = time.perf_counter()
    proofs = prove_vllm(timeout_ms=timeout_ms)
    bad = [p.transition for p in proofs if p.verdict != "proven"]
    verdict = "unbounded proven" if not bad else _not_proven([p.verdict for p in proofs])
    print(_row([INVARIANT_ID, verdict, "any blocks, any hashes", f"{time.perf_counter() - t0:.2f}s"]))
    problems += [f"INV-VLLM-COPIES not proven at {t}" for t in bad]
    t1 = time.perf_counter()
    found = sanity()
    problems += found
    print(_row(["SANITY-VLLM", "ok" if not found else "FAILED", "finite models", f"{time.perf_counter() - t1:.2f}s"]))
    problems += vllm_reach_row("step")
    wheres = [
        _refute_row(registry.VLLM_NAME, name, rule, partial(refute, name), problems) for name, rule in MUTANTS.items()
    ]
    problems += cover_row([INVARIANT_ID], [f"{w} ({INVARIANT_ID})" for w in wheres if w])
    if counterexamples is not None:
        from kvspec.reference.smt.vllm import ops as vops

        for name, w in zip(MUTANTS, wheres, strict=True):
            if w and name not in vops.MUTANTS:  # one of both levels: its operation-level file (``_vllm_ops``)
                _vllm_statement(counterexamples, name)
        if any(p.verdict == "refuted" for p in proofs):
            _vllm_statement(counterexamples, None)
    problems += _vllm_ops(timeout_ms, counterexamples)
    problems += _vllm_progress(timeout_ms)
    problems += order_rows(("vllm-free",))
    for p in problems:
        print(f"sanity check failed: {p}")
    return 1 if problems else 0


def _vllm_progress(timeout_ms: int) -> list[str]:
    """PROGRESS-USE-FITS and PROGRESS-NO-DEADLOCK as ranking arguments (``vllm/progress_rows.py``)."""
    from kvspec.reference.smt.vllm.progress_rows import progress_rows

    return progress_rows(_row, timeout_ms)


def order_rows(policies: tuple[str, ...]) -> list[str]:
    """The eviction-order rows (``order/encoding.py``) of ``policies``, bounded (4 entries)."""
    from kvspec.reference.smt.order.encoding import N, rows

    print(f"eviction order over an encoded recency order ({N} entries; bounded): {', '.join(policies)}")
    return [p for pol in policies for p in rows(pol, _row, N)]


def _not_proven(verdicts: list[str]) -> str:
    """A row that is not proven: refuted somewhere, or only unknown (the solver gave up)."""
    return "unknown" if all(v == "proven" or v.startswith("unknown") for v in verdicts) else "NOT proven"


def _vllm_statement(folder: Path, mutant: str | None) -> None:
    """``--counterexamples`` for vllm. An operation-level mutant (``vllm/ops.py``) is searched
    from the empty pool over the operation-level steps and written as a replay file
    (``vllm/counterexample.py``); a step-only mutant (or the rules as written) is searched over
    the step table (``vllm/reach.py``: a trace breaking INV-VLLM-COPIES, written as text:
    ``counterexamples.NOT_WIRE``)."""
    import z3

    from kvspec.reference.smt import counterexamples as cx
    from kvspec.reference.smt.vllm import copies, ops
    from kvspec.reference.smt.vllm.counterexample import emit
    from kvspec.reference.smt.vllm.reach import BLOCKS, HASHES, _flat, step_system

    name = f"vllm-{mutant or 'rules'}"
    rule: str
    what: str
    if mutant is None:
        rule, what = INVARIANT_ID, f"{INVARIANT_ID} is broken"
    elif mutant in ops.MUTANTS:
        rule, what = (str(x) for x in ops.MUTANTS[mutant])
    else:
        rule, what = str(MUTANTS[mutant]), f"a broken {MUTANTS[mutant]}"
    print(f"counterexample of vllm {mutant or 'rules as written'} ({rule}):")
    if mutant is not None and mutant in ops.MUTANTS:
        lines = emit(folder, mutant, rule, what)
    else:

        def bad(_t: str, mv: Any) -> z3.BoolRef:
            return _flat(z3.Not(copies.invariant(mv.post)))

        sysm = step_system(frozenset({mutant}) if mutant else frozenset())
        bound = f"{BLOCKS} blocks, hashes 0..{HASHES - 1}"
        lines = cx.search_statement(
            folder, registry.VLLM_NAME, name, sysm, bad, rule=rule, what=what, bound=bound, row=INVARIANT_ID
        )
    for line in lines:
        print(line)


def _vllm_ops(timeout_ms: int = 60_000, counterexamples: Path | None = None) -> list[str]:
    """The operation-level rows (``profile_vllm_ops``): a Use as begin / hits /
    check / one step per fresh block / close, so batches of every length."""
    from kvspec.reference.smt.vllm import ops as ops

    print("operation level: a whole Use (any length) with its Removed and its Stored's parent; Deref, Promote, Reset")
    problems: list[str] = []
    proofs = ops.prove_ops(timeout_ms=timeout_ms)
    for prop in dict.fromkeys(p.prop for p in proofs):
        mine = [p for p in proofs if p.prop == prop]
        bad = [p.transition for p in mine if p.verdict != "proven"]
        scope = "any state of the invariants" if "never" in prop else f"initial + {len(mine) - 1} steps"
        secs = f"{sum(p.seconds for p in mine):.2f}s"
        verdict = "unbounded proven" if not bad else _not_proven([p.verdict for p in mine])
        print(_row([f"operation: {prop}", verdict, scope, secs]))
        problems += [f"{prop} not proven at operation step {t}" for t in bad]
    t1 = time.perf_counter()
    found = ops.sanity()
    problems += found
    print(
        _row(["SANITY-VLLM-OPS", "ok" if not found else "FAILED", "finite models", f"{time.perf_counter() - t1:.2f}s"])
    )
    problems += vllm_reach_row("operation")
    op_wheres = [
        _refute_row(registry.VLLM_NAME, f"op:{name}", rule, partial(ops.refute, name), problems)
        for name, (rule, _what) in ops.MUTANTS.items()
    ]
    for name, w in zip(ops.MUTANTS, op_wheres, strict=True):
        if w and counterexamples is not None:
            _vllm_statement(counterexamples, name)
    rows = [str(r) for r in ops.invariants(ops.VllmOpState.fresh("cover_"))]
    wheres = [w for w in op_wheres if w]
    # ``refute`` names the first row a mutant breaks; a row it leaves unnamed is checked
    # against the mutants that declare it (a finite counterexample to that row itself)
    named = {w.rsplit("(", 1)[-1].rstrip(")") for w in wheres}
    for name, (rule, _what) in ops.MUTANTS.items():
        if str(rule) in rows and str(rule) not in named and _vllm_breaks(name, str(rule)):
            wheres.append(f"{name} ({rule})")
    problems += cover_row(rows, wheres, "operation: MUTANTS-COVER")
    return problems


def vllm_reach_row(level: str, tw: frozenset[str] = frozenset()) -> list[str]:
    """REACHABLE at ``level`` ("step": ``copies.py``, searched; "operation": ``ops.py``,
    from recorded traces): every step, rule guard and pair of steps enabled together on
    a trace from the empty pool (``vllm/reach.py``); the problems name the step and case."""
    from kvspec.reference.smt import reach_recordings
    from kvspec.reference.smt.reach import cover
    from kvspec.reference.smt.vllm.reach import step_system

    t1 = time.perf_counter()
    if level == "step":
        cov = cover(step_system(tw))
        found, scope, label = cov.problems(), cov.summary(), "REACHABLE"
        verdict = "ok" if not found else "FAILED"
    elif not reach_recordings.recorded_for("vllm-operation"):
        print(reach_recordings.not_checked("vllm-operation"))
        return []
    else:  # the search costs minutes: its recorded traces, checked again pinned (``smt/recorded.py``)
        chk = reach_recordings.check("vllm-operation")
        found, scope, label = chk.problems, chk.summary(), "operation: REACHABLE"
        verdict = chk.verdict
    secs = f"{time.perf_counter() - t1:.2f}s"
    print(_row([label, verdict, scope, secs]))
    return found


def _vllm_breaks(mutant: str, prop: str) -> bool:
    """The operation-level mutant breaks ``prop`` at some step, in a finite pool."""
    import z3

    from kvspec.reference.smt.vllm import ops

    tw = frozenset({mutant})
    for t in ops.TRANSITIONS:

        def build(S: ops.VllmOpState, t: str = t) -> list[z3.BoolRef]:
            step, hyp = ops.base(t, S, ops.inputs(), tw, "fi_")
            return [*hyp, z3.Not(ops.goal(prop, step))]

        if ops.finite_check(build) == z3.sat:
            return True
    return False


def _vllm_mutant(mutant: str, timeout_ms: int = 60_000) -> int:
    """The vllm proofs (step and operation level, whichever has ``mutant``)
    and the operation-level sanity check with the mutant in force; exit 1
    when it is caught (a proof fails, a sanity check fails or a finite
    counterexample exists), 2 when no level has it."""
    from kvspec.reference.smt.vllm import ops as ops

    if mutant not in MUTANTS and mutant not in ops.MUTANTS:
        names = ", ".join(dict.fromkeys([*MUTANTS, *ops.MUTANTS]))
        print(f"kvspec prove: the vllm profile has no mutant {mutant!r}; its mutants: {names}", file=sys.stderr)
        return 2
    tw = frozenset({mutant})
    caught = False
    if mutant in MUTANTS:
        bad = [p.transition for p in prove_vllm(tw, timeout_ms) if p.verdict != "proven"]
        print(f"MUTANT {mutant} (step level, breaks {MUTANTS[mutant]})")
        print(f"step level: INV-VLLM-COPIES {'NOT proven at ' + ', '.join(bad) if bad else 'proven'}")
        caught |= bool(bad)
    if mutant in ops.MUTANTS:
        rule, what = ops.MUTANTS[mutant]
        print(f"MUTANT {mutant} (operation level): {what} (breaks {rule})")
        bad = [f"{p.prop} at {p.transition}" for p in ops.prove_ops(tw, timeout_ms) if p.verdict != "proven"]
        print(f"operation level: {'NOT proven: ' + '; '.join(bad) if bad else 'every property proven'}")
        found = ops.sanity(tw)  # the sanity checks run on the mutant too: a narrowed guard shows here
        for p in found:
            print(f"sanity (mutant): {p}")
        where = ops.refute(mutant)
        print(f"counterexample (finite pool): {where}" if where else "no finite counterexample found")
        caught |= bool(bad or found or where)
    return 1 if caught else 0


#: the block-level profiles without an offload tier (smt/blocks/): the registry's block profiles the lockstep drives
BLOCK_PROFILES = tuple(p for p in registry.names("block", stateful=True) if p in registry.encodings())


def block_mutants() -> dict[str, list[str]]:
    """Mutant name -> the block-level profiles that have it (for ``--mutant``)."""
    out: dict[str, list[str]] = {}
    for name in BLOCK_PROFILES:
        for m in block_encoding(name).mutants:
            out.setdefault(m, []).append(name)
    return out


def run_blocks(
    profile: str, mutant: str | None = None, timeout_s: float | None = None, counterexamples: Path | None = None
) -> int:
    """One block-level profile: each invariant 1-inductive for any capacity and
    any hashes (steps of a batch of any length), the sanity check on finite
    models, and each of its mutants refuted; with ``mutant``, the proofs of
    that broken variant (exit 1 when it is caught, as for kvbm-offload).
    With ``counterexamples``, each refuted row's trace from the initial state
    is written there as a replay file (``blocks/counterexample.py``)."""
    prof = block_encoding(profile)
    timeout_ms = int(timeout_s * 1000) if timeout_s else 120_000
    summary.set_timeout(timeout_ms / 1000)
    if mutant is not None and mutant not in prof.mutants:
        print(
            f"kvspec prove: the {profile} profile has no mutant {mutant!r}; its mutants: {', '.join(prof.mutants)}",
            file=sys.stderr,
        )
        return 2
    print(
        f"kvspec prove --profile {profile}: {profile} without an offload tier, any capacity, any block hashes"
        " (a Use is a sequence of steps: every batch length)"
    )
    tw = frozenset({mutant}) if mutant else frozenset()
    if mutant:
        rule, what = prof.mutants[mutant]
        print(f"MUTANT {mutant}: {what} (breaks {rule})")
    print(_row(["invariant", "result", "scope", "time"]))
    print(_row(["-" * w for w in WIDTHS]))
    problems: list[str] = []
    t0 = time.perf_counter()
    proofs = prove_blocks(prof, tw, timeout_ms)
    for inv in [*prof.invariants, *(f"never: {n}" for n in prof.unreachable)]:
        mine = [p for p in proofs if p.invariant == inv]
        bad = [p.transition for p in mine if p.verdict != "proven"]
        secs = sum(p.seconds for p in mine)
        if inv.startswith("never: "):
            label = f"{_owner(prof, inv)} (never: {inv.removeprefix('never: ')})"
            scope = "any state of the invariants"
        else:
            label, scope = inv, f"initial + {len(mine) - 1} transitions"
        verdict = "unbounded proven" if not bad else _not_proven([p.verdict for p in mine])
        if verdict == "unknown":
            why = {p.reason for p in mine if p.verdict == "unknown"}
            timed_out = any(w.startswith(("timeout", "canceled")) for w in why)
            verdict = summary.unknown_text(None if timed_out else "z3: " + ", ".join(sorted(why)), timeout_ms / 1000)
        print(_row([label, verdict, scope, f"{secs:.2f}s"]))
        problems += [f"{inv} not proven at {t}" for t in bad]
    t1 = time.perf_counter()
    found = sanity_blocks(prof, tw)
    problems += found
    print(
        _row(
            [
                f"SANITY-{profile.upper()}",
                "ok" if not found else "FAILED",
                "finite models",
                f"{time.perf_counter() - t1:.2f}s",
            ]
        )
    )
    if mutant:  # the sanity checks run on the mutant too: a narrowed guard shows here
        for p in found:
            print(f"sanity (mutant): {p}")
        where = refute_blocks(prof, mutant)
        print(f"counterexample (finite instance): {where}" if where else "no finite counterexample found")
        if counterexamples is not None and (where or problems):
            _counterexample(counterexamples, prof, mutant, rule, what)
        print(f"total {time.perf_counter() - t0:.2f}s")
        return 1 if problems or where else 0
    problems += _reach_row(prof)
    wheres = [
        _refute_row(profile, name, rule, partial(refute_blocks, prof, name), problems)
        for name, (rule, _what) in prof.mutants.items()
    ]
    problems += cover_row(list(prof.invariants), [w for w in wheres if w])
    if counterexamples is not None:
        for inv in dict.fromkeys(p.invariant for p in proofs if p.verdict == "refuted"):
            _counterexample(counterexamples, prof, None, inv.removeprefix("never: "), f"{inv} is broken")
        for (name, (rule, what)), w in zip(prof.mutants.items(), wheres, strict=True):
            if w:
                _counterexample(counterexamples, prof, name, rule, what)
    if profile == registry.KVBM_NAME:
        problems += order_rows(("lru", "multi_lru", "lineage"))
    print(f"total {time.perf_counter() - t0:.2f}s")
    for p in problems:
        print(f"sanity check failed: {p}")
    return 1 if problems else 0


def _reach_row(prof: ProfileEncoding) -> list[str]:
    """REACHABLE: every case of every step on a trace from the initial state, the recorded
    traces checked again pinned (``smt/recorded.py``, ``reach_recordings``); no row where none are recorded."""
    from kvspec.reference.smt import reach_recordings

    key = f"{prof.name}-step"
    if not reach_recordings.recorded_for(key):
        print(reach_recordings.not_checked(key))
        return []
    t1 = time.perf_counter()
    chk = reach_recordings.check(key)
    secs = f"{time.perf_counter() - t1:.2f}s"
    print(_row(["REACHABLE", chk.verdict, chk.summary(), secs]))
    return chk.problems


def _counterexample(folder: Path, prof: ProfileEncoding, mutant: str | None, rule: str, what: str) -> None:
    """Print (and write into ``folder``) the refuted row's trace from the initial state, or why there is none."""
    from kvspec.reference.smt.blocks.counterexample import emit

    print(f"counterexample of {prof.name} {mutant or 'rules as written'} ({rule}):")
    for line in emit(folder, prof, mutant, rule, what):
        print(line)


def _owner(prof: ProfileEncoding, inv: str) -> str:
    """The invariant a never-enabled transition belongs to (atomic: NO-HALF)."""
    return "INV-ATOMIC-NO-HALF" if "INV-ATOMIC-NO-HALF" in prof.invariants else "SANITY"
