"""The frame of a scripted request-level check: one engine session driven call by call beside the model.

The reset check (``reset_check``) and the shared-free check (``shared_free_check``) each run a fixed
script of ``add`` / ``step`` / ``reset_prefix_cache`` calls on an implementation's session
(``RequestImplementation``, capability ``reset``) and the same calls on the reference engine
(``reference.requests.RequestEngine``), keep a log of the implementation's answers, and on the first
difference raise a ``ConformanceFailure`` whose report lists those calls. This module holds what the
scripts share; each script is a subclass with its own ``run``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvspec.conformance.requests.interface import RequestImplementation
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference.requests import PoolSetup, RequestEngine, make_engine
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent


def brief(events: list[KvEvent]) -> str:
    """Events in one line for a report (``-`` for none)."""
    return "; ".join(e.brief() for e in events) or "-"


@dataclass
class ScriptedRequestCheck:
    """One session's script against the reference engine; subclasses write ``run``."""

    impl: RequestImplementation
    setup: PoolSetup
    #: told each time the script compared what its rule is about (the plugin's rule counter)
    record: Callable[[str], None] = lambda rule: None
    model: RequestEngine = field(init=False)
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.model = make_engine(self.setup)

    def run(self) -> None:
        raise NotImplementedError

    def pool(self) -> str:
        """The pool as the report names it."""
        return f"{self.setup.manager.capacity} blocks of {self.setup.manager.block_size} tokens"

    def fail_under(self, rule: RuleId, what: str, expected: object, actual: object) -> None:
        """Raise the failure under ``rule``, its report listing the calls so far."""
        calls = "\n".join(f"  {i}: {line}" for i, line in enumerate(self.log))
        report = (
            f"{what}\n  expected: {expected}\n  actual:   {actual}\n"
            f"pool: {self.pool()}\n"
            f"calls so far (the implementation's answers):\n{calls}"
        )
        raise ConformanceFailure(rule, report)


__all__ = ["ScriptedRequestCheck", "brief"]
