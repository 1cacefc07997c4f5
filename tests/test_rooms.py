"""The two folders that used to be flat stay rooms: at most 15 modules at any one level.

Issue 28 split ``conformance/`` (54 modules side by side) and ``reference/smt/``
(50) into sub-packages by job. This holds the line: a folder at any depth under
either holds at most 15 Python modules of its own (``__init__.py`` counted,
sub-packages not), so a sixteenth module means a new room, not a longer list.
"""

from __future__ import annotations

from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "kvspec"
ROOMS = (PKG / "conformance", PKG / "reference" / "smt")
LIMIT = 15


def crowded(root: Path, limit: int = LIMIT) -> dict[str, int]:
    """Each folder under ``root`` (itself included) holding more than ``limit`` modules -> its count."""
    out: dict[str, int] = {}
    for folder in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if folder.name == "__pycache__":
            continue
        n = sum(1 for p in folder.glob("*.py"))
        if n > limit:
            out[str(folder.relative_to(root.parent))] = n
    return out


@pytest.mark.parametrize("root", ROOMS, ids=lambda p: str(p.relative_to(PKG)))
def test_no_folder_holds_more_than_15_modules(root: Path) -> None:
    assert root.is_dir(), root
    assert crowded(root) == {}, f"split these folders by job (limit {LIMIT} modules each)"


def test_the_count_sees_a_crowded_folder(tmp_path: Path) -> None:
    room = tmp_path / "room"
    (room / "inner").mkdir(parents=True)
    for i in range(LIMIT + 1):
        (room / "inner" / f"m{i}.py").write_text("")
    (room / "inner" / "__pycache__").mkdir()
    for i in range(LIMIT):
        (room / f"m{i}.py").write_text("")
    assert crowded(room) == {"room/inner": LIMIT + 1}
