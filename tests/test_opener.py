"""The one opener (``kvspec.conformance.opener.open_adapter``): the configuration's profile, looked up
in the registry, picks the family; the per-family openers of old open the same implementations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest

import kvspec.api as api
from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.block.opener import open_implementation
from kvspec.conformance.implementation import ImplementationBase, StepwiseImplementation
from kvspec.conformance.managers.interface import ManagerImplementation
from kvspec.conformance.managers.lockstep import open_manager
from kvspec.conformance.opener import OpenConfig, family_of, open_adapter
from kvspec.conformance.radix.interface import RadixImplementation
from kvspec.conformance.radix.opener import open_radix
from kvspec.conformance.requests.api import RequestImplementation, open_request_implementation
from kvspec.conformance.run.manifest import builtin_adapters_dir, load_manifest
from kvspec.reference.requests import PoolSetup
from kvspec.spec import registry
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.manager_wire import ManagerConfigKind, ManagerOp, ManagerOutcome, PagedConfig, SessionConfig
from kvspec.spec.radix_wire import RadixConfig, RadixOp, RadixOutcome
from kvspec.spec.wire import Operation, StepOutcome

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
    with pytest.raises(ConfigError, match="no in-process factory of paged/session"):
        open_adapter(m, tmp_path, PAGED)
    with pytest.raises(ConfigError, match=r"a radix adapter names its factory in start\.python"):
        open_adapter(m, tmp_path, RADIX)


def test_the_public_api_names_the_one_opener() -> None:
    assert api.open_adapter is open_adapter
    assert "open_adapter" in api.__all__


# ---------------------------------------------------------------- one [start] key, the old ones as aliases

ONE_FACTORY = "kvspec.adapters.reference.any_family:open_reference_any"


def _with_start(adapter: str, start: str, tmp_path: Path) -> tuple[Path, str]:
    """A copy of bundled ``adapter``'s manifest in ``tmp_path`` whose ``[start]`` is ``start``."""
    text = (builtin_adapters_dir() / adapter / "manifest.toml").read_text()
    head, _, rest = text.partition("[start]\n")
    _, _, tail = rest.partition("\n[capabilities]")
    (tmp_path / "manifest.toml").write_text(f"{head}[start]\n{start}\n\n[capabilities]{tail}")
    return tmp_path, text


@pytest.mark.parametrize(("config", "family"), [(c, f) for c, f, _ in CASES], ids=[f for _, f, _ in CASES])
def test_an_old_style_and_a_new_style_manifest_open_the_same_implementation(
    config: OpenConfig, family: str, tmp_path: Path
) -> None:
    old_dir = builtin_adapters_dir() / "reference"
    old = load_manifest(old_dir)
    assert old.start.managers and old.start.radix and old.start.requests, "the bundled reference keeps the old keys"
    new_dir, _ = _with_start("reference", f'python = "{ONE_FACTORY}"', tmp_path)
    new = load_manifest(new_dir)
    assert (new.start.requests, new.start.managers, new.start.radix) == (None, None, None)
    with open_adapter(old, old_dir, config) as a, open_adapter(new, new_dir, config) as b:
        assert type(a) is type(b), family
        assert type(a).__module__.startswith("kvspec.adapters.reference"), type(a)


@pytest.mark.parametrize(
    ("adapter", "alias", "config", "variant"),
    [
        ("radix_mutants", "radix", RADIX, "evict_newest_first"),
        ("manager_mutants", "managers", PAGED, "swap_out_frees_shared"),
    ],
)
def test_a_bundled_adapter_moved_to_one_key_opens_what_its_alias_did(
    adapter: str, alias: str, config: OpenConfig, variant: str, tmp_path: Path
) -> None:
    new_dir = builtin_adapters_dir() / adapter
    new = load_manifest(new_dir, variant)
    assert new.start.python and getattr(new.start, alias) is None, "the bundled manifest names one factory"
    old_dir, _ = _with_start(adapter, f'{alias} = "{new.start.python}"', tmp_path)
    old = load_manifest(old_dir, variant)
    assert old.start.python is None and getattr(old.start, alias) == new.start.python
    with open_adapter(old, old_dir, config) as a, open_adapter(new, new_dir, config) as b:
        assert type(a) is type(b)
        assert type(getattr(a, "model", None)) is type(getattr(b, "model", None))
        assert type(getattr(a, "model", None)).__module__.startswith(f"kvspec.adapters.{adapter}"), "the variant's bug"


def test_an_alias_names_its_family_and_python_the_rest(tmp_path: Path) -> None:
    (tmp_path / "manifest.toml").write_text(
        'name = "mixed"\nkind = "python"\nprofile = "kvbm"\n[start]\n'
        f'python = "{ONE_FACTORY}"\nradix = "kvspec.adapters.radix_mutants.adapter:open_radix_mutant"\n'
        '[capabilities]\nprofiles = ["kvbm", "paged", "radix"]\n'
    )
    start = load_manifest(tmp_path).start
    assert start.factory_for("radix", "python") == "kvspec.adapters.radix_mutants.adapter:open_radix_mutant"
    assert start.factory_for("manager", "python") == ONE_FACTORY
    assert start.factory_for("block", "python") == ONE_FACTORY
    # a process-crossing kind goes through its transport unless an alias names a factory
    assert start.factory_for("block", "subprocess") is None
    assert start.factory_for("manager", "subprocess") is None
    assert start.factory_for("radix", "subprocess") == "kvspec.adapters.radix_mutants.adapter:open_radix_mutant"


