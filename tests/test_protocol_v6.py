"""Protocol version 6: the version is a version; the hello names its family (PROTOCOL.md section 13).

- the hellos the parent writes: a child written for versions 1-5 (no ``[start] protocol``) gets
  exactly the hello it got before, byte for byte; a child that reads 6 gets the same hello plus
  ``family``, with 6 offered beside the older version of the session's kind;
- the reference server opened through version 6 for every family (block, several workers, the
  request level, the paged and session allocators, radix): ``ready.protocol`` is 6, ``ready.family``
  the hello's, and the session passes golden scenarios;
- a hello naming a family the child does not know, or parameters that do not fit the family it
  names, is refused with a message naming what was wrong;
- a child that answers the wrong family (or none under 6, or one under an older version) fails the
  run as a broken adapter naming what was wrong, without waiting for a timeout;
- children of the older versions open as before, also when 6 is offered beside their version;
- the manifest key: ``protocol = 6`` only on a subprocess adapter, and only a version that exists.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kvspec.adapters.reference_jsonl.server import Server
from kvspec.conformance.block.scenario_runner import run_scenario
from kvspec.conformance.managers.lockstep import run_golden as run_manager_golden
from kvspec.conformance.opener import open_adapter
from kvspec.conformance.radix.check import run_golden as run_radix_golden
from kvspec.conformance.requests.workloads import setup_of
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.conformance.test_golden import CASES, _skip_reason
from kvspec.conformance.transport.engine import EngineImplementation
from kvspec.conformance.transport.jsonl import JsonlImplementation, encode_hello, encode_request, reuse_children
from kvspec.conformance.transport.manager import JsonlManager, manager_config
from kvspec.conformance.transport.radix import JsonlRadix, radix_manager_config
from kvspec.conformance.workers.check import run_process_scenario
from kvspec.reference.requests import RequestSpec
from kvspec.spec.config import ManagerConfig
from kvspec.spec.engine_wire import EngineConfig
from kvspec.spec.errors import HANG_MARK, AdapterError
from kvspec.spec.manager_scenario import manager_scenarios
from kvspec.spec.manager_wire import PagedAllocate, PagedConfig, PagedOutcome, SessionConfig
from kvspec.spec.manifest import Capabilities, Manifest, Start
from kvspec.spec.process_scenario import tier_scenarios
from kvspec.spec.protocol import Ready, protocol_schema
from kvspec.spec.radix_wire import RadixConfig, RadixMatch, radix_scenarios
from kvspec.spec.wire import FullBlock, Plh, Use

pytestmark = pytest.mark.timeout(300)

JSONL_DIR = resolve_adapter_dir("adapters/reference_jsonl")
PROTOCOL_MD = Path(__file__).resolve().parents[1] / "spec" / "PROTOCOL.md"

BLOCK_CONFIG = (
    '"config":{"profile":"kvbm","capacity":2,"block_size":16,"dp_rank":0,"eviction":"lineage","offload":null}'
)


def _v6() -> Manifest:
    manifest = load_manifest(JSONL_DIR)
    assert manifest.start.protocol == 6
    return manifest


def _before_v6() -> Manifest:
    """The reference server's manifest as a child written for versions 1-5 declares it."""
    manifest = load_manifest(JSONL_DIR)
    return manifest.model_copy(update={"start": manifest.start.model_copy(update={"protocol": None})})


def _session(impl: Any) -> JsonlImplementation:
    """The JSON-lines child behind an implementation of any family."""
    for attr in ("_session", "caller"):
        inner = getattr(impl, attr, None)
        if isinstance(inner, JsonlImplementation):
            return inner
    assert isinstance(impl, JsonlImplementation), type(impl)
    return impl


def _ready(impl: Any) -> Ready:
    ready = _session(impl).ready
    assert ready is not None
    return ready


# ------------------------------------------------------------------ the hellos


def test_a_child_written_for_versions_1_to_5_gets_the_hello_it_got_before() -> None:
    assert encode_hello(ManagerConfig(capacity=2)).decode() == '{"type":"hello","versions":[1,2],' + BLOCK_CONFIG + "}"
    paged = PagedConfig(device_blocks=4, block_size=2)
    radix = RadixConfig(page_size=2, capacity=8)
    old = {
        "request": encode_hello(ManagerConfig(profile="vllm", capacity=2, eviction="lru"), EngineConfig()),
        "workers": encode_hello(ManagerConfig(capacity=2), workers=2),
        "manager": encode_hello(manager_config(paged), manager=paged),
        "radix": encode_hello(radix_manager_config(radix), radix=radix),
    }
    versions = {kind: json.loads(line)["versions"] for kind, line in old.items()}
    assert versions == {"request": [2], "workers": [5], "manager": [3], "radix": [4]}
    assert not [kind for kind, line in old.items() if b"family" in line]


