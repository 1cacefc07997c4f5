"""A declared deviation of a paged manager is contained to its cause: the
manager lockstep follows it (``conformance/managers/follow.py``), checks every
rule afterwards, and still catches a bug outside the declared cause.

The port is ``adapters/declared/paged_write_in_place`` (the paged reference
with the ferrum seed's write into a shared block, declared once under
PAGED-COW), with mutants of ``adapters/manager_mutants`` planted under it, and
the Rust port's own ``write_in_place`` variant (``adapters/paged_rust``)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kvspec.adapters.declared.managers import declared_manager
from kvspec.adapters.manager_mutants.bugs import PAGED_BUGS
from kvspec.conformance.managers.interface import ManagerImplementation
from kvspec.conformance.managers.lockstep import ManagerLockstep, open_manager, paged_configs, paged_ops
from kvspec.conformance.run.manifest import load_impl
from kvspec.conformance.verdicts.failures import ConformanceFailure, DeviationNotFollowed
from kvspec.spec.deviations import Deviation, Scope, Site
from kvspec.spec.manager_wire import (
    PAGED_OP_ADAPTER,
    ManagerOp,
    ManagerOutcome,
    PagedAllocate,
    PagedConfig,
    PagedExtend,
    PagedFork,
    PagedFree,
    PagedOp,
    PagedWrite,
)
from kvspec.spec.rules import RuleId

CONFIG = PagedConfig(device_blocks=4, host_blocks=0, block_size=2, max_prefixes=0)
IN_PLACE = Deviation(rule=RuleId.PAGED_COW, reason="ferrum write_kv", scope=Scope(conditions=["write_in_place"]))
#: s1 shares s0's two blocks; the write is the departure (no copy); then free and extend see the difference
OPS: list[PagedOp] = [
    PagedAllocate(seq="s0", tokens=4),
    PagedFork(src="s0", dst="s1"),
    PagedWrite(seq="s1", position=0, value=7),
    PagedFree(seq="s1"),
    PagedExtend(seq="s0", tokens=4),
]


def drive(
    impl: ManagerImplementation, ops: Sequence[ManagerOp], deviations: Sequence[Deviation]
) -> tuple[ManagerLockstep, list[tuple[int, Site]]]:
    seen: list[tuple[int, Site]] = []
    ls = ManagerLockstep(impl, CONFIG, deviations, lambda i, site: seen.append((i, site)))
    for op in ops:
        ls.step(op)
    return ls, seen


def test_a_declared_write_in_place_is_followed_and_every_later_step_agrees() -> None:
    ls, seen = drive(declared_manager("paged_write_in_place", CONFIG), OPS, [IN_PLACE])
    assert ls.followed == [(2, "write_in_place")]
    assert [(i, s.rule, s.conditions) for i, s in seen] == [(0, RuleId.PAGED_COW, frozenset({"write_in_place"}))]
    # the model took the port's state: s0 reads the value written through s1, and no copy was taken
    model_state = ls.model.snapshot()  # type: ignore[union-attr]
    assert model_state.sequences["s0"].data[0] == 7
    assert model_state.free_device == 0


def test_without_following_the_departure_surfaces_under_another_rule() -> None:
    """What following prevents: the spec model kept after the write expects a
    copy, so the port's free counts differ at the next free (PAGED-FREE)."""
    impl = declared_manager("paged_write_in_place", CONFIG)
    ls = ManagerLockstep(impl, CONFIG)
    ls.step(OPS[0])
    ls.step(OPS[1])
    with pytest.raises(ConformanceFailure):
        ls.step(OPS[2])
    impl2 = declared_manager("paged_write_in_place", CONFIG)
    ls2 = ManagerLockstep(impl2, CONFIG)
    ls2.step(OPS[0])
    ls2.step(OPS[1])
    ls2.model.write_in_place = True  # type: ignore[union-attr]
    ls2.step(OPS[2])
    ls2.model.write_in_place = False  # type: ignore[union-attr]
    ls2.step(OPS[3])
    ls2.step(OPS[4])  # the followed state also predicts the extend's capacity


def test_the_same_port_undeclared_fails_and_names_the_condition_to_declare() -> None:
    with pytest.raises(ConformanceFailure) as ei:
        drive(declared_manager("paged_write_in_place", CONFIG), OPS, [])
    assert not isinstance(ei.value, DeviationNotFollowed)
    assert ei.value.rule == RuleId.PAGED_COW
    assert ei.value.site.conditions == {"write_in_place"}
    assert "declare it" in ei.value.report


def test_a_bug_after_the_followed_departure_fails_under_its_own_rule() -> None:
    """free_ignores_holders under the departure: the free after the followed
    write returns blocks s0 still holds; named PAGED-REFCOUNT, not excused."""
    impl = declared_manager("paged_write_in_place", CONFIG, bug="free_ignores_holders")
    seen: list[tuple[int, Site]] = []
    ls = ManagerLockstep(impl, CONFIG, [IN_PLACE], lambda i, site: seen.append((i, site)))
    for op in OPS[:3]:
        ls.step(op)
    assert ls.followed == [(2, "write_in_place")]
    with pytest.raises(ConformanceFailure) as ei:
        ls.step(OPS[3])
    assert not isinstance(ei.value, DeviationNotFollowed)
    assert ei.value.rule == RuleId.PAGED_REFCOUNT
    assert "followed after declared deviations: step 3 write_in_place" in ei.value.report


