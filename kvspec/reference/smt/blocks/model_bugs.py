"""Seeded bugs of the Python models the exhaustive model-encoding check must catch.

A sampled agreement test can miss a model bug that only shows in a state
its traffic rarely reaches; the exhaustive check (``blocks/equivalence.py``)
visits every state at its bound. Each class here breaks one rule of the
model, the way a slip in ``reference/g1.py`` would.
"""

from __future__ import annotations

from kvspec.reference.g1 import G1Model
from kvspec.reference.outcome import Step
from kvspec.spec.registry import ATOMIC_NAME, KVBM_NAME
from kvspec.spec.wire import Promote


class PromoteExistingLeaksSlot(G1Model):
    """PROMOTE-EXISTING: a partial promoted onto a registered block keeps its slot (never freed)."""

    def _promote(self, op: Promote) -> Step:
        existing = op.uuid in self.partial and op.seq_hash in self.blocks
        step = super()._promote(op)
        if existing:
            self.free -= 1
        return step


#: name -> (profiles it applies to, model class, the rule it breaks)
MODEL_BUGS: dict[str, tuple[tuple[str, ...], type[G1Model], str]] = {
    "promote-existing-leaks-slot": ((KVBM_NAME, ATOMIC_NAME), PromoteExistingLeaksSlot, "PROMOTE-EXISTING"),
}
