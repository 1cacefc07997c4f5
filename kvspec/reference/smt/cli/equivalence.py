"""``kvspec equivalence``: model and encoding have the same successors, every state at a small bound.

For each profile, breadth-first over every state the Python model reaches
within ``--depth`` operations of a finite alphabet; in each state, for every
operation, the model's outcome set must equal the encoding's (enabled in one
iff in the other, same post-state, same events; ``smt/equivalence.py``).
Exit 0 when every profile's sets are equal in every state explored, 1 on a
difference (printed as a trace from the initial state), 2 on bad arguments.
``--mutant`` runs one profile's encoding with a seeded bug in force: a
difference is then the expected outcome (exit 1: caught).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvspec.reference.smt.equivalence import EquivalenceReport, explore
from kvspec.spec.registry import ATOMIC_NAME, KVBM_NAME, KVBM_OFFLOAD, LEGACY_NAME, PAGED, RADIX, SESSION, VLLM_NAME

#: the block-level encodings (smt/blocks/): one per block profile with a lockstep machine
BLOCK_ENCODINGS = (KVBM_NAME, LEGACY_NAME, ATOMIC_NAME)


@dataclass(frozen=True)
class ExhaustiveBound:
    """One profile's exhaustive bound: what its subject is built with, and the depth; and its seeds:
    the encoding mutants and model bugs ``--mutant`` / ``--model-bug`` / ``--campaign`` run, and
    where ``kvspec prove`` refutes a mutant the walk does not catch."""

    profile: str
    depth: int
    text: str
    build: Callable[[str | None, str | None], Any]
    #: the seeded encoding bugs this check runs: those that change what the encoding does (a mutant
    #: that only drops a caller contract is for ``kvspec prove``)
    mutants: Callable[[], list[str]]
    #: the seeded bugs of the Python model that apply to this profile
    model_bugs: Callable[[], list[str]]
    #: mutant -> the transition at which ``kvspec prove`` refutes it (None: it does not)
    refutes: Callable[[str], str | None]
    #: the mutants asked of ``refutes`` before the walk (kvbm-offload's operation mutants: their
    #: operation row refutes each in seconds, while the depth-3 walk, which misses the bugs that need
    #: an offload and a swap-in, 5+ operations, costs minutes of CPU for each it misses)
    prove_first: Callable[[str], bool] = lambda _m: False


def _none() -> list[str]:
    return []


def _vllm(mutant: str | None, model_bug: str | None) -> Any:
    from kvspec.reference.smt.vllm.equivalence import VllmSubject

    return VllmSubject(capacity=2, hashes=2, uuids=1, tw=frozenset({mutant}) if mutant else frozenset())


def _vllm_mutants() -> list[str]:
    from kvspec.reference.smt.vllm import ops

    return [m for m in ops.MUTANTS if not m.startswith("contract-")]


def _vllm_refutes(mutant: str) -> str | None:
    from kvspec.reference.smt.vllm import ops

    return ops.refute(mutant) if mutant in ops.MUTANTS else None


def _blocks_bound(profile: str) -> ExhaustiveBound:
    def build(mutant: str | None, model_bug: str | None) -> Any:
        from kvspec.reference.smt.blocks.equivalence import BlocksSubject
        from kvspec.reference.smt.blocks.model_bugs import MODEL_BUGS

        cls = MODEL_BUGS[model_bug][1] if model_bug else None
        return BlocksSubject(profile, capacity=2, hashes=3, mutant=mutant, model_class=cls)

    def mutants() -> list[str]:
        from kvspec.reference.smt.blocks.agreement import agreement_mutants
        from kvspec.reference.smt.blocks.encoding_mutants import guard_mutants

        return agreement_mutants(profile) + [m.name for m in guard_mutants(profile)]

    def model_bugs() -> list[str]:
        from kvspec.reference.smt.blocks.model_bugs import MODEL_BUGS

        return [name for name, (profiles, _cls, _rule) in MODEL_BUGS.items() if profile in profiles]

    def refutes(mutant: str) -> str | None:
        from kvspec.reference.smt.blocks.encoding import refute

        prof = _blocks_profile(profile)
        return refute(prof, mutant) if mutant in prof.mutants else None

    return ExhaustiveBound(profile, 3, "2 slots, hashes 0-2, uuid u0", build, mutants, model_bugs, refutes)


def _offload(mutant: str | None, model_bug: str | None) -> Any:
    from kvspec.reference.smt.offload.agreement.equivalence import OffloadSubject

    return OffloadSubject(mutant=mutant)


def _offload_mutants() -> list[str]:
    from kvspec.reference.smt.offload.agreement.encoding_mutants import ENCODING_MUTANTS, EQUIVALENCE_MUTANTS
    from kvspec.reference.smt.offload.op_mutants import OP_MUTANTS

    # an operation mutant that only drops a caller contract is for ``kvspec prove``, as vllm's
    ops = [m.name for m in OP_MUTANTS if not m.name.startswith("op:contract:")]
    return [m.name for m in [*ENCODING_MUTANTS, *EQUIVALENCE_MUTANTS]] + ops


def _offload_refutes(mutant: str) -> str | None:
    """Where ``kvspec prove --profile kvbm-offload`` refutes an operation mutant (``op:NAME``: its
    operation row, in the ``refutes`` rows at 3 slots, 4 hashes, batches <= 2); None otherwise."""
    from kvspec.reference.smt.offload.op_mutants import OP_MUTANTS, broken_rows

    m = next((o for o in OP_MUTANTS if o.name == mutant), None)
    if m is None or m.expect not in broken_rows(m):
        return None
    return f"operation row {m.expect}"


def _radix(mutant: str | None, model_bug: str | None) -> Any:
    from kvspec.reference.radix import RadixModel
    from kvspec.reference.smt.order.radix_equivalence import MODEL_BUGS, RadixOrderSubject

    return RadixOrderSubject(MODEL_BUGS[model_bug] if model_bug else RadixModel,
                             mutant=mutant)  # fmt: skip


def _radix_mutants() -> list[str]:
    from kvspec.reference.smt.order.encoding import RADIX_ORDER, mutants_of

    return mutants_of(RADIX_ORDER)


def _radix_bugs() -> list[str]:
    from kvspec.reference.smt.order.radix_equivalence import MODEL_BUGS as RADIX_BUGS

    return list(RADIX_BUGS)


def _radix_refutes(mutant: str) -> str | None:
    from kvspec.reference.smt.order.encoding import RADIX_ORDER
    from kvspec.reference.smt.order.encoding import refute as refute_order

    return refute_order(RADIX_ORDER, mutant)


def _paged(mutant: str | None, model_bug: str | None) -> Any:
    from kvspec.reference.paged import PagedModel
    from kvspec.reference.smt.managers.paged_equivalence import MODEL_BUGS, PagedSubject

    return PagedSubject(mutant=mutant, model_class=MODEL_BUGS[model_bug] if model_bug else PagedModel)


def _paged_mutants() -> list[str]:
    from kvspec.reference.smt.cli.managers import PAGED_MUTANTS
    from kvspec.reference.smt.managers.paged_equivalence import EQUIVALENCE_MUTANTS as PAGED_EQ

    return [*PAGED_MUTANTS, *PAGED_EQ]


def _paged_bugs() -> list[str]:
    from kvspec.reference.smt.managers.paged_equivalence import MODEL_BUGS as PAGED_BUGS

    return list(PAGED_BUGS)


def _paged_refutes(mutant: str) -> str | None:
    """The transition at which ``kvspec prove --profile paged`` finds a counterexample with
    ``mutant`` in force (None: it proves the invariant; the mutant keeps it)."""
    from kvspec.reference.smt.cli.managers import PAGED_MUTANTS
    from kvspec.reference.smt.managers import paged
    from kvspec.reference.smt.managers.paged_equivalence import EQUIVALENCE_MUTANTS as PAGED_EQ

    where, broken = {**PAGED_MUTANTS, **PAGED_EQ}[mutant]
    proofs, _ = paged.prove_paged(paged.PagedBound(), {**paged.TRANSITIONS, where: broken})
    return next((p.transition for p in proofs if not p.proven), None)


def _session(mutant: str | None, model_bug: str | None) -> Any:
    from kvspec.reference.session import SessionModel
    from kvspec.reference.smt.managers.session_equivalence import MODEL_BUGS, SessionSubject

    return SessionSubject(mutant=mutant, model_class=MODEL_BUGS[model_bug] if model_bug else SessionModel)


def _session_mutants() -> list[str]:
    from kvspec.reference.smt.cli.managers import SESSION_MUTANTS
    from kvspec.reference.smt.managers.session_equivalence import EQUIVALENCE_MUTANTS as SESSION_EQ

    return [*SESSION_MUTANTS, *SESSION_EQ]


def _session_bugs() -> list[str]:
    from kvspec.reference.smt.managers.session_equivalence import MODEL_BUGS as SESSION_BUGS

    return list(SESSION_BUGS)


def _session_refutes(mutant: str) -> str | None:
    """As ``_paged_refutes``, for ``kvspec prove --profile session``."""
    from kvspec.reference.smt.cli.managers import SESSION_MUTANTS, SESSION_SLOTS
    from kvspec.reference.smt.managers import session
    from kvspec.reference.smt.managers.session_equivalence import EQUIVALENCE_MUTANTS as SESSION_EQ

    where, broken = {**SESSION_MUTANTS, **SESSION_EQ}[mutant]
    proofs, _ = session.prove_session(SESSION_SLOTS, {**session.TRANSITIONS, where: broken})
    return next((p.transition for p in proofs if not p.proven), None)


#: profile -> its bound and default depth (whether the walk closes its frontier: benchmarks/equivalence.py)
#: and its seeds; every question about one profile is a lookup here, not a chain of name tests
BOUNDS: dict[str, ExhaustiveBound] = {
    b.profile: b
    for b in (
        ExhaustiveBound(KVBM_OFFLOAD, 3, "2 slots, hashes 0->1 and 2, G2 of 1, uuid u0, LRU", _offload,
                        _offload_mutants, _none, _offload_refutes, lambda m: m.startswith("op:")),
        ExhaustiveBound(VLLM_NAME, 6, "2 blocks, hashes 0-1, uuid u0", _vllm, _vllm_mutants, _none, _vllm_refutes),
        *(_blocks_bound(p) for p in BLOCK_ENCODINGS),
        ExhaustiveBound(RADIX, 4, "page 1, capacity 3, keys 1, 12, 13, 2, lock a; recency order", _radix,
                        _radix_mutants, _radix_bugs, _radix_refutes),
        ExhaustiveBound(PAGED, 8, "2+2 blocks of 1 token, sequences a b, prefix p", _paged,
                        _paged_mutants, _paged_bugs, _paged_refutes),
        ExhaustiveBound(SESSION, 6, "2 slots, sessions s0-s2, generations up to a shift", _session,
                        _session_mutants, _session_bugs, _session_refutes),
    )
}  # fmt: skip
#: profile -> its row id (SPEC.md, "Proven invariants"), spelled out so that grep finds each rule's place
EQUIV_ROWS: dict[str, str] = {
    KVBM_OFFLOAD: "EQUIV-KVBM-OFFLOAD",
    VLLM_NAME: "EQUIV-VLLM",
    KVBM_NAME: "EQUIV-KVBM",
    LEGACY_NAME: "EQUIV-LEGACY",
    ATOMIC_NAME: "EQUIV-ATOMIC",
    RADIX: "EQUIV-RADIX",
    PAGED: "EQUIV-PAGED",
    SESSION: "EQUIV-SESSION",
}
BIND_ROW = "BIND-VLLM-STEPS"
ORDER_ROW = "EQUIV-ORDER"
#: profile -> the order policies bound with it (``order/policy_equivalence.py``), each with its depth
ORDER_POLICIES: dict[str, tuple[tuple[str, int], ...]] = {
    KVBM_NAME: (("lru", 12), ("multi_lru", 12), ("lineage", 12)),
    VLLM_NAME: (("vllm-free", 8),),
}


def mutants(profile: str) -> list[str]:
    """The seeded encoding bugs of ``profile`` this check runs (``--mutant``): those that change
    what the encoding does (a mutant that only drops a caller contract is for ``kvspec prove``)."""
    return BOUNDS[profile].mutants()


def model_bugs(profile: str) -> list[str]:
    """The seeded model bugs that apply to ``profile`` (``--model-bug``)."""
    return BOUNDS[profile].model_bugs()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        action="append",
        choices=sorted(BOUNDS),
        help="check this profile (repeatable; default: every profile with an equivalence check)",
    )
    p.add_argument("--depth", type=int, default=None, help="operations from the initial state (default: per profile)")
    p.add_argument("--mutant", default=None, help="an encoding mutant of the one --profile given (expect: caught)")
    p.add_argument("--model-bug", default=None, help="a seeded bug of the Python model (expect: caught)")
    p.add_argument(
        "--campaign",
        action="store_true",
        help="run every encoding mutant and model bug of the profiles; print each verdict and the kill rate",
    )
    p.add_argument("--max-states", type=int, default=None, help="stop after this many states (then: incomplete)")


def row(profile: str, rep: EquivalenceReport, bound: str) -> str:
    verdict = "equal" if rep.equal and rep.complete else ("DIFFERENT" if rep.differences else "incomplete")
    reach = "every reachable state" if rep.closed else f"depth {rep.depth}"
    return (
        f"{EQUIV_ROWS[profile]:<14} {verdict:<10} {bound}, {reach}: {rep.states} states,"
        f" {rep.pairs} (state, operation) pairs, {rep.outcomes} model outcomes  {rep.seconds:.1f}s CPU"
    )


def run(args: argparse.Namespace) -> int:
    profiles = args.profile or list(BOUNDS)
    if args.depth is not None and args.depth < 0:
        print("kvspec equivalence: --depth must be at least 0", file=sys.stderr)
        return 2
    if args.mutant is not None:
        if len(profiles) != 1:
            print("kvspec equivalence: --mutant needs exactly one --profile", file=sys.stderr)
            return 2
        if args.mutant not in mutants(profiles[0]):
            names = ", ".join(mutants(profiles[0]))
            print(f"kvspec equivalence: {profiles[0]} has no mutant {args.mutant!r}; its mutants: {names}",
                  file=sys.stderr)  # fmt: skip
            return 2
    if args.model_bug is not None and (len(profiles) != 1 or args.model_bug not in model_bugs(profiles[0])):
        known = {p: model_bugs(p) for p in BOUNDS if model_bugs(p)}
        print(f"kvspec equivalence: --model-bug {args.model_bug!r} needs one --profile it applies to: {known}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.campaign:
        return campaign(profiles, args.depth)
    bad = False
    for prof in profiles:
        b = BOUNDS[prof]
        depth = b.depth if args.depth is None else args.depth
        rep = explore(b.build(args.mutant, args.model_bug), depth, max_states=args.max_states)
        seeded = (
            f", MUTANT {args.mutant}" if args.mutant else (f", MODEL BUG {args.model_bug}" if args.model_bug else "")
        )
        print(row(prof, rep, b.text + seeded), flush=True)
        for d in rep.differences:
            print(d.render())
        bad |= not (rep.equal and rep.complete)
        if args.mutant is None and args.model_bug is None:
            for pid, count in sorted(rep.progress_checked.items()):
                mine = [v for v in rep.progress_violations if v.startswith(pid + ":")]
                verdict = "holds" if not mine else f"VIOLATED in {len(mine)} state(s)"
                print(f"{pid:<22} {verdict}: checked {count} time(s) over the reachable states above ({prof})")
                for v in mine[:3]:
                    print(f"  {v}")
                bad |= bool(mine)
        if prof == VLLM_NAME and args.mutant is None:
            bad |= not _bind_vllm_steps()
        if args.mutant is None and args.model_bug is None and args.depth is None:
            for policy, pdepth in ORDER_POLICIES.get(prof, ()):
                bad |= not _order_row(policy, pdepth)
    return 1 if bad else 0


def _bind_vllm_steps() -> bool:
    """The row binding the vllm step encoding (``copies.py``) to the operation encoding."""
    import time

    from kvspec.reference.smt.vllm.refinement import prove_simulation

    t0 = time.process_time()
    sims = prove_simulation()
    bad = [f"{s.transition} ({s.verdict})" for s in sims if s.verdict != "proven"]
    verdict = "proven" if not bad else "NOT proven at " + ", ".join(bad)
    print(
        f"{BIND_ROW}  {verdict}: every step of vllm/ops.py is matched by 0-2 steps of vllm/copies.py"
        f" on its projection, any pool, any hashes ({len(sims)} steps)  {time.process_time() - t0:.1f}s CPU",
        flush=True,
    )
    return not bad


def _order_row(policy: str, depth: int, bug: str | None = None) -> bool:
    """The row binding one policy's order encoding to its Python code, both ways (EQUIV-ORDER)."""
    from kvspec.reference.smt.order.policy_equivalence import PolicyOrderSubject

    rep = explore(PolicyOrderSubject(policy, bug=bug), depth)
    verdict = "equal" if rep.equal and rep.complete else ("DIFFERENT" if rep.differences else "incomplete")
    reach = "every reachable state" if rep.closed else f"depth {rep.depth}"
    print(f"{ORDER_ROW} ({policy})".ljust(24) + f" {verdict:<10} 4 entries, {reach}: {rep.states} states,"
          f" {rep.pairs} (state, operation) pairs  {rep.seconds:.1f}s CPU", flush=True)  # fmt: skip
    for d in rep.differences:
        print(d.render())
    return rep.equal and rep.complete and rep.closed