def test_a_child_that_reads_6_gets_the_family_and_6_beside_the_older_version() -> None:
    block = encode_hello(ManagerConfig(capacity=2), newest=6).decode()
    assert block == '{"type":"hello","versions":[1,2,6],"family":"block",' + BLOCK_CONFIG + "}"
    paged = PagedConfig(device_blocks=4, block_size=2)
    radix = RadixConfig(page_size=2, capacity=8)
    hellos = {
        "request": encode_hello(ManagerConfig(profile="vllm", capacity=2, eviction="lru"), EngineConfig(), newest=6),
        "workers": encode_hello(ManagerConfig(capacity=2), workers=2, newest=6),
        "manager": encode_hello(manager_config(paged), manager=paged, newest=6),
        "radix": encode_hello(radix_manager_config(radix), radix=radix, newest=6),
    }
    got = {kind: (json.loads(h)["versions"], json.loads(h)["family"]) for kind, h in hellos.items()}
    assert got == {
        "request": ([2, 6], "request"),
        "workers": ([5, 6], "block"),
        "manager": ([3, 6], "manager"),
        "radix": ([4, 6], "radix"),
    }
    assert json.loads(hellos["workers"])["workers"] == 2 and "engine" in json.loads(hellos["request"])


# ------------------------------------------------------------------ every family through version 6


def test_block_sessions_open_through_version_6_and_pass_the_kvbm_goldens() -> None:
    manifest = _v6()
    cases = [c for c in CASES if c[0].parent.name == "kvbm" and _skip_reason(manifest, c[1], c[2]) is None]
    assert len(cases) >= 10
    with reuse_children():
        for path, scenario, config, name in cases:
            with open_adapter(manifest, JSONL_DIR, config) as impl:
                ready = _ready(impl)
                assert (ready.protocol, ready.family) == (6, "block"), name
                run_scenario(scenario, impl, scenario_id=f"{path.parent.name}/{path.stem}")


def test_a_session_of_two_workers_opens_through_version_6_and_passes_its_golden() -> None:
    [scenario] = [s for _p, s in tier_scenarios() if s.name == "g3_eviction_is_published_by_its_owner"]
    with open_adapter(_v6(), JSONL_DIR, scenario.config, workers=scenario.workers) as impl:
        ready = _ready(impl)
        assert (ready.protocol, ready.family) == (6, "block")
        run_process_scenario(scenario, impl)


def test_allocator_sessions_open_through_version_6_and_pass_the_paged_and_session_goldens() -> None:
    manifest = _v6()
    scenarios = [s for _p, s in manager_scenarios()]
    assert {s.config.kind for s in scenarios} == {"paged", "session"}
    with reuse_children():
        for scenario in scenarios:
            with open_adapter(manifest, JSONL_DIR, scenario.config) as impl:
                assert isinstance(impl, JsonlManager)
                ready = _ready(impl)
                assert (ready.protocol, ready.family, ready.profile) == (6, "manager", scenario.config.kind)
                run_manager_golden(scenario, impl)


def test_radix_sessions_open_through_version_6_and_pass_the_radix_goldens() -> None:
    manifest = _v6()
    scenarios = [s for _p, s in radix_scenarios()]
    assert scenarios
    with reuse_children():
        for scenario in scenarios:
            with open_adapter(manifest, JSONL_DIR, scenario.config) as impl:
                assert isinstance(impl, JsonlRadix)
                assert (_ready(impl).protocol, _ready(impl).family) == (6, "radix")
                run_radix_golden(scenario, impl)


def test_a_request_level_session_opens_through_version_6_and_hits_the_cached_prefix() -> None:
    """PROTOCOL.md 9.5's two requests: the second hits the 4 tokens the first cached."""
    impl = open_adapter(_v6(), JSONL_DIR, setup_of(4, 2, host_blocks=2))
    try:
        assert isinstance(impl, EngineImplementation)
        ready = _ready(impl)
        assert (ready.protocol, ready.family) == (6, "request")
        out = impl.run_sequential(
            [RequestSpec(prompt=[1, 2, 3, 4, 5], max_tokens=2), RequestSpec(prompt=[1, 2, 3, 4, 9, 9, 9], max_tokens=1)]
        )
    finally:
        impl.close()
    assert [o.cached_tokens for o in out] == [0, 4]


