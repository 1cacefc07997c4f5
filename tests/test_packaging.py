"""Packaging: everything installs under the single name ``kvspec``, the wheel
carries the spec's data files, and the suite runs from another directory
through the installed pytest plugin (as a port's own CI would run it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {
    "kvspec": "kvspec",
    "kvspec.spec": "spec",
    "kvspec.reference": "reference",
    "kvspec.conformance": "conformance",
    "kvspec.adapters": "adapters",
}


def _listed_packages() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def _package_dirs() -> set[str]:
    found = set()
    for name, folder in MAPPED.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if any(part.startswith((".", "_")) or part in ("build", "findings") for part in rel.parts):
                continue
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    return found


def test_every_package_directory_is_listed_in_pyproject() -> None:
    missing = _package_dirs() - _listed_packages()
    assert not missing, f"add to [tool.setuptools] packages: {sorted(missing)}"


def test_nothing_generic_is_importable_at_top_level() -> None:
    code = (
        "import importlib.util; "
        "print([m for m in ('spec', 'reference', 'conformance', 'adapters') if importlib.util.find_spec(m)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools builds in the source tree
    return next(out.glob("kvspec-*.whl"))


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
