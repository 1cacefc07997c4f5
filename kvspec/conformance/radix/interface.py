"""The adapter-facing interface of the ``radix`` profile.

A ``RadixImplementation`` is one running radix prefix cache under test: the
suite sends it one operation of ``spec.radix_wire`` at a time and gets back
the outcome: the value (or the error), the KV events the operation
published, in kvspec's wire form, and the cache's state. An adapter names
its factory in the manifest's ``start.radix`` (``module:factory``, called as
``factory(config, manifest, adapter_dir)``, plus ``variant=NAME`` when a
variant is selected); a ``kind = "subprocess"`` adapter without one is a
child process speaking protocol version 4 (``transport/radix.py``). Like
``managers/interface.py`` it depends on the spec and the generic protocol
(``conformance/implementation.py``) alone: starting an
implementation is ``radix_open.open_radix``, a layer above both this
interface and the transport.
"""

from __future__ import annotations

from kvspec.conformance.implementation import StepwiseImplementation
from kvspec.spec.radix_wire import RadixConfig, RadixOp, RadixOutcome


class RadixImplementation(StepwiseImplementation[RadixConfig, RadixOp, RadixOutcome]):
    """One running radix cache (the one implementation protocol, ``conformance/implementation.py``, for
    this family). Close it (or use ``with``)."""
