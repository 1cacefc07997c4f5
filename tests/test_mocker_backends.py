"""Dynamo's mocker backends as backend variants of adapters/rust_mocker
(``[[variants]]`` with ``kind = "backend"``): the manifest model keeps them
apart from mutants, selecting one gives the adapter its backend, its own
capabilities and deviations, and each backend's declared departures are
observed on its replay files (real engines; skipped without the wheel)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvspec.adapters.rust_mocker import adapter as rm
from kvspec.conformance.requests.replay import run_workload
from kvspec.conformance.requests.workloads import load_workload, setup_of
from kvspec.conformance.run.manifest import load_impl, load_manifest
from kvspec.conformance.test_requests import findings_dir
from kvspec.spec.errors import ConfigError, WireError
from kvspec.spec.manifest import Manifest, Variant
from kvspec.spec.wire import make_removed, make_stored

ADAPTER_DIR = Path(rm.__file__).parent
needs_wheel = pytest.mark.skipif(
    rm.wheel_version() is None, reason="the ai-dynamo-runtime wheel is not installed (pip install 'kvspec[dynamo]')"
)


def test_backend_variants_are_not_mutants_and_carry_their_own_deviations() -> None:
    base = load_manifest(ADAPTER_DIR)
    assert {v.name for v in base.variants if v.kind == "backend"} == {"sglang", "trtllm"}
    assert base.mutants() == []
    _, trt = load_impl("adapters/rust_mocker/trtllm")
    assert trt.variant == "trtllm" and trt.capabilities.tiers == ["device"]
    assert {str(d.rule) for d in trt.deviations} >= {"EVENT-ID", "VLLM-PREFIX-HIT"}
    assert "G2-EVICT" not in {str(d.rule) for d in trt.deviations}  # the host tier's are the vLLM backend's only
    assert findings_dir(trt, ADAPTER_DIR) == ADAPTER_DIR / "findings" / "trtllm"
    assert findings_dir(base, ADAPTER_DIR) == ADAPTER_DIR / "findings"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "m", "description": "d"}, "names the rule"),
        ({"name": "m", "rule": "EVENT-ID", "description": "d", "profile": "vllm"}, "kind = 'backend'"),
        ({"name": "b", "kind": "backend", "rule": "EVENT-ID", "description": "d"}, "not a mutant"),
    ],
)
def test_a_variant_whose_fields_do_not_fit_its_kind_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Variant.model_validate(fields)


def test_a_backend_variant_with_an_unknown_capability_value_is_refused() -> None:
    with pytest.raises(ValueError, match="variant b: capabilities"):
        Manifest.model_validate(
            {
                "name": "x",
                "kind": "request",
                "profile": "vllm",
                "variants": [{"name": "b", "kind": "backend", "description": "d", "capabilities": {"tiers": ["moon"]}}],
            }
        )


def test_each_backend_is_asked_for_by_name_and_an_unknown_one_is_refused() -> None:
    setup = setup_of(8, 4)
    assert rm.engine_config(setup)["backend"] == "vllm"
    assert rm.engine_config(setup, "sglang")["backend"] == "sglang"
    with pytest.raises(ConfigError, match="no backend 'kvbm'"):
        rm.open_rust_mocker(setup, load_manifest(ADAPTER_DIR), ADAPTER_DIR, variant="kvbm")


def test_the_sglang_backend_is_checked_under_radix_with_token_ids() -> None:
    _, sg = load_impl("adapters/rust_mocker/sglang")
    assert sg.profile == "radix" and sg.request_profile() == "radix" and sg.capabilities.event_token_ids
    assert rm.engine_config(setup_of(8, 4), "sglang", token_ids=True)["emit_kv_token_ids"] is True
    assert "emit_kv_token_ids" not in rm.engine_config(setup_of(8, 4), "sglang")


def test_token_ids_are_joined_to_the_event_plane_by_block_hash() -> None:
    """The raw publisher batches differently (here: two BlockStored for one
    plane Stored); the join is per block hash, and a block no raw event names
    is an error, never a silent gap."""
    plane = [make_stored(1, [11, 12], [5, 6], None), make_removed(2, [11])]
    raw: list[dict[str, Any]] = [
        {"type": "BlockStored", "block_hashes": [11], "parent_block_hash": None, "token_ids": [1, 2]},
        {"type": "BlockStored", "block_hashes": [12], "parent_block_hash": 11, "token_ids": [3, 4]},
        {"type": "BlockRemoved", "block_hashes": [11]},
    ]
    out = rm.attach_token_ids(plane, raw, 2)
    assert out[0].block_token_ids == [[1, 2], [3, 4]] and out[1].block_token_ids is None
    with pytest.raises(WireError, match=r"blocks \[12\]"):
        rm.attach_token_ids(plane, raw[:1], 2)
    with pytest.raises(WireError, match="token ids"):
        rm.attach_token_ids(plane, [{**raw[0], "token_ids": [1]}], 2)


@needs_wheel
@pytest.mark.parametrize(
    ("impl", "finding", "rule", "condition"),
    [
        ("adapters/rust_mocker/trtllm", "trtllm/full_prompt_hit.jsonl", "VLLM-PREFIX-HIT", "full_prompt_hit"),
        ("adapters/rust_mocker/sglang", "sglang/concurrent_stall.jsonl", "RADIX-CAPACITY", "request_stalled"),
        ("adapters/rust_mocker/sglang", "sglang/last_token_cached.jsonl", "RADIX-INSERT", "request_caches_last_token"),
    ],
)
def test_a_backend_departure_is_observed_on_its_replay_file_and_declared(
    impl: str, finding: str, rule: str, condition: str
) -> None:
    adapter_dir, manifest = load_impl(impl)
    workload = load_workload(ADAPTER_DIR / "findings" / finding)
    # a concurrent run's stall depends on timing (about 2 runs in 5 here):
    # up to 12 tries (a stall-free streak that long is about 0.2 %)
    for _ in range(12 if workload.concurrent else 1):
        checked = run_workload(manifest, adapter_dir, workload)
        hits = [f for f in checked.findings if str(f.rule) == rule and condition in f.site().conditions]
        if hits:
            break
    assert hits, f"no {rule} finding with condition {condition}: {[f.site() for f in checked.findings]}"
    assert manifest.deviation_for(hits[0].site()) is not None
