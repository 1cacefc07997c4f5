"""The one opener (``kvspec.conformance.opener.open_adapter``): the configuration's profile, looked up
in the registry, picks the family; the per-family openers of old open the same implementations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kvspec.api as api
from kvspec.conformance.block.opener import open_implementation
from kvspec.conformance.managers.lockstep import open_manager
from kvspec.conformance.opener import OpenConfig, family_of, open_adapter
from kvspec.conformance.radix.opener import open_radix
from kvspec.conformance.requests.api import open_request_implementation
from kvspec.conformance.run.manifest import builtin_adapters_dir, load_manifest
from kvspec.reference.requests import PoolSetup
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.manager_wire import PagedConfig, SessionConfig
from kvspec.spec.radix_wire import RadixConfig

BLOCK = ManagerConfig(profile="kvbm", capacity=4)
LEGACY = ManagerConfig(profile="legacy", capacity=4, eviction="lru")
PAGED = PagedConfig(device_blocks=4)
SESSION = SessionConfig(slots=2)
RADIX = RadixConfig(capacity=8)
SETUP = PoolSetup(manager=ManagerConfig(profile="vllm", capacity=8, eviction="lru"))

#: (config, the family it opens, the per-family opener of old)
CASES: list[tuple[OpenConfig, str, Callable[..., Any]]] = [
    (BLOCK, "block", open_implementation),
    (LEGACY, "block", open_implementation),
    (PAGED, "manager", open_manager),
    (SESSION, "manager", open_manager),
    (RADIX, "radix", open_radix),
    (SETUP, "request", open_request_implementation),
]


@pytest.mark.parametrize(("config", "family"), [(c, f) for c, f, _ in CASES], ids=[f for _, f, _ in CASES])
def test_the_family_comes_from_the_configuration(config: OpenConfig, family: str) -> None:
    assert family_of(config) == family


def test_a_configuration_of_no_registered_profile_is_refused() -> None:
    stray = ManagerConfig.model_construct(profile="nope", capacity=4)
    with pytest.raises(ConfigError, match="names no registered profile"):
        family_of(stray)


@pytest.mark.parametrize(("config", "old"), [(c, o) for c, _, o in CASES], ids=[f for _, f, _ in CASES])
def test_the_one_opener_and_the_old_one_open_the_same_implementation(
    config: OpenConfig, old: Callable[..., Any]
) -> None:
    d = builtin_adapters_dir() / "reference"
    m = load_manifest(d)
    with open_adapter(m, d, config) as new, old(m, d, config) as before:
        assert type(new) is type(before)
        assert new.__class__.__module__.startswith("kvspec.adapters."), type(new)


@pytest.mark.slow
@pytest.mark.parametrize(("config", "old"), [(c, o) for c, _, o in CASES], ids=[f for _, f, _ in CASES])
def test_the_same_holds_for_a_child_process(config: OpenConfig, old: Callable[..., Any]) -> None:
    d = builtin_adapters_dir() / "reference_jsonl"
    m = load_manifest(d)
    with open_adapter(m, d, config) as new, old(m, d, config) as before:
        assert type(new) is type(before)
        assert new.__class__.__module__.startswith("kvspec.conformance.transport."), type(new)


def test_only_a_block_session_has_several_workers() -> None:
    d = builtin_adapters_dir() / "reference"
    with pytest.raises(ConfigError, match="workers asked of a manager session"):
        open_adapter(load_manifest(d), d, PAGED, workers=2)


def test_a_family_the_manifest_cannot_open_names_what_to_write(tmp_path: Path) -> None:
    (tmp_path / "manifest.toml").write_text(
        'name = "only_blocks"\nkind = "c_abi"\nprofile = "kvbm"\n[start]\nsources = ["x.c"]\n'
    )
    m = load_manifest(tmp_path)
    with pytest.raises(ConfigError, match=r"no start\.managers factory"):
        open_adapter(m, tmp_path, PAGED)
    with pytest.raises(ConfigError, match=r"start\.radix"):
        open_adapter(m, tmp_path, RADIX)


def test_the_public_api_names_the_one_opener() -> None:
    assert api.open_adapter is open_adapter
    assert "open_adapter" in api.__all__
