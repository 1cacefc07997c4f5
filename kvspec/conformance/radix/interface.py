"""The adapter-facing interface of the ``radix`` profile.

A ``RadixImplementation`` is one running radix prefix cache under test: the
suite sends it one operation of ``spec.radix_wire`` at a time and gets back
the outcome: the value (or the error), the KV events the operation
published, in kvspec's wire form, and the cache's state. An adapter names
its factory in the manifest's ``start.radix`` (``module:factory``, called as
``factory(config, manifest, adapter_dir)``, plus ``variant=NAME`` when a
variant is selected); a ``kind = "subprocess"`` adapter without one is a
child process speaking protocol version 4 (``transport/radix.py``). Like
``manager_interface`` it depends on the spec alone: starting an
implementation is ``radix_open.open_radix``, a layer above both this
interface and the transport.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

from kvspec.spec.radix_wire import RadixConfig, RadixOp, RadixOutcome


class RadixImplementation(ABC):
    """One running radix cache. Close it (or use ``with``)."""

    config: RadixConfig

    @abstractmethod
    def step(self, op: RadixOp) -> RadixOutcome:
        """Apply one operation; raise AdapterError if the implementation fails."""

    def close(self) -> None:  # noqa: B027 - optional for in-process adapters
        """Release what the implementation holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
