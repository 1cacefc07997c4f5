"""A status line every few seconds during a long conformance run.

A ``thorough`` run spends minutes inside one Hypothesis test, where pytest
prints nothing but a dot at its end. ``Progress`` writes, at most every
``interval`` seconds, a line such as::

    kvspec progress 0:02:10: test 3 of 20 (test_lockstep[kvbm]), 1,204 examples, 31,880 steps, 41 of 68 rules covered

It is called after every lockstep example (``machine.ON_EXAMPLE``) and
after every test. ``--kvspec-progress=SECONDS`` sets the interval (0: off);
by default it is on (every 30 s) for the ``thorough`` effort on a terminal
and off otherwise (``-q`` included), so logs and CI output stay as they were.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping

import pytest

from kvspec.spec.rules import RULES

#: the interval of the default (``thorough`` on a terminal), in seconds
DEFAULT_INTERVAL = 30.0


def interval(config: pytest.Config, effort: str) -> float:
    """Seconds between status lines for this run (0: no progress)."""
    given = config.getoption("--kvspec-progress", None)
    if given is not None:
        return max(0.0, float(given))
    if effort != "thorough" or config.getoption("verbose", 0) < 0:
        return 0.0
    return DEFAULT_INTERVAL if sys.stdout.isatty() else 0.0


class Progress:
    """Writes the status line (through ``write``) when ``interval`` passed."""

    def __init__(
        self,
        every: float,
        write: Callable[[str], None],
        stats: Mapping[str, int],
        rules: Callable[[], set[str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every = every
        self.write = write
        self.stats = stats
        self.rules = rules
        self.clock = clock
        self.start = clock()
        self.last = self.start
        self.tests_total = 0
        self.tests_done = 0
        self.current = ""

    def tick(self) -> None:
        """Write the line if ``every`` seconds passed since the last one."""
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        self.write(self.line(now))

    def line(self, now: float) -> str:
        secs = int(now - self.start)
        elapsed = f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}"
        known = {str(r) for r in RULES}
        covered = len(self.rules() & known)
        test = f"test {min(self.tests_done + 1, self.tests_total)} of {self.tests_total}"
        if self.current:
            test += f" ({self.current})"
        return (
            f"kvspec progress {elapsed}: {test}, {self.stats.get('examples', 0):,} examples, "
            f"{self.stats.get('steps', 0):,} steps, {covered} of {len(known)} rules covered"
        )
