"""The request-level mutants (adapters/mutants/request_bugs.py).

- every request-level mutant really is broken: on a directed workload, its
  engine's run breaks the mutant's rule, while the unmutated engine's run of
  the same workload breaks nothing (a no-op mutant would "survive" for the
  wrong reason);
- they are served through protocol version 2: the mutants adapter's request
  level for a request-level mutant (and for ``none``) is the reference
  JSON-lines server started with ``--mutant NAME``; for a block-level mutant
  it is the in-process reference;
- at block level a request-level mutant is the unmutated reference.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.adapters.mutants.catalogue import MUTANTS, make_mutant_model
from kvspec.adapters.mutants.request_bugs import REQUEST_MUTANTS, engine_types, open_request_mutant
from kvspec.adapters.reference_jsonl.engine_session import EngineSession
from kvspec.adapters.reference_requests.adapter import ReferenceRequests
from kvspec.conformance.requests.check import check_run
from kvspec.conformance.requests.reset_check import ResetCheck
from kvspec.conformance.requests.shared_free_check import SharedFreeCheck
from kvspec.conformance.requests.workloads import Workload, seed_workloads, setup_of
from kvspec.conformance.run.manifest import load_manifest
from kvspec.conformance.transport.engine import EngineImplementation, engine_config
from kvspec.conformance.transport.jsonl import JsonlImplementation
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference import make_model
from kvspec.reference.requests import RequestSpec
from kvspec.spec.engine_wire import EngineOp, EngineOutcome
from kvspec.spec.errors import AdapterError, ConfigError
from kvspec.spec.rules import RuleId

ADAPTERS = Path(__file__).resolve().parent.parent / "adapters"
MUTANTS_DIR = ADAPTERS / "mutants"


class ErrorReplyCaller:
    """An EngineSession behind the request-level driver that answers a
    refused operation as the JSON-lines server does: an error the transport
    raises as AdapterError."""

    def __init__(self, session: EngineSession) -> None:
        self.session = session

    def engine_call(self, op: EngineOp) -> EngineOutcome:
        try:
            return self.session.apply(op)
        except ConfigError as e:
            raise AdapterError(f"protocol error to {op.op}: {e}") from None

    def close(self) -> None:
        pass


class InProcessCaller:
    """An EngineSession behind the request-level driver, every outcome sent
    through its JSON form (what the server would write)."""

    def __init__(self, session: EngineSession) -> None:
        self.session = session

    def engine_call(self, op: EngineOp) -> EngineOutcome:
        return EngineOutcome.model_validate_json(self.session.apply(op).model_dump_json())

    def close(self) -> None:
        pass


def run(name: str, w: Workload) -> set[RuleId]:
    driver, model = engine_types(name)
    session = EngineSession(w.setup.manager, engine_config(w.setup), driver_type=driver, model_type=model)
    impl = EngineImplementation(load_manifest(MUTANTS_DIR), w.setup, InProcessCaller(session))
    result = impl.run_concurrent(w.requests) if w.concurrent else impl.run_sequential(w.requests)
    return {f.rule for f in check_run(w, result).findings}


def _w(capacity: int, block_size: int, reqs: list[tuple[list[int], int]], host: int | None = None) -> Workload:
    return Workload(
        setup=setup_of(capacity, block_size, host), requests=[RequestSpec(prompt=p, max_tokens=m) for p, m in reqs]
    )


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


DIRECTED = {
    # a block-aligned prompt, twice: the second may hit one block only, not both
    "prefix_hit_uncapped": _w(6, 4, [(toks(1, 8), 1), (toks(1, 8), 1)]),
    # two-block requests under pressure: parents must go after their leaves
    "free_forward_order": _w(4, 4, [(toks(1, 8), 1), (toks(100, 8), 1), (toks(200, 8), 1)]),
    # a request that must evict to allocate: its Removed comes before its Stored
    "stored_before_removed": _w(2, 4, [(toks(1, 8), 1), (toks(100, 8), 1)]),
    # the host seed workload: write-through batches evicted under pressure
    "host_batch_root_first": seed_workloads()[2],
}


#: mutants of the prefix-cache reset: a workload never resets, the reset check does
RESET = ("reset_no_cleared", "reset_while_held", "reset_keeps_cache")
#: mutants of the free of a shared block: no workload frees one and then needs its slot, the shared-free check does
SHARED_FREE = ("free_keeps_shared",)


def test_every_request_mutant_has_a_directed_workload() -> None:
    assert set(DIRECTED) | set(RESET) | set(SHARED_FREE) == {m.id for m in REQUEST_MUTANTS}


def _reset_check(name: str, dp_rank: int = 0) -> None:
    setup = setup_of(8, 4, dp_rank=dp_rank)
    driver, model = engine_types(name)
    session = EngineSession(setup.manager, engine_config(setup), driver_type=driver, model_type=model)
    impl = EngineImplementation(load_manifest(MUTANTS_DIR), setup, InProcessCaller(session))
    ResetCheck(impl, setup).run()


@pytest.mark.parametrize("dp_rank", [0, 2])
def test_the_reset_check_passes_the_reference(dp_rank: int) -> None:
    _reset_check("none", dp_rank)


@pytest.mark.parametrize("mutant", RESET)
def test_each_reset_mutant_fails_the_reset_check_under_clear_all(mutant: str) -> None:
    with pytest.raises(ConformanceFailure) as ei:
        _reset_check(mutant)
    assert ei.value.rule == RuleId.CLEAR_ALL and MUTANTS[mutant].rule == RuleId.CLEAR_ALL
    assert "calls so far" in ei.value.report


def _shared_free_check(name: str, capacity: int = 8, block_size: int = 4) -> None:
    setup = setup_of(capacity, block_size)
    driver, model = engine_types(name)
    session = EngineSession(setup.manager, engine_config(setup), driver_type=driver, model_type=model)
    impl = EngineImplementation(load_manifest(MUTANTS_DIR), setup, ErrorReplyCaller(session))
    SharedFreeCheck(impl, setup).run()


@pytest.mark.parametrize(("capacity", "block_size"), [(8, 4), (12, 2)])
def test_the_shared_free_check_passes_the_reference(capacity: int, block_size: int) -> None:
    _shared_free_check("none", capacity, block_size)


@pytest.mark.parametrize("mutant", SHARED_FREE)
def test_each_shared_free_mutant_fails_the_shared_free_check_under_deref_owner(mutant: str) -> None:
    with pytest.raises(ConformanceFailure) as ei:
        _shared_free_check(mutant)
    assert ei.value.rule == RuleId.DEREF_OWNER and MUTANTS[mutant].rule == RuleId.DEREF_OWNER
    assert "request c needs every block of the pool" in ei.value.report and "can never be admitted" in ei.value.report
    # the exploration's workloads run clean on it: the check is what catches it
    for w in seed_workloads():
        if w.setup.host_blocks is None:
            assert run(mutant, w) == set(), w.note


@pytest.mark.parametrize("mutant", sorted(DIRECTED))
def test_request_mutant_breaks_its_rule_and_the_reference_does_not(mutant: str) -> None:
    w = DIRECTED[mutant]
    assert run("none", w) == set()
    assert MUTANTS[mutant].rule in run(mutant, w)


@pytest.mark.parametrize("mutant", [m.id for m in REQUEST_MUTANTS])
def test_request_mutant_is_the_reference_at_block_level(mutant: str) -> None:
    m = MUTANTS[mutant]
    assert m.profiles == ("vllm",)
    config = setup_of(4, 2).manager
    assert type(make_mutant_model(mutant, config)) is type(make_model(config))


@pytest.mark.parametrize("variant", [None, "prefix_hit_uncapped"])
def test_request_mutants_and_the_sanity_run_go_through_protocol_v2(variant: str | None) -> None:
    setup = setup_of(6, 4)
    impl = open_request_mutant(setup, load_manifest(MUTANTS_DIR, variant), MUTANTS_DIR, variant=variant)
    try:
        assert isinstance(impl, EngineImplementation)
        child = impl.caller
        assert isinstance(child, JsonlImplementation)
        assert child.ready is not None and child.ready.protocol == 2
        if variant is None:
            assert "--mutant" not in child.argv
        else:
            assert child.argv[-2:] == ["--mutant", variant]
        out = impl.run_sequential([RequestSpec(prompt=toks(1, 8), max_tokens=1)] * 2)
    finally:
        impl.close()
    assert out[1].cached_tokens == (8 if variant == "prefix_hit_uncapped" else 4)


def test_block_level_mutant_runs_the_in_process_reference_at_request_level() -> None:
    impl = open_request_mutant(setup_of(6, 4), load_manifest(MUTANTS_DIR), MUTANTS_DIR, variant="event_id_skip")
    assert isinstance(impl, ReferenceRequests)


def test_unknown_request_mutant_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="unknown request-level mutant 'nope'"):
        engine_types("nope")
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.adapters.reference_jsonl.server", "--mutant", "nope"],
        input=b"",
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert b"unknown request-level mutant 'nope'" in proc.stderr
