"""``kvspec prove --profile P``: one profile's proofs, and a clear refusal for
the profiles that have no z3 encoding yet."""

from __future__ import annotations

import pytest

from kvspec.reference.smt.cli_prove import NOT_ENCODED, main


def test_session_profile_runs_only_its_own_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "session"]) == 0
    out = capsys.readouterr().out
    assert "INV-SESSION-FENCE" in out and "proven" in out and "refuted" in out
    assert "INV-PAGED-REFS" not in out and "INV-CONSERVE" not in out


def test_vllm_profile_proves_copy_counting_and_refutes_its_mutants(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "vllm"]) == 0
    out = capsys.readouterr().out
    assert "INV-VLLM-COPIES" in out and "unbounded proven" in out
    for name in ("store-new-only", "remove-last-only", "reset-without-clear"):
        assert f"refutes {name}" in out
    assert "NOT REFUTED" not in out


@pytest.mark.parametrize("profile", NOT_ENCODED)
def test_a_profile_without_an_encoding_is_refused_by_name(profile: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", profile]) == 2
    err = capsys.readouterr().err
    assert f"the {profile} profile has no z3 encoding yet" in err
