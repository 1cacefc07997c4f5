"""The paged and session profiles: models, goldens, checker, z3 rows, protocol version 3.

The conformance suite runs the goldens and the lockstep against adapters;
these tests hold the pieces themselves to account: the checker names the
rule a broken allocator breaks, a rejected operation changes nothing, the
z3 encodings prove the invariants and refute the broken transitions, and the
version-3 handshake behaves.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kvspec.adapters.reference.managers import ModelManager
from kvspec.conformance.managers.check import check_paged, self_check
from kvspec.conformance.managers.lockstep import paged_configs, paged_ops, run_golden
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.conformance.transport.manager import JsonlManager
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference.paged import PagedModel
from kvspec.reference.smt.managers.paged import prove_paged
from kvspec.reference.smt.managers.session import prove_session
from kvspec.spec.errors import AdapterError
from kvspec.spec.manager_scenario import manager_scenarios
from kvspec.spec.manager_wire import (
    PAGED_OP_ADAPTER,
    PagedAllocate,
    PagedConfig,
    PagedFork,
    PagedFree,
    PagedOutcome,
    PagedWrite,
    SessionAdmit,
    SessionConfig,
)

SCENARIOS = manager_scenarios()


@pytest.mark.parametrize(("path", "scenario"), SCENARIOS, ids=[f"{p.parent.name}/{p.stem}" for p, _ in SCENARIOS])
def test_golden_holds_on_the_model(path: Path, scenario: Any) -> None:
    run_golden(scenario, ModelManager(scenario.config))


def test_every_paged_and_session_rule_has_a_golden() -> None:
    from kvspec.spec.rules import RULES, Concern

    covered = {str(r) for _, s in SCENARIOS for r in s.rules}
    mine = {str(r.id) for r in RULES.values() if r.concern in (Concern.PAGED, Concern.SESSION)}
    assert mine - covered == set()


@settings(max_examples=60, deadline=None)
@given(config=paged_configs(), ops=st.lists(paged_ops(), max_size=30))
def test_paged_rejection_changes_nothing_and_state_stays_consistent(config: PagedConfig, ops: list[Any]) -> None:
    m = PagedModel(config)
    for raw in ops:
        before = m.snapshot()
        out = m.step(PAGED_OP_ADAPTER.validate_python(raw))
        if out.error is not None:
            assert out.state == before
        self_check(out.state, config.device_blocks, config.host_blocks)


def _doctored(out: PagedOutcome, **state: Any) -> PagedOutcome:
    return out.model_copy(update={"state": out.state.model_copy(update=state)})


def test_checker_names_the_broken_rule() -> None:
    cfg = PagedConfig(device_blocks=4, block_size=2)
    m = PagedModel(cfg)
    m.step(PagedAllocate(seq="a", tokens=4))
    op = PagedFork(src="a", dst="b")
    before = m.snapshot()
    want = m.step(op)
    sizes = (4, 0)
    check_paged(op, want, want, before, sizes)  # the model agrees with itself
    bad_refs = _doctored(want, device_refs={k: 1 for k in want.state.device_refs})
    with pytest.raises(ConformanceFailure) as e:
        check_paged(op, bad_refs, want, before, sizes)
    assert e.value.rule == "PAGED-REFCOUNT"
    leak = _doctored(want, free_device=want.state.free_device - 1)
    with pytest.raises(ConformanceFailure) as e:
        check_paged(op, leak, want, before, sizes)
    assert e.value.rule == "PAGED-CONSERVE"
    # b gets private copies instead of sharing a's blocks: the pairing of ids breaks
    seqs = dict(want.state.sequences)
    seqs["b"] = seqs["b"].model_copy(update={"blocks": [2, 3]})
    copied = _doctored(want, sequences=seqs, device_refs={"0": 1, "1": 1, "2": 1, "3": 1}, free_device=0)
    with pytest.raises(ConformanceFailure) as e:
        check_paged(op, copied, want, before, sizes)
    assert e.value.rule == "PAGED-SHARE"


def test_a_write_that_reaches_another_holder_is_a_cow_failure() -> None:
    cfg = PagedConfig(device_blocks=4, block_size=2)
    m = PagedModel(cfg)
    for op in (PagedAllocate(seq="a", tokens=2), PagedWrite(seq="a", position=0, value=5), PagedFork(src="a", dst="b")):
        m.step(op)
    op = PagedWrite(seq="b", position=0, value=9)
    before = m.snapshot()
    want = m.step(op)
    seqs = dict(want.state.sequences)
    seqs["a"] = seqs["a"].model_copy(update={"data": [9, None]})
    with pytest.raises(ConformanceFailure) as e:
        check_paged(op, _doctored(want, sequences=seqs), want, before, (4, 0))
    assert e.value.rule == "PAGED-COW"


def test_z3_proves_the_manager_invariants_and_refutes_the_broken_transitions() -> None:
    ok, seed = prove_paged()
    assert [p.transition for p in ok if not p.proven] == []
    assert {p.transition for p in seed} == {"seed swap_out", "seed extend copy"}
    assert all(not p.proven and p.counterexample for p in seed)
    s_ok, s_broken = prove_session()
    assert [p.transition for p in s_ok if not p.proven] == []
    assert s_broken and all(not p.proven for p in s_broken)


def test_bad_configs_and_ops_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="critical_below"):
        PagedConfig(device_blocks=4, high_below=0.1, critical_below=0.5)
    with pytest.raises(ValidationError, match="tokens"):
        PAGED_OP_ADAPTER.validate_python({"op": "allocate", "seq": "a", "tokens": -1})
    with pytest.raises(ValidationError, match="swap_sideways"):
        PAGED_OP_ADAPTER.validate_python({"op": "swap_sideways", "seq": "a"})


# ------------------------------------------------------------ protocol version 3


def test_version_3_session_through_the_reference_server() -> None:
    d = resolve_adapter_dir("adapters/reference_jsonl")
    man = load_manifest(d)
    with JsonlManager(man, d, PagedConfig(device_blocks=2, block_size=2)) as impl:
        out = impl.step(PagedAllocate(seq="a", tokens=3))
        assert isinstance(out, PagedOutcome) and out.value == 2 and out.state.pressure == "critical"
        bad = impl.step(PagedFree(seq="zz"))
        assert bad.error is not None and bad.error.rule == "PAGED-VALIDATE"
    with JsonlManager(man, d, SessionConfig(slots=1)) as impl:
        out2 = impl.step(SessionAdmit(session="s"))
        assert out2.admission is not None and out2.admission.generation == 1  # type: ignore[union-attr]


def test_version_1_hello_for_a_manager_profile_is_refused() -> None:
    hello = {"type": "hello", "versions": [1, 2], "config": {"profile": "paged", "capacity": 4}}
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.adapters.reference_jsonl.server"],
        input=json.dumps(hello) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    reply = json.loads(proc.stdout.splitlines()[0])
    assert reply["type"] == "refused" and reply["error"]["code"] == "unsupported_config"


def test_a_child_answering_the_wrong_outcome_kind_fails(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(
        "import sys, json\n"
        "sys.stdin.readline()\n"
        'print(json.dumps({"type": "ready", "name": "x", "protocol": 3, "profile": "paged", '
        '"capabilities": {"block_level": False}}), flush=True)\n'
        "line = json.loads(sys.stdin.readline())\n"
        'state = {"slots": [], "idle_lru": [], "in_flight": [], "pending": []}\n'
        'print(json.dumps({"id": line["id"], "outcome": {"applied": True, "state": state}}), flush=True)\n'
        "sys.stdin.readline()\n"
    )
    (tmp_path / "manifest.toml").write_text(
        'name = "wrong_kind"\nkind = "subprocess"\nprofile = "paged"\n'
        '[start]\ncommand = ["{python}", "{adapter_dir}/child.py"]\ntimeout_s = 5.0\n'
        "[capabilities]\nblock_level = false\n"
    )
    man = load_manifest(tmp_path)
    with JsonlManager(man, tmp_path, PagedConfig(device_blocks=2)) as impl, pytest.raises(AdapterError, match="kind"):
        impl.step(PagedAllocate(seq="a", tokens=1))


def test_every_manager_mutant_is_declared_and_has_a_model() -> None:
    from kvspec.adapters.manager_mutants.bugs import PAGED_BUGS, SESSION_BUGS

    man = load_manifest(resolve_adapter_dir("adapters/manager_mutants"))
    declared = {v.name: v for v in man.variants}
    assert set(declared) == set(PAGED_BUGS) | set(SESSION_BUGS)
    for name, v in declared.items():
        assert v.profiles == (["paged"] if name in PAGED_BUGS else ["session"])


def test_protocol_md_version_3_example_is_what_the_reference_server_answers() -> None:
    import io
    import re

    from kvspec.adapters.reference_jsonl.server import Server

    text = (Path(__file__).resolve().parents[1] / "spec" / "PROTOCOL.md").read_text()
    [body] = re.findall(r"```jsonl v3\n(.*?)```", text, flags=re.S)
    lines = [(ln[0], ln[2:]) for ln in body.splitlines() if ln[:2] in ("→ ", "← ")]
    sent = [line for d, line in lines if d == "→"]
    documented = [line for d, line in lines if d == "←"]
    assert len(sent) >= 8 and len(documented) >= 8
    wfile = io.BytesIO()
    Server(io.BytesIO(("\n".join(sent) + "\n").encode()), wfile).serve()
    answered = wfile.getvalue().decode().splitlines()
    assert len(answered) == len(documented)
    for doc, got in zip(documented, answered, strict=True):
        d, g = json.loads(doc), json.loads(got)
        if d.get("type") == "ready":
            d.pop("capabilities")
            g.pop("capabilities")
        assert d == g


def test_rust_launcher_without_rustc_refuses_the_hello_with_the_reason(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "PATH": str(tmp_path), "KVSPEC_BUILD_DIR": str(tmp_path / "build")}
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.adapters.rust_launch", str(resolve_adapter_dir("adapters/paged_rust"))],
        input='{"type":"hello"}\n',
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    reply = json.loads(proc.stdout.splitlines()[0])
    assert proc.returncode == 1
    assert reply["type"] == "refused" and "rustc not found" in reply["error"]["message"]
