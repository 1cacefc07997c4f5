"""Every profile, declared once: the one list the rest of kvspec derives from.

A profile is a generation of KV manager whose behaviour kvspec specifies. Its
entry says which family of operations it takes (which wire models, adapter
interface and checker), which reference model reproduces it, which golden
scenario folders hold its expected outcomes and which ``kvspec prove``
encodings prove its invariants. Code that needs "the block-level profiles" or
"the folders of the allocator-level scenarios" asks this module instead of
spelling the names again, so adding a profile is one entry here plus its model,
rules, goldens and checker (CONTRIBUTING.md, "Add a profile").

The spec layer imports nothing above it: models and checkers are named by
``module:attribute`` strings and resolved only by the layers that run them
(``kvspec.reference.make_model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

#: which operations a profile takes, and so its wire models, adapter interface and checker:
#: ``block`` (spec.wire: Use/Deref/Promote/... checked by the block lockstep), ``manager`` (spec.manager_wire:
#: the allocator-level paged and session operations), ``radix`` (spec.radix_wire: match/insert/lock/evict)
Family = Literal["block", "manager", "radix"]


@dataclass(frozen=True, slots=True)
class ProfileEntry:
    name: str
    family: Family
    #: ``module:Class`` of the reference model; its constructor takes the profile's config
    model: str
    #: golden scenario folders under spec/scenarios/ written for this profile
    scenarios: tuple[str, ...]
    #: ``kvspec prove --profile`` names whose encodings cover this profile
    encodings: tuple[str, ...]
    #: golden folders in the multi-worker format (spec.process_scenario: several workers sharing G3/G4)
    process_scenarios: tuple[str, ...] = ()
    #: the Hypothesis lockstep machine drives this profile operation by operation (block family); the
    #: vllm pool is checked at request level and through goldens instead
    stateful: bool = False
    title: str = ""

    def resolve_model(self) -> Any:
        """The model class (imports the reference layer: call it from there or above)."""
        module, _, attr = self.model.partition(":")
        return getattr(import_module(module), attr)


PROFILES: dict[str, ProfileEntry] = {
    p.name: p
    for p in (
        ProfileEntry(
            "kvbm",
            "block",
            "kvspec.reference.g1:G1Model",
            scenarios=("kvbm", "offload", "witnesses"),
            process_scenarios=("tiers",),
            encodings=("kvbm", "kvbm-offload"),
            stateful=True,
            title="kvbm mocker (kvbm-logical block manager), with an optional offload tier",
        ),
        ProfileEntry(
            "atomic",
            "block",
            "kvspec.reference.g1:G1Model",
            scenarios=("atomic",),
            encodings=("atomic",),
            stateful=True,
            title="newest mocker generation (all-or-nothing Use, split Stored groups)",
        ),
        ProfileEntry(
            "legacy",
            "block",
            "kvspec.reference.legacy:LegacyModel",
            scenarios=("legacy",),
            encodings=("legacy",),
            stateful=True,
            title="dynamo-mocker 1.0.2 hash cache (Destroy, boolean result, LRU)",
        ),
        ProfileEntry(
            "vllm",
            "block",
            "kvspec.reference.vllm_pool:VllmPoolModel",
            scenarios=(),
            encodings=("vllm",),
            title="vLLM-style block pool (free queue, copies, lazy Removed)",
        ),
        ProfileEntry(
            "paged",
            "manager",
            "kvspec.reference.paged:PagedModel",
            scenarios=("paged",),
            encodings=("paged",),
            title="paged allocator (reference counts, copy-on-write, swap)",
        ),
        ProfileEntry(
            "session",
            "manager",
            "kvspec.reference.session:SessionModel",
            scenarios=("session",),
            encodings=("session",),
            title="session slot leases with generation fencing",
        ),
        ProfileEntry(
            "radix",
            "radix",
            "kvspec.reference.radix:RadixModel",
            scenarios=("radix",),
            encodings=("radix",),
            title="radix-tree prefix cache (SGLang's RadixCache)",
        ),
    )
}


def names(family: Family | None = None, *, stateful: bool | None = None) -> tuple[str, ...]:
    """Profile names in declaration order, optionally of one family / with a lockstep machine."""
    return tuple(
        p.name
        for p in PROFILES.values()
        if (family is None or p.family == family) and (stateful is None or p.stateful == stateful)
    )


def scenario_dirs(family: Family) -> tuple[str, ...]:
    """The golden folders (under spec/scenarios/) of one family's profiles."""
    return tuple(d for p in PROFILES.values() if p.family == family for d in p.scenarios)


def all_scenario_dirs() -> tuple[str, ...]:
    """Every registered golden folder, of every format."""
    return tuple(d for p in PROFILES.values() for d in (*p.scenarios, *p.process_scenarios))


def encodings() -> tuple[str, ...]:
    """Every ``kvspec prove --profile`` name, in declaration order, each once."""
    return tuple(dict.fromkeys(e for p in PROFILES.values() for e in p.encodings))


def _known(name: str) -> str:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return name


#: a profile name, checked against the registry (the JSON Schema lists them as an enum)
ProfileName = Annotated[str, AfterValidator(_known), Field(json_schema_extra={"enum": list(PROFILES)})]
