"""Regenerate the conformance matrix page, docs/results/matrix.md (``make matrix``).

Runs the conformance suite against each adapter of the matrix at one effort
(``--kvspec-results``; ``ci`` by default, derandomised, so no seed: a seed is
given only with a random effort), renders the results with
``kvspec report`` into ``.kvspec/matrix/`` (Markdown and HTML) and replaces
the page's table between the ``<!-- matrix:begin -->`` and
``<!-- matrix:end -->`` markers (the documentation site's results page). Adapters whose folder does not exist yet
(vllm, sglang before they land) are left out, saying so.

    python scripts/matrix.py                      # run the suite, update docs/results/matrix.md
    python scripts/matrix.py --no-run             # re-render from .kvspec/matrix/*.json
    python scripts/matrix.py --run vllm sglang    # run these, reuse the others' results
    python scripts/matrix.py --run rust_mocker/sglang   # a backend variant (FOLDER/VARIANT)
    python scripts/matrix.py --adapters reference c_port --effort smoke
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from kvspec.conformance.commands.report import build_matrix, render_html, render_markdown
from kvspec.conformance.verdicts.results import load_results

ROOT = Path(__file__).resolve().parents[1]
#: adapter folders, or FOLDER/VARIANT for a backend variant (Dynamo's mocker's
#: TensorRT-LLM-style and SGLang-style backends are variants of rust_mocker)
ADAPTERS = (
    "reference",
    "c_port",
    "rust_mocker",
    "rust_mocker/trtllm",
    "rust_mocker/sglang",
    "vllm",
    "sglang",
    "paged_rust",
    "session_rust",
    "radix_rust",
)
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"


def run_suite(name: str, out: Path, effort: str, seed: str | None) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "conformance",
            f"--impl=adapters/{name}",
            f"--hypothesis-profile={effort}",
            *([f"--hypothesis-seed={seed}"] if seed is not None else []),
            f"--kvspec-results={out}",
            f"--kvspec-replay-dir={out.parent / 'replays' / out.stem}",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    tail = (proc.stdout.strip().splitlines() or [""])[-1]
    print(f"{name}: pytest exit {proc.returncode} in {time.monotonic() - t0:.0f} s: {tail}", flush=True)


def splice(readme: Path, table: str) -> bool:
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: no {BEGIN} ... {END} markers")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = f"{head}{BEGIN}\n{table}{END}{tail}"
    changed = new != text
    readme.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--adapters", nargs="+", default=list(ADAPTERS), help="adapter names under adapters/")
    p.add_argument("--effort", default="ci", help="Hypothesis profile (default ci)")
    p.add_argument("--seed", default=None, help="Hypothesis seed, for a random effort (smoke, thorough) only")
    p.add_argument("--out", default=".kvspec/matrix", help="where the results and reports go")
    p.add_argument("--no-run", action="store_true", help="reuse the results already in --out")
    p.add_argument(
        "--run",
        nargs="+",
        default=None,
        metavar="NAME",
        help="run only these adapters; reuse the results already in --out for the others",
    )
    p.add_argument(
        "--page", "--readme", dest="page", default="docs/results/matrix.md", help="the file whose matrix is replaced"
    )
    args = p.parse_args(argv)
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for name in args.adapters:
        folder = name.partition("/")[0]
        if not (ROOT / "adapters" / folder / "manifest.toml").is_file():
            print(f"{name}: no adapters/{folder}/manifest.toml yet: left out")
            continue
        res = out / f"{name.replace('/', '__')}.json"
        if not args.no_run and (args.run is None or name in args.run):
            run_suite(name, res, args.effort, args.seed)
        if res.is_file():
            files.append(res)
        else:
            print(f"{name}: no results file {res}: left out")
    runs = [load_results(f) for f in files]
    (out / "matrix.html").write_text(render_html(build_matrix(runs, out)))
    (out / "matrix.md").write_text(render_markdown(build_matrix(runs, out)))
    table = render_markdown(build_matrix(runs, ROOT))
    seeded = (
        f", seed {args.seed}"
        if args.seed is not None
        else " (derandomised)"
        if args.effort in ("ci", "default")
        else ""
    )
    note = f"Effort `{args.effort}`{seeded}; regenerate with `make matrix`.\n\n"
    changed = splice(ROOT / args.page, note + table)
    print(f"{args.page}: {'matrix updated' if changed else 'matrix unchanged'}; HTML in {out / 'matrix.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
