"""The CI recipe of spec/GATING.md, end to end: its shell script, exactly as
the document prints it, runs in a temporary git repository that holds an
adapter (a copy of adapters/reference's manifest) and installs kvspec from a
wheel built from this tree. The baseline is made with the script, an
unchanged run passes the gate, and a run whose engine was replaced by a
mutant (event_id_skip, a deliberately broken reference) fails the gate on
that mutant's rule only.

Effort is kept small: the golden scenarios only (``KVSPEC_PYTEST_ARGS``),
and the kvspec wheel is installed without its dependencies into a fresh
virtual environment that sees this environment's dependencies (a path file to
a folder linking them, kvspec itself left out), so the test needs no network.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GATING = ROOT / "kvspec" / "spec" / "GATING.md"
MUTANT, MUTANT_RULE = "event_id_skip", "EVENT-ID"


def fenced(text: str, after: str, lang: str) -> str:
    """The first ``lang`` code block after the heading that contains ``after``."""
    start = text.index(after)
    m = re.compile(rf"^```{lang}\n(.*?)^```$", re.S | re.M).search(text, start)
    assert m is not None, f"no {lang} block after {after!r}"
    return m.group(1)


def test_the_workflow_runs_the_script_and_uploads_what_it_writes() -> None:
    text = GATING.read_text()
    script = fenced(text, "## The shell script", "sh")
    yaml = fenced(text, "## The GitHub Actions job", "yaml")
    assert "run: sh ci/kvspec-gate.sh" in yaml
    for written in ("report.html", "report.md", "gate.md", "results.json", "replays/"):
        assert f"kvspec-out/{written}" in yaml
        assert f'"$OUT/{written.rstrip("/")}' in script
    for setting in ("KVSPEC_PACKAGE", "ADAPTER", "BASELINE", "KVSPEC_SEED", "KVSPEC_EFFORT"):
        assert f"{setting}:" in yaml and setting in script
    assert "\t" not in yaml  # YAML refuses tabs


def test_the_documented_constraints_pin_the_hypothesis_kvspec_is_tested_with() -> None:
    """The recipe's constraints file pins Hypothesis exactly, to the version of
    kvspec's own constraints.txt (what CI runs), inside pyproject's range."""
    from packaging.requirements import Requirement

    block = fenced(GATING.read_text(), "**The constraints file", "text")
    pins = [Requirement(line) for line in block.splitlines() if line and not line.startswith("#")]
    hyp = [r for r in pins if r.name == "hypothesis"]
    assert len(hyp) == 1 and str(hyp[0].specifier).startswith("=="), pins
    version = str(hyp[0].specifier)[2:]
    ours = (ROOT / "constraints.txt").read_text().splitlines()
    assert f"hypothesis=={version}" in ours, "GATING.md's pin differs from constraints.txt"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (dep,) = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "hypothesis"]
    assert version in dep.specifier


def test_the_script_refuses_to_run_without_its_constraints_file(tmp_path: Path) -> None:
    repo = tmp_path / "engine-repo"
    (repo / "ci").mkdir(parents=True)
    (repo / "ci" / "kvspec-gate.sh").write_text(fenced(GATING.read_text(), "## The shell script", "sh"))
    proc = _run(repo, {"PATH": os.environ["PATH"]})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no constraints file ci/kvspec-constraints.txt: it pins Hypothesis" in proc.stderr
    assert not (repo / ".kvspec-venv").exists()  # nothing installed before the check


@pytest.fixture(scope="module")
def wheel(built_wheel: tuple[Path, str]) -> Path:
    """kvspec's wheel, built from the committed tree plus the working copy's
    changes (tests/conftest.py's ``built_wheel``, shared with test_packaging)."""
    return built_wheel[0]


def _venv_with_dependencies(repo: Path) -> Path:
    """A fresh venv whose path reaches this environment's packages except
    kvspec (a folder of links to them, named in a .pth file)."""
    venv = repo / ".kvspec-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    here = Path(sysconfig.get_paths()["purelib"])
    deps = repo.parent / "deps"
    deps.mkdir()
    for entry in here.iterdir():
        name = entry.name.lower()
        if name.startswith(("kvspec", "__editable__", "_kvspec")) or name.endswith(".pth"):
            continue
        (deps / entry.name).symlink_to(entry)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "kvspec_recipe_deps.pth").write_text(f"{deps}\n")
    return venv


