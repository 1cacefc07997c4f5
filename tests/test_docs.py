"""The documentation: the generated pages are current, and what they show comes from elsewhere.

``scripts/gen_docs.py`` writes the CLI reference, the profile pages and the port tutorial's examples;
``make docs`` builds the site with mkdocs in strict mode (broken links and anchors fail it). These tests
hold the committed pages to the generator, and check the generated figures against sources the
generator does not use: the CLI's own ``--help`` output, and the hash vectors recorded from Dynamo's
wheel.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kvspec.spec.registry import PROFILES

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "port" / "write-a-port.md"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvspec_gen_docs_script", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_generated_pages_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert _script().main(["--check"]) == 0, capsys.readouterr().out


def test_a_stale_page_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = _script()
    real = gen.pages()
    cli = ROOT / "docs" / "reference" / "cli.md"
    stale = tmp_path / "cli.md"
    stale.write_text(real[cli].replace("kvspec gate", "kvspec gait", 1))
    monkeypatch.setattr(gen, "pages", lambda: {stale: real[cli]})
    assert gen.main(["--check"]) == 1
    assert "cli.md: not current" in capsys.readouterr().out


def test_one_page_per_registered_profile() -> None:
    pages = {p.stem for p in (ROOT / "docs" / "profiles").glob("*.md")} - {"index"}
    assert pages == set(PROFILES)
    nav = (ROOT / "mkdocs.yml").read_text()
    for name in PROFILES:
        assert f"- profiles/{name}.md" in nav


def test_the_cli_page_is_what_kvspec_prints() -> None:
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    for name in ("gate", "check-log"):
        out = subprocess.run(
            [sys.executable, "-m", "kvspec", name, "--help"], capture_output=True, text=True, env=env, check=True
        ).stdout
        assert "\n".join(line.rstrip() for line in out.rstrip().splitlines()) in page, name


def test_the_tutorials_hash_vectors_are_dynamos() -> None:
    """The table's hashes equal those recorded from the ai-dynamo-runtime wheel (not kvspec's hashing)."""
    recorded = json.loads((ROOT / "kvspec" / "spec" / "vectors" / "hash_vectors.json").read_text())
    several = next(v for v in recorded["vectors"] if v["name"] == "several_blocks_b4")
    assert several["tokens"][:12] == list(range(1, 13)) and several["block_size"] == 4
    text = TUTORIAL.read_text()
    rows = re.findall(
        r"^\| `\[([\d, ]+)\]` \| (\d) \| `(\d+)` \(`0x[0-9a-f]+`\) \| `(\d+)` \(`0x[0-9a-f]+`\) \|$", text, re.M
    )
    assert len(rows) == 3
    assert [int(r[2]) for r in rows] == several["local_hashes"][:3]
    sequence = [int(r[3]) for r in rows]
    assert sequence[0] == several["local_hashes"][0]  # the first block's sequence hash is its local hash
    assert sequence[1:] == [b["block_hash"] for b in several["event_blocks"][:2]]


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_bytes()) <= 15 * 1024
