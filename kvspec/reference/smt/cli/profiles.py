"""``kvspec prove --profile P``: the rows of one profile's proofs (vllm; kvbm, legacy, atomic)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial

from kvspec.reference.smt.blocks.encoding import Profile
from kvspec.reference.smt.blocks.encoding import prove as prove_blocks
from kvspec.reference.smt.blocks.encoding import refute as refute_blocks
from kvspec.reference.smt.blocks.encoding import sanity as sanity_blocks
from kvspec.reference.smt.vllm.copies import INVARIANT_ID, MUTANTS, prove_vllm, refute, sanity

WIDTHS = [44, 18, 50, 9]


def _row(cols: list[str]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cols, WIDTHS, strict=True)).rstrip()


def _refute_row(profile: str, name: str, rule: str, refute_it: Callable[[], str | None], problems: list[str]) -> None:
    """Refute one mutant (``refute_it`` gives where its counterexample is, or
    None), print its row and file a problem if it was not refuted."""
    t1 = time.perf_counter()
    where = refute_it()
    verdict = "refuted" if where else "NOT REFUTED"
    scope = f"{rule} at {where}" if where else rule
    print(_row([f"  refutes {name}", verdict, scope, f"{time.perf_counter() - t1:.2f}s"]))
    if where is None:
        problems.append(f"the {profile} mutant {name} was not refuted")


def run_vllm(mutant: str | None = None) -> int:
    """INV-VLLM-COPIES for any pool size and hashes, its sanity check, and one
    refuted mutant per copy rule; then the operation level. Exit 1 on any
    failure. With ``mutant``: the proofs of that broken variant."""
    if mutant is not None:
        return _vllm_mutant(mutant)
    print("kvspec prove --profile vllm: copy counting, any pool size, any number of block hashes")
    print(_row(["invariant", "result", "scope", "time"]))
    print(_row(["-" * w for w in WIDTHS]))
    problems: list[str] = []
    t0 = time.perf_counter()
    proofs = prove_vllm()
    bad = [p.transition for p in proofs if p.verdict != "proven"]
    verdict = "unbounded proven" if not bad else "NOT proven"
    print(_row([INVARIANT_ID, verdict, "any blocks, any hashes", f"{time.perf_counter() - t0:.2f}s"]))
    problems += [f"INV-VLLM-COPIES not proven at {t}" for t in bad]
    t1 = time.perf_counter()
    found = sanity()
    problems += found
    print(_row(["SANITY-VLLM", "ok" if not found else "FAILED", "finite models", f"{time.perf_counter() - t1:.2f}s"]))
    for name, rule in MUTANTS.items():
        _refute_row("vllm", name, rule, partial(refute, name), problems)
    problems += _vllm_ops()
    for p in problems:
        print(f"sanity check failed: {p}")
    return 1 if problems else 0


def _vllm_ops() -> list[str]:
    """The operation-level rows (``profile_vllm_ops``): a Use as begin / hits /
    check / one step per fresh block / close, so batches of every length."""
    from kvspec.reference.smt.vllm import ops as ops

    print("operation level: a whole Use (any length) with its Removed and its Stored's parent; Deref, Promote, Reset")
    problems: list[str] = []
    proofs = ops.prove_ops()
    for prop in dict.fromkeys(p.prop for p in proofs):
        mine = [p for p in proofs if p.prop == prop]
        bad = [p.transition for p in mine if p.verdict != "proven"]
        scope = "any state of the invariants" if "never" in prop else f"initial + {len(mine) - 1} steps"
        secs = f"{sum(p.seconds for p in mine):.2f}s"
        print(_row([f"operation: {prop}", "unbounded proven" if not bad else "NOT proven", scope, secs]))
        problems += [f"{prop} not proven at operation step {t}" for t in bad]
    t1 = time.perf_counter()
    found = ops.sanity()
    problems += found
    print(
        _row(["SANITY-VLLM-OPS", "ok" if not found else "FAILED", "finite models", f"{time.perf_counter() - t1:.2f}s"])
    )
    for name, (rule, _what) in ops.MUTANTS.items():
        _refute_row("vllm", f"op:{name}", rule, partial(ops.refute, name), problems)
    return problems


def _vllm_mutant(mutant: str) -> int:
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
        bad = [p.transition for p in prove_vllm(tw) if p.verdict != "proven"]
        print(f"MUTANT {mutant} (step level, breaks {MUTANTS[mutant]})")
        print(f"step level: INV-VLLM-COPIES {'NOT proven at ' + ', '.join(bad) if bad else 'proven'}")
        caught |= bool(bad)
    if mutant in ops.MUTANTS:
        rule, what = ops.MUTANTS[mutant]
        print(f"MUTANT {mutant} (operation level): {what} (breaks {rule})")
        bad = [f"{p.prop} at {p.transition}" for p in ops.prove_ops(tw) if p.verdict != "proven"]
        print(f"operation level: {'NOT proven: ' + '; '.join(bad) if bad else 'every property proven'}")
        found = ops.sanity(tw)  # the sanity checks run on the mutant too: a narrowed guard shows here
        for p in found:
            print(f"sanity (mutant): {p}")
        where = ops.refute(mutant)
        print(f"counterexample (finite pool): {where}" if where else "no finite counterexample found")
        caught |= bool(bad or found or where)
    return 1 if caught else 0


def _blocks(profile: str) -> Profile:
    from kvspec.reference.smt.blocks import atomic as profile_atomic
    from kvspec.reference.smt.blocks import kvbm as profile_kvbm
    from kvspec.reference.smt.blocks import legacy as profile_legacy

    return {"kvbm": profile_kvbm.PROFILE, "atomic": profile_atomic.PROFILE, "legacy": profile_legacy.PROFILE}[profile]


#: the block-level profiles without an offload tier (smt/profile_blocks.py)
BLOCK_PROFILES = ("kvbm", "legacy", "atomic")


def block_mutants() -> dict[str, list[str]]:
    """Mutant name -> the block-level profiles that have it (for ``--mutant``)."""
    out: dict[str, list[str]] = {}
    for name in BLOCK_PROFILES:
        for m in _blocks(name).mutants:
            out.setdefault(m, []).append(name)
    return out


def run_blocks(profile: str, mutant: str | None = None) -> int:
    """One block-level profile: each invariant 1-inductive for any capacity and
    any hashes (steps of a batch of any length), the sanity check on finite
    models, and each of its mutants refuted; with ``mutant``, the proofs of
    that broken variant (exit 1 when it is caught, as for kvbm-offload)."""
    prof = _blocks(profile)
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
    proofs = prove_blocks(prof, tw)
    for inv in [*prof.invariants, *(f"never: {n}" for n in prof.unreachable)]:
        mine = [p for p in proofs if p.invariant == inv]
        bad = [p.transition for p in mine if p.verdict != "proven"]
        secs = sum(p.seconds for p in mine)
        if inv.startswith("never: "):
            label = f"{_owner(prof, inv)} (never: {inv.removeprefix('never: ')})"
            scope = "any state of the invariants"
        else:
            label, scope = inv, f"initial + {len(mine) - 1} transitions"
        print(_row([label, "unbounded proven" if not bad else "NOT proven", scope, f"{secs:.2f}s"]))
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
        print(f"total {time.perf_counter() - t0:.2f}s")
        return 1 if problems or where else 0
    for name, (rule, _what) in prof.mutants.items():
        _refute_row(profile, name, rule, partial(refute_blocks, prof, name), problems)
    print(f"total {time.perf_counter() - t0:.2f}s")
    for p in problems:
        print(f"sanity check failed: {p}")
    return 1 if problems else 0


def _owner(prof: Profile, inv: str) -> str:
    """The invariant a never-enabled transition belongs to (atomic: NO-HALF)."""
    return "INV-ATOMIC-NO-HALF" if "INV-ATOMIC-NO-HALF" in prof.invariants else "SANITY"
