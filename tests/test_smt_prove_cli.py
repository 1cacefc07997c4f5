"""An honest ``kvspec prove``: options a profile does not read are usage errors,
an unknown says it timed out and has its own exit status, the plain command
runs every profile, one summary format; and a contract that narrows the
kvbm-offload Use fails the run (reachability from the initial state)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest
import z3

from kvspec.reference.smt.cli import flags, summary
from kvspec.reference.smt.cli import prove as cli_prove
from kvspec.reference.smt.cli.prove import main
from kvspec.reference.smt.cli.prove_output import ProveOutput
from kvspec.reference.smt.managers import session
from kvspec.reference.smt.offload import catalogue
from kvspec.reference.smt.offload.transitions import use_full
from kvspec.reference.smt.universe import RESERVED


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--profile", "session", "--slots", "50"], "--slots does not apply to --profile session"),
        (["--profile", "session", "--no-sanity"], "--no-sanity does not apply to --profile session"),
        (["--profile", "vllm", "--unbounded"], "--unbounded does not apply to --profile vllm"),
        (["--profile", "radix", "--hashes", "3"], "--hashes does not apply to --profile radix"),
        (["--unbounded", "--op-slots", "2"], "--op-slots does not apply to --profile kvbm-offload --unbounded"),
        (["--profile", "atomic", "--invariant", "INV-CONSERVE"], "--invariant does not apply to --profile atomic"),
        (["--mutant", "no-pin"], "no-pin is a mutant of --profile atomic"),
        (["--profile", "paged", "--mutant", "no-pin"], "the paged profile has no mutant 'no-pin'"),
        (["--timeout", "0"], "--timeout must be positive"),
    ],
)
def test_an_option_the_profile_does_not_read_is_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == summary.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err
    if "does not apply" in message:
        assert "it applies to --profile" in err  # names the profiles it applies to


def test_every_option_is_listed_with_the_profiles_it_applies_to() -> None:
    p = argparse.ArgumentParser()
    cli_prove.add_arguments(p)
    options = {o for a in p._actions for o in a.option_strings if o.startswith("--")} - {"--help", "--profile"}
    assert options == set(flags.APPLIES)


def test_help_lists_the_mutants_per_profile_and_the_exit_codes() -> None:
    p = argparse.ArgumentParser()
    cli_prove.add_arguments(p)
    text = p.format_help()
    for profile, names in cli_prove.mutants_by_profile().items():
        assert f"  {profile}: {', '.join(names)}" in text
    assert "3 no failure but the solver gave up" in text
    assert "issue" not in text.lower()


def test_plain_prove_runs_every_profile_with_one_summary_each(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[str] = []

    def runner(profile: str) -> Any:
        def run(_args: argparse.Namespace) -> int:
            ran.append(profile)
            print(summary.row([f"ROW-{profile}", "proven", "", ""], [20, 10, 5, 5]))
            return 0

        return run

    monkeypatch.setattr(cli_prove, "_runner", runner)
    assert main([]) == 0
    out = capsys.readouterr().out
    assert ran == list(flags.PROFILES)
    for p in flags.PROFILES:
        assert f"summary {p}: 1 held, 0 failed, 0 unknown (" in out
    assert "skipped: the --unbounded levels of kvbm-offload and radix" in out


def test_every_encoding_has_a_runner_and_nothing_else_does() -> None:
    assert set(cli_prove.RUNNERS) == set(flags.PROFILES)


def test_an_unknown_says_it_timed_out_and_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = session.check

    def gives_up(name: str, tr: session.Transition, n: int, timeout_ms: int | None = None) -> session.SessionProof:
        p = real(name, tr, n, timeout_ms)
        return dataclasses.replace(p, proven=False, unknown=True, seconds=7.5) if name == "evict_all" else p

    monkeypatch.setattr(session, "check", gives_up)
    assert main(["--profile", "session", "--timeout", "7"]) == summary.EXIT_UNKNOWN
    out = capsys.readouterr().out
    assert "unknown (timeout after 7 s)" in out
    assert "summary session: 7 held, 0 failed, 1 unknown" in out  # 3 fence rows, 4 progress rows


def test_a_contract_narrowing_the_offload_use_fails_prove(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "No slot is reserved" on use(full) removes no rule case and no named
    case (SANITY-* pass), but the Use never happens while a swap-in has
    reserved a slot: REACHABLE fails, naming the transition and the case."""

    def narrowed(state: Any, *args: Any, **kw: Any) -> Any:
        step = use_full(state, *args, **kw)
        step.require("ASSUME-NO-RESERVED", "contract", z3.And([st != RESERVED for st in state.st]))
        return step

    table = [dataclasses.replace(t, fn=narrowed) if t.name == "use(full)" else t for t in catalogue.TRANSITIONS]
    monkeypatch.setattr(catalogue, "TRANSITIONS", table)
    for mod in ("prover", "offload.reach", "offload.narrowing"):
        monkeypatch.setattr(f"kvspec.reference.smt.{mod}.TRANSITIONS", table)
    code = main(["--profile", "kvbm-offload", "--slots", "3", "--hashes", "4", "--no-operations"])
    out = capsys.readouterr().out
    assert code == summary.EXIT_FAILED
    lines = out.splitlines()
    assert all(" FAILED" not in ln for ln in lines if ln.startswith("SANITY-"))
    assert any(ln.startswith("REACHABLE") and "FAILED" in ln for ln in lines)
    assert "use(full): not reached from the initial state within 9 steps" in out
    assert "with swapin_register enabled" in out


