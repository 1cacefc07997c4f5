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

A profile may also be declared outside kvspec, at run time: ``register``
(or the ``registered`` context manager) adds an entry whose model is a
callable and whose goldens live in a folder of its own (``scenario_root``).
Such a profile is of the ``generic`` family: its model and its
implementation both answer ``step(op) -> outcome``, and
``kvspec.conformance.generic`` checks them in lockstep and against its
goldens (``tests/test_toy_profile.py`` declares one that way).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field

from kvspec.spec import rules
from kvspec.spec.model import ModelFactory
from kvspec.spec.profiles import ATOMIC, KVBM, LEGACY, VLLM, Profile

#: which operations a profile takes, and so its wire models, adapter interface and checker:
#: ``block`` (spec.wire: Use/Deref/Promote/... checked by the block lockstep), ``manager`` (spec.manager_wire:
#: the allocator-level paged and session operations), ``radix`` (spec.radix_wire: match/insert/lock/evict),
#: ``generic`` (the profile brings its own operation and outcome types; kvspec.conformance.generic compares
#: the implementation's outcome of each operation with the model's, whole)
Family = Literal["block", "manager", "radix", "generic"]

#: the names of the bundled profiles that have no block-level rule set (spec/profiles.py names those)
PAGED: Final = "paged"
SESSION: Final = "session"
RADIX: Final = "radix"
#: the block-level profiles' names, for code that picks by name: each profile name is spelled once in
#: code, here or in spec/profiles.py, and every other module takes it from these (tests/test_profile_names.py)
KVBM_NAME, ATOMIC_NAME, LEGACY_NAME, VLLM_NAME = KVBM.name, ATOMIC.name, LEGACY.name, VLLM.name
#: the ``kvspec prove`` encoding of the kvbm profile with its G2 offload tier (an encoding, not a profile)
KVBM_OFFLOAD: Final = "kvbm-offload"
#: the family of the radix profile (``Family``): named after it, but a family, not a profile
RADIX_FAMILY: Final = "radix"

#: where the bundled golden folders live (``ProfileEntry.scenarios`` are relative to it)
SCENARIO_ROOT = Path(__file__).parent / "scenarios"


@dataclass(frozen=True, slots=True)
class ProfileEntry:
    name: str
    family: Family
    #: ``module:Class`` of the reference model, or (a profile declared outside kvspec) the callable
    #: itself; it takes the profile's config and returns a ``spec.model.ProfileModel``
    model: str | ModelFactory
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
    #: the folder ``scenarios`` are relative to (None: the bundled ``spec/scenarios/``)
    scenario_root: Path | None = None
    #: a profile declared outside kvspec: the document whose ``### `RULE-ID` — title`` headings define
    #: its rules (``register`` registers them, spec.rules.register_rules); bundled rules are in SPEC.md
    rules_doc: Path | None = None
    #: ``generic`` family: the types (pydantic models or unions, or ``module:attr``) a golden's config,
    #: operations and expected outcomes are read as
    config_type: Any = None
    op_type: Any = None
    outcome_type: Any = None
    #: a block-family profile's rule set and traits (spec/profiles.py: which rules apply, the known breaks,
    #: its own invariants, what its Uses look like); its name is this entry's name
    semantics: Profile | None = None

    def __post_init__(self) -> None:
        if self.semantics is not None and self.semantics.name != self.name:
            raise ValueError(f"profile {self.name!r} declares the rule set of {self.semantics.name!r}")

    def resolve_model(self) -> ModelFactory:
        """The model factory (imports the reference layer: call it from there or above)."""
        if not isinstance(self.model, str):
            return self.model
        module, _, attr = self.model.partition(":")
        factory: ModelFactory = getattr(import_module(module), attr)
        return factory

    def scenario_folders(self) -> tuple[Path, ...]:
        """The absolute golden folders of this profile."""
        root = self.scenario_root or SCENARIO_ROOT
        return tuple(root / d for d in self.scenarios)


