"""Conformance failures: an assertion that names the rule it saw broken.

The plugin keys expected deviations on ``rule``; the message is the readable
report (operation table, first divergence, expected vs actual).
"""

from __future__ import annotations

from kvspec.spec.rules import RuleId


class ConformanceFailure(AssertionError):
    """The implementation broke rule ``rule``; ``str()`` is the full report."""

    def __init__(self, rule: RuleId | str, report: str) -> None:
        super().__init__(f"[{rule}] {report}")
        self.rule = RuleId(rule)
        self.report = report
