"""The adapter-facing interface of the allocator-level profiles (``paged``, ``session``).

A ``ManagerImplementation`` is one running paged allocator or session-slot
manager under test: the suite sends it one operation of ``spec.manager_wire``
at a time and gets back the outcome with the manager's state. In-process
adapters implement it directly (``start.managers`` in the manifest); a child
process reaches it through protocol version 3 (``transport/manager.py``).
Like ``conformance/block/interface.py`` it depends on the spec and the generic
protocol it specialises (``conformance/implementation.py``) alone.
"""

from __future__ import annotations

from kvspec.conformance.implementation import StepwiseImplementation
from kvspec.spec.manager_wire import ManagerConfigKind, ManagerOp, ManagerOutcome


class ManagerImplementation(StepwiseImplementation[ManagerConfigKind, ManagerOp, ManagerOutcome]):
    """One running allocator-level manager (the one implementation protocol, ``conformance/implementation.py``, for
    this family). Close it (or use ``with``)."""
