"""The radix profile's z3 encoding: INV-RADIX-* proven, not vacuous, every
mutant refuted, and the encoding bound to ``reference/radix.py`` by sampled
operation sequences (``kvspec prove --profile radix``)."""

from __future__ import annotations

import pytest
import z3

from kvspec.reference.smt.cli.prove import main
from kvspec.reference.smt.radix import encoding as radix_encoding
from kvspec.reference.smt.radix import steps as profile_radix
from kvspec.reference.smt.radix.agreement import Disagreement, Replayer, catches, check_agreement
from kvspec.reference.smt.radix.encoding import INVARIANTS, ROOT, RadixBound, RadixTransition, RState
from kvspec.reference.smt.radix.steps import LEMMA_ID, MUTANTS, prove_radix, refute, sanity
from kvspec.spec.radix_wire import RadixInsert, RadixLock, RadixMatch, RadixOp, RadixRequest
from kvspec.spec.rules import RULES, Concern

SMALL = RadixBound(pages=4, handles=2)


def test_every_radix_invariant_of_the_catalogue_is_encoded() -> None:
    assert set(EXPECTED_BREAKS) == set(MUTANTS)
    catalogue = {str(r.id) for r in RULES.values() if r.concern == Concern.INVARIANT}
    assert {c for c in catalogue if c.startswith("INV-RADIX-")} == {str(i) for i in INVARIANTS}


def test_all_proven_at_a_small_bound() -> None:
    results = prove_radix(SMALL)
    assert [r.property_id for r in results] == [
        "INV-RADIX-TREE",
        "INV-RADIX-ANCHOR",
        "INV-RADIX-NO-DUP",
        "INV-RADIX-RUN",
        "INV-RADIX-LOCKS",
        "INV-RADIX-ROUTER",
        "INV-RADIX-CAPACITY",
        LEMMA_ID,
    ]
    assert [r.property_id for r in results if r.verdict != "proven"] == []


def test_sanity_every_step_and_case_is_possible() -> None:
    assert sanity(SMALL) == []


def test_a_narrowed_step_fails_the_sanity_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """An insert quietly restricted to hang leaves under pages only (never under
    the root) still proves every invariant; the case check is what notices."""
    real = radix_encoding.add_head

    def narrowed(S: RState, tw: frozenset[str]) -> RadixTransition:
        step = real(S, tw)
        step.requires.append(z3.Int("in_e") != ROOT)
        return step

    monkeypatch.setitem(radix_encoding.STEPS, "add_head", narrowed)
    assert all(r.verdict == "proven" for r in prove_radix(RadixBound(pages=3, handles=1)))
    assert sanity(SMALL) == ["radix add_head: the case 'under the root' is never possible"]


def test_the_invariants_are_not_trivially_true() -> None:
    """Each invariant on its own rules out some state the others allow."""
    for name, inv in INVARIANTS.items():
        S = RState.fresh(SMALL, "v_")
        s = z3.Solver()
        s.add(*[f(S) for n, f in INVARIANTS.items() if n != name], z3.Not(inv(S)))
        assert s.check() == z3.sat, name