PROFILES: dict[str, ProfileEntry] = {
    p.name: p
    for p in (
        ProfileEntry(
            KVBM.name,
            "block",
            "kvspec.reference.g1:G1Model",
            scenarios=(KVBM.name, "offload", "witnesses"),
            process_scenarios=("tiers",),
            encodings=(KVBM.name, KVBM_OFFLOAD),
            stateful=True,
            semantics=KVBM,
            title="kvbm mocker (kvbm-logical block manager), with an optional offload tier",
        ),
        ProfileEntry(
            ATOMIC.name,
            "block",
            "kvspec.reference.g1:G1Model",
            scenarios=(ATOMIC.name,),
            encodings=(ATOMIC.name,),
            stateful=True,
            semantics=ATOMIC,
            title="newest mocker generation (all-or-nothing Use, split Stored groups)",
        ),
        ProfileEntry(
            LEGACY.name,
            "block",
            "kvspec.reference.legacy:LegacyModel",
            scenarios=(LEGACY.name,),
            encodings=(LEGACY.name,),
            stateful=True,
            semantics=LEGACY,
            title="dynamo-mocker 1.0.2 hash cache (Destroy, boolean result, LRU)",
        ),
        ProfileEntry(
            VLLM.name,
            "block",
            "kvspec.reference.vllm_pool:VllmPoolModel",
            scenarios=(),
            encodings=(VLLM.name,),
            semantics=VLLM,
            title="vLLM-style block pool (free queue, copies, lazy Removed)",
        ),
        ProfileEntry(
            PAGED,
            "manager",
            "kvspec.reference.paged:PagedModel",
            scenarios=(PAGED,),
            encodings=(PAGED,),
            title="paged allocator (reference counts, copy-on-write, swap)",
        ),
        ProfileEntry(
            SESSION,
            "manager",
            "kvspec.reference.session:SessionModel",
            scenarios=(SESSION,),
            encodings=(SESSION,),
            title="session slot leases with generation fencing",
        ),
        ProfileEntry(
            RADIX,
            RADIX_FAMILY,
            "kvspec.reference.radix:RadixModel",
            scenarios=(RADIX,),
            encodings=(RADIX,),
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
    """Every registered golden folder under ``spec/scenarios/``, of every format."""
    return tuple(d for p in PROFILES.values() if p.scenario_root is None for d in (*p.scenarios, *p.process_scenarios))


def encodings() -> tuple[str, ...]:
    """Every ``kvspec prove --profile`` name, in declaration order, each once."""
    return tuple(dict.fromkeys(e for p in PROFILES.values() for e in p.encodings))


#: the profiles kvspec itself declares (``register`` adds others; ``unregister`` never removes these)
BUNDLED: tuple[str, ...] = tuple(PROFILES)
#: the rule ids each outside profile registered with it
_OUTSIDE_RULES: dict[str, tuple[str, ...]] = {}


def register(entry: ProfileEntry) -> ProfileEntry:
    """Declare a profile from outside kvspec (module doc). Refused, with nothing
    changed, when the name is taken or a bundled profile's golden folder is claimed."""
    if entry.name in PROFILES:
        raise ValueError(f"profile {entry.name!r} is already registered")
    if entry.scenario_root is None and set(entry.scenarios) & set(all_scenario_dirs()):
        raise ValueError(f"profile {entry.name!r} claims golden folders of another profile: {entry.scenarios}")
    if entry.family == "generic" and entry.op_type is None:
        raise ValueError(f"profile {entry.name!r}: a generic profile names its op_type (and outcome_type)")
    if entry.rules_doc is not None:
        _OUTSIDE_RULES[entry.name] = rules.register_rules(entry.rules_doc)
    PROFILES[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Withdraw a profile ``register`` declared (a bundled one cannot be withdrawn)."""
    if name in BUNDLED:
        raise ValueError(f"profile {name!r} is bundled with kvspec and cannot be unregistered")
    PROFILES.pop(name, None)
    rules.unregister_rules(_OUTSIDE_RULES.pop(name, ()))


@contextmanager
def registered(entry: ProfileEntry) -> Iterator[ProfileEntry]:
    """``register(entry)`` for the duration of a ``with`` block (a test's)."""
    register(entry)
    try:
        yield entry
    finally:
        unregister(entry.name)


def _known(name: str) -> str:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return name


#: a profile name, checked against the registry (the JSON Schema lists them as an enum)
ProfileName = Annotated[str, AfterValidator(_known), Field(json_schema_extra={"enum": list(PROFILES)})]


def profile_of_config(config: Any) -> ProfileEntry:
    """The profile a manager configuration builds: a block-family config (``ManagerConfig``)
    names it in ``profile``; the allocator-level and radix configs carry their profile's name
    as ``kind`` (``PagedConfig.kind == "paged"``). The opener asks this to find the family."""
    name = getattr(config, "profile", None) or getattr(config, "kind", None)
    if not isinstance(name, str) or name not in PROFILES:
        raise ValueError(
            f"{type(config).__name__} names no registered profile (got {name!r}); known: {', '.join(PROFILES)}"
        )
    return PROFILES[name]
