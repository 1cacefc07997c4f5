"""``kvspec report``: the rules x implementations matrix in Markdown and as one
self-contained HTML page, checked in a real headless Chromium (Debian package
``chromium``): the page loads from a file with no network, the browser's DOM
holds the expected cells with the rule text on hover, and the screenshot shows
the cells' colours."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.conformance.commands.report import build_matrix, render_html, render_markdown
from kvspec.conformance.verdicts.provenance import Provenance, Versions
from kvspec.conformance.verdicts.results import (
    DeviationResult,
    ImplementationInfo,
    Results,
    RuleResult,
    spec_version,
    write_results,
)
from kvspec.spec.rules import RULES

CHROMIUM_INSTALL = "apt-get install -y chromium"

PROVENANCE = Provenance(
    versions=Versions(kvspec="0.1.0", spec_digest="0123456789abcdef", hypothesis="6.155.2", python="3.11.7"),
    effort="ci",
    hypothesis_seed="1",
    settings={"max_examples": 60, "stateful_step_count": 40, "derandomize": True},
)


def engine(name: str, rules: dict[str, RuleResult], **kw: object) -> Results:
    return Results.model_validate(
        {
            "tool": "pytest conformance",
            "spec": spec_version(),
            "implementation": ImplementationInfo(name=name),
            "profile": "kvbm",
            "status": "clean",
            "exit_code": 0,
            "rules": rules,
            "provenance": PROVENANCE,
            **kw,
        }
    )


@pytest.fixture
def runs(tmp_path: Path) -> list[Results]:
    replay = tmp_path / "replays" / "engine-b-lockstep.jsonl"
    replay.parent.mkdir()
    replay.write_text("{}\n")
    a = engine(
        "engine-a",
        {
            "USE-NEW": RuleResult(status="pass", exercised=42),
            "EVENT-ID": RuleResult(status="pass", exercised=7),
            "QUARANTINE-HOLD": RuleResult(status="not_applicable", note="missing capability offload"),
            "CLEAR-ALL": RuleResult(status="not_exercised"),
        },
    )
    b = engine(
        "engine-b",
        {
            "USE-NEW": RuleResult(status="pass", exercised=5),
            "EVENT-ID": RuleResult(status="fail", failures=1, replays=[str(replay)]),
            "STORE-COPY": RuleResult(status="deviation", reason="copies are silent", note="observed 3x"),
        },
        deviations=[DeviationResult(rule="STORE-COPY", reason="copies are silent", observed=3)],
        status="findings",
        exit_code=1,
    )
    return [a, b]


def test_markdown_cells(runs: list[Results], tmp_path: Path) -> None:
    md = render_markdown(build_matrix(runs, tmp_path))
    lines = {line.split(" | ")[0].strip("| `"): line for line in md.splitlines() if line.startswith("| `")}
    assert len(lines) == len(RULES)
    assert lines["USE-NEW"] == "| `USE-NEW` | ✓ 42 | ✓ 5 |"
    assert lines["EVENT-ID"] == "| `EVENT-ID` | ✓ 7 | [✗ fail](replays/engine-b-lockstep.jsonl) |"
    assert lines["QUARANTINE-HOLD"] == "| `QUARANTINE-HOLD` | n/a (offload) | – |"
    assert lines["STORE-COPY"] == "| `STORE-COPY` | – | ≈ deviation (observed) [1] |"
    assert "1. engine-b STORE-COPY: declared deviation, observed 3x: copies are silent" in md


def test_the_cli_writes_both_and_refuses_a_bad_file(
    runs: list[Results], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = []
    for r in runs:
        write_results(r, tmp_path / f"{r.implementation.name}.json")
        files.append(str(tmp_path / f"{r.implementation.name}.json"))
    out_md, out_html = tmp_path / "out" / "m.md", tmp_path / "out" / "m.html"
    assert main(["report", *files, "--markdown", str(out_md), "--html", str(out_html)]) == 0
    assert "| `USE-NEW` | ✓ 42 | ✓ 5 |" in out_md.read_text()
    assert out_html.read_text().startswith("<!DOCTYPE html>")
    # the same label twice gets a number
    assert main(["report", files[0], files[0]]) == 0
    assert "| rule | engine-a #1 | engine-a #2 |" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{}")
    assert main(["report", str(tmp_path / "bad.json")]) == 2
    assert "not a kvspec results file" in capsys.readouterr().err


def test_columns_generated_differently_are_said_to_be_not_comparable(
    runs: list[Results], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report never mixes provenances silently: runs under another
    Hypothesis (or that record none) are named above the matrix and on
    standard error; each run line carries its versions and effort."""
    alike = render_markdown(build_matrix(runs, tmp_path))
    assert "not comparable" not in alike
    assert "engine-a (profile kvbm): clean, kvspec 0.1.0+0123456789ab, Hypothesis 6.155.2, Python 3.11.7" in alike
    newer = PROVENANCE.model_copy(
        update={"versions": PROVENANCE.versions.model_copy(update={"hypothesis": "6.170.17"})}
    )
    mixed = [runs[0], runs[1].model_copy(update={"provenance": newer})]
    md = render_markdown(build_matrix(mixed, tmp_path))
    assert md.startswith("**Note:** these runs were not generated alike, so their counts are not comparable")
    assert "engine-a vs engine-b: Hypothesis 6.155.2 vs 6.170.17" in md
    page = render_html(build_matrix(mixed, tmp_path))
    assert '<p class="mixed" id="mixed"><strong>Note:</strong> these runs were not generated alike' in page
    unrecorded = [runs[0], runs[1].model_copy(update={"provenance": None})]
    files = []
    for i, r in enumerate(unrecorded):
        write_results(r, tmp_path / f"r{i}.json")
        files.append(str(tmp_path / f"r{i}.json"))
    assert main(["report", *files]) == 0
    out, err = capsys.readouterr()
    assert "kvspec report: note: these runs were not generated alike" in err
    assert "provenance recorded vs not recorded" in err and "(provenance not recorded)" in out


