"""Replay files that last (issue 10): one folder per run, a cap on how many
are kept, the implementation recorded in the file, a hint that can be pasted
as is, and ``kvspec replay FILE`` without ``--impl``.

The end-to-end case runs the suite twice in a child process, as a port
author would, against an adapter outside the tree that drops its Removed
events (tests/conftest.py); the rest checks the replay folder and the header
directly.
"""

from __future__ import annotations

import json
import platform
import re
import shlex
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kvspec.conformance.block.diff import Divergence
from kvspec.conformance.block.lockstep import Lockstep
from kvspec.conformance.verdicts.replay_file import load_replay
from kvspec.conformance.verdicts.replay_store import ReplayRun, Target, prune, replay_command
from kvspec.spec.config import ManagerConfig
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Deref, FullBlock, Plh, Use

SUITE = Path(__file__).resolve().parent.parent / "kvspec" / "conformance"


def _suite(
    child_pytest: Callable[..., tuple[int, str]],
    impl: str,
    *extra: str,
    replay_dir: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """The lockstep test on ``impl`` in a child pytest, keeping two run folders
    (``replay_dir``: with ``--kvspec-replay-dir=tmp/replays``, else where the
    working dir says)."""
    return child_pytest(
        str(SUITE / "test_stateful.py"),
        "-k",
        "test_lockstep and kvbm",
        f"--impl={impl}",
        "--kvspec-replay-keep=2",
        "-q",
        *extra,
        replay_dir=replay_dir,
        env=env,
    )


def test_each_run_keeps_its_replay_folder_and_the_hint_can_be_pasted(
    tmp_path: Path,
    drops_removed_adapter: Callable[[str], Path],
    child_pytest: Callable[..., tuple[int, str]],
    child_kvspec: Callable[[list[str], Path], tuple[int, str]],
) -> None:
    adapter = drops_removed_adapter("my_port")
    old = tmp_path / "replays" / "20000101T000000Z-my_port"
    old.mkdir(parents=True)
    (tmp_path / "replays" / "flat-file-of-an-older-kvspec.jsonl").write_text("{}\n")

    code1, out1 = _suite(child_pytest, "my_port")
    assert code1 == 1, out1[-3000:]
    # a random effort with a seed: the seed is recorded and pasted back in the hint
    code2, out2 = _suite(child_pytest, "my_port", "--hypothesis-profile=smoke", "--hypothesis-seed=3")
    assert code2 == 1, out2[-3000:]

    runs = sorted(p for p in (tmp_path / "replays").iterdir() if p.is_dir())
    # the fake oldest run was pruned (keep=2); both real runs kept their file
    assert old not in runs and len(runs) == 2, runs
    # <run id: UTC stamp and random suffix>-<adapter>
    assert all(re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}-my_port", p.name) for p in runs), runs
    assert (tmp_path / "replays" / "flat-file-of-an-older-kvspec.jsonl").is_file()
    files = [p / "test_lockstep_kvbm.jsonl" for p in runs]
    assert all(f.is_file() for f in files)

    rf = load_replay(files[1])
    assert rf.target is not None
    assert rf.target.impl == "my_port" and rf.target.adapter_path == str(adapter.resolve())
    assert rf.target.variant is None and rf.target.hypothesis_seed == "3"
    assert rf.target.effort == "smoke"

    # the hint is a command that works as printed, from another directory
    hints = re.findall(r"run again with: (kvspec replay .+)", out2)
    assert hints, out2[-3000:]
    cmd = shlex.split(hints[0])
    assert cmd[2] == str(files[1]) and cmd[3] == f"--impl={adapter.resolve()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out = child_kvspec(cmd, elsewhere)
    assert code == 1 and "rule REMOVE-EXACT" in out, out

    # without --impl: the recorded adapter folder
    code, out = child_kvspec(["kvspec", "replay", str(files[1])], elsewhere)
    assert code == 1 and "rule REMOVE-EXACT" in out and str(adapter.resolve()) in out, out

    # the recorded folder is gone: one clear error
    adapter.rename(tmp_path / "moved")
    code, out = child_kvspec(["kvspec", "replay", str(files[1])], elsewhere)
    assert code == 2, out
    assert "moved or deleted" in out and "--impl=" in out and "Traceback" not in out


def test_replay_folders_follow_the_working_dir(
    tmp_path: Path, drops_removed_adapter: Callable[[str], Path], child_pytest: Callable[..., tuple[int, str]]
) -> None:
    """Without ``--kvspec-replay-dir`` the replay folders are under the working
    dir's ``replays/``: ``--kvspec-dir``, else ``KVSPEC_HOME``; nothing lands in
    the directory the run started in."""
    drops_removed_adapter("my_port")
    wd, home = tmp_path / "wd", tmp_path / "home"
    code, out = _suite(child_pytest, "my_port", f"--kvspec-dir={wd}", replay_dir=False)
    assert code == 1, out[-3000:]
    code, out2 = _suite(child_pytest, "my_port", replay_dir=False, env={"KVSPEC_HOME": str(home)})
    assert code == 1, out2[-3000:]
    for root, printed in ((wd, out), (home, out2)):
        runs = [p for p in (root / "replays").iterdir() if p.is_dir()]
        assert len(runs) == 1 and (runs[0] / "test_lockstep_kvbm.jsonl").is_file(), runs
        assert str(runs[0] / "test_lockstep_kvbm.jsonl") in printed  # the hint names it
    assert not (tmp_path / ".kvspec").exists()
    assert not (tmp_path / "replays").exists()


def test_workers_of_one_run_share_its_folder(tmp_path: Path) -> None:
    """Two ReplayRuns with the run id of one xdist run (two workers) write
    into one folder named after the id; a run without an id gets a stamp."""
    a = ReplayRun(tmp_path, _target(tmp_path), run_id="20261127T010203Z-abc123")
    b = ReplayRun(tmp_path, _target(tmp_path), run_id="20261127T010203Z-abc123")
    assert a.path_for("t1").parent == b.path_for("t2").parent == tmp_path / "20261127T010203Z-abc123-x"
    c = ReplayRun(tmp_path, _target(tmp_path), run_id="20261127T010203Z-def456")
    assert c.folder() != a.folder()


def _target(tmp: Path, variant: str | None = None) -> Target:
    return Target(impl="adapters/x", adapter_path=str(tmp / "x"), variant=variant, effort="ci")


def test_the_run_folder_is_made_at_the_first_failure_and_named_after_the_variant(tmp_path: Path) -> None:
    when = datetime(2026, 11, 27, 1, 2, 3, tzinfo=UTC)
    run = ReplayRun(tmp_path / "r", _target(tmp_path, "early"), started=when)
    assert not (tmp_path / "r").exists()  # a clean run leaves nothing behind
    p = run.path_for("test_lockstep[kvbm]")
    assert p == tmp_path / "r" / "20261127T010203Z-x-early" / "test_lockstep_kvbm.jsonl"
    # another run started in the same second gets a folder of its own
    other = ReplayRun(tmp_path / "r", _target(tmp_path, "early"), started=when)
    assert other.folder() == tmp_path / "r" / "20261127T010203Z-2-x-early"


def test_prune_keeps_the_newest_run_folders_and_nothing_else_is_touched(tmp_path: Path) -> None:
    names = [f"2026112{d}T000000Z-x" for d in range(1, 6)]
    for n in names:
        (tmp_path / n).mkdir()
    (tmp_path / "notes").mkdir()
    gone = prune(tmp_path, 2)
    assert [p.name for p in gone] == names[:3]
    assert sorted(p.name for p in tmp_path.iterdir()) == [*names[3:], "notes"]
    assert prune(tmp_path, 0) == []  # 0: keep all


def test_the_header_records_the_implementation_and_old_files_still_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import hypothesis

    import kvspec
    from kvspec import cli
    from kvspec.adapters.reference.adapter import ReferenceImplementation

    config = ManagerConfig(profile="kvbm", capacity=1, eviction="lru")
    target = _target(tmp_path, "early")
    path = tmp_path / "f.jsonl"
    impl = ReferenceImplementation(config, None)  # no manifest: none is read
    ls = Lockstep(impl, config, adapter="x", replay_path=path, replay_target=target)
    for op in (
        Use(blocks=[FullBlock(full=1)], plhs=[Plh(hash=1)]),
        Deref(blocks=[FullBlock(full=1)]),
    ):
        ls.step(op)
    ls.write_replay(_divergence())
    rf = load_replay(path)
    assert rf.target == target and rf.recorded
    # the versions it was written under (not computed by the code under test:
    # read from the packages themselves)
    assert rf.versions is not None
    assert (rf.versions.kvspec, rf.versions.hypothesis) == (kvspec.__version__, hypothesis.__version__)
    assert rf.versions.python == platform.python_version() and len(rf.versions.spec_digest) == 16
    assert replay_command(path, target).endswith(f"--impl={tmp_path / 'x' / 'early'}")

    # a file of format 1 (no versions, then no adapter folder) still loads ...
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["kvspec_replay"] = 1
    del header["versions"]
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    old = load_replay(path)
    assert old.target == target and old.versions is None and not old.recorded
    # ... but is not replayed without --impl: it cannot say what it ran under
    assert cli.main(["replay", str(path)]) == 2
    out = capsys.readouterr().out
    assert "does not record the kvspec, Hypothesis and Python versions" in out, out
    assert f"--impl={tmp_path / 'x' / 'early'}" in out  # the recorded folder, as a hint to paste
    for k in ("impl", "adapter_path", "variant", "effort", "hypothesis_seed"):
        del header[k]
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    older = load_replay(path)
    assert older.target is None and older.adapter == "x" and len(older.ops) == 2
    assert cli.main(["replay", str(path)]) == 2
    assert "does not record the adapter folder" in capsys.readouterr().out
    # a format this kvspec does not know is refused naming it
    header["kvspec_replay"] = 9
    path.write_text(json.dumps(header) + "\n")
    assert cli.main(["replay", str(path)]) == 2
    assert "replay format 9 is not one this kvspec reads (1, 2)" in capsys.readouterr().out


def _divergence() -> Divergence:
    return Divergence(rule=RuleId.REMOVE_EXACT, what="test", expected=None, actual=None)


@pytest.mark.parametrize("bad", [{"adapter_path": 3}, {"adapter_path": "/x", "variant": ["a"]}])
def test_a_malformed_recorded_implementation_is_refused(tmp_path: Path, bad: dict[str, object]) -> None:
    from kvspec.conformance.verdicts.replay_file import ReplayFileError

    header = {"kvspec_replay": 1, "adapter": "x", "config": {"profile": "kvbm", "capacity": 1}, **bad}
    path = tmp_path / "f.jsonl"
    path.write_text(json.dumps(header) + "\n")
    with pytest.raises(ReplayFileError, match="must be a string"):
        load_replay(path)
