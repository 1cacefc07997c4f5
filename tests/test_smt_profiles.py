"""``kvspec prove --profile P``: one profile's proofs (its own rows, its
mutants refuted), and a clear usage error for a mutant of another profile."""

from __future__ import annotations

import re

import pytest

from kvspec.reference.smt.cli.prove import NOT_ENCODED, main
from kvspec.reference.smt.cli.prove_output import ProveOutput


def test_session_profile_runs_only_its_own_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "session"]) == 0
    out = capsys.readouterr().out
    assert "INV-SESSION-FENCE" in out and "proven" in out and "refuted" in out
    assert "INV-PAGED-REFS" not in out and "INV-CONSERVE" not in out


def _held(whole_prove: ProveOutput, profile: str) -> str:
    """``profile``'s rows in the whole ``kvspec prove`` (tests/conftest.py ``whole_prove``), which
    prints them as ``kvspec prove --profile P`` does; the run exited 0 and the profile's summary
    says every row held (what exit 0 of ``--profile P`` says)."""
    assert whole_prove.code == 0, whole_prove.stdout[-6000:] + whole_prove.stderr[-3000:]
    assert re.match(rf"summary {profile}: [1-9]\d* held, 0 failed, 0 unknown", whole_prove.summary(profile))
    return whole_prove.section(profile)


def test_vllm_profile_proves_copy_counting_and_refutes_its_mutants(whole_prove: ProveOutput) -> None:
    out = _held(whole_prove, "vllm")
    assert "INV-VLLM-COPIES" in out and "unbounded proven" in out
    for name in ("store-new-only", "remove-last-only", "reset-without-clear"):
        assert f"refutes {name}" in out
    assert "NOT REFUTED" not in out


@pytest.mark.parametrize("profile", ["kvbm", "legacy", "atomic"])
def test_block_profile_proves_its_invariants_and_refutes_every_mutant(profile: str, whole_prove: ProveOutput) -> None:
    out = _held(whole_prove, profile)
    ids = {"kvbm": ["INV-KVBM-ANNOUNCED"], "legacy": ["INV-LEGACY-ANNOUNCED"]}.get(
        profile, ["INV-ROUTER-MATCH", "INV-ATOMIC-NO-HALF", "INV-ATOMIC-ANCHOR"]
    )
    for inv in ["INV-CONSERVE", *ids]:
        assert f"{inv} " in out
    assert "NOT proven" not in out and "NOT REFUTED" not in out and "FAILED" not in out
    assert f"SANITY-{profile.upper()}" in out and "refuted" in out
    if profile == "atomic":
        assert "INV-ATOMIC-NO-HALF (never: use(place stuck))" in out


@pytest.mark.parametrize(
    ("profile", "name", "where"),
    [
        ("kvbm", "close-keeps-announced", "use(close) (INV-KVBM-ANNOUNCED)"),
        ("legacy", "fail-forgets-unannounced", "use(close) (INV-LEGACY-ANNOUNCED)"),
        ("atomic", "check-counts-pinned", "use(check) (INV-ATOMIC-NO-HALF)"),
        ("atomic", "contract-dropped", "use(begin) (INV-ATOMIC-ANCHOR)"),
    ],
)
def test_block_profile_mutant_is_caught_where_it_breaks(
    profile: str, name: str, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--profile", profile, "--mutant", name]) == 1
    out = capsys.readouterr().out
    # the quantified proof fails: refuted, or z3 gives up on it (the finite counterexample below is the refutation)
    assert "NOT proven" in out or "unknown (" in out
    assert f"SANITY-{profile.upper()}" in out  # the sanity checks run in --mutant mode too
    assert f"counterexample (finite instance): {where}" in out


def test_a_mutant_of_another_profile_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "legacy", "--mutant", "no-pin"]) == 2
    assert "the legacy profile has no mutant 'no-pin'" in capsys.readouterr().err
    assert main(["--mutant", "no-pin"]) == 2
    assert "no-pin is a mutant of --profile atomic" in capsys.readouterr().err


def test_every_profile_has_an_encoding() -> None:
    assert NOT_ENCODED == ()
