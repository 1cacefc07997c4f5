"""The output of one ``kvspec prove`` run, read back: a profile's rows and its summary line.

The whole run (every profile at its default level) prints each profile's rows as
``kvspec prove --profile P`` does (the same runner with the same defaults, ``cli/prove.py``), so a
check of one profile's default rows can read them from the whole run's output instead of proving
the profile again (the tests share one run a session this way: tests/conftest.py ``whole_prove``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ProveOutput"]


@dataclass(frozen=True)
class ProveOutput:
    """One run of the whole ``kvspec prove`` (every profile at its default level): its exit status
    and output."""

    code: int
    stdout: str
    stderr: str

    def section(self, profile: str) -> str:
        """The rows ``profile`` printed: from its first title line (``kvspec prove --profile P: ...``)
        to the next profile's title, or to the summary lines after the last profile; a KeyError
        where it printed none."""
        titles = [m for m in re.finditer(r"^kvspec prove --profile ([\w-]+):", self.stdout, re.M)]
        starts = [m.start() for m in titles if m.group(1) == profile]
        if not starts:
            raise KeyError(f"kvspec prove printed no rows of {profile}")
        start = starts[0]
        ends = [m.start() for m in titles if m.start() > start and m.group(1) != profile]
        summaries = self.stdout.find("\nsummary ", start)
        ends += [summaries] if summaries >= 0 else [len(self.stdout)]
        return self.stdout[start : min(ends)]

    def summary(self, profile: str) -> str:
        """The profile's summary line (``summary P: N held, N failed, N unknown (...)``)."""
        m = re.search(rf"^summary {re.escape(profile)}: .*$", self.stdout, re.M)
        if m is None:
            raise KeyError(f"kvspec prove printed no summary of {profile}")
        return m.group(0)
