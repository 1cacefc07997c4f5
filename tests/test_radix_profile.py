"""The radix profile's own tests: the model's hashing and invariants, the mutants' catalogue.

The conformance suite checks implementations against the model
(conformance/test_radix.py); these check the model and its fixtures.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.conformance.radix.check import radix_configs, radix_ops
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.reference.radix import RadixModel
from kvspec.spec.hashing import block_hashes
from kvspec.spec.radix_wire import RADIX_OP_ADAPTER, RadixConfig, RadixOutcome, RadixSnapshot


def _paths(model: RadixModel) -> list[tuple[list[int], list[tuple[int, int]]]]:
    out = []
    for n in model.nodes():
        path: list[int] = []
        pages: list[tuple[int, int]] = []
        x = n
        while x.parent is not None:
            path = x.tokens + path
            pages = x.pages + pages
            x = x.parent
        out.append((path, pages))
    return out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(config=radix_configs(), ops=st.lists(radix_ops(), max_size=30))
def test_model_invariants(config: RadixConfig, ops: list[dict[str, object]]) -> None:
    """After every op: each node's page hashes are kvspec's block hashes of its
    path; pages are whole; free + cached = capacity; every child of a locked
    node's ancestor chain is counted; evictable + protected = cached tokens."""
    m = RadixModel(config)
    for raw in ops:
        m.step(RADIX_OP_ADAPTER.validate_python(raw))
        cached = 0
        for path, pages in _paths(m):
            assert len(path) % config.page_size == 0
            assert pages == block_hashes(path, config.page_size)
        for n in m.nodes():
            cached += len(n.tokens)
            assert n.tokens, "no empty node"
            assert n.parent is not None
            assert n.parent is m.root or n.parent.lock_ref >= n.lock_ref
        snap = m.snapshot()
        assert snap.free + cached == config.capacity
        assert snap.evictable + snap.protected == cached


def test_outcome_carries_value_or_error() -> None:
    state = RadixSnapshot(tree=[], evictable=0, protected=0, free=1, locks={})
    with pytest.raises(ValueError, match="exactly one"):
        RadixOutcome(state=state)


def test_every_radix_mutant_is_declared_and_has_a_model() -> None:
    from kvspec.adapters.radix_mutants.bugs import BUGS

    man = load_manifest(resolve_adapter_dir("adapters/radix_mutants"))
    assert {v.name for v in man.variants} == set(BUGS)
    assert len(BUGS) >= 6
