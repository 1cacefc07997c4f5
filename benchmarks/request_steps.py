"""Request-level steps per second: in-process versus through protocol version 2.

A step is one request-level call as the request-level layer makes it
(``transport.engine.EngineImplementation``): an ``add_request`` or an engine
``step``, its ``EngineOutcome`` validated, finished requests collected. The
same driver runs against four engines, so only the way the call travels
differs:

- ``reference in-process``: the reference engine (``reference.requests``,
  ``adapters/reference_jsonl/engine_session.py``) called directly, its
  outcome still validated from JSON as the transports do;
- ``reference_jsonl (v2, JSON lines)``: the same engine in a child process,
  one line each way per call;
- ``vllm_c_port (v2, FFI in-process)``: the C port through ctypes;
- ``vllm_c_port (v2, host process)``: the C port in its host process
  (the default isolation), JSON lines to the host and ctypes inside it.

Two workloads of traffic-shaped requests (a tree of shared prefixes, prompts
on and off block boundaries, 4 to 24 generated tokens) on a pool of 64
blocks of 16 tokens with a host tier of 32: ``sequential`` (one request
after another, as the differential runs them) and ``concurrent`` (all in
flight, as the protocol checks run them). Every engine takes exactly the
same number of calls (checked). Prints the median of 5 runs per (workload,
engine) and the ratio to in-process; the last line is the JSON-lines rate
on the sequential workload.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kvspec.adapters.reference_jsonl.engine_session import EngineSession
from kvspec.adapters.reference_requests.adapter import ReferenceRequests
from kvspec.conformance.requests.workloads import setup_of
from kvspec.conformance.run.manifest import load_manifest
from kvspec.conformance.transport.engine import (
    EngineCaller,
    EngineImplementation,
    engine_config,
    open_engine_implementation,
)
from kvspec.reference.requests import PoolSetup, RequestSpec
from kvspec.spec.engine_wire import EngineOp, EngineOutcome

ROOT = Path(__file__).resolve().parent.parent
JSONL = ROOT / "adapters" / "reference_jsonl"
PORT = ROOT / "adapters" / "vllm_c_port"
RUNS = 5
BLOCK_SIZE = 16
SETUP = setup_of(64, BLOCK_SIZE, host_blocks=32)


def traffic(n: int, seed: int = 11) -> list[RequestSpec]:
    rng = random.Random(seed)
    trunks = [[rng.randrange(1, 50_000) for _ in range(rng.randint(1, 4) * BLOCK_SIZE)] for _ in range(6)]
    out = []
    for _ in range(n):
        trunk = rng.choice(trunks)
        tail = [rng.randrange(1, 50_000) for _ in range(rng.randint(0, 2 * BLOCK_SIZE))]
        out.append(RequestSpec(prompt=trunk + tail or [1], max_tokens=rng.randint(4, 24)))
    return out


class Counting:
    """Counts the calls that reach an engine."""

    def __init__(self, inner: EngineCaller) -> None:
        self.inner = inner
        self.calls = 0

    def engine_call(self, op: EngineOp) -> EngineOutcome:
        self.calls += 1
        return self.inner.engine_call(op)

    def close(self) -> None:
        self.inner.close()


class InProcess:
    """The reference engine called directly; its outcome crosses JSON as on a transport."""

    def __init__(self, setup: PoolSetup) -> None:
        self.session = EngineSession(setup.manager, engine_config(setup))

    def engine_call(self, op: EngineOp) -> EngineOutcome:
        return EngineOutcome.model_validate_json(self.session.apply(op).model_dump_json(exclude_none=True))

    def close(self) -> None:
        pass


def time_no_messages(reqs: list[RequestSpec], concurrent: bool) -> float:
    impl = ReferenceRequests(SETUP, load_manifest(ROOT / "adapters" / "reference_requests"))
    t0 = time.perf_counter()
    if concurrent:
        impl.run_concurrent(reqs)
    else:
        impl.run_sequential(reqs)
    return time.perf_counter() - t0


def opener(kind: str) -> Callable[[PoolSetup], EngineImplementation]:
    if kind == "inprocess":
        manifest = load_manifest(JSONL)
        return lambda s: EngineImplementation(manifest, s, InProcess(s))
    if kind == "jsonl":
        return lambda s: open_engine_implementation(load_manifest(JSONL), JSONL, s)
    port = load_manifest(PORT)
    if kind == "ffi":
        port = port.model_copy(update={"start": port.start.model_copy(update={"isolation": "inprocess"})})
    return lambda s: open_engine_implementation(port, PORT, s)


def timed(
    open_impl: Callable[[PoolSetup], EngineImplementation], reqs: list[RequestSpec], concurrent: bool
) -> tuple[float, int]:
    impl = open_impl(SETUP)
    counter = Counting(impl.caller)
    impl.caller = counter
    try:
        impl.run_sequential(reqs[:1])  # started and warm before the clock starts
        counter.calls = 0
        t0 = time.perf_counter()
        if concurrent:
            impl.run_concurrent(reqs)
        else:
            impl.run_sequential(reqs)
        return time.perf_counter() - t0, counter.calls
    finally:
        impl.close()


def main() -> int:
    os.environ.setdefault("KVSPEC_BUILD_DIR", str(Path(tempfile.gettempdir()) / f"kvspec-build-{os.getuid()}"))
    engines = {
        "reference in-process": "inprocess",
        "reference_jsonl (v2, JSON lines)": "jsonl",
        "vllm_c_port (v2, FFI in-process)": "ffi",
        "vllm_c_port (v2, host process)": "process",
    }
    workloads = {"sequential": (traffic(60), False), "concurrent": (traffic(120, seed=12), True)}
    rates: dict[tuple[str, str], float] = {}
    for wname, (reqs, concurrent) in workloads.items():
        calls_seen: set[int] = set()
        no_messages = statistics.median(time_no_messages(reqs, concurrent) for _ in range(RUNS))
        for label, kind in engines.items():
            open_impl = opener(kind)
            samples = [timed(open_impl, reqs, concurrent) for _ in range(RUNS)]
            calls = samples[0][1]
            calls_seen.update(c for _, c in samples)
            med = statistics.median(t for t, _ in samples)
            rates[(wname, label)] = calls / med
            base = rates[(wname, "reference in-process")]
            print(
                f"{wname:>10} {label:<33} {len(reqs)} requests, {calls} calls: median {med * 1e3:7.1f} ms "
                f"-> {calls / med:9,.0f} steps/s ({calls / med / base:4.2f}x in-process)"
            )
        assert len(calls_seen) == 1, f"engines took different numbers of calls: {sorted(calls_seen)}"
        calls = calls_seen.pop()
        print(
            f"{wname:>10} {'reference_requests (no messages)':<33} {len(reqs)} requests, same work: median "
            f"{no_messages * 1e3:7.1f} ms -> {calls / no_messages:9,.0f} steps/s "
            f"({calls / no_messages / rates[(wname, 'reference in-process')]:4.2f}x in-process)"
        )
    print(f"request_steps: {rates[('sequential', 'reference_jsonl (v2, JSON lines)')]:.0f} steps/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
