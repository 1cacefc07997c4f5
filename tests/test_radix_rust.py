"""adapters/radix_rust, the Rust port of the radix profile (protocol version 4).

The conformance suite checks it (``pytest conformance --impl=adapters/radix_rust``,
in ``make test``) and ``kvspec mutants --impl=adapters/radix_rust`` kills each
variant. Here: what the suite's traffic does not reach (pages of up to 64
tokens, whose 256 bytes take XXH3's long path, and token ids up to 2**32 - 1),
and that every bug main.rs knows is declared in the manifest with its rule.
"""

from __future__ import annotations

import re
import shutil

import pytest

from kvspec.conformance.radix.opener import open_radix
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
from kvspec.conformance.transport.jsonl import reuse_children
from kvspec.reference.radix import RadixModel
from kvspec.spec.radix_wire import RadixConfig, RadixEvict, RadixInsert, RadixMatch, RadixOp, RadixRequest
from kvspec.spec.rules import RuleId

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("rustc") is None, reason="rustc not on PATH: the port is built from source"),
]

DIR = resolve_adapter_dir("adapters/radix_rust")


@pytest.mark.parametrize("pages", [(1, 2, 3, 4, 5, 8), (16, 33, 60, 64)], ids=["short", "long"])
def test_hashes_and_events_of_every_page_size_match_the_model(pages: tuple[int, ...]) -> None:
    manifest = load_manifest(DIR)
    with reuse_children():
        for page in pages:
            config = RadixConfig(page_size=page, capacity=8 * page)
            big = [2**32 - 1 - i for i in range(3 * page)]
            ops: list[RadixOp] = [
                RadixInsert(tokens=big[: 2 * page + 1]),
                RadixMatch(tokens=big[:page] + [7] * page),
                RadixRequest(prompt=big[:page] + list(range(page + 1)), output=[5] * (page + 2)),
                RadixEvict(tokens=1),
                RadixInsert(tokens=[0] * (3 * page)),
            ]
            model = RadixModel(config)
            with open_radix(manifest, DIR, config) as impl:
                for i, op in enumerate(ops):
                    got, want = impl.step(op), model.step(op)
                    assert got.model_dump() == want.model_dump(), f"page {page}, step {i} {op!r}"


def test_every_bug_of_the_port_is_a_declared_variant_naming_a_rule() -> None:
    source = (DIR / "main.rs").read_text()
    [listed] = re.findall(r"const VARIANTS: &\[&str\] = &\[(.*?)\];", source, flags=re.S)
    in_source = re.findall(r'"(\w+)"', listed)
    manifest = load_manifest(DIR)
    assert [v.name for v in manifest.variants] == in_source
    known = {r.value for r in RuleId}
    for v in manifest.variants:
        assert v.rule is not None and v.rule in known and str(v.rule).startswith("RADIX-"), v
        assert f'bugs.on("{v.name}")' in source, f"variant {v.name} changes nothing in main.rs"
    assert 5 <= len(in_source) <= 8


@pytest.mark.parametrize("adapter", ["adapters/radix_rust", "adapters/reference_jsonl"])
def test_protocol_4_children_run_the_tree_operation_tests(adapter: str) -> None:
    """A subprocess radix adapter has no start.radix; the suite must not take it for a request-only one."""
    from kvspec.conformance.test_radix import _require_tree_operations

    _require_tree_operations(load_manifest(resolve_adapter_dir(adapter)))  # would raise Skipped