def test_the_page_is_self_contained(runs: list[Results], tmp_path: Path) -> None:
    page = render_html(build_matrix(runs, tmp_path))
    for external in ("http://", "https://", "<script", "<link", "src="):
        assert external not in page


# ------------------------------------------------------------------ in a real browser


class _Cells(HTMLParser):
    """The matrix cells of the DOM Chromium dumped: (rule, impl) -> (status, title, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str], tuple[str, str, str]] = {}
        self.rule_titles: dict[str, str] = {}
        self._cur: tuple[str, str] | None = None
        self._attrs: dict[str, str] = {}
        self._text: list[str] = []
        self._rule: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "td" and "data-rule" in a:
            self._cur, self._attrs, self._text = (a["data-rule"], a["data-impl"]), a, []
        elif tag == "td" and a.get("class") == "rule":
            self._rule, self._attrs, self._text = "?", a, []

    def handle_data(self, data: str) -> None:
        self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag != "td":
            return
        text = "".join(self._text).strip()
        if self._cur is not None:
            self.cells[self._cur] = (self._attrs["data-status"], self._attrs.get("title", ""), text)
            self._cur = None
        elif self._rule is not None:
            self.rule_titles[text] = self._attrs.get("title", "")
            self._rule = None


def _png_pixels(data: bytes) -> tuple[int, int, set[tuple[int, int, int]]]:
    """Width, height and the set of colours of an 8-bit RGB(A) PNG (what
    Chromium writes), decoded with zlib and the five PNG filters."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h, ctype = 8, b"", 0, 0, 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    bpp = 3 if ctype == 2 else 4
    raw, stride = zlib.decompress(idat), w * bpp
    prev, colours, i = bytearray(stride), set[tuple[int, int, int]](), 0
    for _ in range(h):
        f, line = raw[i], bytearray(raw[i + 1 : i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update((line[x], line[x + 1], line[x + 2]) for x in range(0, stride, bpp))
        prev = line
    return w, h, colours


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    pytest.skip(f"Chromium is not installed: {CHROMIUM_INSTALL}")


def _browser(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp / 'profile'}",
            "--hide-scrollbars",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_html_matrix_in_headless_chromium(runs: list[Results], tmp_path: Path) -> None:
    chromium = _chromium()
    page = tmp_path / "matrix.html"
    page.write_text(render_html(build_matrix(runs, tmp_path)))
    url = page.as_uri()

    dom = _browser(chromium, tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _Cells()
    parsed.feed(dom.stdout)
    cells = parsed.cells
    assert len(cells) == 2 * len(RULES)
    assert cells[("USE-NEW", "engine-a")][0::2] == ("pass", "✓ 42")
    status, title, text = cells[("EVENT-ID", "engine-b")]
    assert (status, text) == ("fail", "✗ fail") and "replay: " in title
    assert cells[("QUARANTINE-HOLD", "engine-a")][0::2] == ("not_applicable", "n/a (offload)")
    assert cells[("QUARANTINE-HOLD", "engine-a")][1] == "not applicable: missing capability offload"
    status, title, text = cells[("STORE-COPY", "engine-b")]
    assert status == "deviation" and "copies are silent" in title and text.startswith("≈ deviation (observed)")
    assert cells[("CLEAR-ALL", "engine-a")][0::2] == ("not_exercised", "! not exercised")
    # a rule the results file does not carry is shown as absent, not as a verdict
    assert cells[("STORE-COPY", "engine-a")][0::2] == ("absent", "–")
    # the rule text on hover: title and the first paragraph of its SPEC.md section
    assert parsed.rule_titles["EVENT-ID"].startswith("EVENT-ID: event ids start at 0 and increase by 1")
    assert "first published event has id 0" in parsed.rule_titles["EVENT-ID"]
    assert 'href="replays/engine-b-lockstep.jsonl"' in dom.stdout

    shot = tmp_path / "matrix.png"
    res = _browser(chromium, tmp_path, f"--screenshot={shot}", "--window-size=900,1600", url)
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    w, h, colours = _png_pixels(shot.read_bytes())
    assert (w, h) == (900, 1600)
    # the styles rendered: pass green, fail red, deviation amber, n/a grey
    for rgb in [(0xC8, 0xE6, 0xC9), (0xEF, 0x9A, 0x9A), (0xFF, 0xE0, 0xB2), (0xE0, 0xE0, 0xE0)]:
        assert rgb in colours, rgb
