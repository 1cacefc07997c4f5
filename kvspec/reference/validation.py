"""The shape checks every profile applies to a Use before touching state.

USE-VALIDATE: one lineage hash per full block; local hashes and token ids
absent or one per full block; each block's token ids exactly ``block_size``
long; no partial block as the batch's parent. The profiles add their own
checks on top (identity against the registry, duplicate positions, ...).
"""

from __future__ import annotations

from kvspec.spec.errors import InvalidOperation
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import FullBlock, PartialBlock, Use


def check_use_shape(op: Use, block_size: int) -> list[int]:
    """Raise USE-VALIDATE on a malformed Use; return its full blocks' hashes."""
    fulls = [b.full for b in op.blocks if type(b) is FullBlock]
    n = len(fulls)
    if len(op.plhs) != n:
        raise InvalidOperation(RuleId.USE_VALIDATE, f"plhs has {len(op.plhs)} entries for {n} full blocks")
    if op.local_hashes and len(op.local_hashes) != n:
        raise InvalidOperation(
            RuleId.USE_VALIDATE, f"local_hashes has {len(op.local_hashes)} entries for {n} full blocks"
        )
    if op.token_ids is not None:
        if len(op.token_ids) != n:
            raise InvalidOperation(
                RuleId.USE_VALIDATE, f"token_ids has {len(op.token_ids)} entries for {n} full blocks"
            )
        for i, toks in enumerate(op.token_ids):
            if len(toks) != block_size:
                raise InvalidOperation(
                    RuleId.USE_VALIDATE, f"token_ids[{i}] has {len(toks)} tokens; a full block has {block_size}"
                )
    if isinstance(op.parent, PartialBlock):
        raise InvalidOperation(RuleId.USE_VALIDATE, "a partial block cannot be the parent of a Use")
    return fulls
