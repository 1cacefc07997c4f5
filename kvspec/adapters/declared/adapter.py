"""In-process ports with one state-changing difference from the spec each.

Each variant is the reference model with one departure switched on, the
kind a real port has for a reason of its own and declares once in its
manifest (``[[variants.deviations]]``):

- ``legacy_source``: a legacy port that validates a Use as the Dynamo mocker
  1.0.2 source does (``LegacyModel.source_validation``: the Stored takes the
  tail of extra local hashes; token lists are read only for new blocks). It
  does not declare ``strict_validation``, so the lockstep never sends it the
  Uses the source accepts and kvspec refuses: it passes with no declaration.
- ``legacy_source_strict_traffic``: the same port declaring
  ``strict_validation``, so it does get those Uses and accepts them; its one
  declaration (USE-VALIDATE on Uses) is followed by the lockstep.
- ``offload_job_fails_whole``: a kvbm port whose offload job larger than G2's
  room fails whole, its source slots staying quarantined for good (an
  older kvbm-engine executor; ``G1Model.job_fails_whole``), declared once
  (QUARANTINE-RELEASE, condition ``offload_job_fails_whole``).

``bug``: a mutant of ``adapters/mutants`` (``catalogue.py``) to put on top of
the departure, so that a campaign can show that the declaration hides no bug
outside its cause (``benchmarks/declared_variant_kills.py``, through
``open_with_bug``). Without a variant the adapter is the reference.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.adapters.mutants.catalogue import make_mutant_model
from kvspec.adapters.reference.adapter import outcome_of
from kvspec.api import Implementation, Model
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.manifest import Manifest
from kvspec.spec.registry import KVBM_NAME, LEGACY_NAME
from kvspec.spec.wire import Operation, StepOutcome

#: each variant's departure: (the profile it lives in, the model's switch)
DEPARTURES: dict[str, tuple[str, str]] = {
    "legacy_source": (LEGACY_NAME, "source_validation"),
    "legacy_source_strict_traffic": (LEGACY_NAME, "source_validation"),
    "offload_job_fails_whole": (KVBM_NAME, "job_fails_whole"),
}


def declared_model(variant: str | None, config: ManagerConfig, bug: str | None = None) -> Model:
    """The reference model (with mutant ``bug`` if given) with ``variant``'s
    departure switched on under its profile."""
    model = make_mutant_model(bug, config)
    if variant is None:
        return model
    if variant not in DEPARTURES:
        raise ConfigError(f"unknown variant {variant!r} of adapters/declared; known: {', '.join(DEPARTURES)}")
    profile, switch = DEPARTURES[variant]
    if config.profile == profile:
        setattr(model, switch, True)
    return model


class DeclaredImplementation(Implementation):
    def __init__(self, model: Model) -> None:
        self.model = model

    def step(self, op: Operation) -> StepOutcome:
        return outcome_of(self.model, op)


def open_declared(
    config: ManagerConfig, manifest: Manifest, adapter_dir: Path, variant: str | None = None
) -> DeclaredImplementation:
    """The port of ``variant`` (None: the reference)."""
    return DeclaredImplementation(declared_model(variant, config))


def open_with_bug(
    config: ManagerConfig, manifest: Manifest, adapter_dir: Path, variant: str | None = None
) -> DeclaredImplementation:
    """For a campaign's adapter folder (``benchmarks/declared_variant_kills.py``):
    the departure named by the manifest's ``description``'s first word
    (``none``: no departure), with mutant ``variant`` on top (None: the
    departure alone)."""
    departure = manifest.description.split()[0]
    return DeclaredImplementation(declared_model(None if departure == "none" else departure, config, bug=variant))
