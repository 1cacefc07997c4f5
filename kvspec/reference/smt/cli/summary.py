"""One summary format and one exit status for every profile of ``kvspec prove``.

Every row any profile prints goes through ``row`` (label, verdict, scope,
time), which prints it and files its verdict: *held* (proven, a sanity check
ok, a mutant refuted, every case reached), *failed* (a counterexample, a
sanity check failed, a mutant not refuted, a case not reached) or *unknown*
(the solver gave up). A run ends with one line per profile in the same
format and an exit status from the tally, so no profile can print "proven"
while exiting on a different rule than the others.

Exit status (``EXIT_*``): 0 every row held; 1 some row failed (under
``--mutant``: the mutant was caught); 2 usage error; 3 no row failed but the
solver gave up on some (``unknown``), so nothing can be said of those rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNKNOWN = 0, 1, 2, 3

EXIT_CODES_HELP = (
    "exit status: 0 every row proven (sanity checks ok, mutants refuted, every case reached);"
    " 1 a counterexample, a failed sanity or reachability check, a mutant not refuted"
    " (with --mutant: the mutant was caught); 2 usage error; 3 no failure but the solver gave up"
    " on some row (printed as 'unknown (timeout after N s)')"
)

_GOOD = ("proven", "unbounded proven", "ok", "agrees", "reached")
_BAD = ("not proven", "counterexample", "failed", "not refuted", "disagrees", "refuted", "not reached")


@dataclass
class Tally:
    profile: str
    held: int = 0
    failed: int = 0
    unknown: int = 0
    cpu0: float = field(default_factory=time.process_time)
    wall0: float = field(default_factory=time.perf_counter)
    #: problems reported in words (sanity, reachability): counted as failed rows already
    notes: list[str] = field(default_factory=list)
    #: when the profile's rows ended (the next profile's ``start``); None while it runs
    cpu1: float | None = None
    wall1: float | None = None

    def stop(self) -> None:
        """Close the profile's time span (its figures are its own, not the run's so far)."""
        if self.cpu1 is None:
            self.cpu1, self.wall1 = time.process_time(), time.perf_counter()

    def line(self) -> str:
        cpu = (self.cpu1 if self.cpu1 is not None else time.process_time()) - self.cpu0
        wall = (self.wall1 if self.wall1 is not None else time.perf_counter()) - self.wall0
        return (
            f"summary {self.profile}: {self.held} held, {self.failed} failed, {self.unknown} unknown"
            f" ({cpu:.1f} s CPU, {wall:.1f} s wall)"
        )


_TALLIES: list[Tally] = []
#: the solver timeout of the rows being printed (seconds), for "unknown (timeout after N s)"
_timeout_s: list[float | None] = [None]


def start(profile: str, timeout_s: float | None = None) -> Tally:
    """Begin a profile's rows (its tally gets every row until the next ``start``, which
    also ends the previous profile's time span)."""
    if _TALLIES:
        _TALLIES[-1].stop()
    t = Tally(profile)
    _TALLIES.append(t)
    _timeout_s[0] = timeout_s
    return t


def set_timeout(seconds: float | None) -> None:
    """The solver timeout of the rows printed from now on (for "unknown (timeout after N s)")."""
    _timeout_s[0] = seconds


def reset() -> None:
    _TALLIES.clear()
    _timeout_s[0] = None


def tallies() -> list[Tally]:
    return list(_TALLIES)


def unknown_text(reason: str | None = None, timeout_s: float | None = None) -> str:
    """How an unknown verdict reads: a timeout says after how long."""
    t = timeout_s if timeout_s is not None else _timeout_s[0]
    if reason in (None, "timeout", "canceled") and t is not None:
        return f"unknown (timeout after {t:g} s)"
    return f"unknown ({reason or 'the solver gave up'})"


def classify(label: str, verdict: str) -> str | None:
    """'held', 'failed', 'unknown', or None for a header or separator row."""
    v = verdict.strip().lower()
    if not v or v == "result" or set(v) == {"-"}:
        return None
    if v.startswith("unknown"):
        return "unknown"
    if label.strip().startswith(("refutes ", "mutant ")):
        return "held" if v.startswith("refuted") else "failed"
    if v in _BAD or v.startswith("not ") or "counterexample" in v:
        return "failed"
    if v in _GOOD or v.startswith("proven") or v.startswith("ok"):
        return "held"
    return None


def file_row(label: str, verdict: str, seconds: float | None = None) -> str:
    """File a row's verdict in the current tally; return the verdict as printed
    (an unknown says why: a timeout only when the row ran that long, else z3
    gave up early, as it may on quantified formulas)."""
    kind = classify(label, verdict)
    if kind is not None and _TALLIES:
        t = _TALLIES[-1]
        setattr(t, kind, getattr(t, kind) + 1)
    if kind == "unknown" and verdict.strip().lower() == "unknown":
        limit = _timeout_s[0]
        if limit is not None and seconds is not None and seconds < limit:
            return "unknown (z3 gave up before the timeout)"
        return unknown_text()
    return verdict


def _seconds(col: str) -> float | None:
    try:
        return float(col.strip().removesuffix("s"))
    except ValueError:
        return None


def row(cols: list[str], widths: list[int]) -> str:
    """Format a row (label, verdict, ..., time) and file its verdict."""
    cols = [cols[0], file_row(cols[0], cols[1], _seconds(cols[-1])), *cols[2:]]
    widths = list(widths)
    widths[1] = max(widths[1], len(cols[1]))
    return "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()


def header(cols: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()


def problem(text: str) -> None:
    """A failure reported in words only (no row of its own): counted as a failed row."""
    if _TALLIES:
        _TALLIES[-1].failed += 1
        _TALLIES[-1].notes.append(text)


def exit_status(mutant: bool = False) -> int:
    failed = sum(t.failed for t in _TALLIES)
    unknown = sum(t.unknown for t in _TALLIES)
    if failed:
        return EXIT_FAILED
    if unknown:
        return EXIT_UNKNOWN
    return EXIT_OK
