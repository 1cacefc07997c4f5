"""Counterexamples as replay files: ``kvspec prove --counterexamples DIR``.

An induction counterexample is a pre-state that satisfies the invariants and
a step that breaks one; the pre-state may be unreachable. So for each row the
prover refutes (an invariant of the rules as written, or a seeded mutant of
the encoding) a bounded search from the initial state (``reach.violation``)
looks for a trace of the encoding's steps that ends in the violation. Such a
trace is turned into wire operations (the profile's ``operations`` of the
trace) and written as a replay file (``conformance/verdicts/replay_file.py``):
``kvspec replay FILE`` runs it against the implementation the file records
and checks it step by step against the model. The file's failure names the
rule the refuted row stands for.

Where the refuted mutant has a twin among the model's seeded bugs
(``adapters/mutants``, the same bug in the Python model), the file records
that variant as its implementation, so replaying it shows the model with the
bug breaking the same rule; without a twin it records the reference. Either
way the operations are first run here against both: against the reference
they must pass (the trace is a valid run of the rules as written), and the
verdict against the twin is printed with the rule it breaks.

When no trace of up to the search depth reaches the violation (or the solver
gives up), nothing replayable exists and the folder gets a text file that
says so: "induction only, unreachable within N steps" or "unknown".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import z3

from kvspec.reference.smt.reach import Move, ReachTrace, System
from kvspec.spec.config import ManagerConfig
from kvspec.spec.registry import KVBM_OFFLOAD, PAGED, RADIX, SESSION, VLLM_NAME
from kvspec.spec.wire import Operation


@dataclass
class Written:
    """What ``write`` left in the folder, and what the replays here showed."""

    path: Path
    #: the replay against the reference: None passed, else "RULE at step N"
    reference: str | None = None
    #: the variant of ``adapters/mutants`` the file records, and its replay's verdict
    twin: str | None = None
    twin_verdict: str | None = None

    def lines(self) -> list[str]:
        out = [f"counterexample written: {self.path} (replay: kvspec replay {self.path})"]
        ref = "passes" if self.reference is None else f"FAILS {self.reference}"
        out.append(f"  against the reference model: {ref}")
        if self.twin is not None:
            out.append(f"  against adapters/mutants/{self.twin} (the same bug in the model): {self.twin_verdict}")
        return out


def _run(ops: list[Operation], config: ManagerConfig, impl: str) -> tuple[str | None, list[object]]:
    """Run ``ops`` in lockstep against ``impl``: (None, the model's outcomes)
    when every step agrees, else ("RULE at step N", the outcomes so far)."""
    from kvspec.conformance.block.lockstep import Lockstep
    from kvspec.conformance.block.opener import open_implementation
    from kvspec.conformance.run.manifest import load_impl
    from kvspec.conformance.verdicts.failures import ConformanceFailure

    adapter_dir, manifest = load_impl(impl)
    handle = open_implementation(manifest, adapter_dir, config)
    try:
        ls = Lockstep(handle, config, adapter=manifest.name, deviations=manifest.deviations)
        for n, op in enumerate(ops):  # numbered from 0, as the lockstep and ``kvspec replay`` number steps
            try:
                ls.step(op)
            except ConformanceFailure as f:
                return f"{f.rule} at step {n}", list(ls.expected)
        return None, list(ls.expected)
    finally:
        handle.close()


def write(
    folder: Path,
    name: str,
    config: ManagerConfig,
    ops: list[Operation],
    *,
    rule: str,
    what: str,
    twin: str | None = None,
) -> Written:
    """Write ``ops`` as the replay file ``folder/name.jsonl`` (failure: ``rule``,
    ``what``), recording ``adapters/mutants/twin`` (or the reference) as its
    implementation; run it against the reference and the twin first."""
    from kvspec.conformance.run.manifest import resolve_impl
    from kvspec.conformance.verdicts.replay_file import write_replay
    from kvspec.conformance.verdicts.replay_store import Target

    ref_verdict, expected = _run(ops, config, "adapters/reference")
    out = Written(folder / f"{name}.jsonl", reference=ref_verdict)
    impl = "adapters/reference"
    if twin is not None:
        impl = f"adapters/mutants/{twin}"
        verdict, _ = _run(ops, config, impl)
        out.twin, out.twin_verdict = twin, ("passes (the bug does not show)" if verdict is None else f"fails {verdict}")
    if ref_verdict is not None:
        # the reference refused the trace: the outcomes stop there, and so does the file
        ops = ops[: len(expected)]
    adapter_dir, variant = resolve_impl(impl)
    target = Target(impl=impl, adapter_path=str(adapter_dir), variant=variant)
    failure = {"rule": rule, "step": len(ops) - 1, "what": what}
    write_replay(
        out.path,
        adapter="mutants" if twin else "reference",
        config=config,
        protocol_only=False,
        failure=failure,
        ops=ops,
        expected=expected[: len(ops)],  # type: ignore[arg-type]
        target=target,
    )
    return out


def not_reachable(folder: Path, name: str, statement: str) -> Path:
    """The text file for a refuted row no trace from the initial state reaches (within the bound)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.txt"
    path.write_text(statement + "\n")
    return path


#: why a profile's traces are not written as replay files (a replay file, ``conformance/verdicts/
#: replay_file.py``, is a ManagerConfig and block-level wire operations run in lockstep)
NOT_WIRE: dict[str, str] = {
    KVBM_OFFLOAD: (
        "the trace is of the step encoding (offload/reach.py: one step per slot move, G2 write"
        " and swap-in job step, over a hash forest z3 chooses); no reader turns those steps back"
        " into wire operations (Use, Deref, Promote, SwapIn, Tick). A mutant that acts through"
        " whole operations is searched at operation level instead and written as a replay file"
        " (offload/counterexample.py)"
    ),
    PAGED: (
        "paged is an allocator-level profile (spec/manager_wire.py): its operations are not the"
        " block-level wire operations a replay file carries, so kvspec replay cannot run it"
    ),
    SESSION: (
        "session is an allocator-level profile (spec/manager_wire.py): its operations are not the"
        " block-level wire operations a replay file carries, so kvspec replay cannot run it"
    ),
    RADIX: (
        "radix operations (match, insert, lock, unlock, evict, reset) are of the radix wire, not"
        " the block-level wire operations a replay file carries, so kvspec replay cannot run it"
    ),
    VLLM_NAME: (
        "the trace is of the step encoding (vllm/copies.py, searched over vllm/reach.py's step table),"
        " one block at a time with every event at once: no reader turns its steps back into wire"
        " operations (an operation-level mutant's trace is: vllm/counterexample.py)"
    ),
}


def trace_statement(
    folder: Path,
    profile: str,
    name: str,
    *,
    rule: str,
    what: str,
    bound: str,
    depth: int | None,
    trace: ReachTrace | None,
    why: list[str] | None = None,
    row: str | None = None,
    reason: str | None = None,
) -> list[str]:
    """The text file of a refuted row of a profile whose traces are not replay files: the trace
    from the initial state when the bounded search found one (and why it is not a replay file:
    ``reason``, else the profile's ``NOT_WIRE``), else "induction only" (no trace within the
    bound) or "unknown (REASON)"; the lines to print."""
    head = f"{name}: {what} (breaks {rule})"
    row = row or rule
    if trace is not None:
        text = [
            head,
            f"reachable: from the initial state ({bound}), {len(trace)} steps, the last breaks {row}:",
            trace.render("  "),
            f"not a replay file: {reason or NOT_WIRE[profile]}",
        ]
    elif depth is None:
        text = [
            head,
            "unknown (not searched): the row is refuted by an induction counterexample only",
        ]
    elif why:
        text = [
            head,
            f"unknown ({why[0]}): the search from the initial state ({bound}) gave up at some depth <= {depth};"
            " the induction counterexample's pre-state is not shown reachable",
        ]
    else:
        text = [
            head,
            f"induction only: no trace of up to {depth} steps from the initial state ({bound}) breaks {row};"
            " the induction counterexample's pre-state may be unreachable",
        ]
    path = not_reachable(folder, name, "\n".join(text))
    return [*text[1:], f"  (written to {path})"]


def search_statement(
    folder: Path,
    profile: str,
    name: str,
    system: System[Any],
    bad: Callable[[str, Move], z3.BoolRef | None],
    *,
    rule: str,
    what: str,
    bound: str,
    timeout_ms: int = 30_000,
    row: str | None = None,
    reason: str | None = None,
) -> list[str]:
    """Search ``system`` from its initial state for a step that is ``bad`` (``reach.violation``,
    ``timeout_ms`` per solver call) and write what was found (``trace_statement``)."""
    from kvspec.reference.smt.reach import violation

    why: list[str] = []
    trace, _ = violation(system, bad, timeout_ms=timeout_ms, why=why)
    return trace_statement(
        folder,
        profile,
        name,
        rule=rule,
        what=what,
        bound=bound,
        depth=system.depth,
        trace=trace,
        why=why,
        row=row,
        reason=reason,
    )


def not_searched(folder: Path, profile: str, name: str, *, rule: str, what: str, reason: str) -> list[str]:
    """The text file of a refuted row that is not searched from the initial state (``reason``: why)."""
    text = [f"{name}: {what} (breaks {rule})", f"unknown (not searched): {reason}"]
    path = not_reachable(folder, name, "\n".join(text))
    return [text[1], f"  (written to {path})"]
