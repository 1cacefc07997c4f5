"""JSON Schemas of the wire models, generated from the pydantic models.

``kvspec schemas`` rewrites ``spec/schema/*.json``; ``kvspec schemas --check``
exits non-zero when a checked-in file differs from what the models generate
(the test suite runs the same check), so the schemas can never drift.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from kvspec.spec.config import ManagerConfig
from kvspec.spec.engine_wire import EngineConfig, EngineOperation, EngineOutcome
from kvspec.spec.manager_wire import (
    MANAGER_CONFIG_ADAPTER,
    PAGED_OP_ADAPTER,
    SESSION_OP_ADAPTER,
    PagedOutcome,
    SessionOutcome,
)
from kvspec.spec.manifest import Manifest
from kvspec.spec.protocol import protocol_schema
from kvspec.spec.radix_wire import RADIX_OP_ADAPTER, RadixOutcome, RadixScenario
from kvspec.spec.scenario import Scenario
from kvspec.spec.wire import KvEvent, Operation, StepOutcome

SCHEMA_DIR = Path(__file__).parent / "schema"


def _schemas() -> dict[str, Callable[[], dict[str, Any]]]:
    return {
        "operation.json": lambda: TypeAdapter(Operation).json_schema(),
        "step_outcome.json": StepOutcome.model_json_schema,
        "kv_event.json": KvEvent.model_json_schema,
        "manager_config.json": ManagerConfig.model_json_schema,
        "scenario.json": Scenario.model_json_schema,
        "adapter_manifest.json": Manifest.model_json_schema,
        "protocol.json": protocol_schema,
        "engine_config.json": EngineConfig.model_json_schema,
        "engine_operation.json": lambda: TypeAdapter(EngineOperation).json_schema(),
        "engine_outcome.json": EngineOutcome.model_json_schema,
        "radix_operation.json": lambda: RADIX_OP_ADAPTER.json_schema(),
        "radix_outcome.json": RadixOutcome.model_json_schema,
        "radix_scenario.json": RadixScenario.model_json_schema,
        "allocator_config.json": MANAGER_CONFIG_ADAPTER.json_schema,
        "paged_operation.json": PAGED_OP_ADAPTER.json_schema,
        "paged_outcome.json": PagedOutcome.model_json_schema,
        "session_operation.json": SESSION_OP_ADAPTER.json_schema,
        "session_outcome.json": SessionOutcome.model_json_schema,
    }


def render(name: str, schema: dict[str, Any]) -> str:
    doc = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": f"kvspec/{name}", **schema}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def generated() -> dict[str, str]:
    return {name: render(name, fn()) for name, fn in _schemas().items()}


def stale(directory: Path = SCHEMA_DIR) -> list[str]:
    """Names of checked-in schema files that differ from the models."""
    out = []
    for name, text in generated().items():
        path = directory / name
        if not path.is_file() or path.read_text() != text:
            out.append(name)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if a file is stale")
    parser.add_argument("--dir", type=Path, default=SCHEMA_DIR, help="schema directory (default: spec/schema)")


def run(args: argparse.Namespace) -> int:
    if args.check:
        bad = stale(args.dir)
        for name in bad:
            print(f"stale: {args.dir / name} (run `kvspec schemas`)")
        return 1 if bad else 0
    args.dir.mkdir(parents=True, exist_ok=True)
    for name, text in generated().items():
        (args.dir / name).write_text(text)
        print(f"wrote {args.dir / name}")
    return 0
