"""Protocol version 2: request-level sessions over JSON lines.

- the messages: schemas generated and current, the hello of a block-level
  session byte for byte the version-1 one, a request-level hello offering
  version 2 only;
- the reference server: request-level sessions answer as the in-process
  reference engine does (sequential and concurrent, every event), refuse
  what does not belong in them with the documented protocol errors, and a
  version-1 handshake is still served;
- the request-level driver (``transport.engine``) over the reference server
  returns exactly what the in-process reference adapter returns;
- robustness: a request-level child that crashes, hangs, writes garbage, an
  oversized line, a reply of the wrong shape or id, or an engine that
  stalls, forgets or invents requests ends in one clear ``AdapterError``
  naming what went wrong, within a bounded time, with nothing left running.
"""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kvspec.adapters.reference_jsonl.server import Server
from kvspec.adapters.reference_requests.adapter import ReferenceRequests
from kvspec.conformance.requests.api import open_request_implementation
from kvspec.conformance.requests.workloads import seed_workloads, setup_of
from kvspec.conformance.run.manifest import Capabilities, Manifest, Start, load_manifest, resolve_adapter_dir
from kvspec.conformance.transport.engine import EngineImplementation, open_engine_implementation, step_budget
from kvspec.conformance.transport.jsonl import JsonlImplementation, encode_hello, offered_versions
from kvspec.conformance.transport.process import group_members
from kvspec.reference.requests import RequestSpec
from kvspec.spec.config import ManagerConfig
from kvspec.spec.engine_wire import AddRequest, EngineConfig, EngineStep, ResetPrefixCache, parse_engine_operation
from kvspec.spec.errors import AdapterError, ConfigError
from kvspec.spec.protocol import BLOCK_VERSIONS, protocol_schema
from kvspec.spec.schema_export import SCHEMA_DIR, stale
from kvspec.spec.wire import FullBlock, Plh, Use

pytestmark = pytest.mark.timeout(120)

JSONL_DIR = resolve_adapter_dir("adapters/reference_jsonl")
BROKEN = Path(__file__).parent / "broken_adapters"
VLLM = ManagerConfig(profile="vllm", capacity=4, block_size=2, eviction="lru")
#: "within the timeout": the 1 s call timeout plus start-up, kill and reaping on a loaded machine
BOUND_S = 8.0


def hello(versions: list[int], engine: dict[str, Any] | None, profile: str = "vllm") -> str:
    msg: dict[str, Any] = {"type": "hello", "versions": versions, "config": {**VLLM.model_dump(), "profile": profile}}
    if engine is not None:
        msg["engine"] = engine
    return json.dumps(msg)


def serve(*lines: str) -> list[dict[str, Any]]:
    """Run the reference server on these lines; its answers, decoded."""
    out = io.BytesIO()
    Server(io.BytesIO(("\n".join(lines) + "\n").encode()), out).serve()
    return [json.loads(x) for x in out.getvalue().decode().splitlines()]


def add(rid: int, name: str, prompt: list[int], max_tokens: int) -> str:
    op = {"op": "add_request", "request_id": name, "prompt": prompt, "max_tokens": max_tokens}
    return json.dumps({"id": rid, "op": op})


def step(rid: int) -> str:
    return json.dumps({"id": rid, "op": {"op": "step"}})


# ------------------------------------------------------------------ the messages


def test_schemas_are_current_and_valid() -> None:
    assert stale() == []
    for name in ("engine_config.json", "engine_operation.json", "engine_outcome.json", "protocol.json"):
        jsonschema.Draft202012Validator.check_schema(json.loads((SCHEMA_DIR / name).read_text()))
    defs = protocol_schema()["$defs"]
    assert {"EngineRequest", "EngineOutcomeReply", "EngineOutcome", "EngineConfig"} <= set(defs)
    assert "engine" in defs["Hello"]["properties"]


def test_engine_operation_schema_accepts_the_models_and_refuses_bad_ones() -> None:
    validator = jsonschema.Draft202012Validator(json.loads((SCHEMA_DIR / "engine_operation.json").read_text()))
    good = [
        AddRequest(op="add_request", request_id="r0", prompt=[1, 2**32 - 1], max_tokens=4),
        EngineStep(op="step"),
        ResetPrefixCache(op="reset_prefix_cache"),
    ]
    for op in good:
        assert validator.is_valid(json.loads(op.model_dump_json())), op
        assert parse_engine_operation(json.loads(op.model_dump_json())) == op
    bad = [
        {"op": "add_request", "request_id": "r0", "prompt": [], "max_tokens": 1},
        {"op": "add_request", "request_id": "", "prompt": [1], "max_tokens": 1},
        {"op": "add_request", "request_id": "r0", "prompt": [2**32], "max_tokens": 1},
        {"op": "add_request", "request_id": "r0", "prompt": [1], "max_tokens": 0},
        {"op": "step", "extra": 1},
        {"op": "use", "blocks": []},
    ]
    for msg in bad:
        assert not validator.is_valid(msg), msg


