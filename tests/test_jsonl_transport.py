"""The JSON-lines protocol and its transport, on well-behaved children.

- spec/schema/protocol.json is current and a valid JSON Schema;
- every example line of spec/PROTOCOL.md validates against it, and the
  reference server answers the examples' requests exactly as documented;
- ``JsonlImplementation`` over ``adapters/reference_jsonl`` returns the same
  outcomes as the in-process reference for the golden scenarios and a
  seeded random workload (so nothing is lost or changed in transit);
- the handshake, close and the server's protocol errors behave as documented.
Broken children are in test_jsonl_robustness.py.
"""

from __future__ import annotations

import io
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kvspec.adapters.reference.adapter import ReferenceImplementation
from kvspec.adapters.reference_jsonl import server as server_mod
from kvspec.adapters.reference_jsonl.server import Server
from kvspec.conformance.run.manifest import Capabilities, Manifest, load_manifest, resolve_adapter_dir
from kvspec.conformance.transport.jsonl import (
    JsonlImplementation,
    capability_mismatches,
    encode_hello,
    encode_request,
    expand_command,
    offered_versions,
    reuse_children,
)
from kvspec.conformance.transport.process import group_members
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.engine_wire import ENGINE_OPS, EngineConfig, parse_engine_operation
from kvspec.spec.errors import AdapterError, ConfigError
from kvspec.spec.protocol import (
    CHILD_MESSAGES,
    PARENT_MESSAGES,
    SCHEMA_PATH,
    protocol_schema,
)
from kvspec.spec.scenario import all_scenarios
from kvspec.spec.schema_export import generated
from kvspec.spec.wire import Deref, FullBlock, Plh, Tick, Use, parse_operation

pytestmark = pytest.mark.timeout(120)

PROTOCOL_MD = Path(__file__).resolve().parents[1] / "spec" / "PROTOCOL.md"
JSONL_DIR = resolve_adapter_dir("adapters/reference_jsonl")
REFERENCE_DIR = resolve_adapter_dir("adapters/reference")


# ------------------------------------------------------------------ schema


def test_checked_in_protocol_schema_is_current() -> None:
    assert SCHEMA_PATH.read_text() == generated()[SCHEMA_PATH.name], (
        "spec/schema/protocol.json is stale; regenerate: kvspec schemas"
    )


def test_protocol_schema_is_a_valid_json_schema_naming_every_message() -> None:
    schema = protocol_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for model in (*PARENT_MESSAGES, *CHILD_MESSAGES):
        assert model.__name__ in schema["$defs"]


VALIDATOR = jsonschema.Draft202012Validator(protocol_schema())
DIRECTION = {
    arrow: jsonschema.Draft202012Validator({"$ref": f"#/$defs/{which}", "$defs": protocol_schema()["$defs"]})
    for arrow, which in (("→", "ParentMessage"), ("←", "ChildMessage"))
}


@pytest.mark.parametrize(
    "message",
    [
        {
            "id": 1,
            "outcome": {
                "result": {"value": 1},
                "error": {"rule": "X", "message": "m"},
                "counters": {"active_blocks": 0, "active_refs": 0, "inactive_blocks": 0, "free_blocks": 1},
            },
        },
        {
            "id": 1,
            "outcome": {"counters": {"active_blocks": 0, "active_refs": 0, "inactive_blocks": 0, "free_blocks": 1}},
        },
        {"id": 0, "op": {"op": "reset"}},
        {"id": 1, "op": {"op": "deref", "blocks": [{"full": 2**64}]}},
        {"id": 1, "op": {"op": "use", "blocks": [], "extra": 1}},
        {"type": "hello", "versions": [], "config": {"capacity": 1}},
        {"type": "ready", "name": "x", "protocol": 1, "profile": "kvbm"},
        {"id": 1, "error": {"code": "oops", "message": ""}},
    ],
    ids=[
        "result-and-error",
        "neither",
        "id-0",
        "hash-over-u64",
        "unknown-field",
        "no-versions",
        "no-capabilities",
        "unknown-code",
    ],
)
def test_schema_rejects_invalid_messages(message: dict[str, Any]) -> None:
    assert not VALIDATOR.is_valid(message)


# ------------------------------------------------------------------ PROTOCOL.md examples


def doc_examples() -> list[tuple[str, list[tuple[str, str]]]]:
    """(info string, [(direction, line)]) for each example block of PROTOCOL.md."""
    text = PROTOCOL_MD.read_text()
    out = []
    for info, body in re.findall(r"```(text[^\n]*)\n(.*?)```", text, flags=re.S):
        lines = [(ln[0], ln[2:]) for ln in body.splitlines() if ln[:2] in ("→ ", "← ")]
        if lines:
            out.append((info.strip(), lines))
    return out


