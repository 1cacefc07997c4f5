"""scripts/matrix.py (``make matrix``): from results files it replaces the
README's table between its markers, leaves the rest of the file alone, and
leaves out adapters that do not exist yet, saying so."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvspec.conformance.verdicts.results import ImplementationInfo, Results, RuleResult, spec_version, write_results

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("kvspec_matrix_script", ROOT / "scripts" / "matrix.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_table_is_replaced_between_its_markers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    matrix = _script()
    out = tmp_path / "matrix"
    for name, n in (("reference", 11), ("c_port", 22)):
        write_results(
            Results(
                tool="pytest conformance",
                spec=spec_version(),
                implementation=ImplementationInfo(name=name),
                status="clean",
                exit_code=0,
                rules={"USE-NEW": RuleResult(status="pass", exercised=n)},
            ),
            out / f"{name}.json",
        )
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n\n{matrix.BEGIN}\nold table\n{matrix.END}\n\nafter\n")
    argv = ["--no-run", "--out", str(out), "--readme", str(readme), "--adapters", "reference", "c_port", "nope"]
    assert matrix.main(argv) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n\n") and text.endswith(f"{matrix.END}\n\nafter\n")
    assert "old table" not in text
    assert "| rule | reference | c_port |" in text and "| `USE-NEW` | ✓ 11 | ✓ 22 |" in text
    assert "no adapters/nope/manifest.toml yet: left out" in capsys.readouterr().out
    assert (out / "matrix.html").is_file()
    # idempotent
    assert matrix.main(argv) == 0
    assert readme.read_text() == text


def test_a_backend_variant_is_a_column_of_its_own(tmp_path: Path) -> None:
    matrix = _script()
    out = tmp_path / "matrix"
    for variant, n in ((None, 3), ("trtllm", 4)):
        write_results(
            Results(
                tool="pytest conformance",
                spec=spec_version(),
                implementation=ImplementationInfo(name="rust_mocker", variant=variant),
                status="clean",
                exit_code=0,
                rules={"USE-NEW": RuleResult(status="pass", exercised=n)},
            ),
            out / ("rust_mocker__trtllm.json" if variant else "rust_mocker.json"),
        )
    readme = tmp_path / "README.md"
    readme.write_text(f"{matrix.BEGIN}\n{matrix.END}\n")
    argv = ["--no-run", "--out", str(out), "--readme", str(readme), "--adapters", "rust_mocker", "rust_mocker/trtllm"]
    assert matrix.main(argv) == 0
    text = readme.read_text()
    assert "| rule | rust_mocker | rust_mocker/trtllm |" in text and "| `USE-NEW` | ✓ 3 | ✓ 4 |" in text
