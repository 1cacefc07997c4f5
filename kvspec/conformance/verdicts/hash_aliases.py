"""Short names for block hashes in failure reports.

Block hashes are up to 20 digits: a table of them is unreadable. Reports
name each hash ``b1``, ``b2``, ... in order of first appearance (in the
operations, then in the events) and end with the legend.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from kvspec.spec.wire import Deref, Destroy, FullBlock, Operation, Promote, StepOutcome, SwapIn, Use

#: a number that may be a block hash (small numbers are left alone: steps, counts)
_HASH_RE = re.compile(r"\b\d{5,20}\b")
_MIN_HASH = 10_000


def hash_aliases(ops: Sequence[Operation], outcomes: Iterable[StepOutcome]) -> dict[int, str]:
    """Short names for the block hashes of ``ops`` and ``outcomes``' events,
    in order of first appearance."""
    names: dict[int, str] = {}

    def add(h: int | None) -> None:
        if h is not None and h not in names and h >= _MIN_HASH:
            names[h] = f"b{len(names) + 1}"

    for op in ops:
        if isinstance(op, Use | Deref | Destroy):
            if isinstance(op, Use) and isinstance(op.parent, FullBlock):
                add(op.parent.full)
            for b in op.blocks:
                if isinstance(b, FullBlock):
                    add(b.full)
        elif isinstance(op, Promote):
            add(op.parent_hash)
            add(op.seq_hash)
        elif isinstance(op, SwapIn):
            add(op.parent)
            for sb in op.blocks:
                add(sb.seq_hash)
    for o in outcomes:
        for e in o.events:
            for h in e.hashes():
                add(h)
    return names


def apply_aliases(text: str, names: dict[int, str]) -> str:
    """``text`` with every aliased hash replaced by its name, and the legend."""
    out = _HASH_RE.sub(lambda m: names.get(int(m.group(0)), m.group(0)), text)
    if names:
        out += "\nblock names: " + ", ".join(f"{n} = {h}" for h, n in names.items())
    return out