def _vacuity_table() -> dict[str, str]:
    """INVARIANTS.md's "Vacuity by construction" table: profile cell -> REACHABLE cell, step or operation rows."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "kvspec" / "spec" / "INVARIANTS.md").read_text()
    section = text.split("## Vacuity by construction", 1)[1].split("\n## ", 1)[0]
    out: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        # a profile's first row is its default level (what ``kvspec prove --profile P`` runs)
        if len(cells) == 4 and cells[0].startswith("`") and cells[1].split(",")[0] in ("step", "operation"):
            for name in cells[0].replace("`", "").split(", "):
                out.setdefault(name, cells[2])
    return out


@pytest.mark.parametrize("profile", ["paged", "session", "vllm"])
def test_the_vacuity_table_says_what_the_command_prints(profile: str, whole_prove: ProveOutput) -> None:
    """What ``kvspec prove --profile P`` prints, read from the whole ``kvspec prove`` (tests/conftest.py
    ``whole_prove``: it prints each profile's rows as ``--profile P`` does), which exited 0."""
    table = _vacuity_table()
    assert set(table) == set(flags.PROFILES)
    assert whole_prove.code == 0, whole_prove.stdout[-6000:] + whole_prove.stderr[-3000:]
    prints = any(ln.startswith("REACHABLE ") for ln in whole_prove.section(profile).splitlines())
    assert table[profile].startswith("yes") == prints


def test_the_whole_runs_output_is_read_back_per_profile() -> None:
    """``ProveOutput`` (how the tests read the one whole ``kvspec prove`` they share): a profile's rows
    run from its first title to the next profile's title, or to the summaries; its summary line."""
    out = ProveOutput(
        0,
        "kvspec prove: every profile\n\nkvspec prove --profile paged: a\nROW-P1  proven\n"
        "kvspec prove --profile paged: b\nROW-P2  proven\n\nkvspec prove --profile vllm: c\nROW-V  proven\n\n"
        "summary paged: 2 held, 0 failed, 0 unknown (1.00 s)\nsummary vllm: 1 held, 0 failed, 0 unknown (1.00 s)\n",
        "",
    )
    paged, vllm = out.section("paged"), out.section("vllm")
    assert "ROW-P1" in paged and "ROW-P2" in paged and "ROW-V" not in paged
    assert "ROW-V" in vllm and "summary" not in vllm and "ROW-P" not in vllm
    assert out.summary("vllm") == "summary vllm: 1 held, 0 failed, 0 unknown (1.00 s)"
    with pytest.raises(KeyError, match="no rows of radix"):
        out.section("radix")
    with pytest.raises(KeyError, match="no summary of radix"):
        out.summary("radix")