class _WrongValue(ManagerImplementation):
    """The departure plus a wrong value in the same step: no mode reproduces it."""

    def __init__(self) -> None:
        self.inner = declared_manager("paged_write_in_place", CONFIG)

    def step(self, op: ManagerOp) -> ManagerOutcome:
        out = self.inner.step(op)
        if isinstance(op, PagedWrite):
            return out.model_copy(update={"value": 5})
        return out


def test_a_bug_in_the_departing_step_is_not_hidden_by_the_narrow_declaration() -> None:
    with pytest.raises(ConformanceFailure) as ei:
        drive(_WrongValue(), OPS, [IN_PLACE])
    assert not isinstance(ei.value, DeviationNotFollowed)
    assert ei.value.rule == RuleId.PAGED_COW
    assert "write_in_place" not in ei.value.site.conditions


def test_a_covered_difference_nothing_follows_fails_the_run() -> None:
    """A rule-wide PAGED-COW declaration covers the step, but no follow mode
    reproduces it: DeviationNotFollowed, never a silently kept model."""
    whole = Deviation(rule=RuleId.PAGED_COW, reason="rule-wide, for the test", scope="all")
    with pytest.raises(DeviationNotFollowed) as ei:
        drive(_WrongValue(), OPS, [whole])
    assert ei.value.rule == RuleId.PAGED_COW
    assert "no follow mode of the model reproduces" in ei.value.report


def test_the_spec_port_is_not_taken_for_the_departure() -> None:
    ls, seen = drive(declared_manager(None, CONFIG), OPS, [IN_PLACE])
    assert ls.followed == [] and seen == []


# ----------------------------------------------------------------- drawn traffic

TRAFFIC = settings(
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


#: the suite's paged traffic rarely writes into a shared block (a fork, then a write inside the shared
#: tokens); these runs start with one and draw writes to the forked pair often, so the departure is met
START = [{"op": "allocate", "seq": "s0", "tokens": 4}, {"op": "fork", "src": "s0", "dst": "s1"}]
WRITES = st.fixed_dictionaries(
    {
        "op": st.just("write"),
        "seq": st.sampled_from(("s0", "s1")),
        "position": st.integers(0, 3),
        "value": st.integers(1, 99),
    }
)


def _traffic(open_impl: Any, deviations: Sequence[Deviation]) -> list[str]:
    """Drawn paged traffic against ``open_impl(config)``; the conditions followed."""
    followed: list[str] = []

    @TRAFFIC
    @given(config=paged_configs(), ops=st.lists(st.one_of(paged_ops(), WRITES), min_size=1, max_size=30))
    def run(config: PagedConfig, ops: list[dict[str, Any]]) -> None:
        with open_impl(config) as impl:
            ls = ManagerLockstep(impl, config, deviations)
            for raw in START + ops:
                ls.step(PAGED_OP_ADAPTER.validate_python(raw))
            followed.extend(c for _, c in ls.followed)

    run()
    return followed


def test_the_declared_port_passes_drawn_traffic_with_its_one_declaration() -> None:
    followed = _traffic(lambda c: declared_manager("paged_write_in_place", c), [IN_PLACE])
    assert followed, "the departure was never observed: the test shows nothing"
    assert set(followed) == {"write_in_place"}


#: the declared departure's own path: cow_in_place is the same write; cow_source_kept miscounts the copy
#: a port that writes in place never takes. Neither is a bug beside the cause.
BESIDE = sorted(set(PAGED_BUGS) - {"cow_in_place", "cow_source_kept"})


def _verdict(bug: str, variant: str | None, deviations: Sequence[Deviation]) -> str:
    try:
        _traffic(lambda c: declared_manager(variant, c, bug=bug), deviations)
    except DeviationNotFollowed as e:
        return f"not followed {e.rule}"
    except ConformanceFailure as e:
        return f"killed {e.rule}"
    return "survived"


@pytest.mark.parametrize("bug", BESIDE)
def test_a_mutant_under_the_declared_departure_is_caught_as_without_it(bug: str) -> None:
    """The same traffic, the mutant alone and the mutant under the declared
    departure: the declaration hides nothing (a kill stays a kill, under a
    rule other than the declared one)."""
    alone = _verdict(bug, None, [])
    declared = _verdict(bug, "paged_write_in_place", [IN_PLACE])
    assert (declared == "survived") == (alone == "survived"), (alone, declared)
    assert declared == "survived" or (declared.startswith("killed") and "PAGED-COW" not in declared), declared


def test_the_drawn_traffic_kills_most_mutants_under_the_departure() -> None:
    """So that the equality above is not two survivals throughout."""
    killed = [b for b in BESIDE if _verdict(b, "paged_write_in_place", [IN_PLACE]).startswith("killed")]
    assert len(killed) >= 3, killed


@pytest.mark.skipif(shutil.which("rustc") is None, reason="rustc is not installed: the Rust port cannot be built")
def test_the_rust_ports_write_in_place_passes_with_the_declaration() -> None:
    """The Rust port of ferrum's manager with the seed's write_kv
    (``paged_rust/write_in_place``, a mutant without a declaration): declared
    once here, the lockstep follows it and the run passes."""
    adapter_dir, manifest = load_impl("adapters/paged_rust/write_in_place")
    followed = _traffic(lambda c: open_manager(manifest, adapter_dir, c), [IN_PLACE])
    assert followed and set(followed) == {"write_in_place"}
