"""The checked-in JSON Schemas are exactly what the wire models generate, and
they accept what the models emit and refuse what the models refuse."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from kvspec.spec.schema_export import SCHEMA_DIR, generated, stale
from kvspec.spec.wire import event_to_json, make_stored


def test_checked_in_schemas_match_the_models() -> None:
    assert stale() == [], "run `kvspec schemas` and commit spec/schema/"


def test_a_drifted_file_is_reported(tmp_path: Path) -> None:
    for name, text in generated().items():
        (tmp_path / name).write_text(text)
    assert stale(tmp_path) == []
    doc = json.loads((tmp_path / "kv_event.json").read_text())
    doc["title"] = "something else"
    (tmp_path / "kv_event.json").write_text(json.dumps(doc))
    assert stale(tmp_path) == ["kv_event.json"]


def _schema(name: str) -> dict:
    return json.loads((SCHEMA_DIR / name).read_text())


def test_event_schema_accepts_model_events_and_refuses_bad_ones() -> None:
    schema = _schema("kv_event.json")
    good = event_to_json(make_stored(0, [2**64 - 1], [5], None, token_ids=[[1, 2]]))
    jsonschema.validate(good, schema)
    bad = {**good, "event_id": -1}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**good, "surprise": 1}, schema)


def test_operation_schema_accepts_each_operation() -> None:
    schema = _schema("operation.json")
    for op in (
        {"op": "use", "blocks": [{"full": 1}, {"partial": "u"}], "plhs": [{"hash": 1}]},
        {"op": "deref", "blocks": [{"full": 1}]},
        {"op": "promote", "uuid": "u", "seq_hash": 2, "plh": {"hash": 2, "parent": 1, "position": 1}},
        {"op": "tick", "now_ms": 1.5},
        {"op": "swap_in", "blocks": [{"seq_hash": 1, "plh": {"hash": 1}}]},
    ):
        jsonschema.validate(op, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"op": "use", "blocks": [{"full": -3}]}, schema)