def test_a_factory_that_is_not_module_colon_name_is_refused(tmp_path: Path) -> None:
    new_dir, _ = _with_start("manager_mutants", 'python = "kvspec.adapters.manager_mutants.adapter"', tmp_path)
    with pytest.raises(ConfigError, match="a \\[start\\] factory is 'module:factory'"):
        open_adapter(load_manifest(new_dir), new_dir, PAGED)


def test_a_request_adapter_takes_requests_only(tmp_path: Path) -> None:
    (tmp_path / "manifest.toml").write_text(
        'name = "engine"\nkind = "request"\nprofile = "vllm"\n[start]\n'
        'python = "kvspec.adapters.reference_requests.adapter:open_reference_requests"\n'
        "[capabilities]\nblock_level = false\nrequest_level = true\n"
    )
    m = load_manifest(tmp_path)
    assert m.start.factory_for("request", m.kind) == m.start.python
    with pytest.raises(ConfigError, match="no in-process factory of paged/session"):
        open_adapter(m, tmp_path, PAGED)
    with pytest.raises(ConfigError, match="takes requests, not block operations"):
        open_adapter(m, tmp_path, BLOCK)


# ---------------------------------------------------------------- the one implementation protocol


@pytest.mark.parametrize(
    ("interface", "args"),
    [
        (Implementation, (ManagerConfig, Operation, StepOutcome)),
        (ManagerImplementation, (ManagerConfigKind, ManagerOp, ManagerOutcome)),
        (RadixImplementation, (RadixConfig, RadixOp, RadixOutcome)),
    ],
    ids=["block", "manager", "radix"],
)
def test_each_stepwise_family_is_the_protocol_with_its_wire_models(interface: type, args: tuple[Any, ...]) -> None:
    assert issubclass(interface, StepwiseImplementation)
    (base,) = [b for b in interface.__orig_bases__ if get_origin(b) is StepwiseImplementation]  # type: ignore[attr-defined]
    assert get_args(base) == args


def test_the_request_level_shares_the_root_only() -> None:
    assert issubclass(RequestImplementation, ImplementationBase)
    assert not issubclass(RequestImplementation, StepwiseImplementation)


@pytest.mark.parametrize("config", [c for c, _, _ in CASES], ids=[f for _, f, _ in CASES])
def test_everything_the_opener_returns_is_of_the_protocol(config: OpenConfig) -> None:
    d = builtin_adapters_dir() / "reference"
    with open_adapter(load_manifest(d), d, config) as impl:
        assert isinstance(impl, ImplementationBase)
        assert isinstance(impl, StepwiseImplementation) == (family_of(config) != "request")


def test_an_adapter_written_against_the_old_interface_still_works() -> None:
    """A block adapter as the docs described it before the protocol: ``step`` only, no ``close``."""
    closed: list[bool] = []

    class OldStyle(Implementation):
        def __init__(self, config: ManagerConfig) -> None:
            self.config = config

        def step(self, op: Operation) -> StepOutcome:
            raise NotImplementedError

    class Closing(OldStyle):
        def close(self) -> None:
            closed.append(True)

    with OldStyle(BLOCK) as impl:
        assert impl.config == BLOCK and impl.workers == 1
    with Closing(BLOCK):
        pass
    assert closed == [True]
    with pytest.raises(TypeError, match="abstract"):
        Implementation()  # type: ignore[abstract]


# ---------------------------------------------------------------- a profile declared outside kvspec

ECHO_ADAPTER = """
from kvspec.api import StepwiseImplementation


class Echo(StepwiseImplementation[dict, str, str]):
    def __init__(self, config, manifest, adapter_dir):
        self.config = config

    def step(self, op):
        return op.upper()


def open_echo(config, manifest, adapter_dir):
    return Echo(config, manifest, adapter_dir)
"""


def test_a_generic_profile_opens_through_the_same_opener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile of the ``generic`` family (registry.register) has no wire protocol: the one opener
    calls the adapter's one factory, told the profile by name since the config type is the profile's own."""
    (tmp_path / "echo_adapter.py").write_text(ECHO_ADAPTER)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = registry.ProfileEntry("echo_toy", "generic", lambda c: c, (), (), op_type=str, outcome_type=str)
    with registry.registered(entry):
        (tmp_path / "manifest.toml").write_text(
            'name = "echo"\nkind = "python"\nprofile = "echo_toy"\n[start]\npython = "echo_adapter:open_echo"\n'
            "[capabilities]\nblock_level = false\n"
        )
        m = load_manifest(tmp_path)
        config = {"slots": 2}
        assert family_of(config, "echo_toy") == "generic"
        with open_adapter(m, tmp_path, config, profile="echo_toy") as impl:
            assert isinstance(impl, StepwiseImplementation)
            assert impl.step("hi") == "HI" and impl.config == config
        sub = m.model_copy(update={"kind": "subprocess"})
        with pytest.raises(ConfigError, match="family 'generic'"):
            open_adapter(sub, tmp_path, config, profile="echo_toy")
    with pytest.raises(ConfigError, match="unknown profile 'echo_toy'"):
        family_of(config, "echo_toy")