def test_block_level_hello_is_the_version_1_hello_and_engine_hello_offers_version_2_only() -> None:
    cfg = ManagerConfig(capacity=3)
    block = json.loads(encode_hello(cfg))
    assert "engine" not in block  # a version-1 child reads exactly the hello it knows
    assert block["versions"] == list(BLOCK_VERSIONS) == [1, 2]
    eng = json.loads(encode_hello(VLLM, EngineConfig(host_blocks=3)))
    assert eng["versions"] == [2] == list(offered_versions(EngineConfig()))
    assert eng["engine"] == {"host_blocks": 3}


# ------------------------------------------------------------------ the reference server


def test_request_level_session_end_to_end() -> None:
    got = serve(
        hello([2], {"host_blocks": None}),
        add(1, "a", [1, 2, 3, 4, 5], 2),
        step(2),
        step(3),
        step(4),
        json.dumps({"id": 5, "op": {"op": "reset_prefix_cache"}}),
        '{"type":"bye"}',
    )
    ready, added, prefill, decode, finish, reset = got
    assert ready["protocol"] == 2 and ready["capabilities"]["request_level"] is True
    assert added["outcome"]["waiting"] == 1 and added["outcome"]["running"] == 0
    assert prefill["outcome"]["running"] == 1
    [stored] = prefill["outcome"]["events"]
    assert len(stored["data"]["stored"]["blocks"]) == 2  # the prompt's two full blocks
    assert decode["outcome"]["finished"] == []
    assert len(decode["outcome"]["events"]) == 1  # the tail block filled by the first generated token
    assert finish["outcome"]["finished"] == [
        {"request_id": "a", "finish_reason": "length", "cached_tokens": 0, "output_tokens": 2}
    ]
    assert finish["outcome"]["counters"]["active_blocks"] == 0
    assert reset["outcome"]["reset"] is True
    assert [e["data"] for e in reset["outcome"]["events"]] == ["cleared"]


def test_request_that_can_never_fit_is_rejected_at_once() -> None:
    got = serve(hello([2], {}), add(1, "big", list(range(1, 9)), 2), step(2))  # 9 tokens > 4 blocks x 2
    assert got[1]["outcome"]["finished"] == [{"request_id": "big", "finish_reason": "rejected", "output_tokens": 0}]
    assert got[2]["outcome"]["running"] == got[2]["outcome"]["waiting"] == 0


def test_reset_fails_while_a_request_holds_blocks() -> None:
    got = serve(
        hello([2], {}), add(1, "a", [1, 2, 3], 3), step(2), json.dumps({"id": 3, "op": {"op": "reset_prefix_cache"}})
    )
    assert got[3]["outcome"]["reset"] is False
    assert got[3]["outcome"]["events"] == []


@pytest.mark.parametrize(
    ("session", "line", "code", "text"),
    [
        (
            "engine",
            json.dumps({"id": 1, "op": {"op": "deref", "blocks": []}}),
            "unexpected_message",
            "block operation 'deref'",
        ),
        ("block", step(1), "unexpected_message", "request-level operation 'step' in a block-level session"),
        ("engine", json.dumps({"id": 1, "op": {"op": "step", "now": 1}}), "malformed_request", "op.step.now"),
        ("engine", '{"id": 1, "op":', "malformed_request", "not valid JSON"),
    ],
)
def test_server_protocol_errors_in_sessions(session: str, line: str, code: str, text: str) -> None:
    first = hello([1, 2], {} if session == "engine" else None, "vllm")
    got = serve(first, line, '{"type":"bye"}')
    assert got[1]["error"]["code"] == code
    assert text in got[1]["error"]["message"], got[1]


def test_duplicate_request_id_is_a_protocol_error_and_changes_nothing() -> None:
    got = serve(hello([2], {}), add(1, "a", [1, 2], 1), add(2, "a", [3, 4], 1), step(3))
    assert got[2] == {
        "id": 2,
        "error": {"code": "malformed_request", "message": "request id 'a' is already in use in this session"},
    }
    assert got[3]["outcome"]["running"] == 1  # only the first one runs