#: each mutant and the invariant its counterexample breaks
EXPECTED_BREAKS = {
    "evict-locked": "INV-RADIX-LOCKS",
    "evict-inner": "INV-RADIX-ANCHOR",
    "insert-restores-page": "INV-RADIX-NO-DUP",
    "insert-republishes-prefix": "INV-RADIX-ROUTER",
    "leaf-under-run": "INV-RADIX-RUN",
    "insert-takes-no-slot": "INV-RADIX-CAPACITY",
    "split-publishes": "INV-RADIX-ROUTER",
    "split-forgets-parent": "INV-RADIX-TREE",
    "split-forgets-lock": "INV-RADIX-LOCKS",
    "lock-node-only": "INV-RADIX-LOCKS",
    "reset-keeps-locks": "INV-RADIX-LOCKS",
    "reset-without-clear": "INV-RADIX-ROUTER",
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_every_mutant_is_refuted_with_a_counterexample(name: str) -> None:
    m = MUTANTS[name]
    assert m.breaks == EXPECTED_BREAKS[name]
    cx = refute(name, SMALL)
    assert cx is not None, f"{name} not refuted"
    assert cx.invariant == m.breaks and f"{m.breaks} fails after {m.step}(" in cx.text
    assert "before:" in cx.text and "after:" in cx.text
    # the unbroken step keeps the invariant from every state: the failure is the mutant's
    good = profile_radix.STEPS[m.step](RState.fresh(SMALL, "pre_"), frozenset())
    s = z3.Solver()
    s.add(*radix_encoding.all_invariants(good.pre), *good.requires, z3.Not(INVARIANTS[m.breaks](good.post)))
    assert s.check() == z3.unsat


def test_sanity_runs_in_mutant_mode_too() -> None:
    for name in ("evict-locked", "split-publishes"):
        assert sanity(SMALL, frozenset({name})) == []


def test_encoding_agrees_with_the_model_on_sampled_sequences() -> None:
    run = check_agreement(sequences=8, length=12, seed=1)
    assert run.operations == 120 and run.steps > run.operations  # 8 sequences and 2 aimed at locked splits


def test_agreement_replays_a_split_lock_and_request_by_hand() -> None:
    r = Replayer(page=2, pages=6)
    ops: list[RadixOp] = [
        RadixInsert(tokens=[1, 1, 2, 2, 3, 3]),
        RadixLock(name="a", tokens=[1, 1, 2, 2]),  # splits the node before its third page
        RadixMatch(tokens=[1, 1, 5, 5]),  # splits again, after the first page
        RadixRequest(prompt=[1, 1, 2, 2, 4, 4, 9], output=[1, 2]),
    ]
    for op in ops:
        r.apply(op)
    names = [t.split("(")[0] for t in r.trace if not t.startswith("--")]
    assert names.count("split") == 2 and "lock" in names and "unlock" in names and "add_head" in names
    assert sum(r.enc.live) == 5 and r.enc.held[0]  # 11|22|33 and the request's 44|91


@pytest.mark.parametrize("name", sorted(n for n, m in MUTANTS.items() if m.agreement))
def test_the_agreement_catches_every_mutant_that_changes_a_successor(name: str) -> None:
    found = catches(name, sequences=20)
    assert found is not None and 1 <= found.operations <= 300  # 20 sequences and 5 aimed ones


def test_a_guard_the_model_needs_is_caught_by_the_agreement(monkeypatch: pytest.MonkeyPatch) -> None:
    """An encoding that forbids a step the model takes (evicting a node's first
    page) disagrees with the model."""
    real = radix_encoding.evict

    def strict(S: RState, tw: frozenset[str]) -> RadixTransition:
        step = real(S, tw)
        step.requires.append(radix_encoding.sel_b(S.head, z3.Int("in_t"), True) == False)  # noqa: E712
        return step

    monkeypatch.setitem(radix_encoding.STEPS, "evict", strict)
    with pytest.raises(Disagreement, match="which the encoding does not allow"):
        check_agreement(sequences=20, seed=0)


def test_cli_radix_mutant_prints_its_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "radix", "--mutant", "evict-locked"]) == 1
    out = capsys.readouterr().out
    assert "MUTANT evict-locked" in out and "INV-RADIX-LOCKS fails after evict(" in out
    assert "SANITY-RADIX" in out and "ok" in out


def test_cli_refuses_a_mutant_of_another_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "radix", "--mutant", "release-at-enqueue"]) == 2
    assert main(["--mutant", "evict-locked"]) == 2
    err = capsys.readouterr().err
    assert (
        "the radix profile has no mutant 'release-at-enqueue'" in err
        and "evict-locked is a mutant of --profile radix" in err
    )
