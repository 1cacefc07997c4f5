"""Options and scopes that would do nothing are errors that say what to write.

A deviation scope that can never match a failure (a golden named with the
``@POLICY`` suffix of its test id, a golden that does not exist, a profile
the adapter does not run, an operation kind the adapter never performs) is
refused when the manifest loads; ``check-log --strict``, which once switched
the strict rules on and now did nothing, is a usage error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.conformance.run.manifest import load_manifest
from kvspec.spec.deviations import golden_ids
from kvspec.spec.errors import ConfigError

_HEAD = 'name = "x"\nkind = "python"\nprofile = "{profile}"\n[capabilities]\nblock_level = {block}\n'


def _manifest(tmp_path: Path, deviation: str, *, profile: str = "kvbm", block: str = "true") -> Path:
    text = _HEAD.format(profile=profile, block=block) + '[[deviations]]\nrule = "REMOVE-EXACT"\nreason = "r"\n'
    (tmp_path / "manifest.toml").write_text(text + deviation)
    return tmp_path


def test_a_golden_named_as_its_test_id_is_refused_with_the_id_to_write(tmp_path: Path) -> None:
    assert "kvbm/promote_existing" in golden_ids()
    d = _manifest(tmp_path, 'scope = { scenarios = ["kvbm/promote_existing@lru"] }\n')
    with pytest.raises(ConfigError, match=r"without the @POLICY suffix.*write 'kvbm/promote_existing'"):
        load_manifest(d)


def test_an_unknown_golden_is_refused_with_close_ids(tmp_path: Path) -> None:
    d = _manifest(tmp_path, 'scope = { scenarios = ["kvbm/promote_existin"] }\n')
    with pytest.raises(
        ConfigError, match=r"no golden scenario 'kvbm/promote_existin'.*did you mean 'kvbm/promote_existing'"
    ):
        load_manifest(d)


def test_a_known_golden_is_accepted(tmp_path: Path) -> None:
    m = load_manifest(_manifest(tmp_path, 'scope = { scenarios = ["kvbm/promote_existing"] }\n'))
    assert m.deviations[0].scope is not None


def test_a_profile_the_adapter_does_not_run_is_refused(tmp_path: Path) -> None:
    d = _manifest(tmp_path, 'profile = "legacy"\nscope = { operations = ["use"] }\n')
    with pytest.raises(ConfigError, match=r"profile = 'legacy' is not a profile this adapter runs \(kvbm\)"):
        load_manifest(d)


def test_an_operation_the_profiles_lack_is_refused(tmp_path: Path) -> None:
    d = _manifest(tmp_path, 'scope = { operations = ["destroy"] }\n')
    with pytest.raises(ConfigError, match=r"operation\(s\) destroy are not operations of the profiles"):
        load_manifest(d)


def test_operations_of_a_request_level_adapter_are_refused(tmp_path: Path) -> None:
    d = _manifest(tmp_path, 'scope = { operations = ["use"] }\n', profile="vllm", block="false")
    with pytest.raises(ConfigError, match=r"runs no block-level operations.*scope it by conditions"):
        load_manifest(d)


def test_check_log_strict_is_a_usage_error_saying_what_to_write(tmp_path: Path) -> None:
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    r = subprocess.run(
        [sys.executable, "-m", "kvspec", "check-log", str(log), "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "--strict does nothing" in r.stderr and "remove the flag" in r.stderr


@pytest.mark.parametrize(
    ("caps", "message"),
    [
        ("destroy = true", r"capability destroy = true does nothing: Destroy is an operation of the legacy profile"),
        ("reset = true", r"capability reset = true does nothing: .*add 'vllm' to the profiles"),
        ("swap_in = true", r"capability swap_in = true does nothing: .*declare offload = true"),
    ],
)
def test_a_capability_that_would_do_nothing_is_refused(tmp_path: Path, caps: str, message: str) -> None:
    (tmp_path / "manifest.toml").write_text(_HEAD.format(profile="kvbm", block="true") + caps + "\n")
    with pytest.raises(ConfigError, match=message):
        load_manifest(tmp_path)


def test_the_same_capability_is_accepted_where_it_does_something(tmp_path: Path) -> None:
    text = _HEAD.format(profile="kvbm", block="true") + 'destroy = true\nprofiles = ["legacy"]\n'
    (tmp_path / "manifest.toml").write_text(text)
    assert load_manifest(tmp_path).capabilities.destroy