EXAMPLES = doc_examples()


def test_protocol_md_has_the_documented_examples() -> None:
    assert len(EXAMPLES) == 8  # five of version 1, two request-level sessions of version 2, one of version 5
    assert sum(len(lines) for _, lines in EXAMPLES) > 30


@pytest.mark.parametrize(("info", "lines"), EXAMPLES, ids=[f"block{i}" for i in range(len(EXAMPLES))])
def test_protocol_md_example_lines_match_the_schema(info: str, lines: list[tuple[str, str]]) -> None:
    for direction, line in lines:
        if (
            direction == "→"
            and info.endswith("malformed")
            and not line.startswith(('{"type":"hello"', '{"type":"bye"'))
        ):
            continue  # deliberately malformed lines
        message = json.loads(line)
        errors = [e.message for e in VALIDATOR.iter_errors(message)]
        assert not errors, f"{line}\n{errors}"
        assert DIRECTION[direction].is_valid(message), f"{direction} line is in the wrong direction: {line}"


@pytest.mark.parametrize(("info", "lines"), EXAMPLES, ids=[f"block{i}" for i in range(len(EXAMPLES))])
def test_reference_server_answers_protocol_md_examples_exactly(
    info: str, lines: list[tuple[str, str]], server_answers_as_documented: Callable[[list[tuple[str, str]]], None]
) -> None:
    server_answers_as_documented(lines)


WELL_FORMED = [(info, lines) for info, lines in EXAMPLES if not info.endswith("malformed")]


@pytest.mark.parametrize(("info", "lines"), WELL_FORMED, ids=[f"block{i}" for i in range(len(WELL_FORMED))])
def test_protocol_md_parent_lines_are_what_the_parent_writes(info: str, lines: list[tuple[str, str]]) -> None:
    for direction, line in lines:
        if direction != "→":
            continue
        msg = json.loads(line)
        if msg.get("type") == "hello":
            engine = EngineConfig.model_validate(msg["engine"]) if "engine" in msg else None
            workers = msg.get("workers", 1)
            if tuple(msg["versions"]) == offered_versions(engine, workers):
                assert encode_hello(ManagerConfig.model_validate(msg["config"]), engine, workers).decode() == line
        elif "op" in msg and msg["op"]["op"] in ENGINE_OPS:
            assert encode_request(msg["id"], parse_engine_operation(msg["op"])).decode() == line
        elif "op" in msg:
            assert encode_request(msg["id"], parse_operation(msg["op"]), msg.get("worker")).decode() == line


# ------------------------------------------------------------------ the transport, end to end


def _run_both(config: ManagerConfig, ops: list[Any]) -> None:
    manifest = load_manifest(JSONL_DIR)
    ref = ReferenceImplementation(config, load_manifest(REFERENCE_DIR))
    with JsonlImplementation(manifest, JSONL_DIR, config) as impl:
        for i, op in enumerate(ops):
            want = ref.step(op)
            got = impl.step(op)
            assert got.model_dump() == want.model_dump(), f"step {i} {op!r}"


def longest_scenario_per_folder() -> list[tuple[Path, Any]]:
    """One scenario per folder of spec/scenarios (one child process each costs ~0.3-1 s;
    the conformance run itself sends every scenario through the child)."""
    best: dict[str, tuple[Path, Any]] = {}
    for path, sc in all_scenarios():
        key = path.parent.name
        if key not in best or len(sc.steps) > len(best[key][1].steps):
            best[key] = (path, sc)
    return [best[k] for k in sorted(best)]


SAMPLE = longest_scenario_per_folder()


@pytest.mark.parametrize(("path", "scenario"), SAMPLE, ids=[f"{p.parent.name}/{p.stem}" for p, _ in SAMPLE])
def test_golden_scenarios_cross_the_process_boundary_unchanged(path: Path, scenario: Any) -> None:
    manifest = load_manifest(JSONL_DIR)
    if scenario.config.profile not in manifest.supported_profiles():
        pytest.skip(f"reference_jsonl does not declare profile:{scenario.config.profile}")
    _run_both(scenario.config, [s.op for s in scenario.steps])


