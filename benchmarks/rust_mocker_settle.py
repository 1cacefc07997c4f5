"""Does the rust_mocker adapter's split of the event stream into requests
depend on machine load? Runs one seed workload many times against
``adapters/rust_mocker/sglang``, half of them under load: busy-loop
processes on every core (started and killed here) and the engine's process
stopped for 30-80 ms at random moments (SIGSTOP/SIGCONT, what a loaded
machine does to it now and then), and counts the runs whose
per-request event counts differ from the unloaded runs' (events attributed
to the wrong request), the runs with a rule finding, and the runs the
adapter refused as a transport problem (AdapterError).

    python benchmarks/rust_mocker_settle.py [RUNS] [BUSY_PROCESSES]

Last line: ``rust_mocker_settle: N misattributed-or-undeclared of M loaded runs``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
from collections import Counter

from kvspec.conformance.radix.requests import check_radix_run
from kvspec.conformance.requests.api import open_request_implementation
from kvspec.conformance.requests.workloads import seed_workloads
from kvspec.conformance.run.manifest import load_impl
from kvspec.spec.errors import AdapterError

IMPL = "adapters/rust_mocker/sglang"
NOTE = "shared prefix, partial tails"


def _busy(stop_at: float) -> None:
    x = 0
    while time.monotonic() < stop_at:
        x += 1


def _pauser(pid: int, done: threading.Event, seed: int) -> None:
    """Deschedule the engine's process now and then (SIGSTOP for 30-80 ms):
    what a loaded machine does to it, at will rather than by chance."""
    rnd = random.Random(seed)
    while not done.wait(rnd.uniform(0.0, 0.03)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(rnd.uniform(0.03, 0.08))
            os.kill(pid, signal.SIGCONT)


def _one(manifest, adapter_dir, workload, pause: int | None = None):  # type: ignore[no-untyped-def]
    impl = open_request_implementation(manifest, adapter_dir, workload.setup)
    done = threading.Event()
    t = None
    if pause is not None:
        t = threading.Thread(target=_pauser, args=(impl.child_pid, done, pause), daemon=True)
        t.start()
    try:
        outs = impl.run_sequential(workload.requests)
    finally:
        done.set()
        if t is not None:
            t.join()
        impl.close()
    counts = tuple(len(o.events) for o in outs)
    if getattr(impl, "retried", None):
        print(f"rerun after late events: {impl.retried}")
    findings = check_radix_run(workload, outs).findings
    return counts, [f for f in findings if manifest.deviation_for(f.site()) is None]


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    busy = int(sys.argv[2]) if len(sys.argv) > 2 else 2 * (os.cpu_count() or 2)
    adapter_dir, manifest = load_impl(IMPL)
    (workload,) = [w for w in seed_workloads() if w.note.startswith(NOTE)]
    results: dict[bool, list[object]] = {False: [], True: []}
    cpu0 = os.times()
    for i in range(2 * runs):
        loaded = i % 2 == 1
        procs = []
        if loaded:
            stop_at = time.monotonic() + 30
            procs = [multiprocessing.Process(target=_busy, args=(stop_at,), daemon=True) for _ in range(busy)]
            for p in procs:
                p.start()
        try:
            try:
                results[loaded].append(_one(manifest, adapter_dir, workload, i if loaded else None))
            except AdapterError as e:
                results[loaded].append(("adapter", str(e).splitlines()[0][:160]))
        finally:
            for p in procs:
                p.kill()
                p.join()
    cpu1 = os.times()
    quiet_counts = Counter(r[0] for r in results[False] if r[0] != "adapter")
    usual = quiet_counts.most_common(1)[0][0] if quiet_counts else None
    bad = 0
    for loaded in (False, True):
        for r in results[loaded]:
            tag = "loaded" if loaded else "quiet "
            if r[0] == "adapter":
                print(f"{tag} adapter problem: {r[1]}")
                continue
            counts, findings = r  # type: ignore[misc]
            wrong = usual is not None and counts != usual
            rules = sorted({str(f.rule) for f in findings})
            print(f"{tag} events per request {counts}{' MISATTRIBUTED' if wrong else ''} undeclared {rules}")
            if loaded and (wrong or findings):
                bad += 1
    print(f"child CPU {cpu1.children_user + cpu1.children_system - cpu0.children_user - cpu0.children_system:.1f} s")
    print(f"rust_mocker_settle: {bad} misattributed-or-undeclared of {runs} loaded runs")


if __name__ == "__main__":
    main()
