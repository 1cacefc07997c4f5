"""Run kvspec's tests on the oldest and the newest version of a dependency that
``pyproject.toml`` admits.

``constraints.txt`` pins the versions CI and the Makefile install; the ranges
in ``pyproject.toml`` are what a user installing kvspec into another project
gets. Only the pins are tested by ``make test``, so a range can admit a version
that breaks kvspec without anyone noticing (Hypothesis 6.170 renamed its
"Falsifying example" and "minimal failing example", and three tests failed).
This script makes one virtual environment per bound, installs kvspec there with
every other dependency at its pin and the swept one at the bound, and runs a
test selection:

    python scripts/dependency_bounds.py                        # hypothesis, oldest and newest
    python scripts/dependency_bounds.py --bound newest         # only the newest admitted
    python scripts/dependency_bounds.py --package pydantic --tests tests/test_wire.py
    python scripts/dependency_bounds.py --list                 # the bounds, without installing

"oldest" is the range's lower bound (``>=6.120`` -> ``==6.120``), "newest" is
what pip resolves for the range itself (the registry's latest admitted
release). Environments are kept under ``.kvspec/bounds/`` (``--dir``) and
reused when the version is already there. The last line is
``dependency_bounds: PACKAGE VERSION: passed|failed (pytest exit N)`` per
bound; the exit code is 0 only when every bound passed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]

#: the tests whose outcome depends on what Hypothesis prints, records and
#: generates (report layout, observability phases, example database, efforts,
#: replay files), and the fast model tests
DEFAULT_TESTS = (
    "tests/test_run_output.py",
    "tests/test_parallel.py",
    "tests/test_effort.py",
    "tests/test_startup_errors.py",
    "tests/test_replay.py",
    "tests/test_replay_runs.py",
    "tests/test_request_replay.py",
    "tests/test_dependency_bounds.py",
    "tests/test_lockstep.py",
    "tests/test_traffic.py",
    "tests/test_model_stateful.py",
)


@dataclass(frozen=True)
class Bound:
    package: str
    #: "oldest" or "newest"
    which: str
    #: the requirement pip installs for this bound
    requirement: str


def ranges(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, SpecifierSet]:
    """Canonical package name -> its range, over the dependencies and every extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    out: dict[str, SpecifierSet] = {}
    for text in reqs:
        r = Requirement(text)
        out[canonicalize_name(r.name)] = r.specifier
    return out


def oldest_requirement(package: str, spec: SpecifierSet) -> str:
    """``package==LOWER`` for a range with a ``>=`` lower bound (or ``==``);
    a range with none has no oldest version to test (ValueError)."""
    lower = [s.version for s in spec if s.operator in (">=", "==", "~=")]
    if not lower:
        raise ValueError(f"{package}: the range {spec or '(none)'} has no lower bound to test")
    return f"{package}=={lower[0]}"


def bounds(package: str, which: str, spec: SpecifierSet) -> list[Bound]:
    out = []
    if which in ("oldest", "both"):
        out.append(Bound(package, "oldest", oldest_requirement(package, spec)))
    if which in ("newest", "both"):
        out.append(Bound(package, "newest", f"{package}{spec}"))
    return out


def constraints_without(package: str, constraints: Path = ROOT / "constraints.txt") -> str:
    """constraints.txt without the swept package's pin (comments kept)."""
    keep = []
    for line in constraints.read_text().splitlines():
        name = re.split(r"[=<>!~ ;\[]", line.strip(), maxsplit=1)[0]
        if name and not line.lstrip().startswith("#") and canonicalize_name(name) == canonicalize_name(package):
            continue
        keep.append(line)
    return "\n".join(keep) + "\n"


def _run(cmd: list[str], log: Path) -> int:
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, check=False).returncode


def installed_version(python: Path, package: str) -> str | None:
    proc = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def prepare(bound: Bound, folder: Path) -> tuple[Path, str]:
    """A venv with kvspec (editable, extras dev) and the bound installed;
    returns (its python, the version of the package installed)."""
    venv = folder / f"{bound.package}-{bound.which}"
    python = venv / "bin" / "python"
    log = folder / f"{bound.package}-{bound.which}.log"
    folder.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    cons = folder / f"constraints-without-{bound.package}.txt"
    cons.write_text(constraints_without(bound.package))
    cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(cons)]
    if _run([*cmd, "-e", ".[dev]", bound.requirement], log) != 0:
        raise RuntimeError(f"installing {bound.requirement} failed: see {log}")
    version = installed_version(python, bound.package)
    if version is None:
        raise RuntimeError(f"{bound.package} is not importable in {venv}: see {log}")
    return python, version


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", default="hypothesis", help="the dependency to sweep (default: hypothesis)")
    p.add_argument("--bound", choices=("oldest", "newest", "both"), default="both")
    p.add_argument("--dir", type=Path, default=ROOT / ".kvspec" / "bounds", help="where the venvs are kept")
    p.add_argument("--tests", nargs="+", default=list(DEFAULT_TESTS), help="test files or ids to run")
    p.add_argument("--workers", default="2", help="pytest -n (default 2; 0: in one process)")
    p.add_argument("--list", action="store_true", help="print the requirements of the bounds and exit")
    args = p.parse_args(argv)

    name = canonicalize_name(args.package)
    spec = ranges().get(name)
    if spec is None:
        print(f"dependency_bounds: {args.package} is not a dependency in pyproject.toml", file=sys.stderr)
        return 2
    todo = bounds(name, args.bound, spec)
    if args.list:
        for b in todo:
            print(f"{b.which}: {b.requirement}")
        return 0
    tests = [t for t in args.tests if (ROOT / t.split("::", 1)[0]).exists()]
    results: list[tuple[Bound, str, int]] = []
    for b in todo:
        try:
            python, version = prepare(b, args.dir)
        except RuntimeError as e:
            print(f"dependency_bounds: {b.which}: {e}", file=sys.stderr)
            results.append((b, "?", 2))
            continue
        print(f"dependency_bounds: {b.which} {name} {version}: running {len(tests)} test files", flush=True)
        workers = [] if args.workers == "0" else ["-n", args.workers]
        code = subprocess.run([str(python), "-m", "pytest", "-q", *workers, *tests], cwd=ROOT, check=False).returncode
        results.append((b, version, code))
    for b, version, code in results:
        print(
            f"dependency_bounds: {b.which} {name} {version}: {'passed' if code == 0 else 'failed'} (pytest exit {code})"
        )
    return 0 if all(code == 0 for _, _, code in results) else 1


if __name__ == "__main__":
    sys.exit(main())
