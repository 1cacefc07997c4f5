"""Each profile name is spelled once in code: in the registry (issue 28).

An AST scan of kvspec/ counts the string constants equal to a registered profile
or ``kvspec prove`` encoding name outside the registry modules. Code that means a
profile takes its name from ``kvspec.spec.registry`` (``KVBM_NAME``, ``PAGED``,
...) or from the profile object (``profile.name``); what is left is listed in
``ALLOWED`` with the count and the reason: a wire ``Literal`` pydantic needs
spelled out, or a word that is spelled like a profile but names something else
(the vLLM engine, a stream format, the radix family, a pytest scope). The counts
are exact both ways, so a new spelling fails and so does a stale entry.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import kvspec
from kvspec.spec import registry

ROOT = Path(kvspec.__file__).parent
#: where the names are defined: the block profiles' rule sets and the registry
REGISTRY_MODULES = ("spec/profiles.py", "spec/registry.py")

_HELLO = "the Hello model's radix field, named by its name (the family's parameters), not the profile"
_SCOPE = 'pytest fixture scope="session", not the session profile'
_LITERAL = "a wire model's kind tag: the Literal a discriminated union (ManagerConfigKind, the hello) needs"
_CONCERN = "a rule concern (SPEC.md area) named after its profile; rules.py sits below the registry"

#: module (relative to kvspec/) -> (how many profile-name spellings it keeps, why)
ALLOWED: dict[str, tuple[int, str]] = {
    "adapters/rust_mocker/adapter.py": (1, "VLLM_BACKEND: the mocker's vLLM-style engine backend, not the profile"),
    "adapters/vllm/adapter.py": (1, "the vllm Python package (importlib.util.find_spec), not the vllm profile"),
    "conformance/run/plugin.py": (4, _SCOPE),
    "conformance/test_requests.py": (2, _SCOPE),
    "conformance/run/summary.py": (1, "the word printed for the radix family's protocol versions"),
    "conformance/transport/jsonl.py": (1, _HELLO),
    "conformance/transport/cabi_host.py": (
        1,
        "ManagerConfig's default profile, in the C ABI host that runs standard library only (python -S)",
    ),
    "reference/smt/reach_recordings.py": (
        2,
        "the smt/vllm/ and smt/radix/ package folders in paths, not the vllm and radix profiles",
    ),
    "spec/manager_wire.py": (2, _LITERAL + " (PagedConfig.kind, SessionConfig.kind)"),
    "spec/radix_wire.py": (1, _LITERAL + " (RadixConfig.kind)"),
    "spec/manifest.py": (2, "the radix family in the AdapterFamily Literal, and the [start] radix key (a field name)"),
    "spec/protocol.py": (5, "the radix family in the SessionFamily Literal; " + _HELLO + " (4)"),
    "spec/rules.py": (3, _CONCERN),
    "streams/producer_names.py": (2, "VLLM_PRODUCER and VLLM_FORMAT: the vLLM engine as a feed's producer and format"),
}


def profile_names() -> frozenset[str]:
    """Every registered profile name and every ``kvspec prove`` encoding name."""
    return frozenset(registry.BUNDLED) | frozenset(registry.encodings())


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, nodes)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }


def spellings(source: str, names: frozenset[str]) -> int:
    """How many string constants of ``source`` (docstrings aside) equal one of ``names``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return sum(
        1
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names and id(n) not in docs
    )


def spelled_in_tree() -> dict[str, int]:
    """Module (relative to kvspec/) -> its profile-name spellings, registry modules aside."""
    names = profile_names()
    found: dict[str, int] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in REGISTRY_MODULES:
            continue
        if count := spellings(path.read_text(encoding="utf-8"), names):
            found[rel] = count
    return found


def test_the_scan_counts_constants_and_skips_docstrings() -> None:
    names = frozenset({"kvbm", "paged"})
    source = '"""kvbm"""\ndef f(p: str) -> bool:\n    """paged"""\n    return p == "kvbm" or p in ("paged", "kvbm-x")\n'
    assert spellings(source, names) == 2


def test_the_registry_defines_every_name() -> None:
    defined = Counter[str]()
    for rel in REGISTRY_MODULES:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in profile_names():
                defined[n.value] += 1
    assert set(defined) == profile_names()


def test_profile_names_are_spelled_only_in_the_registry() -> None:
    found = spelled_in_tree()
    over = {rel: (n, ALLOWED.get(rel, (0, ""))[0]) for rel, n in found.items() if n > ALLOWED.get(rel, (0, ""))[0]}
    stale = {rel: (found.get(rel, 0), n) for rel, (n, _) in ALLOWED.items() if found.get(rel, 0) < n}
    assert not over, (
        "profile names spelled outside kvspec/spec/registry.py (module: (found, allowed)); take them from "
        f"the registry (KVBM_NAME, PAGED, ... or profile.name), or allow them here with a reason: {over}"
    )
    assert not stale, f"ALLOWED counts more than the modules spell (module: (found, allowed)); lower them: {stale}"
