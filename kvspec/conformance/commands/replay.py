"""``kvspec replay FILE [--impl=adapters/NAME]``: run a replay file again.

Without ``--impl`` the file's recorded adapter folder (absolute) and
variant are used, so a file written for an adapter outside the tree replays
from anywhere; a folder that is gone is a clear error (exit 2). A file that
does not record its implementation and the versions it ran under (an older
kvspec's, a request workload written by hand) is refused with exit 2 unless
``--impl`` names what to run it against: running it against whatever its
adapter name finds once printed "conforms" for the bundled reference instead
of the port that had failed. The recorded provenance is printed, and what
differs from this process (kvspec, Hypothesis, Python) is said.

A replay file is what a failing lockstep run leaves behind (its format:
``conformance/verdicts/replay_file.py``). Replaying opens the implementation with the
header's configuration and runs the operations through the same lockstep
checker (``conformance/block/lockstep.py``) on a fresh model, so the model again follows the implementation's choices
where the policy allows several; nothing random is involved, so the run is
deterministic. The first divergence is printed with its rule id (exit 1);
otherwise "replay passed" (exit 0). A file that cannot be read, or an adapter
that cannot be started or crashes, is exit 2.

The recorded expectations are not what is checked (the current model is);
when the current model disagrees with them the spec or the model changed
since the file was written, and the replay says so.

A request-workload file (what the request-level layer writes for a finding,
``conformance/requests/workloads.py``) is replayed by
``conformance/requests/replay.py``: the same checks, through protocol
version 2 for a subprocess or C ABI adapter, against the implementation the
file records (or ``--impl``), refused like a block-level file when it
records none.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from kvspec.conformance.block.lockstep import Lockstep
from kvspec.conformance.block.opener import open_implementation
from kvspec.conformance.run.manifest import Manifest, load_impl, load_manifest
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.conformance.verdicts.replay_file import (
    ReplayFile,
    ReplayFileError,
    load_replay,
    outcome_json,
    provenance_lines,
)
from kvspec.conformance.verdicts.replay_store import NotRecordedError, open_recorded, unrecorded_message
from kvspec.spec.errors import AdapterError, ConfigError

__all__ = ["ReplayFile", "ReplayFileError", "ReplayResult", "load_replay", "replay", "run"]


@dataclass
class ReplayResult:
    passed: bool
    steps: int
    failure: ConformanceFailure | None
    #: steps where the current model's outcome differs from the recorded one
    model_drift: list[int]


def replay(
    rf: ReplayFile, impl_dir: Path, *, protocol_only: bool | None = None, manifest: Manifest | None = None
) -> ReplayResult:
    """Run ``rf`` against the adapter in ``impl_dir`` (its ``manifest``, a
    variant selected, or the folder's; raises AdapterError / ConfigError when
    the adapter cannot run)."""
    manifest = manifest or load_manifest(impl_dir)
    impl = open_implementation(manifest, impl_dir, rf.config)
    drift: list[int] = []
    try:
        ls = Lockstep(
            impl,
            rf.config,
            adapter=manifest.name,
            replay_path=None,
            protocol_only=rf.protocol_only if protocol_only is None else protocol_only,
            event_token_ids=manifest.capabilities.event_token_ids,
            deviations=manifest.deviations,  # followed as the suite follows them
        )
        for i, op in enumerate(rf.ops):
            try:
                exp = ls.step(op)
            except ConformanceFailure as f:
                if rf.expected[i] is not None and outcome_json(ls.expected[-1]) != rf.expected[i]:
                    drift.append(i)
                return ReplayResult(False, i + 1, f, drift)
            if rf.expected[i] is not None and outcome_json(exp) != rf.expected[i]:
                drift.append(i)
        return ReplayResult(True, len(rf.ops), None, drift)
    finally:
        impl.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", type=Path, help="replay file (JSON lines) of a failing lockstep run, or a request-workload file"
    )
    parser.add_argument(
        "--impl",
        default=None,
        help="adapter folder (DIR/VARIANT for a variant) or bundled adapter name "
        "(default: the adapter folder and variant recorded in the file)",
    )
    parser.add_argument(
        "--protocol-only",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="check only what a router sees (default: as recorded in the file)",
    )


def _open_target(rf: ReplayFile, impl_arg: str | None) -> tuple[str, Path, Manifest]:
    """(what to call it, adapter folder, manifest) of the implementation to
    replay against: ``--impl`` when given, else what the file recorded
    (NotRecordedError when it records no implementation or no versions)."""
    if impl_arg is not None:
        return (impl_arg, *load_impl(impl_arg))
    t = rf.target
    if t is None or not rf.recorded:
        raise NotRecordedError(unrecorded_message(rf.path, t, rf.versions, rf.adapter))
    return open_recorded(t)


def run(args: argparse.Namespace) -> int:
    from kvspec.conformance.requests.replay import is_request_workload, replay_files

    if is_request_workload(args.file):
        return replay_files([args.file], args.impl)
    try:
        rf = load_replay(args.file)
    except ReplayFileError as e:
        print(f"kvspec replay: {e}")
        return 2
    try:
        impl, impl_dir, manifest = _open_target(rf, args.impl)
    except NotRecordedError as e:
        print(f"kvspec replay: {e}")
        return 2
    except ConfigError as e:
        print(f"kvspec replay: cannot run {args.file} against {args.impl or 'the recorded adapter'}: {e}")
        return 2
    try:
        result = replay(rf, impl_dir, protocol_only=args.protocol_only, manifest=manifest)
    except (ConfigError, AdapterError) as e:
        print(f"kvspec replay: cannot run {args.file} against {args.impl or 'the recorded adapter'}: {e}")
        return 2
    recorded = rf.failure or {}
    print(
        f"replay {args.file}: {len(rf.ops)} operations, profile {rf.config.profile}, policy {rf.config.eviction}, "
        f"capacity {rf.config.capacity}, against {impl}"
        + (f" (recorded failure: {recorded.get('rule')} at step {recorded.get('step')})" if recorded else "")
    )
    for line in provenance_lines(rf.target, rf.versions):
        print(line)
    if result.model_drift:
        print(
            "note: the reference model now expects something different from the file at step(s) "
            f"{', '.join(map(str, result.model_drift))}: the spec or the model changed since it was written"
        )
    if result.failure is not None:
        print(f"replay FAILED at step {result.steps - 1}: rule {result.failure.rule}")
        print(result.failure.report)
        return 1
    print(f"replay passed ({result.steps} steps)")
    return 0