@pytest.mark.parametrize(
    ("first", "code", "text"),
    [
        (hello([1], {}), "unsupported_version", "speaks request-level sessions in versions [2], offered [1]"),
        (hello([2], {}, profile="kvbm"), "unsupported_config", "needs the vllm profile"),
        (hello([2], {"host_blocks": 0}), "unsupported_config", "engine.host_blocks"),
    ],
)
def test_server_refuses_a_request_level_hello_it_cannot_serve(first: str, code: str, text: str) -> None:
    [refused] = serve(first)
    assert refused["type"] == "refused" and refused["error"]["code"] == code
    assert text in refused["error"]["message"], refused


def test_version_1_parent_is_still_served() -> None:
    """A parent that speaks version 1 only gets version 1 and block operations, as before."""
    use = {"op": "use", "blocks": [{"full": 7}], "plhs": [{"hash": 7}]}
    ready, reply = serve(hello([1], None, "kvbm"), json.dumps({"id": 1, "op": use}))
    assert ready["protocol"] == 1 and ready["capabilities"]["request_level"] is False
    assert reply["outcome"]["result"] == {"value": 1, "status": "ok"}


# ------------------------------------------------------------------ the driver, end to end


def _reference_outcomes(workload: Any) -> Any:
    ref = ReferenceRequests(workload.setup, load_manifest(resolve_adapter_dir("adapters/reference_requests")))
    if workload.concurrent:
        return ref.run_concurrent(workload.requests)
    return ref.run_sequential(workload.requests)


@pytest.mark.parametrize("index", range(len(seed_workloads())))
def test_reference_jsonl_request_level_equals_the_in_process_reference(index: int) -> None:
    """Every cached-token count and every event (ids, tiers, hashes, parents,
    order) crosses the process boundary unchanged (a fresh child: decode salt 1,
    as the in-process adapter's first run)."""
    w = seed_workloads()[index]
    manifest = load_manifest(JSONL_DIR)
    impl = open_request_implementation(manifest, JSONL_DIR, w.setup)
    assert isinstance(impl, EngineImplementation)
    try:
        got: Any = impl.run_concurrent(w.requests) if w.concurrent else impl.run_sequential(w.requests)
    finally:
        impl.close()
    want: Any = _reference_outcomes(w)
    # the in-process adapter does not report output_tokens (0); through v2 the engine does
    got_out = got.outcomes if w.concurrent else got
    assert [o.output_tokens for o in got_out] == [r.max_tokens for r in w.requests]
    if w.concurrent:
        drop: Any = {"outcomes": {"__all__": {"output_tokens"}}}
        assert got.model_dump(exclude=drop) == want.model_dump(exclude=drop)
        assert got.events
    else:
        assert [o.model_dump(exclude={"output_tokens"}) for o in got] == [
            o.model_dump(exclude={"output_tokens"}) for o in want
        ]
        assert any(o.events for o in got)


def test_block_level_adapter_without_request_level_is_refused_by_name() -> None:
    manifest = load_manifest(JSONL_DIR)
    no_requests = manifest.model_copy(
        update={"capabilities": manifest.capabilities.model_copy(update={"request_level": False})}
    )
    with pytest.raises(ConfigError, match="does not declare request_level"):
        open_request_implementation(no_requests, JSONL_DIR, setup_of(4, 2))


def test_sessions_take_only_their_own_operations() -> None:
    manifest = load_manifest(JSONL_DIR)
    with (
        JsonlImplementation(manifest, JSONL_DIR, VLLM, engine=EngineConfig()) as impl,
        pytest.raises(ConfigError, match="takes no block operations"),
    ):
        impl.step(Use(blocks=[FullBlock(full=1)], plhs=[Plh(hash=1)]))
    with (
        JsonlImplementation(manifest, JSONL_DIR, VLLM) as impl,
        pytest.raises(ConfigError, match="takes no request-level operations"),
    ):
        impl.engine_call(EngineStep(op="step"))


def test_step_budget_allows_every_sane_schedule() -> None:
    reqs = [RequestSpec(prompt=[1] * 10, max_tokens=5), RequestSpec(prompt=[2], max_tokens=1)]
    assert step_budget(reqs) == 10 + 5 + 1 + 1 + 16


# ------------------------------------------------------------------ robustness


def broken(mode: str) -> Manifest:
    return Manifest(
        name=f"broken_engine_{mode}",
        kind="subprocess",
        profile="vllm",
        start=Start(
            command=["{python}", "{adapter_dir}/broken_engine.py", mode],
            timeout_s=1.0,
            startup_timeout_s=5.0,
            max_reply_bytes=65536,
        ),
        capabilities=Capabilities(block_level=False, request_level=True, tiers=["device", "host_pinned"]),
    )


