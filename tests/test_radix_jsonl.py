"""The radix profile over the JSON-lines protocol (version 4, PROTOCOL.md section 11).

- the reference server's radix sessions give exactly the in-process model's
  outcomes on every golden scenario and on random traffic (nothing is lost
  or changed in transit), in one reused process;
- PROTOCOL.md's version-4 example is what the reference server answers, and
  its lines match the schema;
- a hello for the radix profile without ``radix`` is refused, naming why;
- a child that misbehaves in a radix session (a reply that breaks the wire
  model, the wrong version, a hang) fails the run with an error naming what
  was wrong, within the manifest's timeout.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kvspec.conformance.radix.check import BASES
from kvspec.conformance.radix.opener import open_radix
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.conformance.transport.jsonl import encode_hello, reuse_children
from kvspec.conformance.transport.radix import JsonlRadix, radix_manager_config
from kvspec.reference.radix import RadixModel
from kvspec.spec.errors import AdapterError
from kvspec.spec.protocol import protocol_schema
from kvspec.spec.radix_wire import (
    RADIX_OP_ADAPTER,
    RadixConfig,
    RadixInsert,
    RadixLock,
    RadixMatch,
    radix_scenarios,
)

pytestmark = pytest.mark.timeout(120)

JSONL_DIR = resolve_adapter_dir("adapters/reference_jsonl")
PROTOCOL_MD = Path(__file__).resolve().parents[1] / "spec" / "PROTOCOL.md"
VALIDATOR = jsonschema.Draft202012Validator(protocol_schema())


def _random_ops(rng: random.Random, n: int) -> list[Any]:
    def toks() -> list[int]:
        base = rng.choice(BASES)
        return list(base[: rng.randint(0, len(base))])

    out: list[dict[str, Any]] = []
    for _ in range(n):
        kind = rng.choice(["match", "insert", "lock", "unlock", "evict", "request", "request", "insert"])
        if kind in ("match", "insert"):
            out.append({"op": kind, "tokens": toks()})
        elif kind == "lock":
            out.append({"op": "lock", "name": rng.choice("ab"), "tokens": toks()})
        elif kind == "unlock":
            out.append({"op": "unlock", "name": rng.choice("ab")})
        elif kind == "evict":
            out.append({"op": "evict", "tokens": rng.randint(0, 6)})
        else:
            out.append({"op": "request", "prompt": toks() or [1], "output": [4, 5, 4][: rng.randint(1, 3)]})
    return [RADIX_OP_ADAPTER.validate_python(o) for o in out]


def test_goldens_and_random_traffic_cross_the_process_boundary_unchanged() -> None:
    manifest = load_manifest(JSONL_DIR)
    assert "radix" in manifest.capabilities.profiles and manifest.start.radix is None
    rng = random.Random(20261127)
    runs = [(sc.config, [s.op for s in sc.steps]) for _, sc in radix_scenarios()]
    runs += [(RadixConfig(page_size=p, capacity=c), _random_ops(rng, 60)) for p, c in ((1, 12), (2, 16), (3, 24))]
    with reuse_children() as pool:
        for config, ops in runs:
            model = RadixModel(config)
            with open_radix(manifest, JSONL_DIR, config) as impl:
                assert isinstance(impl, JsonlRadix)
                for i, op in enumerate(ops):
                    got, want = impl.step(op), model.step(op)
                    assert got.model_dump() == want.model_dump(), f"step {i} {op!r}"
        assert pool.reused == len(runs) - 1  # one process served every session


def _v4_example() -> list[tuple[str, str]]:
    [body] = re.findall(r"```jsonl v4\n(.*?)```", PROTOCOL_MD.read_text(), flags=re.S)
    return [(ln[0], ln[2:]) for ln in body.splitlines() if ln[:2] in ("→ ", "← ")]


def test_protocol_md_version_4_example_matches_the_schema_and_the_reference_server(
    server_answers_as_documented: Callable[[list[tuple[str, str]]], None],
) -> None:
    lines = _v4_example()
    sent = [line for d, line in lines if d == "→"]
    documented = [line for d, line in lines if d == "←"]
    assert len(sent) >= 6 and len(documented) >= 5
    for _, line in lines:
        assert not list(VALIDATOR.iter_errors(json.loads(line))), line
    server_answers_as_documented(lines)


def test_parent_hello_is_the_documented_one() -> None:
    sent = next(line for d, line in _v4_example() if d == "→" and '"hello"' in line)
    radix = RadixConfig.model_validate(json.loads(sent)["radix"])
    assert encode_hello(radix_manager_config(radix), radix=radix).decode() == sent


@pytest.mark.parametrize(
    ("hello", "why"),
    [
        ({"type": "hello", "versions": [1, 2], "config": {"profile": "radix", "capacity": 4}}, "version-4"),
        (
            {
                "type": "hello",
                "versions": [4],
                "config": {"profile": "kvbm", "capacity": 4},
                "radix": {"kind": "radix", "page_size": 1, "capacity": 4},
            },
            "config.profile kvbm",
        ),
        (
            {
                "type": "hello",
                "versions": [3],
                "config": {"profile": "radix", "capacity": 4},
                "radix": {"kind": "radix", "page_size": 1, "capacity": 4},
            },
            "speaks versions \\[4\\]",
        ),
    ],
    ids=["v1-v2", "wrong-profile", "v3-offered"],
)
def test_server_refuses_a_radix_hello_it_cannot_serve(hello: dict[str, Any], why: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.adapters.reference_jsonl.server"],
        input=json.dumps(hello) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    reply = json.loads(proc.stdout.splitlines()[0])
    assert reply["type"] == "refused" and re.search(why, reply["error"]["message"]), reply


# ------------------------------------------------------------------ broken children

STATE = {"tree": [], "evictable": 0, "protected": 0, "free": 4, "locks": {}}

CHILD = """
import json, sys, time
reply = json.loads(sys.argv[1])
hello = json.loads(sys.stdin.readline())
print(json.dumps({"type": "ready", "name": "x", "protocol": reply.pop("__protocol", 4), "profile": "radix",
                  "capabilities": {"block_level": False, "profiles": ["radix"]}}), flush=True)
