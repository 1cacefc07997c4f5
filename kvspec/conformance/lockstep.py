"""The differential checker: an implementation and the reference model in lockstep.

``Lockstep.step(op)`` sends one operation to the implementation first, then
applies it to the reference model with ``prefer=`` the blocks the
implementation evicted, so that where the policy allows several victims
(``policies.allowed()``) the model follows the implementation's choice and
both keep the same state. It then compares the two outcomes
(``step_check.StepCheck``: error, result, the stream as a router sees it,
events, counters, deadline, INV-ROUTER-MATCH) and counts the rules the step
exercised (``coverage.cover_step``).

The first difference raises ``ConformanceFailure(rule, report)``; the
report (``lockstep_report``) shows the operations so far with their
outcomes, the first diverging result or event and the rule, and a replay
file (``replay_file``) is written so that ``kvspec replay`` can run the
sequence again.

``protocol_only=True`` keeps only the checks a router cares about: for
implementations whose events may differ in detail from the model's but must
still keep a router's view right.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from kvspec.reference import RouterView, make_model
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import AdapterError, InvalidOperation
from kvspec.spec.profiles import Profile, profile
from kvspec.spec.wire import Counters, ErrorInfo, KvEvent, Operation, StepOutcome

from .coverage import Before, cover_step
from .diff import Divergence
from .failures import ConformanceFailure
from .interface import Implementation
from .lockstep_report import divergence_report, unfinished_note
from .replay_file import write_replay
from .step_check import StepCheck
from .stream_check import StreamCheck


def _removed_device(events: list[KvEvent]) -> set[int]:
    out: set[int] = set()
    for e in events:
        if e.kind == "removed" and e.storage_tier == "device":
            out.update(e.hashes())
    return out


class Lockstep:
    """Drive one implementation and the reference model with the same operations.

    ``replay_path``: where a failure writes its replay file (None: nowhere).
    ``event_token_ids=False``: the implementation does not publish token ids
    in its events (manifest capability), so the model's events are compared
    without them.
    """

    def __init__(
        self,
        impl: Implementation,
        config: ManagerConfig,
        *,
        adapter: str,
        replay_path: Path | None = None,
        protocol_only: bool = False,
        event_token_ids: bool = True,
    ) -> None:
        self.impl = impl
        self.event_token_ids = event_token_ids
        self.config = config
        self.adapter = adapter
        self.replay_path = replay_path
        self.protocol_only = protocol_only
        self.model = make_model(config)
        self.profile: Profile = profile(config.profile)
        self.stream = StreamCheck(config, self.profile, protocol_only=protocol_only)
        self.checker = StepCheck(self.stream, protocol_only=protocol_only)
        self.ops: list[Operation] = []
        self.expected: list[StepOutcome] = []
        self.actual: list[StepOutcome] = []
        self.coverage: Counter[str] = Counter()
        #: the model's counters after the last step
        self.before: Counters = self.model.counters()

    # the router views and the known breaks they excused (see stream_check)
    @property
    def view(self) -> RouterView:
        return self.stream.view

    @property
    def model_view(self) -> RouterView:
        return self.stream.model_view

    @property
    def tiers(self) -> list[str]:
        """The storage tiers INV-ROUTER-MATCH compares."""
        return self.stream.tiers

    @property
    def known_breaks(self) -> Counter[str]:
        return self.stream.known_breaks

    @property
    def cascaded_breaks(self) -> Counter[str]:
        return self.stream.cascaded_breaks

    # ------------------------------------------------------------------ step
    def step(self, op: Operation) -> StepOutcome:
        """Apply ``op`` to both sides and check; returns the model's outcome."""
        before = Before.of(self.model, op, self.before)
        try:
            actual = self.impl.step(op)
        except AdapterError as e:
            e.add_note(unfinished_note([*self.ops, op], self.expected))
            raise
        expected = self._model_step(op, prefer=_removed_device(actual.events))
        self.ops.append(op)
        self.expected.append(expected)
        self.actual.append(actual)
        self.before = expected.counters
        div = next(self.checker.divergences(op, expected, actual, before.counters, self.model), None)
        if div is not None:
            self.fail(div)
        cover_step(self.coverage, op, expected, before, offload=self.config.offload is not None)
        return expected

    def _model_step(self, op: Operation, *, prefer: set[int]) -> StepOutcome:
        """The model's outcome of ``op`` (following the implementation's
        victims where the policy allows)."""
        try:
            step = self.model.apply(op, prefer=prefer)
        except InvalidOperation as err:
            return StepOutcome.model_construct(
                result=None,
                error=ErrorInfo(rule=str(err.rule), message=err.message),
                counters=self.model.counters(),
                events=[],
                earliest_deadline_ms=self.model.earliest_deadline(),
            )
        events = step.events
        if not self.event_token_ids:
            events = [e.model_copy(update={"block_token_ids": None}) if e.block_token_ids else e for e in events]
        return StepOutcome.model_construct(
            result=step.result,
            error=None,
            counters=self.model.counters(),
            events=events,
            earliest_deadline_ms=self.model.earliest_deadline(),
        )

    # --------------------------------------------------------------- failure
    def fail(self, div: Divergence) -> None:
        """Raise the ConformanceFailure for ``div`` (writing the replay file)."""
        raise ConformanceFailure(div.rule, self.report(div))

    def report(self, div: Divergence) -> str:
        """The readable report of ``div`` at the last step (writes the replay file)."""
        return divergence_report(
            div,
            config=self.config,
            adapter=self.adapter,
            protocol_only=self.protocol_only,
            ops=self.ops,
            expected=self.expected,
            actual=self.actual,
            replay_path=self.write_replay(div),
        )

    def write_replay(self, div: Divergence) -> Path | None:
        """Write the replay file of the run so far (None: no replay path)."""
        if self.replay_path is None:
            return None
        return write_replay(
            self.replay_path,
            adapter=self.adapter,
            config=self.config,
            protocol_only=self.protocol_only,
            failure={"rule": str(div.rule), "step": len(self.ops) - 1, "what": div.what},
            ops=self.ops,
            expected=self.expected,
        )


def run_ops(
    impl: Implementation,
    config: ManagerConfig,
    ops: Sequence[Operation],
    *,
    adapter: str,
    replay_path: Path | None = None,
    protocol_only: bool = False,
    on_step: Callable[[int, StepOutcome], None] | None = None,
) -> Lockstep:
    """Run a fixed operation sequence in lockstep (raises at the first divergence)."""
    ls = Lockstep(impl, config, adapter=adapter, replay_path=replay_path, protocol_only=protocol_only)
    for i, op in enumerate(ops):
        exp = ls.step(op)
        if on_step is not None:
            on_step(i, exp)
    return ls


__all__ = ["Lockstep", "run_ops"]
