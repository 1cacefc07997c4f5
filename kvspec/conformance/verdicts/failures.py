"""Conformance failures: an assertion that names the rule it saw broken.

The plugin matches the failure's ``site`` (rule, golden scenario, operation
kind, the named conditions the checker found to hold) against the manifest's
scoped deviations (``kvspec.spec.deviations``); the message is the readable
report (operation table, first divergence, expected vs actual).
"""

from __future__ import annotations

from dataclasses import replace

from kvspec.spec.deviations import Site
from kvspec.spec.rules import RuleId


class ConformanceFailure(AssertionError):
    """The implementation broke rule ``rule``; ``str()`` is the full report."""

    def __init__(self, rule: RuleId | str, report: str, *, site: Site | None = None) -> None:
        super().__init__(f"[{rule}] {report}")
        self.rule = RuleId(rule)
        self.report = report
        #: where it happened (the rule's site with nothing else known by default)
        self.site = replace(site, rule=self.rule) if site is not None else Site(self.rule)


class DeviationNotFollowed(ConformanceFailure):
    """A declared deviation covers a step's difference, but the model cannot
    take the implementation's state after it (no follow mode reproduces the
    step, and the counters, the deadline or the refusal differ): the rest of
    the run could not be checked honestly, so it fails here, naming the rule.
    Never an expected deviation itself (the plugin does not match it against
    the manifest): a declaration contains its cause or the run fails."""


class CallerContractBroken(AssertionError):
    """The driver broke caller contract ``contract`` (an ASSUME-* id): the
    operations it sent are not those of a well-behaved caller, so the
    implementation is not to blame (never matched against deviations)."""

    def __init__(self, contract: str, report: str) -> None:
        super().__init__(f"[{contract}] {report}")
        self.contract = contract
        self.report = report
