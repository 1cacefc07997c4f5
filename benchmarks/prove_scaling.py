"""How the z3 proofs scale, profile by profile: the bounded and the unbounded figures of each.

- ``kvbm-offload`` (``kvspec prove``): bounded at 8, 16, 32 and 48 slots
  (1.5 block hashes per slot); operation level (whole Use, Deref, Promote,
  SwapIn and Tick, every batch shape up to N blocks; bounded) at its default
  bound and one larger; unbounded (``kvspec prove --unbounded``: any number of
  slots and hashes).
- ``kvbm``, ``legacy``, ``atomic`` (``kvspec prove --profile P``): unbounded
  only (per-hash arrays over unbounded integers; there is no bounded encoding).
- ``vllm`` (``--profile vllm``, INV-VLLM-COPIES): unbounded only.
- ``radix`` (``--profile radix``): bounded at 4, 5 and 6 page slots, 2 locks
  (``--radix-pages``), and unbounded (``--profile radix --unbounded``: any
  number of pages, tokens and locks; skipped with ``--radix-pages ''``);
  operation level (whole match, insert, lock, unlock, batched evict, reset:
  ``profile_radix_ops``, the rows ``op ...`` of ``--profile radix``) at its
  default bound and one smaller (``--radix-ops``), with each operation's CPU.

Every run is a child process with a CPU-time budget (``--budget``, default
60 s; a wall-clock net of 6 times that): a run that exceeds it is reported as
"gave up after N s CPU" and the benchmark goes on, so the whole table takes
minutes, not the hour the unbounded-in-time rows used to. Each figure is the
CPU time of the process that ran it (user + system, comparable under load;
wall time beside it). The last line is the CPU time of the unbounded proofs of
every profile that has them, summed: ``prove_scaling: VALUE s``.

With ``--whole-only``: only ``kvspec prove`` as a user runs it (every
profile at its default level, every row: proofs, sanity, reachability from
the initial state, mutants), in one child with its own budget
(``--whole-budget``, default 600 s CPU); the last line is then its CPU time,
``prove_scaling: VALUE s``.

Run from the repository root: ``python benchmarks/prove_scaling.py
[--budget SECONDS] [--slots 8,16,32,48] [--radix-pages 4,5,6]
[--radix-ops 4/2/2/2/2,5/2/3/2/3] | --whole-only [--whole-budget SECONDS]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

SLOTS = (8, 16, 32, 48)
#: page slots of the radix profile's bounded proofs (2 lock handles each)
RADIX_PAGES = (4, 5, 6)

_RADIX = """
import json, sys
from kvspec.reference.smt.radix.steps import prove_radix
from kvspec.reference.smt.radix.encoding import RadixBound
rs = prove_radix(RadixBound(pages=int(sys.argv[1]), handles=2))
print(json.dumps({r.property_id: [r.seconds, r.verdict] for r in rs}))
"""

#: the radix profile at operation level (kvspec prove --profile radix, rows 'op ...'): every row of every operation
_RADIX_OPS = """
import json, sys
from kvspec.reference.smt.radix.ops import prove_ops
from kvspec.reference.smt.radix.operations import OpBound
rs = prove_ops(OpBound(*(int(x) for x in sys.argv[1:6])))
print(json.dumps({f"{r.property_id} @ {r.op}": [r.seconds, r.verdict] for r in rs}))
"""
#: (pages, locks, pages of a key, nodes of an eviction, pages of an evicted node): a smaller bound, then the
#: default of ``kvspec prove --profile radix`` (profile_radix_ops.DEFAULT_OP_BOUND)
RADIX_OP_BOUNDS = ((4, 2, 2, 2, 2), (5, 2, 3, 2, 3))

_CHILD = """
import json, sys
from kvspec.reference.smt.prover import prove
from kvspec.reference.smt.universe import Bound
n = int(sys.argv[1])
rs = prove(Bound(n, n * 3 // 2))
print(json.dumps({str(r.property_id): [r.seconds, r.verdict] for r in rs}))
"""

_UNBOUNDED = """
import json
from kvspec.reference.smt.unbounded.encoding import prove_unbounded
rs = prove_unbounded(timeout_ms=120_000)
print(json.dumps({r.property_id: [r.seconds, r.verdict] for r in rs}))
"""

#: the radix profile for any number of pages, tokens and locks (kvspec prove --profile radix --unbounded)
_RADIX_UNBOUNDED = """
import json
from kvspec.reference.smt.radix.unbounded import prove_radix_unbounded
rs = prove_radix_unbounded()
print(json.dumps({r.property_id: [r.seconds, r.verdict] for r in rs}))
"""

#: operation level (kvspec prove's 'operation:' rows): whole operations, batches of every shape up to N blocks
_OPERATIONS = """
import json, sys
from kvspec.reference.smt.offload.operations_prove import prove_operations
from kvspec.reference.smt.universe import Bound
n, h, b = (int(x) for x in sys.argv[1:4])
rs = prove_operations(Bound(n, h), b)
print(json.dumps({f"{r.property_id} @ {r.operation}": [r.seconds, "proven" if r.proven else "not proven"] for r in rs}))
"""
#: (slots, hashes, blocks per batch) of the operation-level rows: the default, and a longer batch
OPERATION_BOUNDS = ((3, 5, 3), (4, 6, 4))

#: the block-level profiles without offload (kvspec prove --profile P): unbounded, proofs only
_PROFILE = """
import json, sys
from kvspec.reference.smt.cli.profiles import _blocks
from kvspec.reference.smt.blocks.encoding import prove
rs = prove(_blocks(sys.argv[1]))
print(json.dumps({f"{r.invariant} @ {r.transition}": [r.seconds, r.verdict] for r in rs}))
"""
PROFILES = ("kvbm", "legacy", "atomic")

#: ``kvspec prove`` with no option: every profile, every row
_WHOLE = """
import json
from kvspec.reference.smt.cli.prove import main
code = main([])
print(json.dumps({"kvspec prove": [0, "proven" if code == 0 else f"exit {code}"]}))
"""

_VLLM = """
import json
from kvspec.reference.smt.vllm.copies import prove_vllm
rs = prove_vllm()
print(json.dumps({r.transition: [r.seconds, r.verdict] for r in rs}))
"""


@dataclass
class Run:
    """One child process: per-property [seconds, verdict] (None: gave up), CPU s, wall s."""

    data: dict[str, list] | None
    cpu: float
    wall: float

    def verdict(self, budget: float) -> str:
        if self.data is None:
            return f"gave up after {budget:.0f} s CPU"
        bad = [k for k, (_s, v) in self.data.items() if v != "proven"]
        return "all proven" if not bad else "NOT proven: " + ", ".join(bad)

    @property
    def failed(self) -> bool:
        """Finished and something not proven (giving up on a bound is not a failure)."""
        return self.data is not None and any(v != "proven" for _s, v in self.data.values())


def _run(code: str, args: list[str], budget: float) -> Run:
    """Run ``code`` in a child limited to ``budget`` seconds of CPU (and 6 times that of wall clock)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (int(budget), int(budget) + 5))

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    data: dict[str, list] | None
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=6 * budget,
            check=True,
            preexec_fn=limit,
        ).stdout
        data = json.loads(out.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        data = None
    except subprocess.CalledProcessError as e:
        if e.returncode not in (-signal.SIGXCPU, -signal.SIGKILL):
            raise RuntimeError(f"proof run failed (exit {e.returncode}):\n{e.stderr}") from e
        data = None  # the CPU budget ran out
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(data, cpu, time.perf_counter() - t0)


def _line(profile: str, scope: str, r: Run | None, budget: float, note: str = "") -> None:
    if r is None:
        print(f"{profile:<14}{scope:<46}{'-':>9} {'-':>9}   {note}", flush=True)
        return
    cpu = f"{r.cpu:.1f}s" if r.data is not None else f">{r.cpu:.0f}s"
    print(f"{profile:<14}{scope:<46}{cpu:>9} {r.wall:>8.1f}s   {r.verdict(budget)}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=60.0, help="CPU seconds per run (default %(default)s)")
    p.add_argument("--slots", default=",".join(map(str, SLOTS)), help="slot counts (default %(default)s)")
    p.add_argument(
        "--radix-pages",
        default=",".join(map(str, RADIX_PAGES)),
        help="page slots of the radix profile's proofs, 2 locks each ('' to skip; default %(default)s)",
    )
    p.add_argument(
        "--radix-ops",
        default=",".join("/".join(map(str, x)) for x in RADIX_OP_BOUNDS),
        help="radix operation-level bounds, pages/locks/key/batch/node ('' to skip; default %(default)s)",
    )
    p.add_argument("--whole-only", action="store_true", help="only `kvspec prove` (every profile), one run")
    p.add_argument("--whole-budget", type=float, default=600.0, help="CPU seconds of that run (default %(default)s)")
    a = p.parse_args()
    b = a.budget
    if a.whole_only:
        print(f"load average: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} cores")
        r = _run(_WHOLE, [], a.whole_budget)
        _line("every", "kvspec prove (every profile, default levels)", r, a.whole_budget)
        print(f"prove_scaling: {r.cpu:.1f} s" + ("" if r.data is not None else " (gave up)"))
        return 1 if r.failed else 0
    print(f"load average: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} cores; budget {b:.0f} s CPU per run")
    print(f"{'profile':<14}{'scope':<46}{'CPU':>9} {'wall':>9}   result")
    failed = False
    unbounded_cpu = 0.0
    # the unbounded proofs first: they are the fast ones
    r = _run(_UNBOUNDED, [], b)
    _line("kvbm-offload", "unbounded (any slots, any hashes)", r, b)
    if r.data is not None:
        for k, (secs, v) in r.data.items():
            print(f"{'':<14}  {k:<44}{secs:>8.2f}s {'':>9}   {v}")
    runs = [r]
    for prof in PROFILES:
        runs.append(_run(_PROFILE, [prof], b))
        _line(prof, "unbounded (any capacity, hashes, batch length)", runs[-1], b)
    runs.append(_run(_VLLM, [], b))
    _line("vllm", "unbounded (any pool size, any hashes)", runs[-1], b)
    if a.radix_pages:
        runs.append(_run(_RADIX_UNBOUNDED, [], b))
        _line("radix", "unbounded (any pages, tokens, locks)", runs[-1], b)
    for r in runs:
        failed |= r.failed or r.data is None
        unbounded_cpu += r.cpu
    for n in [int(x) for x in a.slots.split(",") if x]:
        r = _run(_CHILD, [str(n)], b)
        _line("kvbm-offload", f"bounded, {n} slots, {n * 3 // 2} hashes", r, b)
        failed |= r.failed
    for n, h, k in OPERATION_BOUNDS:
        r = _run(_OPERATIONS, [str(n), str(h), str(k)], b)
        _line("kvbm-offload", f"operation level, {n} slots, {h} hashes, batch <= {k}", r, b)
        failed |= r.failed
    for prof in (*PROFILES, "vllm"):
        _line(prof, "bounded", None, b, "none: encoded for any size only")
    for n in [int(x) for x in a.radix_pages.split(",") if x]:
        r = _run(_RADIX, [str(n)], b)
        _line("radix", f"bounded, {n} pages, 2 locks", r, b)
        failed |= r.failed
    for spec in [x for x in a.radix_ops.split(",") if x]:
        pages, locks, key, batch, node = (int(x) for x in spec.split("/"))
        r = _run(_RADIX_OPS, [str(pages), str(locks), str(key), str(batch), str(node)], b)
        scope = f"operation, {pages} pages, {locks} locks, key {key}, evict {batch}x{node}"
        _line("radix", scope, r, b)
        if r.data is not None:
            per_op: dict[str, float] = {}
            for k, (secs, _v) in r.data.items():
                per_op[k.split(" @ ")[1]] = per_op.get(k.split(" @ ")[1], 0.0) + secs
            print(f"{'':<14}  " + ", ".join(f"{op} {secs:.1f}s" for op, secs in per_op.items()))
        failed |= r.failed
    print(f"prove_scaling: {unbounded_cpu:.2f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
