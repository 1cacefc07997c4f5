"""Run one request workload (a replay or finding file) against an adapter.

    python -m kvspec.conformance.request_replay FILE.jsonl --impl adapters/rust_mocker

prints each finding of ``conformance.request_check`` with its report, or
that the run conforms, and exits 1 when something was found. The suite's
request-level layer runs workloads the same way (``run_workload``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .manifest import Manifest, load_manifest, resolve_adapter_dir
from .request_check import RunCheck, check_run
from .requests_api import open_request_implementation
from .workloads import Workload, load_workload


def run_workload(manifest: Manifest, adapter_dir: Path, workload: Workload) -> RunCheck:
    """Start the implementation, run the workload, close it, check the run."""
    impl = open_request_implementation(manifest, adapter_dir, workload.setup)
    try:
        if workload.concurrent:
            result = impl.run_concurrent(workload.requests)
            return check_run(workload, result, manifest.capabilities.tiers)
        outcomes = impl.run_sequential(workload.requests)
    finally:
        impl.close()
    return check_run(workload, outcomes, manifest.capabilities.tiers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvspec.conformance.request_replay", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path, help="request-workload files (JSON lines)")
    parser.add_argument("--impl", default="adapters/reference_requests", help="adapter folder or bundled name")
    args = parser.parse_args(argv)
    adapter_dir = resolve_adapter_dir(args.impl)
    manifest = load_manifest(adapter_dir)
    status = 0
    for path in args.files:
        checked = run_workload(manifest, adapter_dir, load_workload(path))
        if not checked.findings:
            print(f"{path}: conforms ({sum(checked.exercised.values())} checks)")
            continue
        status = 1
        for f in checked.findings:
            dev = manifest.deviation(str(f.rule), "vllm")
            tag = f"declared deviation: {dev.reason}" if dev is not None else "NOT DECLARED"
            print(f"{path}: [{f.rule}] ({tag})\n{f.report()}\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
