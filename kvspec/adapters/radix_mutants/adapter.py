"""In-process adapter of the radix mutants: ``--impl=adapters/radix_mutants/NAME``.

Without a variant it is the unmutated radix model (the sanity run of
``kvspec mutants --impl=adapters/radix_mutants``); with one, the broken
model of ``bugs.py``.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.adapters.radix_mutants.bugs import BUGS
from kvspec.adapters.reference.radix import ModelRadix
from kvspec.api import RadixImplementation
from kvspec.spec.errors import ConfigError
from kvspec.spec.manifest import Manifest
from kvspec.spec.radix_wire import RadixConfig


def open_radix_mutant(
    config: RadixConfig, manifest: Manifest, adapter_dir: Path, variant: str | None = None
) -> RadixImplementation:
    if variant is None:
        return ModelRadix(config)
    if variant not in BUGS:
        raise ConfigError(f"radix_mutants: no model for variant {variant!r}")
    return ModelRadix(config, BUGS[variant](config))
