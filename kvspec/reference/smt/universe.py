"""The bounded universe the z3 encoding ranges over, and its sorts.

The proofs are about *every* state of a universe with ``slots`` G1 slots,
``hashes`` block hashes (numbered 0..hashes-1; ``NONE`` = -1 stands for "no
block", the root parent) and as many partial-block uuids and swap-in jobs as
there are slots (no state can hold more). The G2 capacity is left symbolic
(any value >= 1), so one proof covers every G2 size.

Slot states are a z3 enumeration so that counterexamples print by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

#: "no block": the parent of a root block, the anchor of a Stored with no parent
NONE = -1

SLOT_STATE_NAMES = ("free", "partial", "active", "inactive", "quarantined", "reserved")

SlotSort, _SLOT_CONSTS = z3.EnumSort("SlotState", list(SLOT_STATE_NAMES))
FREE, PARTIAL, ACTIVE, INACTIVE, QUARANTINED, RESERVED = _SLOT_CONSTS
SLOT_STATES = dict(zip(SLOT_STATE_NAMES, _SLOT_CONSTS, strict=True))


@dataclass(frozen=True, slots=True)
class Bound:
    """The size of the universe: G1 slots and block hashes."""

    slots: int = 8
    hashes: int = 12

    def __post_init__(self) -> None:
        if self.slots < 1 or self.hashes < 1:
            raise ValueError("a bound needs at least one slot and one block hash")

    @property
    def uuids(self) -> int:
        """Partial-block uuids: at most one per slot can be held at once."""
        return self.slots

    @property
    def jobs(self) -> int:
        """Swap-in jobs: each holds at least one reserved slot."""
        return self.slots

    def __str__(self) -> str:
        return f"{self.slots} slots, {self.hashes} hashes"


DEFAULT_BOUND = Bound(8, 12)
