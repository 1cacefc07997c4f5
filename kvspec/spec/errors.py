"""Typed errors that carry the id of the rule they enforce.

An operation the spec forbids raises ``InvalidOperation``; the model guarantees
that when it does, its state is exactly what it was before the call (no
half-applied change) and no event was emitted. Adapters and wire decoding
raise ``WireError`` for input that does not parse; adapter failures (crash,
hang, garbage on a pipe) are ``AdapterError``.
"""

from __future__ import annotations

from typing import Any

from kvspec.spec.rules import RuleId


class KvSpecError(Exception):
    """Base class of every error kvspec raises on purpose."""


class InvalidOperation(KvSpecError):
    """An operation the spec rejects. ``rule`` names the rule it breaks."""

    def __init__(self, rule: RuleId, message: str, **detail: Any) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule
        self.message = message
        self.detail = detail

    def to_json(self) -> dict[str, Any]:
        return {"rule": str(self.rule), "message": self.message}


class WireError(KvSpecError):
    """A message that does not match the wire models (names the field)."""


class ConfigError(KvSpecError):
    """A model or adapter configuration that is not valid."""


#: the words every transport puts in an AdapterError for an implementation
#: that stopped answering (the plugin stops the run on it: see plugin.py)
HANG_MARK = "the adapter hangs"


class AdapterError(KvSpecError):
    """The implementation under test misbehaved at the transport level:
    it crashed, hung past its timeout, or wrote something that is not a reply."""

    def __init__(self, message: str, *, stderr_tail: str = "", exit_status: int | None = None) -> None:
        text = message
        if exit_status is not None:
            text += f" (exit status {exit_status})"
        if stderr_tail:
            text += "\n--- stderr (tail) ---\n" + stderr_tail
        super().__init__(text)
        self.stderr_tail = stderr_tail
        self.exit_status = exit_status
        #: the verdict a checker made of this failure when it came in answer to
        #: an operation (the rule whose precondition the crash reveals, the
        #: operations and a replay file: ``conformance.block.lockstep``); None:
        #: a failure outside any operation (start-up, close)
        self.verdict: AssertionError | None = None
