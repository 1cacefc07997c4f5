"""The request-level C port (adapters/vllm_c_port) and the C ABI version 2.

- the port's own XXH3 equals the xxhash package on every input length of
  each code path, and its block hashes are kvspec's (HASH-LOCAL,
  HASH-SEQUENCE);
- the ABI contract for request-level handles: ``kvspec_open`` refuses (no
  block level), ``kvspec_open_engine`` refuses what it does not run naming
  the field, a malformed request is ``KVSPEC_E_REQUEST`` naming the field and
  changes nothing, a reply larger than the buffer is held;
- the whole request-level exploration through FFI in this process
  (isolation "inprocess": seeds and generated workloads find nothing);
- robustness under process isolation for the new messages: a crash, a hang,
  a reply that breaks the schema and an oversized reply are each one clear
  AdapterError with nothing left running, a library that prints does not
  corrupt the protocol (test-only hooks, ``-DKVSPEC_TEST_HOOKS``);
- compatibility: a library of ABI version 1 keeps working at block level and
  is refused by name for a request-level session; a missing compiler is
  named.

CI cost: about 10 s (two builds of the port, one of c_port pinned to ABI 1).
"""

from __future__ import annotations

import ctypes
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings

from kvspec.conformance.requests.replay import run_workload
from kvspec.conformance.requests.workloads import Workload, seed_workloads, setup_of, workloads
from kvspec.conformance.run.manifest import Manifest, load_manifest
from kvspec.conformance.transport.cabi import E_REQUEST, CAbiImplementation, CAbiLibrary, CAbiSession, build_library
from kvspec.conformance.transport.engine import EngineImplementation, open_engine_implementation
from kvspec.conformance.transport.jsonl import AdapterProtocolError, reuse_children
from kvspec.conformance.transport.process import group_members
from kvspec.reference.requests import RequestSpec
from kvspec.spec.config import ManagerConfig
from kvspec.spec.engine_wire import AddRequest, EngineConfig, EngineOutcome, EngineStep
from kvspec.spec.errors import AdapterError, ConfigError
from kvspec.spec.hashing import block_hashes
from kvspec.spec.wire import FullBlock, Plh, Stored, Use

pytestmark = pytest.mark.timeout(300)

ADAPTERS = Path(__file__).resolve().parent.parent / "adapters"
PORT = ADAPTERS / "vllm_c_port"
VLLM = ManagerConfig(profile="vllm", capacity=8, block_size=4, eviction="lru", dp_rank=2)
ENGINE = EngineConfig(host_blocks=4)


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(PORT)


@pytest.fixture(scope="module")
def lib(build_env: None, manifest: Manifest) -> CAbiLibrary:
    lib = CAbiLibrary(build_library(manifest, PORT))
    lib.dll.xxh3_64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
    lib.dll.xxh3_64.restype = ctypes.c_uint64
    return lib


@pytest.fixture(scope="module")
def hooks_manifest(manifest: Manifest) -> Manifest:
    """The port built with its test-only request ids, 1 s call timeout, 64 KiB replies."""
    start = manifest.start.model_copy(
        update={
            "cflags": [*manifest.start.cflags, "-DKVSPEC_TEST_HOOKS"],
            "timeout_s": 1.0,
            "max_reply_bytes": 65536,
        }
    )
    return manifest.model_copy(update={"start": start})


def session(lib: CAbiLibrary, config: ManagerConfig = VLLM, engine: EngineConfig = ENGINE) -> CAbiSession:
    return CAbiSession(lib, config.model_dump_json(), engine_json=engine.model_dump_json())


def add(name: str, prompt: list[int], max_tokens: int) -> bytes:
    return (
        AddRequest(op="add_request", request_id=name, prompt=prompt, max_tokens=max_tokens).model_dump_json().encode()
    )


STEP = b'{"op":"step"}'


def outcome(raw: bytes) -> EngineOutcome:
    return EngineOutcome.model_validate_json(raw)


# ------------------------------------------------------------------ hashing


def test_xxh3_equals_xxhash_on_every_code_path(lib: CAbiLibrary) -> None:
    rng = random.Random(5)
    data = bytes(rng.randrange(256) for _ in range(2200))
    lengths = [*range(0, 260), 1023, 1024, 1025, 2048, 2200]  # 0-16, 17-128, 129-240, long: one and several blocks
    for seed in (0, 1337, 2**64 - 1, rng.randrange(2**64)):
        for n in lengths:
            assert lib.dll.xxh3_64(data[:n], n, seed) == xxhash.xxh3_64_intdigest(data[:n], seed=seed), (n, seed)


