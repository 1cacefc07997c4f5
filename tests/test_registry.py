"""The profile registry is the one list of profiles: the scenario folders, the
models, the config's profile field and the suite's lists all come from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kvspec.reference import make_model
from kvspec.spec import registry
from kvspec.spec.config import ManagerConfig, PolicyName
from kvspec.spec.errors import ConfigError
from kvspec.spec.manager_scenario import MANAGER_SCENARIO_DIRS
from kvspec.spec.manager_wire import PagedConfig, PagedFree, SessionConfig, SessionDrain
from kvspec.spec.model import ProfileModel
from kvspec.spec.profiles import PROFILES as BLOCK_RULES
from kvspec.spec.radix_wire import RadixConfig, RadixMatch
from kvspec.spec.wire import Use

SCENARIOS = Path(registry.__file__).parent / "scenarios"


def test_every_scenario_folder_belongs_to_one_profile() -> None:
    folders = {p.name for p in SCENARIOS.iterdir() if p.is_dir()}
    owners = list(registry.all_scenario_dirs())
    assert len(owners) == len(set(owners)), "a folder is claimed by two profiles"
    assert folders == set(owners), f"unregistered: {folders - set(owners)}; missing: {set(owners) - folders}"


def test_families_partition_the_profiles() -> None:
    fams = [registry.names(f) for f in ("block", "manager", "radix")]
    assert sorted(n for f in fams for n in f) == sorted(registry.PROFILES)
    assert registry.names("manager") == ("paged", "session")
    assert MANAGER_SCENARIO_DIRS == ("paged", "session")
    assert set(registry.names("block", stateful=True)) == {"kvbm", "atomic", "legacy"}


def test_block_rule_tables_exist_for_exactly_the_block_profiles() -> None:
    assert set(BLOCK_RULES) == set(registry.names("block"))


@pytest.mark.parametrize("name", registry.names("block"))
def test_make_model_builds_the_registered_model(name: str) -> None:
    eviction: PolicyName = "lru" if name in ("legacy", "vllm") else "lineage"
    model = make_model(ManagerConfig(profile=name, capacity=2, eviction=eviction))
    assert type(model) is registry.PROFILES[name].resolve_model()


def test_make_model_refuses_a_profile_of_another_family() -> None:
    with pytest.raises(ConfigError, match="no block-level model for profile 'radix'"):
        make_model(ManagerConfig(profile="radix", capacity=2))


def test_an_unknown_profile_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValidationError, match=r"unknown profile 'kvbm2'; known: kvbm, atomic"):
        ManagerConfig(profile="kvbm2", capacity=2)


def test_every_encoding_is_a_prove_profile() -> None:
    assert set(registry.encodings()) == {
        "kvbm",
        "kvbm-offload",
        "atomic",
        "legacy",
        "vllm",
        "paged",
        "session",
        "radix",
    }


def _a_config_and_op(name: str) -> tuple[Any, Any]:
    """A small configuration of the profile and one operation its model accepts."""
    fam = registry.PROFILES[name].family
    if fam == "block":
        eviction: PolicyName = "lru" if name in ("legacy", "vllm") else "lineage"
        return ManagerConfig(profile=name, capacity=2, eviction=eviction), Use(blocks=[])
    if name == "paged":
        return PagedConfig(device_blocks=2), PagedFree(seq="s0")
    if name == "session":
        return SessionConfig(slots=1), SessionDrain()
    assert name == "radix", f"no configuration for profile {name!r}: add one here"
    return RadixConfig(), RadixMatch(tokens=[1])


@pytest.mark.parametrize("name", registry.names())
def test_every_profiles_model_satisfies_the_one_model_protocol(name: str) -> None:
    config, op = _a_config_and_op(name)
    model = registry.PROFILES[name].resolve_model()(config)
    assert isinstance(model, ProfileModel), f"{type(model).__name__} lacks step(op) or config"
    assert model.config is config
    assert model.step(op) is not None


def test_the_model_protocol_check_can_fail() -> None:
    class ApplyOnly:
        config = None

        def apply(self, op: object) -> None: ...

    assert not isinstance(ApplyOnly(), ProfileModel)
