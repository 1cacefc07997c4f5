"""Packaging: everything installs under the single name ``kvspec``, the wheel
carries the spec's data files, and the suite runs from another directory
through the installed pytest plugin (as a port's own CI would run it)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvspec"
#: the architecture's four layers: top-level links into the one package
LAYERS = ("spec", "reference", "conformance", "adapters")


def test_top_level_layers_are_links_into_the_package() -> None:
    for layer in LAYERS:
        link = ROOT / layer
        assert link.is_symlink(), f"{layer}/ should link to kvspec/{layer}"
        assert link.resolve() == (PACKAGE / layer).resolve()


def test_every_module_import_name_follows_its_path() -> None:
    """A module at kvspec/a/b.py is imported as kvspec.a.b: no package-dir
    mapping that tools cannot follow."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in config
    for py in PACKAGE.rglob("*.py"):
        rel = py.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        assert importlib.util.find_spec(name) is not None, name
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        assert Path(spec.origin).resolve() == py.resolve(), (name, spec.origin)


def test_nothing_generic_is_importable_at_top_level() -> None:
    code = (
        "import importlib.util; "
        "print([m for m in ('spec', 'reference', 'conformance', 'adapters') if importlib.util.find_spec(m)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def built(built_wheel: tuple[Path, str]) -> tuple[Path, str]:
    """The wheel and its build's output (tests/conftest.py's ``built_wheel``)."""
    return built_wheel


@pytest.fixture(scope="module")
def wheel(built: tuple[Path, str]) -> Path:
    return built[0]


def test_building_prints_no_setuptools_warning(built: tuple[Path, str]) -> None:
    lines = [line for line in built[1].splitlines() if "warning" in line.lower()]
    assert not lines, "\n".join(lines)


def test_wheel_has_one_top_level_name_and_the_spec_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("kvspec-")}
    assert tops == {"kvspec"}
    for needed in (
        "kvspec/spec/SPEC.md",
        "kvspec/spec/schema/kv_event.json",
        "kvspec/spec/vectors/hash_vectors.json",
        "kvspec/spec/scenarios/kvbm/stringent_lifecycle_lineage.json",
        "kvspec/adapters/reference/manifest.toml",
        "kvspec/conformance/test_golden.py",
    ):
        assert needed in names, needed


def test_suite_runs_from_another_directory_through_the_plugin(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--pyargs",
            "kvspec.conformance",
            "--impl=reference",
            "-q",
            "-k",
            "golden",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout
