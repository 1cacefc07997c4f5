"""Readable forms of operations and outcomes, for failure reports, replays and witnesses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvspec.spec.wire import BlockRef, Deref, Destroy, FullBlock, Operation, Promote, Reset, SwapIn, Tick, Use


def _ref(b: BlockRef) -> str:
    return str(b.full) if isinstance(b, FullBlock) else f"p:{b.partial}"


def format_op(op: Operation) -> str:
    if isinstance(op, Use):
        parent = f" parent={_ref(op.parent)}" if op.parent is not None else ""
        toks = " +tokens" if op.token_ids is not None else ""
        return f"Use [{', '.join(_ref(b) for b in op.blocks)}]{parent}{toks}"
    if isinstance(op, Deref):
        return f"Deref [{', '.join(_ref(b) for b in op.blocks)}]"
    if isinstance(op, Destroy):
        return f"Destroy [{', '.join(_ref(b) for b in op.blocks)}]"
    if isinstance(op, Promote):
        return f"Promote p:{op.uuid} -> {op.seq_hash} parent={op.parent_hash}"
    if isinstance(op, Tick):
        return f"Tick {op.now_ms:g} ms"
    if isinstance(op, SwapIn):
        return f"SwapIn [{', '.join(str(b.seq_hash) for b in op.blocks)}] parent={op.parent}"
    if isinstance(op, Reset):
        return "Reset"
    return repr(op)


def format_ops(ops: Sequence[Any], outcomes: Sequence[Any] | None = None) -> str:
    """A numbered table of operations (and, when given, what each returned)."""
    lines = ["  step | operation" + (" | result | events" if outcomes is not None else "")]
    for i, op in enumerate(ops):
        line = f"  {i:>4} | {format_op(op)}"
        if outcomes is not None and i < len(outcomes):
            o = outcomes[i]
            res = f"error [{o.error.rule}]" if o.error is not None else f"{o.result.value} {o.result.status}"
            line += f" | {res} | {'; '.join(e.brief() for e in o.events) or '-'}"
        lines.append(line)
    return "\n".join(lines)
