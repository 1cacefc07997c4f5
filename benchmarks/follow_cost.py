"""What following declared deviations costs the lockstep, per step.

When a manifest declares deviations, the lockstep keeps what following one
needs (``conformance/block/follow.py``): a copy of the model before every
step and the list of past steps, whether or not a deviation is ever
observed. This runs the lockstep machine (``test_lockstep``'s, in-process,
``ci`` effort: derandomised, generate phase only, so both runs draw the same
traffic) against the spec port of ``adapters/declared`` (no departure: no
deviation is observed, so the difference is the bookkeeping alone), once
with no declaration and once with one (QUARANTINE-RELEASE scoped by
``offload_job_fails_whole``), for the ``kvbm`` and ``legacy`` profiles.

CPU time of this process; the median of ``--repeat`` runs (default 3).

    python benchmarks/follow_cost.py [--repeat N] [--examples N]

The last line: ``follow_cost: RATIO x`` (CPU per step with a declaration
over without, kvbm profile).
"""

from __future__ import annotations

import argparse
import statistics
import time

from hypothesis import Phase, settings

from kvspec.conformance.block import machine as machine_mod
from kvspec.conformance.block.machine import MachineSetup, machine_class, run_machine
from kvspec.conformance.run.manifest import load_impl
from kvspec.conformance.run.settings import effort
from kvspec.spec.deviations import Deviation, Scope
from kvspec.spec.rules import RuleId

DECLARED = Deviation(
    rule=RuleId.QUARANTINE_RELEASE,
    reason="benchmark: declared, never observed on the spec port",
    scope=Scope(conditions=["offload_job_fails_whole"]),
)


def _run(profile: str, declare: bool, examples: int) -> tuple[float, int]:
    """CPU seconds and steps of one machine run."""
    adapter_dir, manifest = load_impl("adapters/declared")
    manifest = manifest.model_copy(update={"deviations": [DECLARED] if declare else []})
    cls = machine_class(MachineSetup(manifest, adapter_dir, profile))
    before = machine_mod.STATS["steps"]
    t = time.process_time()
    run_machine(cls, settings=settings(effort("ci"), max_examples=examples, phases=[Phase.generate]))
    return time.process_time() - t, machine_mod.STATS["steps"] - before


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--examples", type=int, default=60)
    args = p.parse_args(argv)
    ratio = {}
    for profile in ("legacy", "kvbm"):
        per_step: dict[bool, float] = {}
        for declare in (False, True):
            runs = [_run(profile, declare, args.examples) for _ in range(args.repeat)]
            steps = runs[0][1]
            assert all(s == steps for _, s in runs), "the traffic must be the same in every run"
            cpu = statistics.median(c for c, _ in runs)
            per_step[declare] = cpu / steps * 1e6
            label = "one declaration" if declare else "no declaration "
            print(f"{profile:6} {label}: {steps} steps, {cpu:.2f} CPU s, {per_step[declare]:.0f} us/step", flush=True)
        ratio[profile] = per_step[True] / per_step[False]
        print(f"{profile:6} cost of following: {ratio[profile]:.2f}x CPU per step", flush=True)
    print(f"follow_cost: {ratio['kvbm']:.2f} x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
