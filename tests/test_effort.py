"""The suite's efforts: ``default`` and ``ci`` are derandomised and keep no
database (a verdict is reproducible), the lockstep draws the same examples on
every run, and nothing is registered with Hypothesis globally."""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvspec.conformance.block.machine import MachineSetup, machine_class, run_machine
from kvspec.conformance.run import settings as effort_mod
from kvspec.conformance.run.manifest import load_impl


@pytest.mark.parametrize("name", ["default", "ci"])
def test_default_and_ci_are_derandomised_without_a_database(name: str) -> None:
    s = effort_mod.effort(name)
    assert s.derandomize is True
    assert s.database is None
    assert effort_mod.is_deterministic(name)


def test_ci_is_the_default_effort() -> None:
    """What a port author runs locally is what CI runs."""
    d, c = effort_mod.effort("default"), effort_mod.effort("ci")
    assert (d.max_examples, d.stateful_step_count) == (c.max_examples, c.stateful_step_count)


def test_random_efforts_are_deterministic_only_with_a_seed() -> None:
    assert not effort_mod.is_deterministic("thorough")
    assert effort_mod.is_deterministic("thorough", seeded=True)
    assert effort_mod.effort("thorough", seeded=True).database is None
    assert effort_mod.effort_name("no_such_profile") == "default"
    with pytest.raises(ValueError, match="unknown effort"):
        effort_mod.effort("fast")


def test_importing_the_plugin_registers_no_profile() -> None:
    before = dict(settings._profiles)
    import kvspec.conformance.run.plugin  # noqa: F401

    assert settings._profiles.keys() == before.keys()
    assert (
        settings.default is not None and settings.default.max_examples == 100
    ) or settings._current_profile != "default"


def _run_fingerprint(profile: str) -> list[tuple[str, int]]:
    """What one Hypothesis run of the lockstep machine on the reference
    reports, in order (each example's rule coverage at its teardown): equal
    fingerprints mean the same examples were drawn."""
    adapter_dir, manifest = load_impl("adapters/reference")
    seen: list[tuple[str, int]] = []
    setup = MachineSetup(
        manifest=manifest, adapter_dir=adapter_dir, profile=profile, record=lambda r, n: seen.append((r, n))
    )
    run_machine(machine_class(setup), settings=settings(effort_mod.effort("default"), max_examples=8))
    return seen


def test_the_same_implementation_gets_the_same_examples_every_time() -> None:
    first = _run_fingerprint("kvbm")
    assert len(first) > 20
    assert _run_fingerprint("kvbm") == first