def _run(repo: Path, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "ci/kvspec-gate.sh"],
        cwd=repo,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=900,
    )


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


ENGINE_REGRESSED = '''"""The engine after a bad change: the reference with one bug (a kvspec mutant)."""

from kvspec.adapters.mutants.adapter import open_mutant


def open_engine(config, manifest, adapter_dir, variant=None):
    return open_mutant(config, manifest, adapter_dir, variant="{mutant}")
'''


def test_the_recipe_gates_a_regression_and_only_it(tmp_path: Path, wheel: Path) -> None:
    repo = tmp_path / "engine-repo"
    (repo / "ci").mkdir(parents=True)
    (repo / "kvspec-adapter").mkdir()
    shutil.copy(ROOT / "adapters" / "reference" / "manifest.toml", repo / "kvspec-adapter" / "manifest.toml")
    (repo / "ci" / "kvspec-gate.sh").write_text(fenced(GATING.read_text(), "## The shell script", "sh"))
    (repo / "ci" / "kvspec-constraints.txt").write_text(fenced(GATING.read_text(), "**The constraints file", "text"))
    shutil.copy(wheel, repo / "ci" / wheel.name)
    (repo / ".gitignore").write_text(".kvspec-venv/\nkvspec-out/\n")
    _venv_with_dependencies(repo)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "engine with its kvspec adapter")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(
        KVSPEC_PACKAGE=f"ci/{wheel.name}",
        KVSPEC_PIP_ARGS="--no-deps --no-index",
        KVSPEC_EFFORT="smoke",
        KVSPEC_SEED="7",
        KVSPEC_PYTEST_ARGS="-k golden",
    )

    made = _run(repo, env, KVSPEC_UPDATE_BASELINE="1")
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    baseline = repo / "ci" / "kvspec-baseline.json"
    assert baseline.is_file() and "created" in made.stdout
    _git(repo, "add", "ci/kvspec-baseline.json")
    _git(repo, "commit", "-qm", "kvspec baseline")

    same = _run(repo, env)
    assert same.returncode == 0, same.stdout[-3000:] + same.stderr[-3000:]
    assert "kvspec gate: passed: no regression of reference" in same.stdout
    assert (repo / "kvspec-out" / "report.html").is_file() and (repo / "kvspec-out" / "report.md").is_file()

    # the engine regresses: its adapter now runs a mutant of the reference
    (repo / "engine_impl.py").write_text(ENGINE_REGRESSED.format(mutant=MUTANT))
    manifest = repo / "kvspec-adapter" / "manifest.toml"
    text = manifest.read_text()
    assert 'python = "kvspec.adapters.reference.adapter:open_reference"' in text
    manifest.write_text(text.replace("kvspec.adapters.reference.adapter:open_reference", "engine_impl:open_engine"))
    _git(repo, "commit", "-qam", "a change that breaks event ids")

    bad = _run(repo, env)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-3000:]
    gate_md = (repo / "kvspec-out" / "gate.md").read_text()
    assert "kvspec gate: FAILED: 1 regression(s)" in gate_md
    newly_failing = re.findall(r"^\| (?:passing rule fails|rule fails) \| `([A-Z0-9-]+)` \|", gate_md, re.M)
    assert newly_failing == [MUTANT_RULE], gate_md
    # the engine changed, not kvspec: every row is the engine's
    assert "| spec" not in gate_md and "kvspec changed" not in gate_md
    # the report marks the rule and links the failing scenario (its replay)
    report = (repo / "kvspec-out" / "report.md").read_text()
    assert re.search(rf"^\| `{MUTANT_RULE}` \| \[✗ fail\]\(", report, re.M), report
    # the baseline in the repository is untouched by a gating run
    _git(repo, "diff", "--quiet", "HEAD", "--", "ci/kvspec-baseline.json")
