"""No two classes of one name anywhere under kvspec/ (bundled adapters included).

A reader who meets ``Trace`` or ``Node`` in a traceback, a docstring or a grep should find one
class, not three: each class name says what it is (``RadixTreeNode``, ``TreeBlock``,
``ReachTrace``, ``BmcTrace``). Nested and private classes count too, as they show up in
tracebacks and reprs all the same.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "kvspec"


def class_sites(sources: Mapping[str, str]) -> dict[str, list[str]]:
    """Class name -> every ``file:line`` that defines a class of that name."""
    out: dict[str, list[str]] = {}
    for where, text in sources.items():
        for node in ast.walk(ast.parse(text, where)):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(f"{where}:{node.lineno}")
    return out


def duplicates(sources: Mapping[str, str]) -> dict[str, list[str]]:
    return {name: sites for name, sites in class_sites(sources).items() if len(sites) > 1}


def _tree() -> dict[str, str]:
    return {str(p.relative_to(PKG.parent)): p.read_text() for p in sorted(PKG.rglob("*.py"))}


def test_every_class_name_under_kvspec_is_defined_once() -> None:
    tree = _tree()
    assert len(tree) > 100, "the scan found kvspec's modules"
    assert "RadixTreeNode" in class_sites(tree), "the scan sees classes in the reference layer"
    dup = duplicates(tree)
    assert not dup, "class names defined more than once (rename so each says what it is): " + "; ".join(
        f"{name} at {', '.join(sites)}" for name, sites in sorted(dup.items())
    )


def test_a_duplicate_class_name_is_found() -> None:
    """The check can fail: a second class of an existing name, even nested, is reported."""
    tree = _tree()
    tree["kvspec/extra.py"] = "class Holder:\n    class RadixTreeNode:\n        pass\n"
    dup = duplicates(tree)
    assert list(dup) == ["RadixTreeNode"]
    assert "kvspec/extra.py:2" in dup["RadixTreeNode"]
    assert "kvspec/reference/radix.py" in " ".join(dup["RadixTreeNode"])