def test_prompt_blocks_are_stored_with_kvspecs_hashes(lib: CAbiLibrary) -> None:
    prompt = [7, 2**32 - 1, 0, 99, 5, 6, 7, 8, 9]
    s = session(lib)
    s.call(add("a", prompt, 1))
    out = outcome(s.call(STEP))
    [stored] = [e for e in out.events if e.storage_tier == "device"]
    assert isinstance(stored.data, Stored)
    got = [(b.block_hash, b.tokens_hash) for b in stored.data.stored.blocks]
    assert got == block_hashes(prompt, 4)
    s.close()


# ------------------------------------------------------------------ the ABI


def test_abi_version_2_with_a_request_level_only(lib: CAbiLibrary) -> None:
    assert lib.version == 2 and lib.has_engine
    err = ctypes.create_string_buffer(256)
    assert not lib.dll.kvspec_open(
        ManagerConfig(profile="vllm", capacity=4, eviction="lru").model_dump_json().encode(), err, 256
    )
    assert b"request level only" in err.value and b"kvspec_open_engine" in err.value


@pytest.mark.parametrize(
    ("config", "engine", "field"),
    [
        ({"profile": "kvbm", "capacity": 4}, {}, "config.profile: the vllm_c_port runs the vllm profile only"),
        ({"profile": "vllm", "capacity": 4}, {}, "config.eviction"),
        ({"profile": "vllm", "capacity": 4, "eviction": "lru", "offload": {"num_g2_blocks": 2}}, {}, "config.offload"),
        ({"profile": "vllm", "capacity": 4, "eviction": "lru", "speed": 1}, {}, "config.speed: unknown field"),
        ({"profile": "vllm", "capacity": 0, "eviction": "lru"}, {}, "config.capacity: 0 is outside 1..1000000"),
        (
            {"profile": "vllm", "capacity": 4.0, "eviction": "lru"},
            {},
            "config.capacity: expected a non-negative integer",
        ),
        ({"profile": "vllm", "capacity": 4, "eviction": "lru"}, {"host_blocks": 0}, "engine.host_blocks: 0 is outside"),
        ({"profile": "vllm", "capacity": 4, "eviction": "lru"}, {"host": 1}, "engine.host: unknown field"),
        ({"profile": "vllm", "eviction": "lru"}, {}, "config.capacity: field required"),
    ],
)
def test_open_engine_refuses_what_it_does_not_run(
    lib: CAbiLibrary, config: dict[str, Any], engine: dict[str, Any], field: str
) -> None:
    err = ctypes.create_string_buffer(512)
    assert not lib.dll.kvspec_open_engine(json.dumps(config).encode(), json.dumps(engine).encode(), err, 512)
    assert field in err.value.decode(), err.value


@pytest.mark.parametrize(
    ("request_text", "field"),
    [
        (b'{"op":"add_request","request_id":"a","prompt":[1,2],"max_tokens":0}', "max_tokens: 0 is outside 1..4096"),
        (
            b'{"op":"add_request","request_id":"a","prompt":[1,4294967296],"max_tokens":1}',
            "prompt.1: expected a token id",
        ),
        (b'{"op":"add_request","request_id":"a","prompt":[],"max_tokens":1}', "prompt: expected an array of 1"),
        (
            b'{"op":"add_request","request_id":"","prompt":[1],"max_tokens":1}',
            "request_id: expected a string of 1 to 64",
        ),
        (b'{"op":"add_request","prompt":[1],"max_tokens":1}', "request_id: field required"),
        (b'{"op":"add_request","request_id":"x","prompt":[1],"max_tokens":1,"n":2}', "n: unknown field"),
        (b'{"op":"add_request","request_id":"a","prompt":[1],"max_tokens":1}', "'a' is already in use"),
        (b'{"op":"step","now":1}', "now: unknown field"),
        (b'{"op":"use","blocks":[]}', "op: 'use' is not a request-level operation"),
        (b'{"op":"step"} x', "not valid JSON: trailing characters"),
        (b'{"op":"step","op":"step"}', 'duplicate member "op"'),
        (b"[1]", "request: expected a JSON object"),
    ],
)
def test_malformed_request_is_refused_naming_the_field_and_changes_nothing(
    lib: CAbiLibrary, request_text: bytes, field: str
) -> None:
    s, fresh = session(lib), session(lib)
    try:
        for h in (s, fresh):
            h.call(add("a", [1, 2, 3, 4, 5], 2))
        buf = ctypes.create_string_buffer(512)
        assert lib.dll.kvspec_call(s.handle, request_text, buf, 512) == E_REQUEST
        assert field in buf.value.decode(), buf.value
        for _ in range(4):  # the refused request left no trace: both engines go on alike
            assert s.call(STEP) == fresh.call(STEP)
    finally:
        s.close()
        fresh.close()


