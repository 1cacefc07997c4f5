"""The block encodings test a profile's traits, never its name (issue 28).

``spec.profiles.BlockSemantics`` says, one field per difference, what kvbm, atomic
and legacy do differently; the z3 encodings in ``reference/smt/blocks/`` and their
checks against the models branch on those fields. An AST scan fails when a
comparison against a profile-name constant of the registry (``profile ==
LEGACY_NAME``, ``prof.name != KVBM_NAME``, ``name in (ATOMIC_NAME, ...)``) comes
back into those modules. Tables keyed by a name (a mutant's profiles, a twin's
key) are data, not comparisons, and stay allowed.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import kvspec
from kvspec.spec import registry
from kvspec.spec.profiles import ATOMIC, KVBM, LEGACY, VLLM, BlockSemantics, block_semantics

ROOT = Path(kvspec.__file__).parent
#: the modules whose branches must be trait tests: the block encodings and the recordings that pick
#: a block profile's reach search
SCANNED = (*sorted((ROOT / "reference/smt/blocks").glob("*.py")), ROOT / "reference/smt/reach_recordings.py")


def name_constants() -> frozenset[str]:
    """The registry's names for profiles and encodings (``KVBM_NAME``, ``PAGED``, ``KVBM_OFFLOAD``, ...)."""
    return frozenset(
        k for k, v in vars(registry).items() if k.isupper() and isinstance(v, str) and v in registry.encodings()
    )


def _named(node: ast.expr, names: frozenset[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_named(e, names) for e in node.elts)
    return False


def name_comparisons(source: str, names: frozenset[str]) -> list[int]:
    """The lines of ``source`` that compare something with a name constant (==, !=, in, not in, is)."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Compare) and any(_named(x, names) for x in [n.left, *n.comparators]):
            out.append(n.lineno)
    return out


def test_the_scan_finds_each_kind_of_comparison() -> None:
    names = frozenset({"LEGACY_NAME", "ATOMIC_NAME"})
    source = (
        "a = profile == LEGACY_NAME\n"
        "b = prof.name != registry.ATOMIC_NAME\n"
        "c = p in (LEGACY_NAME, 'x')\n"
        "d = {LEGACY_NAME: 1}[p]\n"  # a table keyed by the name: data, not a branch
        "e = traits.destroy == True\n"
    )
    assert name_comparisons(source, names) == [1, 2, 3]


def test_the_scan_knows_the_block_profiles_names() -> None:
    assert {"KVBM_NAME", "ATOMIC_NAME", "LEGACY_NAME", "VLLM_NAME", "PAGED", "KVBM_OFFLOAD"} <= name_constants()


def test_the_block_encodings_branch_on_traits_not_names() -> None:
    names = name_constants()
    found = {
        path.relative_to(ROOT).as_posix(): lines
        for path in SCANNED
        if (lines := name_comparisons(path.read_text(encoding="utf-8"), names))
    }
    assert not found, (
        "a block encoding compares a profile with a name constant (module: lines); test a trait of "
        f"spec.profiles.BlockSemantics (block_semantics(profile).FIELD) instead: {found}"
    )


def test_every_encoded_profile_declares_its_traits() -> None:
    from kvspec.reference.smt.blocks.catalogue import block_encoding

    for p in (KVBM, ATOMIC, LEGACY):
        assert block_encoding(p.name).name == p.name
        assert isinstance(block_semantics(p.name), BlockSemantics)
    with pytest.raises(KeyError, match="declares no BlockSemantics"):
        block_semantics(VLLM.name)


def test_the_traits_tell_the_three_profiles_apart() -> None:
    traits = [dataclasses.astuple(block_semantics(p.name)) for p in (KVBM, ATOMIC, LEGACY)]
    assert len(set(traits)) == 3


def test_traits_that_contradict_the_rule_table_are_refused() -> None:
    assert LEGACY.blocks is not None
    wrong = dataclasses.replace(LEGACY.blocks, use_parent=True, destroy=False)
    with pytest.raises(ValueError, match=r"\['destroy', 'use_parent'\]"):
        dataclasses.replace(LEGACY, blocks=wrong)