def random_ops(seed: int, n: int) -> list[Any]:
    """A seeded mix of Use/Deref (with rejected Derefs and evictions) and ticks."""
    rng = random.Random(seed)
    ops: list[Any] = []
    held: list[int] = []
    now = 0.0
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            h = rng.randrange(1, 40)
            toks = [[rng.randrange(0, 2**32) for _ in range(4)]] if rng.random() < 0.5 else None
            ops.append(Use(blocks=[FullBlock(full=h)], local_hashes=[h * 7], plhs=[Plh(hash=h)], token_ids=toks))
            held.append(h)
        elif r < 0.85 and held:
            ops.append(Deref(blocks=[FullBlock(full=held.pop(rng.randrange(len(held))))]))
        elif r < 0.92:
            ops.append(Deref(blocks=[FullBlock(full=2**64 - 1 - rng.randrange(5))]))  # unknown: rejected
        else:
            now += rng.choice([0.5, 1.0, 3.0])
            ops.append(Tick(now_ms=now))
    return ops


def test_random_workload_with_offload_crosses_unchanged() -> None:
    config = ManagerConfig(
        capacity=6, eviction="lru", offload=OffloadConfig.legacy(num_g2_blocks=5, block_size_bytes=1_000_000)
    )
    _run_both(config, random_ops(seed=7, n=400))


def test_dict_operations_are_validated_and_sent() -> None:
    with JsonlImplementation(load_manifest(JSONL_DIR), JSONL_DIR, ManagerConfig(capacity=2)) as impl:
        out = impl.step({"op": "use", "blocks": [{"full": 5}], "plhs": [{"hash": 5}]})  # type: ignore[arg-type]  # a dict, on purpose
        assert out.result is not None and out.result.value == 1
        assert [e.hashes() for e in out.events] == [[5]]


def test_handshake_and_clean_close() -> None:
    config = ManagerConfig(profile="legacy", capacity=2, eviction="lru")
    impl = JsonlImplementation(load_manifest(JSONL_DIR), JSONL_DIR, config)
    assert impl.ready is not None
    assert impl.ready.protocol == 6  # offered [1, 2, 6] (its manifest says protocol = 6): the newest both speak
    assert impl.ready.profile == "legacy"
    assert impl.ready.name.startswith("kvspec reference model")
    pgid = impl.pgid
    assert group_members(pgid) == [impl.pid]
    impl.close()
    impl.close()
    assert impl.exit_status == 0  # it exited on bye, not on a signal
    assert group_members(pgid) == []


def test_reference_jsonl_claims_what_the_reference_claims() -> None:
    """Everything, the request level included (protocol version 2 carries it)."""
    jsonl, ref = load_manifest(JSONL_DIR), load_manifest(REFERENCE_DIR)
    assert jsonl.kind == "subprocess"
    assert jsonl.profile == ref.profile
    # every profile, radix included (protocol version 4 carries it; the reference serves
    # it in process through start.radix, reference_jsonl through the protocol)
    assert "radix" in ref.capabilities.profiles and ref.start.radix is not None
    assert jsonl.capabilities == ref.capabilities
    assert jsonl.start.radix is None
    assert jsonl.start.requests is None  # the request level goes through the protocol, not a Python factory


def test_manifest_claiming_more_than_the_child_announces_fails_the_handshake() -> None:
    manifest = load_manifest(JSONL_DIR)
    # (the reference server announces every capability its manifest declares,
    # reset included: only a larger capacity can be claimed beyond it)
    caps = manifest.capabilities.model_copy(update={"max_capacity": 2_000_000})
    lying = manifest.model_copy(update={"capabilities": caps})
    with pytest.raises(
        AdapterError,
        match=r"declares capabilities the adapter's handshake does not: max_capacity >= 2000000 \(announces 1000000\)",
    ):
        JsonlImplementation(lying, JSONL_DIR, ManagerConfig(capacity=2))


def test_capability_mismatches() -> None:
    claimed = Capabilities(offload=True, tiers=["device", "host_pinned"], max_capacity=100)
    assert capability_mismatches(claimed, claimed) == []
    announced = Capabilities(offload=False, tiers=["device"], max_capacity=10)
    assert capability_mismatches(claimed, announced) == [
        "offload",
        "tier:host_pinned",
        "max_capacity >= 100 (announces 10)",
    ]
    # announcing more than the manifest claims is fine
    assert capability_mismatches(announced, claimed) == []


def test_expand_command(tmp_path: Path) -> None:
    import sys

    assert expand_command(["{python}", "{adapter_dir}/x.py", "-v"], tmp_path) == [
        sys.executable,
        f"{tmp_path}/x.py",
        "-v",
    ]