def test_reply_larger_than_the_buffer_is_held(lib: CAbiLibrary) -> None:
    s = CAbiSession(lib, VLLM.model_dump_json(), reply_cap=16, engine_json=ENGINE.model_dump_json())
    s.call(add("a", list(range(1, 30)), 1))
    assert outcome(s.call(STEP)).events  # the prefill Stored did not fit 16 bytes
    assert s.grown >= 1
    s.close()


# ------------------------------------------------------------------ the suite through FFI


def in_process(manifest: Manifest) -> Manifest:
    return manifest.model_copy(update={"start": manifest.start.model_copy(update={"isolation": "inprocess"})})


def assert_conforms(manifest: Manifest, w: Workload) -> None:
    checked = run_workload(manifest, PORT, w)
    assert checked.findings == [], "\n".join(f.report() for f in checked.findings)
    assert sum(checked.exercised.values()) > 0


@pytest.mark.parametrize("index", range(len(seed_workloads())))
def test_seed_workloads_conform_through_ffi(build_env: None, manifest: Manifest, index: int) -> None:
    assert_conforms(in_process(manifest), seed_workloads()[index])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(workloads())
def test_generated_workloads_conform_through_ffi(build_env: None, manifest: Manifest, w: Workload) -> None:
    assert_conforms(in_process(manifest), w)


def test_ffi_and_process_isolation_answer_alike(build_env: None, manifest: Manifest) -> None:
    w = seed_workloads()[2]  # with a host tier
    runs = []
    for m in (manifest, in_process(manifest)):
        impl = open_engine_implementation(m, PORT, w.setup)
        try:
            runs.append([o.model_dump() for o in impl.run_sequential(w.requests)])
        finally:
            impl.close()
    assert runs[0] == runs[1]


# ------------------------------------------------------------------ robustness of the new messages


def hooked(hooks_manifest: Manifest, isolation: str = "process") -> CAbiImplementation:
    return CAbiImplementation(hooks_manifest, PORT, VLLM, isolation=isolation, engine=ENGINE)


def hook(name: str) -> AddRequest:
    return AddRequest(op="add_request", request_id=name, prompt=[1, 2, 3], max_tokens=1)


def assert_group_gone(pgid: int, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert group_members(pgid) == []


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("__crash__", r"exited to request 1 \(add_request\) \(killed by SIGABRT\)"),
        ("__hang__", r"no reply to request 1 \(add_request\) within 1 s: the adapter hangs"),
        (
            "__bad_reply__",
            r"EngineOutcomeReply to request 1 \(add_request\) does not match the protocol schema: "
            r"outcome\.running: Input should be greater than or equal to 0",
        ),
        ("__huge__", r"reply to request 1 \(add_request\) is larger than max_reply_bytes=65536"),
    ],
)
def test_misbehaving_library_under_process_isolation(
    build_env: None, hooks_manifest: Manifest, name: str, pattern: str
) -> None:
    impl = hooked(hooks_manifest)
    assert impl.host is not None
    pgid = impl.host.pgid
    start = time.monotonic()
    with pytest.raises(AdapterError, match=pattern):
        impl.engine_call(hook(name))
    assert time.monotonic() - start < 8.0
    impl.close()
    assert_group_gone(pgid)


def test_library_printing_to_stdout_does_not_corrupt_the_protocol(build_env: None, hooks_manifest: Manifest) -> None:
    impl = hooked(hooks_manifest)
    try:
        assert impl.engine_call(hook("__print__")).waiting == 1
        assert impl.engine_call(EngineStep(op="step")).running == 1
    finally:
        impl.close()


def test_in_process_bad_and_huge_replies(build_env: None, hooks_manifest: Manifest) -> None:
    impl = hooked(hooks_manifest, "inprocess")
    try:
        with pytest.raises(AdapterError, match=r"c_abi reply does not match EngineOutcome: running"):
            impl.engine_call(hook("__bad_reply__"))
    finally:
        impl.close()
    impl = hooked(hooks_manifest, "inprocess")
    try:  # in-process there is no line limit: the buffer grows and the reply is read whole
        assert len(impl.engine_call(hook("__huge__")).events) == 200_000
    finally:
        impl.close()


def test_hooks_are_absent_from_the_normal_build(lib: CAbiLibrary) -> None:
    s = session(lib)
    assert outcome(s.call(add("__crash__", [1, 2], 1))).waiting == 1
    s.close()


# ------------------------------------------------------------------ compatibility and building


@pytest.fixture(scope="module")
def v1_manifest() -> Manifest:
    """c_port built as a version-1 library (KVSPEC_ABI_VERSION pinned to 1)."""
    m = load_manifest(ADAPTERS / "c_port")
    return m.model_copy(
        update={"start": m.start.model_copy(update={"cflags": [*m.start.cflags, "-DKVSPEC_ABI_VERSION=1"]})}
    )


