"""In-process adapter of the radix profile over its reference model.

``open_reference_radix`` is the manifest's ``start.radix`` factory: a
``RadixImplementation`` answering from ``reference.radix``. The radix
mutants (``adapters/radix_mutants``) reuse ``ModelRadix`` with a broken model.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.api import RadixImplementation, RadixModel
from kvspec.spec.manifest import Manifest
from kvspec.spec.radix_wire import RadixConfig, RadixOp, RadixOutcome


class ModelRadix(RadixImplementation):
    """A radix model behind the radix interface."""

    def __init__(self, config: RadixConfig, model: RadixModel | None = None) -> None:
        self.config = config
        self.model = model if model is not None else RadixModel(config)

    def step(self, op: RadixOp) -> RadixOutcome:
        return self.model.step(op)


def open_reference_radix(
    config: RadixConfig, manifest: Manifest, adapter_dir: Path, variant: str | None = None
) -> RadixImplementation:
    """The reference model; a variant of another adapter (a G1 mutant) leaves this profile alone."""
    return ModelRadix(config)
