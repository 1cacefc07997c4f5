"""In-process adapter that runs one mutant of the reference model.

Which mutant comes from the adapter variant: ``--impl=adapters/mutants/NAME``
selects the manifest's ``[[variants]]`` entry NAME and the suite calls the
factory with ``variant=NAME``. Without a variant (``--impl=adapters/mutants``)
the factory runs the unmutated reference through this same adapter: the
sanity run of ``kvspec mutants``.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.adapters.mutants.catalogue import make_mutant_model
from kvspec.adapters.reference.adapter import outcome_of
from kvspec.api import Implementation, Manifest
from kvspec.spec.config import ManagerConfig
from kvspec.spec.wire import Operation, StepOutcome


class MutantImplementation(Implementation):
    def __init__(self, name: str | None, config: ManagerConfig, manifest: Manifest) -> None:
        self.name = name
        self.config = config
        self.manifest = manifest
        self.model = make_mutant_model(name, config)

    def step(self, op: Operation) -> StepOutcome:
        return outcome_of(self.model, op)


def open_mutant(
    config: ManagerConfig, manifest: Manifest, adapter_dir: Path, variant: str | None = None
) -> MutantImplementation:
    """The mutant ``variant`` (None: the unmutated reference); an unknown
    name is a ConfigError listing the known ones."""
    return MutantImplementation(variant, config, manifest)
