"""The replay file format: what a failing lockstep run leaves behind.

JSON lines:

- line 1, the header: ``{"kvspec_replay": 2, "adapter": NAME, "config":
  {ManagerConfig}, "protocol_only": bool, "failure": {"rule", "step", "what"}}``
  and the run it comes from (its provenance): ``"impl"`` (the ``--impl``
  value as given), ``"adapter_path"`` (the adapter folder, absolute),
  ``"variant"``, ``"effort"``, ``"hypothesis_seed"`` (``replay_store.Target``)
  and ``"versions"`` (kvspec and its spec digest, Hypothesis, Python:
  ``provenance.Versions``);
- then one line per operation, in order: ``{"op": {operation}, "expect":
  {the reference model's outcome when the file was written}}``.

Format 1 (older kvspec) had no ``versions`` and, before that, no adapter
folder: it still loads (``ReplayFile.recorded`` is False), and ``kvspec
replay`` refuses it unless ``--impl`` says what to run it against, because
replaying it against whatever its ``adapter`` name finds once said "passed"
for the bundled reference instead of the port that had failed.

``write_replay`` writes one (atomically: a reader never sees half a file),
``load_replay`` reads and validates one; ``kvspec replay``
(``conformance/commands/replay.py``) runs it again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kvspec.conformance.verdicts.provenance import Versions
from kvspec.conformance.verdicts.replay_store import Target
from kvspec.conformance.verdicts.results import current_versions
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import KvSpecError
from kvspec.spec.wire import Operation, StepOutcome, event_to_json, parse_operation

REPLAY_FORMAT = 2
#: the formats ``load_replay`` reads (1: no versions, maybe no adapter folder)
READABLE_FORMATS = (1, 2)


class ReplayFileError(KvSpecError):
    """A replay file that cannot be used (names the line and what is wrong)."""


def outcome_json(o: StepOutcome) -> dict[str, Any]:
    """Canonical JSON of a step outcome (events in their canonical form)."""
    out: dict[str, Any] = {}
    if o.error is not None:
        out["error"] = o.error.model_dump(mode="json")
    else:
        assert o.result is not None
        out["result"] = o.result.model_dump(mode="json")
    out["counters"] = o.counters.model_dump(mode="json")
    out["events"] = [event_to_json(e) for e in o.events]
    if o.earliest_deadline_ms is not None:
        out["earliest_deadline_ms"] = o.earliest_deadline_ms
    return out


def write_replay(
    path: Path,
    *,
    adapter: str,
    config: ManagerConfig,
    protocol_only: bool,
    failure: dict[str, Any],
    ops: Sequence[Operation],
    expected: Sequence[StepOutcome],
    target: Target | None = None,
) -> Path:
    """Write the replay file: a header line, then one line per operation
    with the model's expected outcome. Returns ``path``."""
    header: dict[str, Any] = {
        "kvspec_replay": REPLAY_FORMAT,
        "adapter": adapter,
        "config": config.model_dump(mode="json"),
        "protocol_only": protocol_only,
        "failure": failure,
    }
    header.update(recorded_header(target))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        f.write(json.dumps(header) + "\n")
        for op, exp in zip(ops, expected, strict=True):
            f.write(json.dumps({"op": op.model_dump(mode="json"), "expect": outcome_json(exp)}) + "\n")
    tmp.replace(path)
    return path


@dataclass
class ReplayFile:
    path: Path
    adapter: str
    config: ManagerConfig
    protocol_only: bool
    failure: dict[str, Any] | None
    ops: list[Operation]
    expected: list[dict[str, Any] | None]
    #: the implementation the file was written against (None: not recorded)
    target: Target | None = None
    #: the versions it was written under (None: an older file)
    versions: Versions | None = None

    @property
    def recorded(self) -> bool:
        """Does the file say what it ran against and under which versions?"""
        return self.target is not None and self.versions is not None