# ------------------------------------------------------------------ the server refuses a bad version-6 hello


def _serve(*lines: dict[str, Any]) -> list[dict[str, Any]]:
    wfile = io.BytesIO()
    Server(io.BytesIO(b"".join(json.dumps(m).encode() + b"\n" for m in lines)), wfile).serve()
    return [json.loads(line) for line in wfile.getvalue().splitlines()]


CFG = {"profile": "kvbm", "capacity": 2}


@pytest.mark.parametrize(
    ("hello", "message"),
    [
        ({"versions": [6], "family": "kv_tree", "config": CFG}, r"unknown session family 'kv_tree'"),
        ({"versions": [1, 6], "config": CFG}, r"offering version 6 names its session's family"),
        ({"versions": [1, 2], "family": "block", "config": CFG}, r"family 'block' is a version-6 field"),
        (
            {"versions": [6], "family": "radix", "config": {**CFG, "profile": "radix"}},
            r"radix session's hello carries radix",
        ),
        (
            {"versions": [6], "family": "block", "config": {**CFG, "profile": "vllm", "eviction": "lru"}, "engine": {}},
            r"block session's hello carries no engine",
        ),
        (
            {"versions": [6], "family": "manager", "config": CFG, "manager": {"kind": "paged", "device_blocks": 2}},
            r"profile 'kvbm' is not of family 'manager'",
        ),
        (
            {"versions": [6], "family": "request", "config": CFG, "engine": {}},
            r"profile 'kvbm' is not of family 'request'",
        ),
    ],
    ids=[
        "unknown-family",
        "6-without-family",
        "family-without-6",
        "no-radix",
        "engine-in-block",
        "manager-kvbm",
        "request-kvbm",
    ],
)
def test_server_refuses_a_version_6_hello_naming_what_was_wrong(hello: dict[str, Any], message: str) -> None:
    [refused] = _serve({"type": "hello", **hello})
    assert refused["type"] == "refused" and refused["error"]["code"] == "unsupported_config"
    assert re.search(message, refused["error"]["message"]), refused


def test_protocol_md_unknown_family_example_is_what_the_server_answers() -> None:
    [body] = re.findall(r"```jsonl v6 refused\n(.*?)```", PROTOCOL_MD.read_text(), flags=re.S)
    [(_, hello), (_, refused)] = [(ln[0], ln[2:]) for ln in body.splitlines() if ln[:2] in ("→ ", "← ")]
    assert _serve(json.loads(hello)) == [json.loads(refused)]


def test_server_answers_a_version_6_hello_with_its_family_and_an_older_one_without() -> None:
    paged = {"kind": "paged", "device_blocks": 2, "block_size": 2}
    pcfg = {"profile": "paged", "capacity": 2, "block_size": 2}
    replies = _serve(
        {"type": "hello", "versions": [3, 6], "family": "manager", "config": pcfg, "manager": paged},
        {"type": "hello", "versions": [3], "config": pcfg, "manager": paged},
    )
    assert [(r["type"], r["protocol"], r.get("family")) for r in replies] == [
        ("ready", 6, "manager"),
        ("ready", 3, None),
    ]
    assert "family" not in replies[1]  # a version-3 ready is today's, byte for byte in its fields


# ------------------------------------------------------------------ a child that answers the wrong family

CHILD = """
import json, sys, time
mode = sys.argv[1]
hello = json.loads(sys.stdin.readline())
with open(sys.argv[2], "a") as log:
    log.write(json.dumps(hello) + "\\n")
family = hello.get("family")
ready = {"type": "ready", "name": "x", "protocol": 6, "family": family, "profile": hello["config"]["profile"],
         "capabilities": {"block_level": False, "profiles": ["radix"]}}
if mode == "wrong_family":
    ready["family"] = "block"
elif mode == "no_family":
    del ready["family"]
elif mode == "old_with_family":
    ready.update(protocol=4, family="radix")
elif mode == "v4_only":  # a child of version 4: picks 4 if offered, whatever else is
    ready["protocol"] = 4
    del ready["family"]
print(json.dumps(ready), flush=True)
while True:
    line = sys.stdin.readline()
    if not line or json.loads(line).get("type") == "bye":
        break
    with open(sys.argv[2], "a") as log:
        log.write(line)
    req = json.loads(line)
    state = {"tree": [], "evictable": 0, "protected": 0, "free": 4, "locks": {}}
    print(json.dumps({"id": req["id"], "outcome": {"value": 0, "state": state}}), flush=True)
time.sleep(0 if mode == "v4_only" else 60)
"""


