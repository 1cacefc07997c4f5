"""adapters/sglang: the install hint, the hash scheme, and the Dynamo-format option.

The conformance suite runs the adapter (``make test``:
``pytest conformance --impl=adapters/sglang``); these tests check the
adapter's own parts. The ones that need SGLang skip, naming the install
command, where it is not installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import Any

import pytest

from kvspec.adapters.sglang.adapter import INSTALL_HINT, PageHashes, open_sglang, require_sglang
from kvspec.conformance.requests.interface import ImplementationUnavailableError
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.spec.hashing import block_hashes, sglang_event_hash, sglang_page_digests
from kvspec.spec.radix_wire import (
    RadixConfig,
    RadixEvict,
    RadixInsert,
    RadixLock,
    RadixMatch,
    RadixRequest,
    RadixUnlock,
)

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None


def test_missing_wheel_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(ImplementationUnavailableError, match="make engines"):
        require_sglang()
    assert "make engines" in INSTALL_HINT


def test_sglang_page_hashes_match_a_recorded_event() -> None:
    """Hashes SGLang 0.5.23 published for one node of tokens 1, 2, 3, 4 at page size 2
    (a BlockStored recorded from the wheel's RadixCache), recomputed by kvspec."""
    assert [sglang_event_hash(d) for d in sglang_page_digests([1, 2, 3, 4], 2)] == [
        3817746824117602890,
        -4216701448867210342,
    ]


def test_page_hashes_map_only_exact_sglang_hashes() -> None:
    ph = PageHashes()
    pub = [sglang_event_hash(d) for d in sglang_page_digests([5, 6, 7, 8], 2)]
    parent, got = ph.stored(None, [[5, 6], [7, 8]], pub)
    assert parent is None and got == [s for s, _ in block_hashes([5, 6, 7, 8], 2)]
    # a wrong hash passes through (unsigned), the suite then reports it
    _, wrong = ph.stored(None, [[9, 9]], [-1])
    assert wrong == [2**64 - 1]
    assert ph.removed(pub[1]) == got[1]


WORKLOAD: list[Any] = [
    RadixInsert(tokens=[1, 2, 3, 4, 5, 6]),
    RadixMatch(tokens=[1, 2, 3, 9]),
    RadixLock(name="a", tokens=[1, 2]),
    RadixRequest(prompt=[1, 2, 7, 7, 7], output=[8, 8, 8]),
    RadixEvict(tokens=3),
    RadixUnlock(name="a"),
    RadixEvict(tokens=100),
]


@pytest.mark.skipif(not HAVE_SGLANG, reason=f"SGLang is not installed; install it with: {INSTALL_HINT}")
@pytest.mark.parametrize("page_size", [1, 2])
def test_dynamo_format_publishes_the_same_stream(page_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's dynamo_kv_event_format changes only namespaced hashing: on keys
    without a namespace both options publish the same events, every hash verified."""
    adapter_dir = resolve_adapter_dir("adapters/sglang")
    manifest = load_manifest(adapter_dir)
    config = RadixConfig(page_size=page_size, capacity=32)
    runs = []
    for flag in ("0", "1"):
        monkeypatch.setenv("KVSPEC_SGLANG_DYNAMO_FORMAT", flag)
        impl = open_sglang(config, manifest, adapter_dir)
        with impl:
            runs.append([impl.step(op).model_dump() for op in WORKLOAD])
            assert impl.hashes.verified > 0
    assert runs[0] == runs[1]
    assert any(o["events"] for o in runs[0])
