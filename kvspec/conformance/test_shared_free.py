"""Freeing a block two requests share (DEREF-OWNER) at request level, call by call.

An adapter that declares ``reset`` (request level, profile vllm: the
step-by-step interface) runs two requests holding the same prompt blocks,
frees both, then one request that needs the whole pool: the shared blocks
must have lost both owners and be evicted for it
(``conformance/requests/shared_free_check.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvspec.conformance.requests.api import ImplementationUnavailableError, open_request_implementation
from kvspec.conformance.requests.shared_free_check import SharedFreeCheck
from kvspec.conformance.requests.workloads import setup_of
from kvspec.conformance.run.manifest import Manifest
from kvspec.spec.profiles import VLLM


@pytest.mark.kvspec_rules("DEREF-OWNER")
@pytest.mark.kvspec_requires("request_level", "reset")
@pytest.mark.parametrize(("capacity", "block_size"), [(8, 4), (12, 2)])
def test_free_of_a_shared_block(
    capacity: int, block_size: int, kvspec_manifest: Manifest, kvspec_adapter_dir: Path, kvspec_record_rule: Any
) -> None:
    """A block two requests held is evictable once both have freed it, and only then is the pool whole."""
    if kvspec_manifest.request_profile() != VLLM.name:
        pytest.skip(f"adapter {kvspec_manifest.name!r} does not declare capability profile:vllm")
    setup = setup_of(capacity, block_size)
    try:
        impl = open_request_implementation(kvspec_manifest, kvspec_adapter_dir, setup)
    except ImplementationUnavailableError as e:
        pytest.skip(f"adapter {kvspec_manifest.name!r} cannot run here: {e}")
    with impl:
        SharedFreeCheck(impl, setup, record=kvspec_record_rule).run()