def _child(tmp_path: Path, mode: str, protocol: int | None = 6) -> Manifest:
    (tmp_path / "child.py").write_text(CHILD)
    log = tmp_path / "received.jsonl"
    declared = "" if protocol is None else f"protocol = {protocol}\n"
    (tmp_path / "manifest.toml").write_text(
        'name = "v6_child"\nkind = "subprocess"\nprofile = "radix"\n'
        f'[start]\ncommand = ["{{python}}", "{{adapter_dir}}/child.py", "{mode}", {json.dumps(str(log))}]\n'
        f"timeout_s = 5.0\nstartup_timeout_s = 30.0\n{declared}"
        '[capabilities]\nblock_level = false\nprofiles = ["radix"]\n'
    )
    return load_manifest(tmp_path)


@pytest.mark.parametrize(
    ("mode", "protocol", "message"),
    [
        ("wrong_family", 6, r"answered a hello for a 'radix' session with a ready for a 'block' session"),
        ("no_family", 6, r"chose protocol version 6 but its ready names no family \(the hello named 'radix'\)"),
        ("old_with_family", 6, r"chose protocol version 4, whose ready has no family, yet names family 'radix'"),
        ("right", None, r"chose protocol version 6; a radix session offers only 4"),
    ],
    ids=["wrong-family", "no-family", "old-with-family", "6-not-offered"],
)
def test_a_child_answering_the_wrong_family_is_a_broken_adapter(
    tmp_path: Path, mode: str, protocol: int | None, message: str
) -> None:
    manifest = _child(tmp_path, mode, protocol)
    with pytest.raises(AdapterError, match=message) as e:
        JsonlRadix(manifest, tmp_path, RadixConfig(capacity=4))
    assert HANG_MARK not in str(e.value)  # it failed on the answer, not on the 30 s startup timeout


def test_a_version_4_child_offered_4_and_6_gets_todays_messages(tmp_path: Path) -> None:
    manifest = _child(tmp_path, "v4_only")
    op = RadixMatch(tokens=[1, 2])
    with JsonlRadix(manifest, tmp_path, RadixConfig(capacity=4)) as impl:
        assert _ready(impl).protocol == 4 and _ready(impl).family is None
        assert impl.step(op).value == 0
    hello, request = (tmp_path / "received.jsonl").read_text().splitlines()
    assert json.loads(hello)["versions"] == [4, 6]
    assert request.encode() == encode_request(1, op)


def test_children_of_versions_2_to_5_open_as_before() -> None:
    """The reference server declared as a child of versions 1-5: each kind of session gets its old version."""
    manifest = _before_v6()
    scenario = next(s for _p, s in tier_scenarios() if s.name == "g3_eviction_is_published_by_its_owner")
    configs: dict[str, tuple[Any, int]] = {
        "block": (ManagerConfig(capacity=2), 1),
        "workers": (scenario.config, 2),
        "request": (setup_of(4, 2), 1),
        "paged": (PagedConfig(device_blocks=2, block_size=2), 1),
        "session": (SessionConfig(slots=1), 1),
        "radix": (RadixConfig(capacity=4), 1),
    }
    got = {}
    with reuse_children():  # one process, a new hello per session
        for kind, (config, workers) in configs.items():
            impl = open_adapter(manifest, JSONL_DIR, config, workers=workers)
            try:
                got[kind] = (_ready(impl).protocol, _ready(impl).family)
                if isinstance(impl, JsonlManager) and kind == "paged":
                    out = impl.step(PagedAllocate(seq="a", tokens=3))
                    assert isinstance(out, PagedOutcome) and out.value == 2
            finally:
                impl.close()
    assert got == {
        "block": (2, None),
        "workers": (5, None),
        "request": (2, None),
        "paged": (3, None),
        "session": (3, None),
        "radix": (4, None),
    }


# ------------------------------------------------------------------ misbehaviour in a version-6 session

BROKEN = Path(__file__).parent / "broken_adapters"


def _declaring_6(manifest: Manifest) -> Manifest:
    return manifest.model_copy(update={"start": manifest.start.model_copy(update={"protocol": 6})})


