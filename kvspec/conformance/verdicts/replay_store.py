"""Where a conformance run's replay files go, and the command that replays one.

Each run that fails writes its replay files into a folder of its own,
``<root>/<run id>-<adapter>[-<variant>]/``, so that a later run (a
``thorough`` campaign after a ``ci`` run, another variant of the same
adapter) never overwrites them. The run id (``xdist_support.run_id``: a UTC
time stamp and a random suffix) is the controller's under pytest-xdist, so
the workers of one ``-n`` run write into one folder (each test its own
file) instead of racing for a name. The folder is made at the first failure:
a clean run leaves nothing behind. When it is made, the oldest run folders
beyond ``keep`` are removed (only folders named like a run folder: anything
else under the root, e.g. flat replay files of older kvspec versions, is
left alone).

``replay_root`` is the one place that decides the root
(``--kvspec-replay-dir``, else ``replays/`` under the working dir,
``workdir.py``), so that it can be redirected without touching the callers.

Each file records the implementation it ran against (``Target``: the
``--impl`` value as given, the adapter folder as an absolute path, the
variant, the effort), so that ``kvspec replay FILE`` needs no ``--impl`` and
the hint printed with a failure is a command that can be pasted as is.
"""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kvspec.conformance.run.manifest import load_manifest
from kvspec.conformance.run.workdir import REPLAYS, working_dir
from kvspec.spec.errors import ConfigError
from kvspec.spec.manifest import Manifest

if TYPE_CHECKING:
    from kvspec.conformance.verdicts.provenance import Versions

#: run folders kept under the root by default (the newest ones)
DEFAULT_KEEP = 20

_RUN_FOLDER = re.compile(r"^\d{8}T\d{6}Z(?:-\d+)?-")


def replay_root(config: pytest.Config) -> Path:
    """The folder under which each run gets its replay folder:
    ``--kvspec-replay-dir`` when given, else ``replays/`` under the run's
    working dir (``--kvspec-dir``, ``KVSPEC_HOME``, ``./.kvspec``; on an xdist
    worker the controller's). Nothing is created here but the working dir."""
    given = config.getoption("--kvspec-replay-dir", None)
    if given:
        return Path(str(given)).expanduser()
    return working_dir(config) / REPLAYS


def slug(text: str) -> str:
    """``text`` as one safe path segment."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:120] or "_"


@dataclass(frozen=True)
class Target:
    """The implementation a run checks, as a replay file records it."""

    #: the ``--impl`` value as given on the command line
    impl: str
    #: the adapter folder, absolute
    adapter_path: str
    variant: str | None = None
    #: the effort (``--hypothesis-profile``) and seed of the run
    effort: str | None = None
    hypothesis_seed: str | None = None

    def header(self) -> dict[str, Any]:
        """The replay header's fields for this target."""
        return {
            "impl": self.impl,
            "adapter_path": self.adapter_path,
            "variant": self.variant,
            "effort": self.effort,
            "hypothesis_seed": self.hypothesis_seed,
        }

    def impl_option(self) -> str:
        """An ``--impl`` value that selects this adapter and variant from any
        working directory."""
        return str(Path(self.adapter_path) / self.variant) if self.variant else self.adapter_path


class NotRecordedError(ConfigError):
    """A file that does not say what it ran against (and no ``--impl``)."""


def unrecorded_message(path: Path, target: Target | None, versions: Versions | None, named: str | None) -> str:
    """Why a file without its provenance is refused, and what to write instead."""
    missing = []
    if target is None:
        missing.append("the adapter folder, variant and effort it ran against")
    if versions is None:
        missing.append("the kvspec, Hypothesis and Python versions it ran under")
    hint = f"--impl={target.impl_option()}" if target is not None else "--impl=ADAPTER"
    what = f" (it names the adapter {named!r})" if named and target is None else ""
    return (
        f"{path} does not record {' nor '.join(missing)}{what}: written by an older kvspec or by hand, "
        f"it cannot say which implementation failed; pass {hint} to replay it against one"
    )


def open_recorded(t: Target) -> tuple[str, Path, Manifest]:
    """The recorded implementation (a ConfigError when its folder is gone)."""
    folder = Path(t.adapter_path)
    if not (folder / "manifest.toml").is_file():
        raise ConfigError(
            f"the adapter folder recorded in the file ({folder}, given as --impl={t.impl}) has no manifest.toml "
            "any more (moved or deleted?); pass --impl=FOLDER to replay against another"
        )
    return (t.impl_option(), folder, load_manifest(folder, t.variant))


def replay_command(path: Path, target: Target | None) -> str:
    """The shell command that replays ``path`` (absolute paths, quoted)."""
    cmd = ["kvspec", "replay", str(path.resolve())]
    if target is not None:
        cmd.append(f"--impl={target.impl_option()}")
    return shlex.join(cmd)


@dataclass
class ReplayRun:
    """The replay folder of one run (made at the first file written)."""

    root: Path
    target: Target
    keep: int = DEFAULT_KEEP
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    #: the run's id (``xdist_support.run_id``), shared by the xdist workers of
    #: one run; None: a stamp of ``started`` (a folder of this process alone)
    run_id: str | None = None
    _folder: Path | None = None

    def name(self) -> str:
        """``<run id>-<adapter>[-<variant>]`` (the run id starts with the UTC
        time stamp, so names sort by age)."""
        adapter = slug(Path(self.target.adapter_path).name)
        stamp = slug(self.run_id) if self.run_id else self.started.strftime("%Y%m%dT%H%M%SZ")
        return f"{stamp}-{adapter}" + (f"-{slug(self.target.variant)}" if self.target.variant else "")

    def folder(self) -> Path:
        """This run's folder, made (and the oldest pruned) on first use.

        With a run id the folder is the run's, shared by its xdist workers
        (whichever fails first makes it); without one, a name another run
        already took gets a ``-N`` suffix after the stamp."""
        if self._folder is not None:
            return self._folder
        self.root.mkdir(parents=True, exist_ok=True)
        base = self.name()
        if self.run_id:
            shared = self.root / base
            shared.mkdir(exist_ok=True)
            self._folder = shared
            prune(self.root, self.keep, spare=shared)
            return shared
        stamp, _, rest = base.partition("-")
        for n in range(1, 1000):
            candidate = self.root / (base if n == 1 else f"{stamp}-{n}-{rest}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            self._folder = candidate
            break
        else:  # pragma: no cover - a thousand runs in one second
            raise OSError(f"{self.root}: no free run folder for {base}")
        prune(self.root, self.keep, spare=self._folder)
        return self._folder

    def path_for(self, test_id: str, suffix: str = ".jsonl") -> Path:
        """The replay file of test ``test_id`` in this run's folder."""
        return self.folder() / f"{slug(test_id)}{suffix}"


def prune(root: Path, keep: int, *, spare: Path | None = None) -> list[Path]:
    """Remove the oldest run folders under ``root`` so that ``keep`` remain
    (``keep <= 0``: keep all); ``spare`` is never removed. Returns what went."""
    if keep <= 0:
        return []
    runs = sorted(p for p in root.iterdir() if p.is_dir() and _RUN_FOLDER.match(p.name))
    gone: list[Path] = []
    for p in runs[: max(0, len(runs) - keep)]:
        if p == spare:
            continue
        shutil.rmtree(p, ignore_errors=True)
        gone.append(p)
    return gone