def assert_group_gone(pgid: int, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert group_members(pgid) == [], f"processes left in group {pgid}: {group_members(pgid)}"


SETUP = setup_of(4, 2)
ONE = [RequestSpec(prompt=[1, 2, 3], max_tokens=2)]


@pytest.mark.parametrize(
    ("mode", "pattern"),
    [
        ("crash", r"exited to request 2 \(step\) \(exit status 3\)"),
        ("segfault", r"exited to request 2 \(step\) \(killed by SIGSEGV\)"),
        ("hang", r"no reply to request 2 \(step\) within 1 s: the adapter hangs; its process group was killed"),
        ("garbage", r"reply to request 2 \(step\) is not valid JSON .*'scheduler: step 1 admitted 1 request"),
        ("wrong_id", r"reply to request 2 \(step\) carries id 3, expected 2"),
        (
            "schema",
            r"EngineOutcomeReply to request 2 \(step\) does not match the protocol schema: "
            r"outcome\.running: Input should be greater than or equal to 0",
        ),
        (
            "step_outcome",
            r"EngineOutcomeReply to request 2 \(step\) does not match the protocol schema: "
            r"outcome\.running: Field required",
        ),
        ("oversized", r"reply to request 2 \(step\) is larger than max_reply_bytes=65536"),
        ("protocol_error", r"protocol error to request 2 \(step\): unsupported_op: step is not implemented"),
        ("unknown_finish", r"step 1: reports request 'someone-else' finished, which is not running"),
        ("finish_twice", r"step 1: request 'w1r0' finished twice"),
        ("stall", r"requests \['w1r0'\] did not finish within 21 engine steps .*: the engine stalls"),
        ("idle", r"after step 1 the engine reports nothing running or waiting, but requests \['w1r0'\] never finished"),
    ],
)
def test_misbehaving_request_level_child_is_one_clear_adapter_error(mode: str, pattern: str) -> None:
    impl = open_engine_implementation(broken(mode), BROKEN, SETUP)
    child = impl.caller
    assert isinstance(child, JsonlImplementation)
    pgid = child.pgid
    start = time.monotonic()
    with pytest.raises(AdapterError) as info:
        impl.run_sequential(ONE)
    elapsed = time.monotonic() - start
    impl.close()
    assert re.search(pattern, str(info.value)), str(info.value)
    assert f"adapter 'broken_engine_{mode}'" in str(info.value)
    assert elapsed < BOUND_S, f"{mode}: took {elapsed:.1f} s"
    assert_group_gone(pgid)
    if child.dead is not None:  # a transport failure: the session is over
        with pytest.raises(AdapterError, match="not usable after an earlier failure"):
            child.engine_call(EngineStep(op="step"))


def test_crash_keeps_the_childs_last_words() -> None:
    impl = open_engine_implementation(broken("crash"), BROKEN, SETUP)
    with pytest.raises(AdapterError) as info:
        impl.run_sequential(ONE)
    impl.close()
    assert "fatal: block table corrupted in step 1" in info.value.stderr_tail
    assert info.value.exit_status == 3


@pytest.mark.parametrize(
    ("mode", "pattern"),
    [
        ("v1_only", r"refused the handshake \(unsupported_version\): speaks versions \[1\], offered \[2\]"),
        ("picks_v1", r"chose protocol version 1, which the parent did not offer \(offered \[2\]\)"),
    ],
)
def test_version_1_child_cannot_open_a_request_level_session(mode: str, pattern: str) -> None:
    with pytest.raises(AdapterError, match=pattern):
        open_engine_implementation(broken(mode), BROKEN, SETUP)


# ------------------------------------------------------------------ kvspec replay of a request workload


def test_kvspec_replay_runs_a_request_workload_through_v2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.cli import main as cli_main
    from kvspec.conformance.requests.workloads import Workload

    w = Workload(setup=setup_of(6, 4), requests=[RequestSpec(prompt=list(range(1, 9)), max_tokens=1)] * 2)
    path = tmp_path / "requests-VLLM-PREFIX-HIT.jsonl"
    path.write_text(w.to_jsonl())
    assert cli_main(["replay", str(path), "--impl", "adapters/reference_jsonl"]) == 0
    assert "conforms" in capsys.readouterr().out
    assert cli_main(["replay", str(path), "--impl", "adapters/mutants/prefix_hit_uncapped"]) == 1
    out = capsys.readouterr().out
    assert "[VLLM-PREFIX-HIT] (NOT DECLARED: " in out and "8 cached tokens" in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kvspec":"request-workload","version":1,"setup":{"manager":{"profile":"vllm","capacity":1}}}\n')
    assert cli_main(["replay", str(bad), "--impl", "adapters/reference_jsonl"]) == 2
    assert "cannot run" in capsys.readouterr().out