@pytest.mark.parametrize("isolation", ["process", "inprocess"])
def test_version_1_library_keeps_working_at_block_level(build_env: None, v1_manifest: Manifest, isolation: str) -> None:
    assert CAbiLibrary(build_library(v1_manifest, ADAPTERS / "c_port")).version == 1
    config = ManagerConfig(capacity=4, eviction="lru")
    with CAbiImplementation(v1_manifest, ADAPTERS / "c_port", config, isolation=isolation) as impl:
        out = impl.step(Use(blocks=[FullBlock(full=9)], plhs=[Plh(hash=9)]))
        assert out.result is not None and out.result.value == 1
        if impl.host is not None:
            assert impl.host.ready is not None and impl.host.ready.protocol == 1


@pytest.mark.parametrize(
    ("flags", "isolation", "error", "pattern"),
    [
        (["-DKVSPEC_ABI_VERSION=1"], "inprocess", ConfigError, r"needs ABI version 2 .*implements ABI version 1\)"),
        (
            ["-DKVSPEC_ABI_VERSION=1"],
            "process",
            AdapterProtocolError,
            r"request-level sessions in protocol versions \[\]",
        ),
        ([], "inprocess", ConfigError, r"ABI version 2 without kvspec_open_engine"),
        ([], "process", ConfigError, r"does not export kvspec_open_engine"),
    ],
)
def test_library_without_a_request_level_is_refused_by_name(
    build_env: None, flags: list[str], isolation: str, error: type[Exception], pattern: str
) -> None:
    m = load_manifest(ADAPTERS / "c_port")
    m = m.model_copy(update={"start": m.start.model_copy(update={"cflags": [*m.start.cflags, *flags]})})
    with pytest.raises(error, match=pattern):
        CAbiImplementation(m, ADAPTERS / "c_port", VLLM, isolation=isolation, engine=ENGINE)


def test_missing_compiler_is_named(manifest: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"no C compiler found \(tried \$CC, cc, gcc\)"):
        open_engine_implementation(manifest, PORT, setup_of(4, 2))


def test_request_level_through_the_transport_finishes_every_request(build_env: None, manifest: Manifest) -> None:
    impl = open_engine_implementation(manifest, PORT, setup_of(4, 2))
    assert isinstance(impl, EngineImplementation)
    try:
        out = impl.run_concurrent(
            [RequestSpec(prompt=[1, 2, 3], max_tokens=3), RequestSpec(prompt=[1, 2, 4], max_tokens=2)]
        )
    finally:
        impl.close()
    assert [o.finish for o in out.outcomes] == ["length", "length"]
    assert [o.output_tokens for o in out.outcomes] == [3, 2]


# ------------------------------------------------------------------ ABI.md


ABI_MD = Path(__file__).resolve().parent.parent / "spec" / "ABI.md"


def test_abi_md_request_level_example_is_what_the_port_answers(lib: CAbiLibrary) -> None:
    text = ABI_MD.read_text()
    block = text[text.index("## 6. Version 2") :]
    body = block[block.index("```text\n") + 8 :]
    body = body[: body.index("```")]
    opens = [ln.split(":", 1)[1].strip() for ln in body.splitlines() if ln.startswith("open:")]
    opens += [ln.strip() for ln in body.splitlines() if ln.startswith("       {")]
    calls = [ln.split(":", 1)[1].strip() for ln in body.splitlines() if ln.startswith("call:")]
    replies = [ln.split(":", 1)[1].strip() for ln in body.splitlines() if ln.startswith("reply:")]
    assert len(opens) == 2 and len(calls) == len(replies) == 4
    s = CAbiSession(lib, opens[0], engine_json=opens[1])
    try:
        for call, reply in zip(calls, replies, strict=True):
            got = s.call(call.encode()).decode()
            assert got == reply, f"ABI.md documents\n  {reply}\nbut the port answers\n  {got}"
            EngineOutcome.model_validate_json(got)
    finally:
        s.close()


def test_host_process_serves_fresh_sessions_one_after_another(build_env: None, manifest: Manifest) -> None:
    """The C ABI host announces multi_session: a pooled host opens a new handle
    for the next session, which starts from nothing (event ids from 0)."""
    w = seed_workloads()[0]
    with reuse_children() as pool:
        firsts = []
        for _ in range(2):
            impl = open_engine_implementation(manifest, PORT, w.setup)
            out = impl.run_sequential(w.requests[:2])
            firsts.append(out[0].events[0].event_id)
            impl.close()
        assert pool.reused == 1
    assert firsts == [0, 0]
