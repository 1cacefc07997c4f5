"""Run one request workload (a replay or finding file) against an adapter.

    kvspec replay FILE.jsonl --impl adapters/vllm_c_port
    python -m kvspec.conformance.requests.replay FILE.jsonl --impl adapters/rust_mocker

prints each finding of ``conformance.requests.check`` with its report, or
that the run conforms, and exits 1 when something was found (2 when a file
cannot be read or the adapter cannot run). The suite's request-level layer
runs workloads the same way (``run_workload``): a subprocess or C ABI
adapter through protocol version 2 (``transport.engine``). ``kvspec replay``
hands a request-workload file (``is_request_workload``) to ``replay_files``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvspec.conformance.radix.requests import check_radix_run
from kvspec.conformance.requests.api import open_request_implementation
from kvspec.conformance.requests.check import RunCheck, check_run
from kvspec.conformance.requests.workloads import FORMAT, Workload, load_workload
from kvspec.conformance.run.manifest import Manifest, load_impl
from kvspec.spec.errors import AdapterError, ConfigError

#: the adapter a request workload runs against when none is named
DEFAULT_IMPL = "adapters/reference_requests"


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
    (against the radix profile for a radix adapter, ``radix_requests``)."""
    impl = open_request_implementation(manifest, adapter_dir, workload.setup)
    try:
        reqs = workload.requests
        result = impl.run_concurrent(reqs) if workload.concurrent else impl.run_sequential(reqs)
    finally:
        impl.close()
    if manifest.request_profile() == "radix":
        return check_radix_run(workload, result)
    return check_run(workload, result, manifest.capabilities.tiers)


def replay_files(files: list[Path], impl: str = DEFAULT_IMPL) -> int:
    """Run each workload file against ``impl`` and print what was found:
    0 all conform, 1 a finding, 2 a file or the adapter could not be used."""
    try:
        adapter_dir, manifest = load_impl(impl)
    except ConfigError as e:
        print(f"kvspec replay: {e}")
        return 2
    status = 0
    for path in files:
        try:
            checked = run_workload(manifest, adapter_dir, load_workload(path))
        except (ConfigError, AdapterError) as e:
            print(f"kvspec replay: cannot run {path} against {impl}: {e}")
            return 2
        if not checked.findings:
            print(f"{path}: conforms ({sum(checked.exercised.values())} checks, against {manifest.name})")
            continue
        status = 1
        for f in checked.findings:
            dev = manifest.deviation_for(f.site())
            tag = f"declared deviation: {dev.reason}" if dev is not None else f"NOT DECLARED: {f.site().describe()}"
            print(f"{path}: [{f.rule}] ({tag})\n{f.report()}\n")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvspec.conformance.requests.replay", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path, help="request-workload files (JSON lines)")
    parser.add_argument("--impl", default=DEFAULT_IMPL, help="adapter folder or bundled name")
    args = parser.parse_args(argv)
    return replay_files(args.files, args.impl)


if __name__ == "__main__":
    sys.exit(main())