def load_replay(path: Path) -> ReplayFile:
    """Read and validate a replay file (raises ReplayFileError)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ReplayFileError(f"{path}: cannot read: {e}") from e
    except UnicodeDecodeError as e:
        raise ReplayFileError(
            f"{path}: not a replay file: byte {e.start} is not UTF-8 text (replay files are JSON lines)"
        ) from e
    if not lines:
        raise ReplayFileError(f"{path}: empty file (expected a header line)")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError as e:
        raise ReplayFileError(f"{path}:1: header is not JSON: {e}") from e
    if not isinstance(header, dict) or "kvspec_replay" not in header:
        raise ReplayFileError(f'{path}:1: not a kvspec replay header (want "kvspec_replay": {REPLAY_FORMAT})')
    if header["kvspec_replay"] not in READABLE_FORMATS:
        raise ReplayFileError(
            f"{path}:1: replay format {header['kvspec_replay']!r} is not one this kvspec reads "
            f"({', '.join(map(str, READABLE_FORMATS))}): upgrade kvspec"
        )
    try:
        config = ManagerConfig.model_validate(header.get("config"))
    except ValidationError as e:
        raise ReplayFileError(f"{path}:1: invalid config:\n{e}") from e
    ops: list[Operation] = []
    expected: list[dict[str, Any] | None] = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ReplayFileError(f"{path}:{n}: not JSON: {e}") from e
        if not isinstance(rec, dict) or "op" not in rec:
            raise ReplayFileError(f'{path}:{n}: expected an object with an "op"')
        try:
            ops.append(parse_operation(rec["op"]))
        except ValidationError as e:
            raise ReplayFileError(f"{path}:{n}: invalid operation:\n{e}") from e
        expected.append(rec.get("expect"))
    return ReplayFile(
        path=path,
        adapter=str(header.get("adapter", "reference")),
        config=config,
        protocol_only=bool(header.get("protocol_only", False)),
        failure=header.get("failure"),
        ops=ops,
        expected=expected,
        target=_target(path, header),
        versions=_versions(path, header),
    )


def recorded_header(target: Target | None) -> dict[str, Any]:
    """The header fields that say which run a file comes from: the target's
    (when known) and this process's versions."""
    return {**(target.header() if target is not None else {}), "versions": current_versions().model_dump()}


def recorded_run(where: str, header: dict[str, Any]) -> tuple[Target | None, Versions | None]:
    """The implementation and versions a header records (None where it does
    not); raises ReplayFileError naming ``where`` when they are malformed."""
    return _target(where, header), _versions(where, header)


def _versions(path: Path | str, header: dict[str, Any]) -> Versions | None:
    raw = header.get("versions")
    if raw is None:
        return None
    try:
        return Versions.model_validate(raw)
    except ValidationError as e:
        raise ReplayFileError(f"{path}:1: invalid versions:\n{e}") from e


def _target(path: Path | str, header: dict[str, Any]) -> Target | None:
    """The recorded implementation (None when the header has none)."""
    if "adapter_path" not in header:
        return None
    fields = ("impl", "adapter_path", "variant", "effort", "hypothesis_seed")
    bad = [k for k in fields if header.get(k) is not None and not isinstance(header[k], str)]
    if bad or not isinstance(header.get("adapter_path"), str):
        raise ReplayFileError(f"{path}:1: {', '.join(bad) or 'adapter_path'} must be a string")
    return Target(
        impl=str(header.get("impl") or header["adapter_path"]),
        adapter_path=header["adapter_path"],
        variant=header.get("variant"),
        effort=header.get("effort"),
        hypothesis_seed=header.get("hypothesis_seed"),
    )


def provenance_lines(target: Target | None, versions: Versions | None) -> list[str]:
    """What ``kvspec replay`` prints about the run a file comes from, and
    whether the kvspec judging it now differs from the one that wrote it."""
    out: list[str] = []
    if target is not None:
        variant = f", variant {target.variant}" if target.variant else ""
        seed = f", --hypothesis-seed={target.hypothesis_seed}" if target.hypothesis_seed else ""
        out.append(f"recorded run: {target.adapter_path}{variant}, effort {target.effort}{seed}")
    now = current_versions()
    if versions is None:
        out.append(f"recorded versions: none (an older file); replaying under {now.label()}")
        return out
    out.append(f"recorded versions: {versions.label()}")
    if versions.spec_digest != now.spec_digest:
        # the operations replay exactly (nothing is generated: Hypothesis and
        # Python do not matter here); the model that judges them may differ
        out.append(
            f"note: written under kvspec {versions.kvspec}+{versions.spec_digest[:12]}, replayed under "
            f"{now.kvspec}+{now.spec_digest[:12]}: the spec or the model judging the operations may have changed"
        )
    return out
