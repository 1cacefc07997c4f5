"""The inductive proofs: every invariant and lemma holds initially and is
kept by every transition, at a small bound in detail and at the default
bound through ``kvspec prove`` (the CLI runs in CI this way)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvspec.cli import main as kvspec_main
from kvspec.reference.smt.cli.flags import PROFILES
from kvspec.reference.smt.cli.prove_output import ProveOutput
from kvspec.reference.smt.offload.invariants import ALL_PROPERTIES, INVARIANTS, by_id
from kvspec.reference.smt.prover import check_enabled, check_rules_reachable, prove
from kvspec.reference.smt.universe import Bound
from kvspec.spec.rules import RULES, Concern

SMALL = Bound(3, 5)
ROOT = Path(__file__).resolve().parents[1]


def test_every_invariant_id_of_the_catalogue_is_proven_here() -> None:
    catalogue = {str(r.id) for r in RULES.values() if r.concern == Concern.INVARIANT}
    # the allocator-level invariants have their own encodings (tests/test_manager_profiles.py)
    catalogue -= {"INV-PAGED-REFS", "INV-SESSION-FENCE", "INV-VLLM-COPIES"}
    # the block-level profiles without offload (tests/test_smt_profiles.py)
    catalogue -= {"INV-KVBM-ANNOUNCED", "INV-LEGACY-ANNOUNCED", "INV-ATOMIC-NO-HALF", "INV-ATOMIC-ANCHOR"}
    # the radix profile's invariants are proven by its own encoding (tests/test_smt_radix.py)
    catalogue -= {c for c in catalogue if c.startswith("INV-RADIX-")}
    # the vllm owner safety is proven by the vllm operation encoding (tests/test_smt_vllm_ops.py)
    catalogue -= {"INV-VLLM-OWNER-SAFE"}
    # eviction order, model = encoding, binding and progress have their own checks
    # (tests/test_smt_order.py, tests/test_smt_equivalence.py)
    catalogue -= {c for c in catalogue if c.startswith(("ORDER-", "EQUIV-", "BIND-", "PROGRESS-"))}
    assert catalogue == {str(p.id) for p in INVARIANTS}


def test_all_proven_at_a_small_bound() -> None:
    results = prove(SMALL)
    assert [r.property_id for r in results] == [p.id for p in ALL_PROPERTIES]
    bad = [r.counterexample.render() if r.counterexample else r.property_id for r in results if not r.proven]
    assert not bad, "\n\n".join(bad)


def test_symmetry_reduction_loses_nothing() -> None:
    """Fixing the chosen slots (and G2 victim) by symmetry proves the same as
    leaving every choice free."""
    free = prove(SMALL, symmetry=False)
    assert all(r.proven for r in free)
    from kvspec.reference.smt.offload.mutants import mutant

    for name in ("release-at-enqueue", "swapin-registers-present"):
        m = mutant(name)
        reduced = prove(SMALL, props=[by_id(m.expect)], applier=m.applier, symmetry=True)[0]
        unreduced = prove(SMALL, props=[by_id(m.expect)], applier=m.applier, symmetry=False)[0]
        assert not reduced.proven and not unreduced.proven


def test_no_valid_operation_lacks_a_successor_and_every_rule_fires() -> None:
    assert check_enabled(SMALL) == []
    assert check_rules_reachable(SMALL) == []


@pytest.mark.parametrize(
    ("prop", "lemma"),
    [
        ("INV-ROUTER-MATCH", "INV-NO-DUP"),
        ("INV-ANCHOR", "LEMMA-SWAPIN-PARENT-HELD"),
        ("INV-ANCHOR", "LEMMA-ONBOARD-ANCHOR"),
        ("INV-CONSERVE", "INV-OWNERS"),
    ],
)
def test_strengthening_lemma_is_needed(prop: str, lemma: str) -> None:
    """Without the lemma in the inductive hypothesis the invariant is not
    inductive (spec/INVARIANTS.md lists these)."""
    without = [p for p in ALL_PROPERTIES if str(p.id) != lemma]
    r = prove(SMALL, props=[by_id(prop)], assume=without)[0]
    assert not r.proven and r.counterexample is not None
    assert prove(SMALL, props=[by_id(prop)])[0].proven


def test_only_the_anchor_needs_the_caller_contracts() -> None:
    """Without ASSUME-* every invariant but INV-ANCHOR (and the lemmas about
    the swap-in's parent it rests on) is still inductive."""
    from kvspec.reference.smt.prover import contract_free

    free = contract_free(SMALL)
    needs = {str(p.id) for p in ALL_PROPERTIES} - free
    assert needs == {"INV-ANCHOR", "LEMMA-SWAPIN-PARENT-HELD", "LEMMA-ONBOARD-ANCHOR"}


def test_a_lone_invariant_can_fail_to_be_inductive() -> None:
    """INV-ANCHOR assumed alone is not inductive: the prover finds a pre-state
    where a swap-in's parent is gone, which the lemmas rule out."""
    r = prove(SMALL, props=[by_id("INV-ANCHOR")], assume=[by_id("INV-ANCHOR")])[0]
    assert not r.proven and r.counterexample is not None
    assert r.counterexample.transition in ("swapin_register", "use(full)", "promote")


def test_kvspec_prove_at_the_default_bound(whole_prove: ProveOutput) -> None:
    """``kvspec prove`` as CI runs it: every profile at its default level, in a child process (z3's
    search in this worker would depend on what the worker built before; tests/conftest.py
    ``whole_prove``, the one run other tests of the default rows read too). It exits 0 only if
    every row of every profile held (``make test`` has no separate prove gate: this is that run),
    and the kvbm-offload rows are the ones below."""
    proc = whole_prove
    assert proc.code == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    for profile in PROFILES:
        assert re.search(rf"^summary {profile}: \d+ held, 0 failed, 0 unknown", proc.stdout, re.M), profile
    out = proc.stdout.split("kvspec prove --profile kvbm-offload:", 1)[1].split("\nkvspec prove --profile ", 1)[0]
    assert "8 slots, 12 hashes" in out
    for p in ALL_PROPERTIES:
        line = next(ln for ln in out.splitlines() if ln.startswith(str(p.id) + " "))
        assert " proven " in line
    assert "SANITY-ENABLED" in out and "SANITY-CASES" in out and "FAILED" not in out
    # the operation level: every property again, for whole operations
    ops = [ln for ln in out.splitlines() if "operation: 3 slots, 5 hashes, batches <= 3" in ln]
    for p in ALL_PROPERTIES:
        assert any(ln.startswith(str(p.id) + " ") and " proven " in ln for ln in ops), p.id
    assert any(ln.startswith("SANITY-OPERATIONS") and " ok " in ln for ln in ops)
    # the shared G3 tier of several workers (smt/tiers/shared.py)
    tier = [ln for ln in out.splitlines() if "2 workers, 4 hashes, G3 3" in ln]
    assert any(ln.startswith("TIER-ADMIT ") and " proven " in ln for ln in tier)
    assert any(ln.startswith("TIER-DEDUP ") and " proven " in ln for ln in tier)
    assert sum(ln.startswith("mutant ") and " refuted " in ln for ln in tier) == 3
    # INVARIANTS.md's tables say what this run printed (smt/cli/doc_tables.py)
    from kvspec.reference.smt.cli.doc_tables import DOC, problems

    assert problems(DOC.read_text(), proc.stdout) == []


def test_kvspec_prove_reports_a_mutant_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    code = kvspec_main(
        [
            "prove",
            "--slots",
            "3",
            "--hashes",
            "4",
            "--mutant",
            "device-removed-at-completion",
            "--invariant",
            "INV-ROUTER-MATCH",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "counterexample" in out and "COUNTEREXAMPLE to INV-ROUTER-MATCH" in out
    assert "pre-state" in out and "transition:" in out and "post-state" in out


def test_kvspec_prove_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvspec_main(["prove", "--slots", "0"]) == 2
    assert kvspec_main(["prove", "--invariant", "INV-NOPE"]) == 2
    assert "unknown invariant" in capsys.readouterr().err


# ------------------------------------------------- contracts and narrowing


def test_a_contract_is_filed_only_under_its_own_new_id() -> None:
    """EncodedStep.require never re-files a contract under an existing name, nor a
    validity condition as a contract (the narrowing would hide inside it)."""
    import z3

    from kvspec.reference.smt.offload.step import ContractError, EncodedStep

    step = EncodedStep("x", None, None)  # type: ignore[arg-type]
    step.require("DEREF-UNKNOWN", "valid", z3.Bool("a"))
    step.require("ASSUME-X", "contract", z3.Bool("b"))
    with pytest.raises(ContractError, match="already required"):
        step.require("ASSUME-X", "contract", z3.Bool("c"))
    with pytest.raises(ContractError, match="own id"):
        step.require("DEREF-UNKNOWN", "contract", z3.Bool("c"))
    with pytest.raises(ContractError, match="is a contract id"):
        step.require("ASSUME-X", "valid", z3.Bool("c"))
    with pytest.raises(ContractError, match="cannot add"):
        step.require("DEREF-UNKNOWN", "choice", z3.Bool("c"))
    step.require("DEREF-UNKNOWN", "valid", z3.Bool("d"))  # same rule, same category: conjoined
    assert step.requires["DEREF-UNKNOWN"][0] == "valid" and step.contracts() == {"ASSUME-X": z3.Bool("b")}


def _narrowed(spec, state, prefix, policy, *, symmetry=False):
    """The rules with one more contract: a Deref never drops a block's last
    owner. Every invariant stays provable: the narrowing is silent there."""
    from kvspec.reference.smt.prover import default_applier
    from kvspec.reference.smt.terms import sel

    step, consts, doms = default_applier(spec, state, prefix, policy, symmetry=symmetry)
    if spec.name == "deref(full)":
        step.require("ASSUME-DEREF-KEEPS-AN-OWNER", "contract", sel(state.own, step.params["t"]) >= 2)
    return step, consts, doms


def test_a_narrowing_contract_passes_the_proofs_and_fails_the_case_check() -> None:
    from kvspec.reference.smt.offload.narrowing import check_cases

    assert all(r.proven for r in prove(SMALL, applier=_narrowed))
    assert check_enabled(SMALL, applier=_narrowed) == []
    assert check_rules_reachable(SMALL, applier=_narrowed) == []  # DEREF-OWNER's guard is True
    found = check_cases(SMALL, applier=_narrowed)
    assert found and all(p.startswith("deref(full): case the last owner goes") for p in found), found
    assert check_cases(SMALL) == []


# ----------------------------------------------------- operation level


def test_operation_level_proofs_at_a_small_bound() -> None:
    from kvspec.reference.smt.offload.operations_prove import check_operations_enabled, prove_operations

    results = prove_operations(Bound(3, 4), 2)
    bad = [f"{r.operation} {r.property_id}\n{r.counterexample}" for r in results if not r.proven]
    assert not bad, "\n\n".join(bad)
    ops = {r.operation for r in results}
    assert {"use[FF]", "use[PF]", "deref[FP]", "promote", "swap_in[FF]", "tick[offload]", "tick[swap_in job]"} <= ops
    assert check_operations_enabled(Bound(3, 4), 2) == []


def test_the_operation_level_proof_sees_the_uses_one_stored() -> None:
    """Without USE-VALIDATE a batch may name a block twice: it stores it,
    then reuses it, and the Use's one Stored names the block itself as its
    parent. No one-block step does that; the operation-level proof finds it."""
    from kvspec.reference.smt.offload.operations_prove import prove_operations

    results = prove_operations(Bound(3, 4), 3, operations=["use"], use_validate=False)
    broken = {r.property_id for r in results if not r.proven}
    assert "INV-ANCHOR" in broken
    cex = next(r.counterexample for r in results if r.property_id == "INV-ANCHOR" and not r.proven)
    assert cex is not None and "operation: use[" in cex


def test_kvspec_prove_sanity_also_runs_under_a_mutant(capsys: pytest.CaptureFixture[str]) -> None:
    """The sanity checks run under ``--mutant`` too: this mutant's lookup never
    finds a present block, so besides breaking INV-NO-DUP it removes the
    SWAPIN-SKIP-PRESENT branch, and the sanity check says so."""
    code = kvspec_main(
        ["prove", "--slots", "3", "--hashes", "4", "--mutant", "swapin-registers-present", "--invariant", "INV-NO-DUP"]
    )
    out = capsys.readouterr().out
    assert code == 1
    rows = {ln.split()[0]: ln.split()[1] for ln in out.splitlines() if ln.startswith("SANITY-")}
    assert rows == {"SANITY-ENABLED": "ok", "SANITY-RULES-FIRE": "FAILED", "SANITY-CASES": "FAILED"}
    assert "sanity check failed: swapin_register: rule SWAPIN-SKIP-PRESENT never fires" in out
