"""The prefix-cache reset (CLEAR-ALL) at request level, call by call.

An adapter that declares ``reset`` (request level, profile vllm) has its
reset asked with nothing held, after it (the cache must be empty and the
prompt Stored again) and while a request holds blocks
(``conformance/requests/reset_check.py``); at dp_rank 0 and 2, so the
Cleared's source is checked too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvspec.conformance.requests.api import ImplementationUnavailableError, open_request_implementation
from kvspec.conformance.requests.reset_check import ResetCheck
from kvspec.conformance.requests.workloads import setup_of
from kvspec.conformance.run.manifest import Manifest
from kvspec.spec.profiles import VLLM


@pytest.mark.kvspec_rules("CLEAR-ALL")
@pytest.mark.kvspec_requires("request_level", "reset")
@pytest.mark.parametrize("dp_rank", [0, 2])
def test_reset_prefix_cache(
    dp_rank: int, kvspec_manifest: Manifest, kvspec_adapter_dir: Path, kvspec_record_rule: Any
) -> None:
    """A reset succeeds with one Cleared only when nothing is held, and forgets every cached block."""
    if kvspec_manifest.request_profile() != VLLM.name:
        pytest.skip(f"adapter {kvspec_manifest.name!r} does not declare capability profile:vllm")
    setup = setup_of(8, 4, dp_rank=dp_rank)
    try:
        impl = open_request_implementation(kvspec_manifest, kvspec_adapter_dir, setup)
    except ImplementationUnavailableError as e:
        pytest.skip(f"adapter {kvspec_manifest.name!r} cannot run here: {e}")
    with impl:
        ResetCheck(impl, setup, record=kvspec_record_rule).run()
