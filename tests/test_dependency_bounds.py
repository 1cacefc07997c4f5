"""The dependency ranges and the pins agree, and scripts/dependency_bounds.py
sweeps the versions it should (issue 27 item 6).

The script itself installs from the registry and runs tests on the oldest and
the newest version a range admits (``make bounds``); these checks are the
cheap part that can run everywhere: the bounds it would install, and that
every version kvspec is tested with lies inside the range it declares.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvspec_dependency_bounds", ROOT / "scripts" / "dependency_bounds.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version.strip()
    return out


def test_the_bounds_of_a_range_are_its_lower_bound_and_the_range_itself(script: ModuleType) -> None:
    spec = SpecifierSet(">=6.120,<7")
    oldest, newest = script.bounds("hypothesis", "both", spec)
    assert (oldest.which, oldest.requirement) == ("oldest", "hypothesis==6.120")
    assert (newest.which, newest.requirement) == ("newest", "hypothesis<7,>=6.120")
    with pytest.raises(ValueError, match="no lower bound"):
        script.oldest_requirement("x", SpecifierSet("<2"))


def test_the_swept_package_alone_leaves_the_constraints(script: ModuleType) -> None:
    text = script.constraints_without("hypothesis")
    assert "hypothesis==" not in text
    assert set(_pins()) - {"hypothesis"} == {
        canonicalize_name(line.split("==")[0]) for line in text.splitlines() if "==" in line
    }


def test_the_script_reads_the_ranges_pyproject_declares(script: ModuleType) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {canonicalize_name(Requirement(d).name) for d in project["dependencies"]}
    ranges = script.ranges()
    assert declared <= set(ranges)
    assert ranges["hypothesis"] == Requirement(next(d for d in project["dependencies"] if "hypothesis" in d)).specifier


def test_every_pin_lies_in_its_range(script: ModuleType) -> None:
    """constraints.txt (what CI installs) never pins outside pyproject's ranges,
    so what is tested is something a user can get."""
    ranges = script.ranges()
    outside = {
        name: (version, str(ranges[name]))
        for name, version in _pins().items()
        if name in ranges and Version(version) not in ranges[name]
    }
    assert not outside, outside


def test_the_installed_hypothesis_is_one_the_range_admits(script: ModuleType) -> None:
    """Whichever bound this runs under (the pin, the oldest, the newest), it is inside the range."""
    installed = Version(importlib.metadata.version("hypothesis"))
    assert installed in script.ranges()["hypothesis"], installed
