"""Where kvspec keeps its working files: one folder, chosen once.

A conformance run leaves files behind that a user may want again (replay
files of failures, results, per-mutant logs) and caches that make the next
run better (Hypothesis's example database and its ``constants`` cache,
pytest's cache, built C libraries). Installed use used to scatter them over
whatever directory the run started in (``.hypothesis/``, ``.pytest_cache/``,
``.kvspec/``); now they all live under one root:

1. ``--kvspec-dir DIR`` (pytest option; ``kvspec mutants --kvspec-dir``),
2. else the ``KVSPEC_HOME`` environment variable,
3. else ``.kvspec/`` in the current directory.

The default stays in the current directory on purpose: the files belong to
the project being tested (a replay file is printed by path and is read next
to the port's sources), and ``rm -rf .kvspec`` or ``make clean`` clears them.
A user who wants them out of the tree sets ``KVSPEC_HOME`` (for example to
``$XDG_CACHE_HOME/kvspec``). The root gets a ``.gitignore`` of ``*`` so that
it never shows up in ``git status``.

Layout of the root (``SUBDIRS``):

- ``hypothesis/``: Hypothesis's home directory (its ``constants`` cache) and
  ``hypothesis/examples``, the example database of random efforts
  (``settings.py``; ``--kvspec-example-db`` points elsewhere);
- ``pytest-cache/``: pytest's ``cache_dir`` (``--lf``, ``--nf``);
- ``replays/``: replay files of failing runs (``replay_store.replay_root``);
- ``mutants/``: ``kvspec mutants`` logs, one folder per mutant;
- ``build/``: C libraries and Rust binaries built from an adapter's sources
  (``$KVSPEC_BUILD_DIR`` overrides; a session sets it for the adapter
  processes it starts, whose current directory is the adapter's folder).

The plugin takes the root over (``take_over``) only in a session where it
is active from the start (``--impl``, ``--kvspec-dir``, or the command line
names the conformance suite), so that a project with kvspec installed keeps
pytest's and Hypothesis's own defaults in its own test runs. An explicit
``cache_dir`` in the project's pytest configuration and an explicit
``HYPOTHESIS_STORAGE_DIRECTORY`` are respected.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported at run time: adapter processes (build_dir) need no pytest
    import pytest

#: the environment variable naming the root
ENV = "KVSPEC_HOME"
#: the root when neither the option nor the environment names one (relative to the current directory)
DEFAULT = ".kvspec"

HYPOTHESIS = "hypothesis"
PYTEST_CACHE = "pytest-cache"
REPLAYS = "replays"
MUTANTS = "mutants"
BUILD = "build"
SUBDIRS = (HYPOTHESIS, PYTEST_CACHE, REPLAYS, MUTANTS, BUILD)

#: the root a pytest session chose (``take_over``), for code that has no config at hand (``build/``)
_session_root: Path | None = None
#: the environment variable naming the build cache (C libraries, Rust binaries, the fast stream view); a
#: session that takes the root over sets it for the adapter processes it starts (their cwd is the adapter
#: folder, which must stay clean) unless the user set it
BUILD_ENV = "KVSPEC_BUILD_DIR"
#: ``KVSPEC_BUILD_DIR`` before ``take_over`` set it (restored by ``release``)
_build_env_before: str | None = None
_build_env_set = False

#: key of the root in xdist's ``workerinput`` (the controller's choice, so every worker agrees)
WORKER_KEY = "kvspec_dir"


def add_options(group: pytest.OptionGroup) -> None:
    """The working-dir option of the pytest plugin."""
    group.addoption(
        "--kvspec-dir",
        action="store",
        default=None,
        metavar="DIR",
        help=f"where kvspec keeps its working files (replays, example database, pytest cache, logs); "
        f"default: ${ENV}, else ./{DEFAULT}",
    )


def resolve(option: str | os.PathLike[str] | None = None) -> Path:
    """The root for an explicit choice ``option`` (None: the environment, then
    the default), as an absolute path. Nothing is created."""
    raw = str(option) if option else (os.environ.get(ENV) or DEFAULT)
    return Path(raw).expanduser().resolve()


def working_dir(config: pytest.Config | None = None) -> Path:
    """The working-files root of this run (created, with its ``.gitignore``).

    With a pytest ``config``: its ``--kvspec-dir``, or on an xdist worker the
    controller's choice; without one: the root the current session took over,
    else ``KVSPEC_HOME``, else ``./.kvspec``."""
    if config is not None:
        worker = getattr(config, "workerinput", None)
        if isinstance(worker, dict) and worker.get(WORKER_KEY):
            root = Path(str(worker[WORKER_KEY]))
        else:
            root = resolve(config.getoption("--kvspec-dir", None))
    else:
        root = _session_root if _session_root is not None else resolve()
    return ensure(root)


def ensure(root: Path) -> Path:
    """Create ``root`` with a ``.gitignore`` that ignores everything in it."""
    root.mkdir(parents=True, exist_ok=True)
    ignore = root / ".gitignore"
    if not ignore.exists():
        with contextlib.suppress(OSError):  # a read-only root still works for reading
            ignore.write_text("# kvspec's working files (conformance/run/workdir.py)\n*\n")
    return root


def current_root() -> Path:
    """The root for code without a pytest config (builds, ``kvspec`` commands):
    the current session's, else ``KVSPEC_HOME``, else ``./.kvspec``; not created."""
    return _session_root if _session_root is not None else resolve()


