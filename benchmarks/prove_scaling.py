"""How the z3 proofs scale: the bounded proofs at 8, 16, 32 and 48 slots
(1.5 block hashes per slot), each run in its own process with a time limit,
then the unbounded proofs (``kvspec prove --unbounded``: any number of slots
and hashes), which do not grow with the bound at all. Between them, the
operation-level proofs (whole Use, Deref, Promote, SwapIn and Tick, every
batch shape up to N blocks; bounded) at their default bound and one larger,
and the radix profile's bounded proofs (``--profile radix``) at 4, 5 and 6
page slots, 2 locks (``--radix-pages``), then its unbounded ones
(``--profile radix --unbounded``: any number of pages and locks).

Each figure is the CPU time of the process that ran it (user + system, so
comparable under load; wall time is printed beside it). The last line is the
CPU time of the unbounded proofs of every invariant and lemma:
``prove_scaling: VALUE s``. The block-level profiles without offload
(``--profile kvbm``, ``legacy``, ``atomic``; unbounded by construction) get
one row each before it.

Run from the repository root: ``python benchmarks/prove_scaling.py
[--timeout SECONDS] [--slots 8,16,32,48]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SLOTS = (8, 16, 32, 48)
#: page slots of the radix profile's bounded proofs (2 lock handles each)
RADIX_PAGES = (4, 5, 6)

_RADIX = """
import json, sys
from kvspec.reference.smt.profile_radix import prove_radix
from kvspec.reference.smt.radix_encoding import RadixBound
rs = prove_radix(RadixBound(pages=int(sys.argv[1]), handles=2))
print(json.dumps({r.property_id: [r.seconds, r.verdict] for r in rs}))
"""

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
from kvspec.reference.smt.unbounded import prove_unbounded
rs = prove_unbounded(timeout_ms=300_000)
print(json.dumps({r.property_id: [r.seconds, r.verdict] for r in rs}))
"""

#: the radix profile for any number of pages, tokens and locks (kvspec prove --profile radix --unbounded)
_RADIX_UNBOUNDED = """
import json
from kvspec.reference.smt.radix_unbounded import prove_radix_unbounded
rs = prove_radix_unbounded()
print(json.dumps({r.property_id: [r.seconds, r.verdict] for r in rs}))
"""

#: operation level (kvspec prove's 'operation:' rows): whole operations, batches of every shape up to N blocks
_OPERATIONS = """
import json, sys
from kvspec.reference.smt.operations_prove import prove_operations
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
from kvspec.reference.smt.cli_profiles import _blocks
from kvspec.reference.smt.profile_blocks import prove
rs = prove(_blocks(sys.argv[1]))
print(json.dumps({f"{r.invariant} @ {r.transition}": [r.seconds, r.verdict] for r in rs}))
"""
PROFILES = ("kvbm", "legacy", "atomic")


def _run(code: str, args: list[str], timeout: float) -> tuple[dict[str, list] | None, float, float]:
    """(per-property [seconds, verdict] or None on timeout, CPU s, wall s) of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, check=True
        ).stdout
        data = json.loads(out.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        data = None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return data, cpu, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--timeout", type=float, default=600.0, help="per bounded run, seconds (default %(default)s)")
    p.add_argument("--slots", default=",".join(map(str, SLOTS)), help="slot counts (default %(default)s)")
    p.add_argument(
        "--radix-pages",
        default=",".join(map(str, RADIX_PAGES)),
        help="page slots of the radix profile's proofs, 2 locks each ('' to skip; default %(default)s)",
    )
    a = p.parse_args()
    print(f"load average: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} cores")
    print(f"{'run':<34}{'CPU':>10}{'wall':>10}  result")
    for n in [int(x) for x in a.slots.split(",")]:
        data, cpu, wall = _run(_CHILD, [str(n)], a.timeout)
        label = f"bounded, {n} slots, {n * 3 // 2} hashes"
        if data is None:
            print(f"{label:<34}{'>' + format(cpu, '.1f'):>10}{wall:>9.1f}s  timed out after {a.timeout:.0f}s")
            continue
        bad = [k for k, (_s, v) in data.items() if v != "proven"]
        print(f"{label:<34}{cpu:>9.1f}s{wall:>9.1f}s  {'all proven' if not bad else 'NOT proven: ' + ', '.join(bad)}")
    for n, h, b in OPERATION_BOUNDS:
        odata, ocpu, owall = _run(_OPERATIONS, [str(n), str(h), str(b)], a.timeout)
        label = f"operation level, {n} slots, {h} hashes, batches <= {b}"
        if odata is None:
            print(f"{label:<34}{'>' + format(ocpu, '.1f'):>10}{owall:>9.1f}s  timed out after {a.timeout:.0f}s")
            continue
        obad = [k for k, (_s, v) in odata.items() if v != "proven"]
        verdict = "all proven" if not obad else "NOT proven: " + ", ".join(obad)
        print(f"{label:<34}{ocpu:>9.1f}s{owall:>9.1f}s  {verdict}")
    radix_bad: list[str] = []
    for n in [int(x) for x in a.radix_pages.split(",") if x]:
        rdata, rcpu, rwall = _run(_RADIX, [str(n)], a.timeout)
        label = f"radix, {n} pages, 2 locks"
        if rdata is None:
            print(f"{label:<34}{'>' + format(rcpu, '.1f'):>10}{rwall:>9.1f}s  timed out after {a.timeout:.0f}s")
            continue
        rbad = [k for k, (_s, v) in rdata.items() if v != "proven"]
        radix_bad += rbad
        verdict = "all proven" if not rbad else "NOT proven: " + ", ".join(rbad)
        print(f"{label:<34}{rcpu:>9.1f}s{rwall:>9.1f}s  {verdict}")
    if a.radix_pages:
        udata, ucpu, uwall = _run(_RADIX_UNBOUNDED, [], 1800.0)
        ubad = ["timed out"] if udata is None else [k for k, (_s, v) in udata.items() if v != "proven"]
        radix_bad += ubad
        verdict = "all proven" if not ubad else "NOT proven: " + ", ".join(ubad)
        print(f"{'radix unbounded (any pages, locks)':<34}{ucpu:>9.1f}s{uwall:>9.1f}s  {verdict}")
    data, cpu, wall = _run(_UNBOUNDED, [], 1800.0)
    if data is None:
        print("unbounded: timed out", file=sys.stderr)
        return 1
    bad = [k for k, (_s, v) in data.items() if v != "proven"]
    verdict = "all proven" if not bad else "NOT proven: " + ", ".join(bad)
    print(f"{'unbounded (any slots, any hashes)':<34}{cpu:>9.1f}s{wall:>9.1f}s  {verdict}")
    for k, (secs, v) in data.items():
        print(f"  {k:<32}{secs:>19.2f}s  {v}")
    for prof in PROFILES:
        pdata, pcpu, pwall = _run(_PROFILE, [prof], 1800.0)
        pbad = ["timed out"] if pdata is None else [k for k, (_s, v) in pdata.items() if v != "proven"]
        label = f"--profile {prof} (unbounded)"
        print(
            f"{label:<34}{pcpu:>9.1f}s{pwall:>9.1f}s  {'all proven' if not pbad else 'NOT proven: ' + ', '.join(pbad)}"
        )
        bad += pbad
    print(f"prove_scaling: {cpu:.2f} s")
    return 1 if bad or radix_bad else 0


if __name__ == "__main__":
    sys.exit(main())
