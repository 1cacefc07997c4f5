"""INVARIANTS.md's tables against what ``kvspec prove`` prints, profile by profile.

The "Vacuity by construction" table claims, per profile and level, whether a
``REACHABLE`` row and a ``MUTANTS-COVER`` row guard the proofs; the "What is
proven" table lists each profile's INV-* and LEMMA-* properties. ``problems``
splits one run of plain ``kvspec prove`` (every profile at its default level)
by profile and checks each claim against its rows: a "yes" needs the row,
passing; a "no" needs it absent; every property listed is a row of that
profile and every INV-* row printed is listed. The "Progress" table lists,
per profile, the PROGRESS-* ids proven as ranking arguments: each one claimed
for plain ``kvspec prove --profile P`` is a held row ``ID (ranking)`` of P,
and every such row printed is claimed. Used by the tests (the suite
runs plain ``kvspec prove`` once, in ``tests/test_smt_prove.py``), so that the
tables cannot drift from the command.
"""

from __future__ import annotations

import re
from pathlib import Path

from kvspec.spec.registry import KVBM_OFFLOAD, PAGED, RADIX, SESSION

DOC = Path(__file__).resolve().parents[3] / "spec" / "INVARIANTS.md"
ID = re.compile(r"\b(?:INV|LEMMA)-[A-Z0-9]+(?:-[A-Z0-9]+)*")
PROGRESS_ID = re.compile(r"\bPROGRESS-[A-Z0-9]+(?:-[A-Z0-9]+)*")
RANKING = " (ranking)"
HELD = ("unbounded proven", "proven")

#: (profile, level) -> the label of its REACHABLE / MUTANTS-COVER row, where not the level's default
REACH_LABEL = {
    (PAGED, "operation"): "REACHABLE",
    (SESSION, "operation"): "REACHABLE",
    (RADIX, "operation"): "op REACHABLE",
}
COVER_LABEL = {
    (PAGED, "operation"): "MUTANTS-COVER",
    (SESSION, "operation"): "MUTANTS-COVER",
    (RADIX, "operation"): "op MUTANTS-COVER",
}
DEFAULT_LABEL = {
    "step": ("REACHABLE", "MUTANTS-COVER"),
    "operation": ("operation: REACHABLE", "operation: MUTANTS-COVER"),
}


def _table(text: str, head: str) -> list[list[str]]:
    """The rows (cells) of the markdown table whose header line starts with ``head``."""
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(head))
    out = []
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        out.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return out


def vacuity_claims(text: str) -> list[tuple[str, str, bool, bool]]:
    """(profile, level, REACHABLE claimed, MUTANTS-COVER claimed) for each level plain ``prove`` runs."""
    out = []
    for cells in _table(text, "| profile | level | REACHABLE"):
        profiles = re.findall(r"`([\w-]+)`", cells[0])
        if "--unbounded" in cells[1]:
            assert cells[2].startswith("no") and cells[3].startswith("no"), cells  # plain prove does not run it
            continue
        for p in profiles:
            for level in (x.strip() for x in cells[1].split(",")):
                out.append((p, level, cells[2].startswith("yes"), cells[3].startswith("yes")))
    return out


def proven_claims(text: str) -> dict[str, set[str]]:
    """Profile -> the INV-* and LEMMA-* ids the "What is proven" table lists for what plain ``prove`` runs."""
    out: dict[str, set[str]] = {}
    last = ""
    for cells in _table(text, "| profile | properties"):
        name = cells[0]
        if name.startswith("same"):
            prof = RADIX if RADIX in name else last
        else:
            first = re.findall(r"`([\w-]+)`", name)[0]
            prof = KVBM_OFFLOAD if "offload tier" in name else first
        last = prof
        if "--unbounded" in cells[-1]:
            continue
        ids = {m.group(0) for m in ID.finditer(cells[1]) if not cells[1].startswith("-*", m.end())}  # not "INV-RADIX-*"
        if "LEMMA-*" in cells[1]:
            ids.add("LEMMA-*")
        out.setdefault(prof, set()).update(ids)
    return out


def progress_claims(text: str) -> dict[str, set[str]]:
    """Profile -> the PROGRESS-* ids the "Progress" table claims as ranking arguments of plain
    ``kvspec prove --profile P`` (rows of ``--unbounded`` or of another command are not run by it)."""
    out: dict[str, set[str]] = {}
    for cells in _table(text, "| profile | property | form"):
        if len(cells) < 5:  # a profile with none: "| `paged` | none | | | |"
            continue
        cmd = re.findall(r"`kvspec prove --profile ([\w-]+)`", cells[4])
        if not cells[2].startswith("ranking") or not cmd:
            continue
        ids = {m.group(0) for m in PROGRESS_ID.finditer(cells[1])}
        for p in re.findall(r"`([\w-]+)`", cells[0]):
            out.setdefault(p, set()).update(ids)
    return out


def sections(out: str) -> dict[str, dict[str, str]]:
    """Profile -> its rows (label -> verdict), from ``kvspec prove``'s output."""
    res: dict[str, dict[str, str]] = {}
    cur: dict[str, str] | None = None
    for line in out.splitlines():
        m = re.match(r"kvspec prove --profile ([\w-]+):", line)
        if m:
            cur = res.setdefault(m.group(1), {})
            continue
        cols = re.split(r"\s{2,}", line.strip())
        if cur is not None and len(cols) >= 2 and not line.startswith(("-", "summary", "sanity check failed")):
            cur.setdefault(cols[0], cols[1])
    return res


def problems(text: str, out: str) -> list[str]:
    """Every table claim the output contradicts."""
    secs = sections(out)
    bad = []
    for p, level, reach, cover in vacuity_claims(text):
        rows = secs.get(p)
        if rows is None:
            bad.append(f"{p}: no section in the output")
            continue
        for claimed, label in (
            (reach, REACH_LABEL.get((p, level), DEFAULT_LABEL[level][0])),
            (cover, COVER_LABEL.get((p, level), DEFAULT_LABEL[level][1])),
        ):
            if claimed and rows.get(label) != "ok":
                bad.append(f"{p} {level}: the table says yes, the row {label!r} is {rows.get(label, 'absent')}")
            if not claimed and label in rows:
                bad.append(f"{p} {level}: the table says no, but {label!r} is printed ({rows[label]})")
    for p, ids in proven_claims(text).items():
        labels = secs.get(p, {})
        printed = {i for lb in labels for i in ID.findall(lb.split(" (never")[0])}
        for i in sorted(ids - {"LEMMA-*"}):
            if i not in printed:
                bad.append(f"{p}: the table lists {i}, no row of it is printed")
        for i in sorted(printed):
            if i.startswith("INV-") and i not in ids:
                bad.append(f"{p}: the row {i} is printed, the table does not list it")
            if i.startswith("LEMMA-") and i not in ids and "LEMMA-*" not in ids:
                bad.append(f"{p}: the row {i} is printed, the table does not list it")
    ranked_claims = progress_claims(text)
    for p in sorted(set(ranked_claims) | set(secs)):
        rows = secs.get(p, {})
        ranked = {lb.removesuffix(RANKING) for lb in rows if lb.endswith(RANKING)}
        for i in sorted(ranked_claims.get(p, set())):
            if rows.get(i + RANKING) not in HELD:
                bad.append(
                    f"{p}: the progress table claims {i}, the row '{i}{RANKING}' is {rows.get(i + RANKING, 'absent')}"
                )
        for i in sorted(ranked - ranked_claims.get(p, set())):
            bad.append(f"{p}: the row '{i}{RANKING}' is printed, the progress table does not claim it")
    return bad
