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

_ENGINE = "the vLLM engine / producer / stream format, not the vllm profile"
_FAMILY = "the radix family (a session family or adapter section), not the radix profile"
_SCOPE = 'pytest fixture scope="session", not the session profile'
_LITERAL = "a wire model's Literal tag, spelled for pydantic and the JSON Schema"
_PENDING = "not yet taken from the registry (issue 28: being moved area by area)"
_CONCERN = "a rule concern (SPEC.md area) named after its profile; rules.py sits below the registry"

#: module (relative to kvspec/) -> (how many profile-name spellings it keeps, why)
ALLOWED: dict[str, tuple[int, str]] = {
    "adapters/declared/adapter.py": (3, _PENDING),
    "adapters/declared/managers.py": (4, _PENDING),
    "adapters/mutants/catalogue.py": (1, _PENDING),
    "adapters/reference_jsonl/server.py": (3, _PENDING),
    "adapters/rust_mocker/adapter.py": (4, _PENDING),
    "adapters/vllm/adapter.py": (1, _PENDING),
    "conformance/opener.py": (2, _PENDING),
    "conformance/run/plugin.py": (4, _PENDING),
    "conformance/run/summary.py": (2, _PENDING),
    "conformance/test_radix.py": (1, _PENDING),
    "conformance/test_requests.py": (2, _PENDING),
    "conformance/transport/cabi_host.py": (1, _PENDING),
    "conformance/transport/jsonl.py": (3, _PENDING),
    "conformance/transport/manager.py": (2, _PENDING),
    "conformance/transport/radix.py": (1, _PENDING),
    "conformance/verdicts/applicability.py": (10, _PENDING),
    "reference/caller_contracts.py": (4, _PENDING),
    "reference/g1.py": (3, _PENDING),
    "reference/legacy.py": (1, _PENDING),
    "reference/requests.py": (1, _PENDING),
    "reference/smt/reach_recordings.py": (1, "the smt/vllm/ package folder in a path, not the vllm profile"),
    "reference/vllm_pool.py": (1, _PENDING),
    "spec/config.py": (1, _PENDING),
    "spec/manager_wire.py": (4, _PENDING),
    "spec/manifest.py": (6, _PENDING),
    "spec/protocol.py": (9, _PENDING),
    "spec/radix_wire.py": (3, _PENDING),
    "spec/rules.py": (3, _PENDING),
    "streams/check.py": (7, _PENDING),
    "streams/check_log.py": (2, _PENDING),
    "streams/formats.py": (3, _PENDING),
    "streams/results.py": (1, _PENDING),
    "streams/zmqfeed.py": (1, _PENDING),
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