def _prove_refutes(profile: str, mutant: str) -> str | None:
    """Where ``kvspec prove``'s machinery refutes ``mutant`` (None: it does not, or has no such mutant)."""
    return BOUNDS[profile].refutes(mutant)


def _blocks_profile(profile: str) -> Any:
    from kvspec.reference.smt.blocks.catalogue import block_encoding

    return block_encoding(profile)


def campaign(profiles: list[str], depth: int | None) -> int:
    """Every seeded encoding mutant and model bug of ``profiles``: killed when the exhaustive
    check finds a difference (or, failing that, ``kvspec prove``'s refutation finds a
    counterexample). Prints one row each and ``kill rate: K/N``; exit 0 only at 100%."""
    killed = total = 0
    for prof in profiles:
        b = BOUNDS[prof]
        d = b.depth if depth is None else depth
        seeded = [(m, None) for m in mutants(prof)] + [(None, bug) for bug in model_bugs(prof)]
        for mutant, bug in seeded:
            total += 1
            t0 = time.process_time()
            how: str | None = None
            if mutant is not None and b.prove_first(mutant):
                where = _prove_refutes(prof, mutant)
                how = f"prove (refuted at {where})" if where else None
            if how is None:
                rep = explore(b.build(mutant, bug), d)
                how = f"equivalence (after {len(rep.differences[0].trace) + 1} operations)" if rep.differences else None
            if how is None and mutant is not None and not b.prove_first(mutant):
                where = _prove_refutes(prof, mutant)
                how = f"prove (refuted at {where})" if where else None
            killed += how is not None
            name = mutant if mutant is not None else f"model bug {bug}"
            verdict = "killed" if how else "SURVIVED"
            cpu = time.process_time() - t0
            print(f"{prof:<13} {name:<34} {verdict:<9} {how or f'no difference at depth {d}'}  {cpu:.1f}s CPU",
                  flush=True)  # fmt: skip
        for policy, pdepth in ORDER_POLICIES.get(prof, ()) if depth is None else ():
            from kvspec.reference.smt.order.policy_equivalence import POLICY_BUGS, PolicyOrderSubject

            for pbug in POLICY_BUGS[policy]:
                total += 1
                rep = explore(PolicyOrderSubject(policy, bug=pbug), pdepth)
                caught = bool(rep.differences)
                killed += caught
                how = f"{ORDER_ROW} (after {len(rep.differences[0].trace) + 1} operations)" if caught else None
                print(f"{prof:<13} {'policy bug ' + pbug:<34} {'killed' if caught else 'SURVIVED':<9} "
                      f"{how or f'no difference at depth {pdepth}'}  {rep.seconds:.1f}s CPU", flush=True)  # fmt: skip
    rate = 100.0 * killed / total if total else 100.0
    print(f"kill rate: {killed}/{total} ({rate:.0f}%)")
    return 0 if killed == total else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvspec equivalence", description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