def build_dir_candidates() -> list[Path]:
    """Where built libraries and binaries may be cached, in order:
    ``$KVSPEC_BUILD_DIR``, the working dir's ``build/``, a per-user folder of
    the temp dir (when the working dir is not writable)."""
    import tempfile

    env = os.environ.get(BUILD_ENV)
    out = [Path(env)] if env else []
    return [*out, current_root() / BUILD, Path(tempfile.gettempdir()) / f"kvspec-build-{os.getuid()}"]


def subdir(name: str, config: pytest.Config | None = None) -> Path:
    """``working_dir(config) / name``, created."""
    d = working_dir(config) / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def example_db_dir(config: pytest.Config | None = None) -> Path:
    """The example database of random efforts when no ``--kvspec-example-db`` is given."""
    return subdir(HYPOTHESIS, config) / "examples"


def in_effect(config: pytest.Config, *, conformance_named: bool) -> bool:
    """Does this session use the working dir for pytest's and Hypothesis's
    files too? Only where kvspec is what the session runs."""
    return bool(config.getoption("--kvspec-dir", None) or config.getoption("--impl", None) or conformance_named)


def take_over(config: pytest.Config) -> Path:
    """Point pytest's cache and Hypothesis's home at the working dir (unless
    the project or the environment chose their place explicitly). Called by
    the plugin before pytest's cache provider is configured."""
    global _session_root, _build_env_before, _build_env_set
    root = working_dir(config)
    _session_root = root
    if not _build_env_set:
        _build_env_before, _build_env_set = os.environ.get(BUILD_ENV), True
        if not _build_env_before:
            os.environ[BUILD_ENV] = str(root / BUILD)
    cache_on = config.pluginmanager.has_plugin("cacheprovider")  # off with -p no:cacheprovider
    if cache_on and _is_pytest_default_cache_dir(str(config.getini("cache_dir"))):
        # pytest reads cache_dir through getini (cached) when its cache
        # provider is configured, later in this same pytest_configure call
        config._inicache["cache_dir"] = str(root / PYTEST_CACHE)
    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        from hypothesis.configuration import set_hypothesis_home_dir

        set_hypothesis_home_dir(root / HYPOTHESIS)
    return root


def _is_pytest_default_cache_dir(value: str) -> bool:
    """Is ``value`` pytest's own default ``cache_dir`` (not a project's choice)?"""
    return value in (".pytest_cache", os.path.join(os.environ.get("TOX_ENV_DIR", ""), ".pytest_cache"))


def release() -> None:
    """Forget the session's root (at the end of the session: an in-process
    pytest run must not redirect the next one)."""
    global _session_root, _build_env_before, _build_env_set
    if _session_root is not None and not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        from hypothesis.configuration import set_hypothesis_home_dir

        set_hypothesis_home_dir(None)
    _session_root = None
    if _build_env_set:
        if _build_env_before:
            os.environ[BUILD_ENV] = _build_env_before
        else:
            os.environ.pop(BUILD_ENV, None)
        _build_env_before, _build_env_set = None, False
