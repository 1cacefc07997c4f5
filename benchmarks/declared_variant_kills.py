"""Kill rate of the mutant catalogue on top of a port with one declared departure.

A declaration must never hide a bug outside its cause. For each port of
``adapters/declared`` with a declaration (``legacy_source_strict_traffic``,
``offload_job_fails_whole``), this puts each block-level mutant of
``adapters/mutants`` that lives in the port's profile on top of the departure
(``declared.adapter.open_with_bug``), keeps the port's one declaration, and
runs the block lockstep (``test_lockstep``'s machine, in-process) at the
``ci`` effort (60 examples of 40 steps, derandomised; generate phase only:
a kill needs no shrinking). First the departure alone (the sanity run: it
must pass). A kill is a ``ConformanceFailure``; one raised as
``DeviationNotFollowed`` is counted as a kill and marked. A mutant the
lockstep misses then runs the profile's goldens (as ``test_golden`` does:
the declared departure is followed and the rest of each golden checked; a
failure the declaration covers is excused, any other kills). ``--baseline``
also runs each mutant on the plain reference without the departure or the
declaration, to compare.

    python benchmarks/declared_variant_kills.py [--variant V] [--mutant M] [--baseline]

The last line: ``declared_variant_kills: KILLED/TOTAL mutants``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from hypothesis import Phase, settings

from kvspec.adapters.mutants.catalogue import CATALOGUE
from kvspec.conformance.block.machine import MachineSetup, machine_class, run_machine
from kvspec.conformance.block.opener import open_implementation
from kvspec.conformance.block.scenario_runner import run_scenario
from kvspec.conformance.run.manifest import load_impl
from kvspec.conformance.run.settings import effort
from kvspec.conformance.test_golden import CASES, _skip_reason
from kvspec.conformance.verdicts.failures import ConformanceFailure, DeviationNotFollowed
from kvspec.spec.deviations import covering
from kvspec.spec.manifest import Manifest

VARIANTS = {"legacy_source_strict_traffic": "legacy", "offload_job_fails_whole": "kvbm"}


def _with_bug(manifest: Manifest, departure: str | None, bug: str | None) -> Manifest:
    start = manifest.start.model_copy(update={"python": "kvspec.adapters.declared.adapter:open_with_bug"})
    update: dict[str, object] = {"start": start, "description": departure or "none", "variant": bug}
    if departure is None:
        update["deviations"] = []
    return manifest.model_copy(update=update)


def _run(manifest: Manifest, adapter_dir: Path, profile: str) -> tuple[str, float]:
    cls = machine_class(MachineSetup(manifest, adapter_dir, profile))
    t = time.process_time()
    try:
        run_machine(cls, settings=settings(effort("ci"), phases=[Phase.generate], report_multiple_bugs=False))
    except DeviationNotFollowed as e:
        return f"killed [{e.rule}] (not followed)", time.process_time() - t
    except ConformanceFailure as e:
        return f"killed [{e.rule}]", time.process_time() - t
    return _goldens(manifest, adapter_dir, profile), time.process_time() - t


def _goldens(manifest: Manifest, adapter_dir: Path, profile: str) -> str:
    """The profile's goldens against ``manifest``'s port: the first failure
    no declaration covers, or SURVIVED."""
    for path, scenario, config, _ in CASES:
        if scenario.config.profile != profile or _skip_reason(manifest, scenario, config) is not None:
            continue
        try:
            sid = f"{path.parent.name}/{path.stem}"
            impl = open_implementation(manifest, adapter_dir, config)
            run_scenario(scenario, impl, deviations=manifest.deviations, scenario_id=sid)
        except DeviationNotFollowed as e:
            return f"killed [{e.rule}] by golden {path.parent.name}/{path.stem} (not followed)"
        except ConformanceFailure as e:
            site = replace(e.site, scenario=f"{path.parent.name}/{path.stem}", profile=profile)
            if covering(manifest.deviations, site) is None:
                return f"killed [{e.rule}] by golden {site.scenario}"
    return "SURVIVED"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    p.add_argument("--mutant", action="append", help="only this mutant (repeatable)")
    p.add_argument("--baseline", action="store_true", help="also run each mutant without the departure")
    args = p.parse_args(argv)
    killed = total = 0
    for variant in args.variant or sorted(VARIANTS):
        profile = VARIANTS[variant]
        adapter_dir, manifest = load_impl(f"adapters/declared/{variant}")
        verdict, cpu = _run(_with_bug(manifest, variant, None), adapter_dir, profile)
        sanity = "passed" if verdict == "SURVIVED" else f"FAILED: {verdict}"
        print(f"{variant}: the departure alone with its declaration: {sanity} ({cpu:.1f} CPU s)", flush=True)
        bugs = [
            m
            for m in CATALOGUE
            if profile in m.profiles and (m.legacy if profile == "legacy" else m.g1) is not None
            if not args.mutant or m.id in args.mutant
        ]
        for m in bugs:
            verdict, cpu = _run(_with_bug(manifest, variant, m.id), adapter_dir, profile)
            line = f"  {m.id:34} (rule {m.rule}) {verdict} {cpu:.1f} CPU s"
            if args.baseline:
                base, _ = _run(_with_bug(manifest, None, m.id), adapter_dir, profile)
                line += f" | without the departure: {base}"
            print(line, flush=True)
            total += 1
            killed += verdict.startswith("killed")
    print(f"declared_variant_kills: {killed}/{total} mutants")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
