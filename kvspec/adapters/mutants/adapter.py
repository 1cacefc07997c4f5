"""In-process adapter that runs one mutant of the reference model.

Which mutant comes from the adapter variant: ``--impl=adapters/mutants/NAME``
makes ``resolve_adapter_dir`` export ``KVSPEC_ADAPTER_VARIANT=NAME`` (or set
the variable yourself and pass ``--impl=adapters/mutants``). ``none`` runs
the unmutated reference through this same adapter.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kvspec.adapters.reference.adapter import outcome_of
from kvspec.conformance.implementation import Implementation
from kvspec.conformance.manifest import VARIANT_ENV, Manifest
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.wire import StepOutcome

from .catalogue import make_mutant_model


class MutantImplementation(Implementation):
    def __init__(self, name: str, config: ManagerConfig, manifest: Manifest) -> None:
        self.name = name
        self.config = config
        self.manifest = manifest
        self.model = make_mutant_model(name, config)

    def step(self, op: Any) -> StepOutcome:
        return outcome_of(self.model, op)


def open_mutant(config: ManagerConfig, manifest: Manifest, adapter_dir: Path) -> MutantImplementation:
    name = os.environ.get(VARIANT_ENV)
    if not name:
        raise ConfigError(
            f"the mutants adapter needs a mutant name: --impl=adapters/mutants/NAME (or {VARIANT_ENV}=NAME)"
        )
    return MutantImplementation(name, config, manifest)
