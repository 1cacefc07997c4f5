"""How often random radix traffic alone (no golden) kills each radix variant.

For every variant of ``adapters/radix_rust`` and ``adapters/radix_mutants``
and for each seed, the lockstep test's body (``conformance/test_radix.py``
``test_radix_lockstep``) runs at the effort ``make test`` uses (``ci``, with
the suite's third of its examples, ``cheap_op_settings``) but random with that
seed instead of derandomised, so that the kill rate is measured, not one
draw's luck. Shrinking is off (the first failing example is what counts).
The faithful adapters (the reference, the port without a variant,
``reference_jsonl``, SGLang's real RadixCache when installed) must pass.

    python benchmarks/radix_traffic_kills.py [--seeds 10] [--traffic state|blind] [--only NAME ...]

Prints one row per adapter: kills / seeds, the rules named, the median number
of examples drawn until the first failure; last line ``radix_traffic_kills:
K/N variant-seeds``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections import Counter
from pathlib import Path

from hypothesis import Phase, given, seed, settings
from hypothesis import strategies as st

from kvspec.conformance.managers.profile_suite import cheap_op_settings
from kvspec.conformance.radix.check import RadixLockstep, drive, radix_configs, radix_ops
from kvspec.conformance.radix.opener import open_radix
from kvspec.conformance.run.manifest import Manifest, load_manifest, resolve_adapter_dir
from kvspec.conformance.run.settings import effort
from kvspec.conformance.transport.jsonl import reuse_children
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.spec.radix_wire import RADIX_OP_ADAPTER, RadixConfig

FAITHFUL = ("adapters/reference", "adapters/radix_rust", "adapters/reference_jsonl", "adapters/sglang")
MUTATED = ("adapters/radix_rust", "adapters/radix_mutants")


def run_once(manifest: Manifest, adapter_dir: Path, n: int, traffic: str) -> tuple[str | None, int]:
    """One seeded run: (the rule of the first failure or None, examples drawn until it)."""
    base = cheap_op_settings(effort("ci"))
    steps = base.stateful_step_count
    drawn = [0]
    first: list[tuple[str, int]] = []

    @seed(n)
    @settings(base, derandomize=False, database=None, phases=[Phase.generate], report_multiple_bugs=False)
    @given(config=radix_configs(), data=st.data())
    def body(config: RadixConfig, data: st.DataObject) -> None:
        drawn[0] += 1
        try:
            with open_radix(manifest, adapter_dir, config) as impl:
                ls = RadixLockstep(impl, config)
                if traffic == "state":
                    drive(data, ls, steps)
                else:
                    for raw in data.draw(st.lists(radix_ops(), min_size=1, max_size=steps)):
                        ls.step(RADIX_OP_ADAPTER.validate_python(raw))
        except Exception as e:  # a protocol error of the child fails the suite too
            if not first:
                first.append((str(e.rule) if isinstance(e, ConformanceFailure) else type(e).__name__, drawn[0]))
            raise

    with contextlib.suppress(Exception):
        body()
    return first[0] if first else (None, drawn[0])


def targets(only: list[str]) -> list[tuple[str, Manifest, Path, bool]]:
    """(label, manifest, dir, must fail) of every adapter to run."""
    out: list[tuple[str, Manifest, Path, bool]] = []
    for name in FAITHFUL:
        d = resolve_adapter_dir(name)
        out.append((name, load_manifest(d), d, False))
    for name in MUTATED:
        d = resolve_adapter_dir(name)
        for v in load_manifest(d).variants:
            out.append((f"{name}/{v.name}", load_manifest(d, v.name), d, True))
    return [t for t in out if not only or any(o in t[0] for o in only)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--traffic", choices=("state", "blind"), default="state")
    ap.add_argument("--only", nargs="*", default=[])
    args = ap.parse_args()
    killed_total = runs_total = 0
    with reuse_children():
        for label, manifest, d, must_fail in targets(args.only):
            if label == "adapters/sglang":
                try:
                    import sglang  # noqa: F401
                except ImportError:
                    print(f"{label:50} skipped: SGLang not installed (make engines)")
                    continue
            results = [run_once(manifest, d, n, args.traffic) for n in range(1, args.seeds + 1)]
            kills = [(r, k) for r, k in results if r is not None]
            rules = Counter(r for r, _ in kills)
            med = statistics.median(k for _, k in kills) if kills else "-"
            verdict = "ok" if (len(kills) == args.seeds if must_fail else not kills) else "MISS"
            print(
                f"{label:50} {len(kills):>2}/{args.seeds} killed  median examples {med!s:>4}  {dict(rules)}  {verdict}"
            )
            if must_fail:
                killed_total += len(kills)
                runs_total += args.seeds
    print(f"radix_traffic_kills: {killed_total}/{runs_total} variant-seeds")


if __name__ == "__main__":
    main()
