"""The layers import downward only: no import cycle between kvspec's modules
(counting imports inside functions too, which only hide a cycle from the
interpreter), and the adapter-facing interface depends on the spec alone."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "kvspec"


def _module_name(path: Path) -> str:
    parts = ["kvspec", *path.relative_to(PKG).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The kvspec modules ``path`` imports (at any depth of the file)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` names a module; ``from mod import name`` the module itself
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module name -> the kvspec modules it imports."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    known = set(files)
    return {name: _imports(path, name, known) for name, path in files.items()}


def _reachable(g: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(g[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(g[m])
    return seen


def test_no_import_cycle() -> None:
    try:
        TopologicalSorter(import_graph()).prepare()
    except CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None


PROTOCOL = "kvspec.conformance.implementation"


def test_the_interface_depends_on_the_spec_alone() -> None:
    g = import_graph()
    assert not g[PROTOCOL], f"the generic implementation protocol imports nothing of kvspec: {g[PROTOCOL]}"
    for family in ("block", "managers", "radix"):
        deps = g[f"kvspec.conformance.{family}.interface"]
        assert PROTOCOL in deps, f"the {family} interface specialises the one protocol"
        assert all(d.startswith("kvspec.spec.") or d == PROTOCOL for d in deps), deps


def test_transports_sit_above_the_interface_not_the_opener() -> None:
    g = import_graph()
    for t in ("kvspec.conformance.transport.jsonl", "kvspec.conformance.transport.cabi"):
        assert "kvspec.conformance.block.interface" in g[t]
        assert "kvspec.conformance.block.opener" not in _reachable(g, t)


def test_a_cycle_is_found() -> None:
    """The cycle check can fail: a graph with a cycle is reported."""
    g = import_graph()
    g["kvspec.spec.wire"] = {*g["kvspec.spec.wire"], "kvspec.spec.schema_export"}
    try:
        TopologicalSorter(g).prepare()
    except CycleError:
        return
    raise AssertionError("a cycle through kvspec.spec.wire went unnoticed")


#: the mutant zoos are deliberately broken copies of the reference model: they subclass its internals
#: (policy nodes, blocks, radix nodes) on purpose, so they may import kvspec.reference as well
MUTANT_ZOOS = ("mutants", "manager_mutants", "radix_mutants")


def _adapter_imports() -> dict[str, set[str]]:
    """Each bundled adapter module -> the kvspec modules it imports (any depth of the file)."""
    g = import_graph()
    return {name: deps for name, deps in g.items() if name.startswith("kvspec.adapters.")}


def _allowed(adapter_module: str, dep: str) -> bool:
    if dep == "kvspec.api" or dep == "kvspec.spec" or dep.startswith(("kvspec.spec.", "kvspec.adapters.")):
        return True
    zoo = adapter_module.split(".")[2]
    return zoo in MUTANT_ZOOS and dep.startswith("kvspec.reference")


def test_bundled_adapters_import_only_the_public_api_and_the_spec() -> None:
    bad = {m: sorted(d for d in deps if not _allowed(m, d)) for m, deps in _adapter_imports().items()}
    bad = {m: d for m, d in bad.items() if d}
    assert not bad, f"adapters importing past kvspec.api / kvspec.spec: {bad}"


def test_the_adapter_rule_can_fail() -> None:
    assert not _allowed("kvspec.adapters.reference.adapter", "kvspec.conformance.run.manifest")
    assert not _allowed("kvspec.adapters.reference.adapter", "kvspec.reference.g1")
    assert _allowed("kvspec.adapters.mutants.policy_bugs", "kvspec.reference.policies")


def test_every_public_name_resolves() -> None:
    import kvspec.api as api

    for name in api.__all__:
        assert getattr(api, name) is not None, name