def test_subprocess_manifest_without_command_is_a_config_error() -> None:
    m = Manifest(name="nocmd", kind="subprocess", profile="kvbm")
    with pytest.raises(ConfigError, match=r"needs start\.command"):
        JsonlImplementation(m, JSONL_DIR, ManagerConfig(capacity=1))


# ------------------------------------------------------------------ the server, in-process


def serve(*lines: bytes) -> tuple[int, list[dict[str, Any]]]:
    wfile = io.BytesIO()
    rc = Server(io.BytesIO(b"".join(line + b"\n" for line in lines)), wfile).serve()
    return rc, [json.loads(x) for x in wfile.getvalue().splitlines()]


HELLO = encode_hello(ManagerConfig(capacity=2))


def test_server_exits_cleanly_at_end_of_input_without_bye() -> None:
    rc, out = serve(HELLO, encode_request(1, Use(blocks=[FullBlock(full=1)], plhs=[Plh(hash=1)])))
    assert rc == 0
    assert [m.get("type") or "reply" for m in out] == ["ready", "reply"]


def test_server_refuses_a_config_the_model_rejects(monkeypatch: pytest.MonkeyPatch) -> None:
    def make_model(config: ManagerConfig) -> Any:
        raise ConfigError("no such policy here")

    monkeypatch.setattr(server_mod, "make_model", make_model)
    rc, out = serve(HELLO)
    assert rc == 1
    assert out == [{"type": "refused", "error": {"code": "unsupported_config", "message": "no such policy here"}}]


def test_server_refuses_a_first_line_that_is_not_hello() -> None:
    rc, out = serve(b'{"id":1,"op":{"op":"reset"}}')
    assert rc == 1
    assert out[0]["type"] == "refused" and "not a valid hello" in out[0]["error"]["message"]


def test_server_reports_an_overlong_request_and_continues() -> None:
    huge = b'{"id":1,"op":{"op":"deref","blocks":[' + b'{"full":1},' * 200_000 + b'{"full":1}]}}'
    assert len(huge) > server_mod.MAX_REQUEST_BYTES
    rc, out = serve(HELLO, huge, encode_request(2, Deref(blocks=[FullBlock(full=9)])))
    assert rc == 0
    assert out[1]["id"] is None and out[1]["error"]["code"] == "malformed_request"
    assert out[2]["id"] == 2 and out[2]["outcome"]["error"]["rule"] == "DEREF-UNKNOWN"


# ------------------------------------------------------------------ reusing children (PROTOCOL.md 3.8)

BROKEN = Path(__file__).parent / "broken_adapters"


def test_reuse_children_runs_fresh_sessions_in_one_process() -> None:
    manifest = load_manifest(JSONL_DIR)
    first_config = ManagerConfig(capacity=2, eviction="lru")
    second_config = ManagerConfig(profile="legacy", capacity=2, eviction="lru")
    op = Use(blocks=[FullBlock(full=7)], local_hashes=[70], plhs=[Plh(hash=7)])
    with reuse_children() as pool:
        first = JsonlImplementation(manifest, JSONL_DIR, first_config)
        assert first.ready is not None and first.ready.multi_session
        first.step(op)
        first.close()
        assert group_members(first.pgid) == [first.pid], "the idle child should wait in the pool"
        second = JsonlImplementation(manifest, JSONL_DIR, second_config)
        assert second.reused and second.pid == first.pid and pool.reused == 1
        assert second.ready is not None and second.ready.profile == "legacy"
        # a fresh manager: same outcome as a new in-process reference (event ids from 0 again)
        want = ReferenceImplementation(second_config, load_manifest(REFERENCE_DIR)).step(op)
        assert second.step(op).model_dump() == want.model_dump()
        second.close()
    assert group_members(first.pgid) == [], "leaving reuse_children() must end idle children"


def test_reuse_children_never_keeps_a_failed_or_single_session_child() -> None:
    with reuse_children() as pool:
        failed = JsonlImplementation(load_manifest(BROKEN / "garbage"), BROKEN / "garbage", ManagerConfig(capacity=2))
        assert failed.ready is not None and failed.ready.multi_session
        with pytest.raises(AdapterError, match="not valid JSON"):
            for i in range(1, 4):
                failed.step(Use(blocks=[FullBlock(full=i)], plhs=[Plh(hash=i)]))
        failed.close()
        single = JsonlImplementation(
            load_manifest(BROKEN / "two_lines"), BROKEN / "two_lines", ManagerConfig(capacity=2)
        )
        single.close()
        assert single.exit_status == 0
        assert pool.idle_children() == []
        assert group_members(failed.pgid) == [] and group_members(single.pgid) == []