line = json.loads(sys.stdin.readline())
if reply.pop("__hang", False):
    time.sleep(30)
print(json.dumps({"id": line["id"], **reply}), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ({"outcome": {"value": 1, "error": {"rule": "RADIX-MATCH", "message": "m"}, "state": STATE}}, "exactly one"),
        ({"outcome": {"value": 0}}, r"outcome\.state: Field required"),
        (
            {"outcome": {"value": 0, "state": {**STATE, "tree": [{"tokens": ["x"], "lock_ref": 0}]}}},
            r"outcome\.state\.tree\.0\.tokens\.0",
        ),
        ({"outcome": {"value": -1, "state": STATE}}, r"outcome\.value"),
        ({"outcome": {"value": 0, "state": {**STATE, "extra": 1}}}, r"outcome\.state\.extra: Extra inputs"),
        ({"id_shift": 1, "outcome": {"value": 0, "state": STATE}}, r"id_shift"),
        ({"__protocol": 3, "outcome": {"value": 0, "state": STATE}}, r"chose protocol version 3; a radix session"),
        ({"__hang": True, "outcome": {"value": 0, "state": STATE}}, r"no reply to request 1 \(match\) within 1 s"),
    ],
    ids=["value-and-error", "no-state", "string-token", "negative-value", "unknown-field", "extra-key", "v3", "hang"],
)
def test_a_broken_radix_child_fails_naming_what_was_wrong(tmp_path: Path, reply: dict[str, Any], message: str) -> None:
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "manifest.toml").write_text(
        'name = "broken_radix"\nkind = "subprocess"\nprofile = "radix"\n'
        f'[start]\ncommand = ["{{python}}", "{{adapter_dir}}/child.py", {json.dumps(json.dumps(reply))}]\n'
        'timeout_s = 1.0\n[capabilities]\nblock_level = false\nprofiles = ["radix"]\n'
    )
    man = load_manifest(tmp_path)
    with pytest.raises(AdapterError, match=message), open_radix(man, tmp_path, RadixConfig(capacity=4)) as impl:
        impl.step(RadixMatch(tokens=[1]))


def test_ops_cross_with_every_field() -> None:
    """The parent writes every field of a radix operation (a child may rely on them)."""
    from kvspec.conformance.transport.jsonl import encode_request

    lock = b'{"id":3,"op":{"op":"lock","name":"a","tokens":[1,2]}}'
    assert encode_request(3, RadixLock(name="a", tokens=[1, 2])) == lock
    assert encode_request(4, RadixInsert(tokens=[])) == b'{"id":4,"op":{"op":"insert","tokens":[]}}'