@pytest.mark.parametrize(
    ("mode", "pattern"),
    [
        ("crash_mid_session", r"exited to request 3 \(use\) \(exit status 3\)"),
        ("hang", r"no reply to request 2 \(use\) within 1 s: the adapter hangs"),
        ("garbage", r"reply to request 2 \(use\) is not valid JSON"),
        ("wrong_id", r"reply to request 2 \(use\) carries id 3, expected 2"),
        ("schema", r"OutcomeReply to request 2 \(use\) does not match the protocol schema"),
    ],
)
def test_a_version_6_block_session_fails_on_misbehaviour_as_the_older_ones_do(mode: str, pattern: str) -> None:
    """The broken children of tests/broken_adapters answer 6 when offered it: after a version-6
    handshake the transport's failures are the same clear errors (test_jsonl_robustness.py)."""
    d = BROKEN / mode
    impl = JsonlImplementation(_declaring_6(load_manifest(d)), d, ManagerConfig(capacity=4))
    assert impl.ready is not None and (impl.ready.protocol, impl.ready.family) == (6, "block")
    with pytest.raises(AdapterError, match=pattern):
        for i in range(1, 6):
            impl.step(Use(blocks=[FullBlock(full=i)], plhs=[Plh(hash=i)]))
    assert impl.dead is not None


def test_a_version_6_request_level_session_fails_on_a_wrong_id_as_version_2_does() -> None:
    manifest = Manifest(
        name="broken_engine_wrong_id",
        kind="subprocess",
        profile="vllm",
        start=Start(command=["{python}", "{adapter_dir}/broken_engine.py", "wrong_id"], timeout_s=1.0, protocol=6),
        capabilities=Capabilities(block_level=False, request_level=True, tiers=["device", "host_pinned"]),
    )
    impl = open_adapter(manifest, BROKEN, setup_of(4, 2))
    try:
        assert (_ready(impl).protocol, _ready(impl).family) == (6, "request")
        assert isinstance(impl, EngineImplementation)
        with pytest.raises(AdapterError, match=r"reply to request 2 \(step\) carries id 3, expected 2"):
            impl.run_sequential([RequestSpec(prompt=[1, 2, 3], max_tokens=2)])
    finally:
        impl.close()


# ------------------------------------------------------------------ the manifest key and the schema


def test_manifest_protocol_is_a_subprocess_key_naming_a_version_that_exists() -> None:
    base = {"name": "x", "profile": "kvbm"}
    assert Manifest.model_validate({**base, "kind": "subprocess", "start": {"command": ["x"]}}).start.protocol is None
    with pytest.raises(ValidationError, match=r"start\.protocol = 6 does nothing"):
        Manifest.model_validate({**base, "kind": "python", "start": {"python": "m:f", "protocol": 6}})
    with pytest.raises(ValidationError, match="protocol"):
        Manifest.model_validate({**base, "kind": "subprocess", "start": {"command": ["x"], "protocol": 5}})


def test_schema_documents_the_family_of_hello_and_ready() -> None:
    defs = protocol_schema()["$defs"]
    families = {"block", "request", "manager", "radix"}
    for message in ("Hello", "Ready"):
        family = defs[message]["properties"]["family"]
        enums = [set(alt["enum"]) for alt in family.get("anyOf", [family]) if "enum" in alt]
        assert enums == [families], (message, family)


def test_protocol_md_version_6_example_is_what_the_server_answers_and_the_parent_writes() -> None:
    [body] = re.findall(r"```jsonl v6\n(.*?)```", PROTOCOL_MD.read_text(), flags=re.S)
    lines = [(ln[0], ln[2:]) for ln in body.splitlines() if ln[:2] in ("→ ", "← ")]
    sent = [line for d, line in lines if d == "→"]
    documented = [json.loads(line) for d, line in lines if d == "←"]
    hellos = [json.loads(line) for line in sent if '"hello"' in line]
    assert {h["family"] for h in hellos} >= {"block", "radix"}
    for h in hellos:
        radix = RadixConfig.model_validate(h["radix"]) if "radix" in h else None
        config = ManagerConfig.model_validate(h["config"])
        assert encode_hello(config, radix=radix, newest=6).decode() in sent
    wfile = io.BytesIO()
    Server(io.BytesIO(("\n".join(sent) + "\n").encode()), wfile).serve()
    answered = [json.loads(line) for line in wfile.getvalue().splitlines()]
    for doc, got in zip(documented, answered, strict=True):
        if doc.get("type") == "ready":
            doc.pop("capabilities")
            got.pop("capabilities")
        assert doc == got
