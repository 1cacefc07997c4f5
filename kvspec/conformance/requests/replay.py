"""Run one request workload (a replay or finding file) against an adapter.

    kvspec replay FILE.jsonl                  # the implementation the file records
    kvspec replay FILE.jsonl --impl adapters/vllm_c_port
    python -m kvspec.conformance.requests.replay FILE.jsonl --impl adapters/rust_mocker

prints each finding of ``conformance.requests.check`` with its report, or
that the run conforms, and exits 1 when something was found (2 when a file
cannot be read or the adapter cannot run). Without ``--impl`` a file runs
against the adapter folder and variant its header records (a replay the
suite wrote: ``workloads.py`` version 2); a workload that records none (a
seed, an adapter's finding file, an older kvspec's replay) is refused with
exit 2 instead of being run against a default adapter, which once printed
"conforms (... against reference_requests)" for a port's real failure. The suite's request-level layer
runs workloads the same way (``run_workload``): a subprocess or C ABI
adapter through protocol version 2 (``transport.engine``). ``kvspec replay``
hands a request-workload file (``is_request_workload``) to ``replay_files``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from kvspec.conformance.radix.requests import check_radix_run
from kvspec.conformance.requests.api import STALLED, ConcurrentRun, RequestOutcome, open_request_implementation
from kvspec.conformance.requests.check import RunCheck, check_run
from kvspec.conformance.requests.workloads import FORMAT, Workload, load_workload
from kvspec.conformance.run.manifest import Manifest, load_impl
from kvspec.conformance.verdicts.replay_file import ReplayFileError, provenance_lines, recorded_run
from kvspec.conformance.verdicts.replay_store import NotRecordedError, open_recorded, unrecorded_message
from kvspec.spec.errors import AdapterError, ConfigError
from kvspec.spec.registry import RADIX


def is_request_workload(path: Path) -> bool:
    """Does the file start with a request-workload header?"""
    try:
        with path.open() as f:
            head = json.loads(f.readline())
    except (OSError, ValueError):
        return False
    return isinstance(head, dict) and head.get("kvspec") == FORMAT


def run_workload(manifest: Manifest, adapter_dir: Path, workload: Workload) -> RunCheck:
    """Start the implementation, run the workload, close it, check the run
    (against the radix profile for a radix adapter, ``radix_requests``).

    A sequential run that stalls (condition ``request_stalled``) where the
    manifest declares it is followed: an engine that still holds the stalled
    request runs nothing after it (the requests after it come back stalled,
    unsent: ``unsent_after``), so the requests after it run as a workload of
    their own on a fresh engine and are checked like any other (their
    findings name that workload, so that its replay file reproduces them).
    An undeclared stall is not followed: it fails the run as it is."""
    checked, outcomes = _run_and_check(manifest, adapter_dir, workload)
    while not workload.concurrent:
        k = declared_stall(manifest, checked, outcomes)
        if k is None:
            break
        rest = workload.model_copy(
            update={
                "requests": workload.requests[k + 1 :],
                "note": f"the requests after request {k} of a run, which stalled (request_stalled, declared; "
                "followed on a fresh engine)",
                "run": None,
            }
        )
        more, outcomes = _run_and_check(manifest, adapter_dir, rest)
        for f in more.findings:
            checked.add(f)
        checked.exercised.update(more.exercised)
        checked.followed_stalls += 1
        workload = rest
    return checked


def _run_and_check(
    manifest: Manifest, adapter_dir: Path, workload: Workload
) -> tuple[RunCheck, list[RequestOutcome] | None]:
    impl = open_request_implementation(manifest, adapter_dir, workload.setup)
    try:
        reqs = workload.requests
        result = impl.run_concurrent(reqs) if workload.concurrent else impl.run_sequential(reqs)
    finally:
        impl.close()
    outcomes = None if isinstance(result, ConcurrentRun) else list(result)
    if manifest.request_profile() == RADIX:
        return check_radix_run(workload, result), outcomes
    return check_run(workload, result, manifest.capabilities.tiers), outcomes


def unsent_after(outcomes: Sequence[RequestOutcome], k: int) -> bool:
    """Request ``k`` stalled and every request after it came back stalled
    with nothing done (no token, no event): the engine still held ``k`` and
    was sent nothing more. At least one request comes after ``k``."""
    if outcomes[k].finish != STALLED or k + 1 >= len(outcomes):
        return False
    return all(o.finish == STALLED and not o.events and o.output_tokens == 0 for o in outcomes[k + 1 :])


def declared_stall(manifest: Manifest, checked: RunCheck, outcomes: Sequence[RequestOutcome] | None) -> int | None:
    """The request a declared ``request_stalled`` finding names, when the
    requests after it were not run (``unsent_after``); else None."""
    if outcomes is None:
        return None
    for f in checked.findings:
        k = f.request
        if "request_stalled" not in f.conditions or k is None or k >= len(outcomes):
            continue
        if manifest.deviation_for(f.site()) is not None and unsent_after(outcomes, k):
            return k
    return None


def _implementation(path: Path, workload: Workload, impl: str | None) -> tuple[str, Path, Manifest]:
    """(what to call it, adapter folder, manifest): ``impl`` when given, else
    the implementation the file records (NotRecordedError when it records
    none, or no versions)."""
    if impl is not None:
        return (impl, *load_impl(impl))
    try:
        target, versions = recorded_run(str(path), workload.run or {})
    except ReplayFileError as e:
        raise ConfigError(str(e)) from None
    if target is None or versions is None:
        raise NotRecordedError(unrecorded_message(path, target, versions, None))
    return open_recorded(target)


def replay_files(files: list[Path], impl: str | None = None) -> int:
    """Run each workload file against ``impl`` (None: the implementation each
    file records) and print what was found: 0 all conform, 1 a finding, 2 a
    file or the adapter could not be used (or a file records no implementation
    and no ``impl`` was given)."""
    status = 0
    for path in files:
        try:
            workload = load_workload(path)
            name, adapter_dir, manifest = _implementation(path, workload, impl)
        except NotRecordedError as e:
            print(f"kvspec replay: {e}")
            return 2
        except (ConfigError, OSError) as e:
            print(f"kvspec replay: cannot run {path} against {impl or 'the recorded adapter'}: {e}")
            return 2
        print(f"replay {path}: request workload ({len(workload.requests)} requests), against {name}")
        if impl is None and workload.run is not None:
            print("\n".join(provenance_lines(*recorded_run(str(path), workload.run))))
        try:
            checked = run_workload(manifest, adapter_dir, workload)
        except (ConfigError, AdapterError) as e:
            print(f"kvspec replay: cannot run {path} against {name}: {e}")
            return 2
        if not checked.findings:
            print(f"{path}: conforms ({sum(checked.exercised.values())} checks, against {manifest.name})")
            continue
        status = 1
        for f in checked.findings:
            dev = manifest.deviation_for(f.site())
            tag = f"declared deviation: {dev.reason}" if dev is not None else f"NOT DECLARED: {f.site().describe()}"
            print(f"{path}: [{f.rule}] ({tag})\n{f.report()}\n")
        print(f"replay FAILED: {len(checked.findings)} finding(s) against {manifest.name}")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvspec.conformance.requests.replay", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path, help="request-workload files (JSON lines)")
    parser.add_argument(
        "--impl", default=None, help="adapter folder or bundled name (default: the implementation the file records)"
    )
    args = parser.parse_args(argv)
    return replay_files(args.files, args.impl)


if __name__ == "__main__":
    sys.exit(main())
