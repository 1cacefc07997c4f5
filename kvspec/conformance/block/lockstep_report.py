"""The failure report of a lockstep run, written for a person.

The operations so far as a table with the model's outcomes (the last row is
what the implementation returned), what the model expected at the failing
step, the first divergence (expected vs actual) with its rule, block hashes
replaced by short names, and where the replay file went.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from kvspec.conformance.block.diff import Divergence
from kvspec.conformance.block.step_check import brief_outcome
from kvspec.conformance.verdicts.hash_aliases import apply_aliases, hash_aliases
from kvspec.spec.config import ManagerConfig
from kvspec.spec.display import format_op, format_ops
from kvspec.spec.rules import rule
from kvspec.spec.wire import Operation, StepOutcome


def run_title(config: ManagerConfig, adapter: str) -> str:
    """What was run: adapter, profile, policy, capacity and the options that matter."""
    return (
        f"adapter {adapter}, profile {config.profile}, policy {config.eviction}, capacity {config.capacity}"
        + (f", dp_rank {config.dp_rank}" if config.dp_rank else "")
        + (", offload tier" if config.offload is not None else "")
    )


def divergence_report(
    div: Divergence,
    *,
    config: ManagerConfig,
    adapter: str,
    protocol_only: bool,
    ops: Sequence[Operation],
    expected: Sequence[StepOutcome],
    actual: Sequence[StepOutcome],
    replay_path: Path | None = None,
    replay_command: Callable[[Path], str] | None = None,
) -> str:
    """The report of ``div`` at the last step of ``ops``."""
    i = len(ops) - 1
    head = f"{'protocol-only ' if protocol_only else ''}lockstep divergence at step {i} ({run_title(config, adapter)})"
    try:
        title = rule(div.rule).title
    except KeyError:
        title = ""
    lines = [
        head,
        f"rule: {div.rule} - {title}",
        "operations (model's outcomes; the last row is what the implementation returned):",
        format_ops(ops, [*expected[:i], actual[i]]),
        f"  the model expected at step {i}: {brief_outcome(expected[i])}",
        f"first divergence at step {i} ({format_op(ops[i])}): {div.describe()}",
    ]
    text = apply_aliases("\n".join(lines), hash_aliases(ops, [*expected, *actual]))
    if replay_path is not None:
        command = replay_command(replay_path) if replay_command is not None else f"kvspec replay {replay_path}"
        text += f"\nreplay file: {replay_path}\n  run again with: {command}"
    return text


def unfinished_note(ops: Sequence[Operation], expected: Sequence[StepOutcome]) -> str:
    """What an adapter failure carries: the operations so far, the last of
    which did not complete."""
    return "operations so far (the last one did not complete):\n" + format_ops(ops, expected)
