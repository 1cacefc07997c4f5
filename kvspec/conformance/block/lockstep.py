"""The differential checker: an implementation and the reference model in lockstep.

``Lockstep.step(op)`` sends one operation to the implementation first, then
applies it to the reference model with ``prefer=`` the blocks the
implementation evicted, so that where the policy allows several victims
(``policies.allowed()``) the model follows the implementation's choice and
both keep the same state. It then compares the two outcomes
(``step_check.StepCheck``: error, result, the stream as a router sees it,
events, counters, deadline, INV-ROUTER-MATCH) and counts the rules the step
exercised (``coverage.cover_step``).

Every difference of a step is described as a ``Site`` (rule, operation
kind, the named conditions ``deviation_scope`` finds to hold) and matched
against the manifest's scoped deviations (``kvspec.spec.deviations``):

- outside every scope, it raises ``ConformanceFailure(rule, report)``; the
  report (``lockstep_report``) shows the operations so far with their
  outcomes, the first diverging result or event and the rule, and a replay
  file (``replay_file``) is written so that ``kvspec replay`` can run the
  sequence again;
- inside a declared scope, it is recorded and counted (``deviations``,
  ``on_deviation``), never raised, so a run never ends on it and Hypothesis
  never shrinks into it. The lockstep then *adopts* the implementation's
  observable outcome and goes on checking every rule: the router view keeps
  the implementation's stream, INV-ROUTER-MATCH is compared against what the
  model announced corrected by the blocks the departure added or left out
  (until the model itself stores or removes them), and later events are
  expected with the implementation's event numbering. The manager's state
  stays the model's own (the victim choice is followed anyway, see above):
  a later difference that a departure causes is judged again against the
  scopes, inside one it is recorded, outside every one it fails. At the
  step of an adopted departure, INV-ROUTER-MATCH is its consequence and is
  recorded with it.

``caller_contracts=True`` (the lockstep machine, a well-behaved caller by
design) also evaluates the caller contracts the proofs of the profile under test
assume (``reference/caller_contracts.py``, ``assumed``: kvbm with offload
both, atomic ASSUME-PARENT-REGISTERED) on the model's state before
every operation the model accepts, and raises ``CallerContractBroken`` naming
the contract's id: a bug of the traffic, not of the implementation.

``protocol_only=True`` keeps only the checks a router cares about: for
implementations whose events may differ in detail from the model's but must
still keep a router's view right.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from kvspec.conformance.block.coverage import Before, cover_step
from kvspec.conformance.block.diff import Divergence
from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.block.lockstep_report import divergence_report, unfinished_note
from kvspec.conformance.block.step_check import StepCheck
from kvspec.conformance.block.stream_check import StreamCheck
from kvspec.conformance.run.deviation_scope import site_of, step_conditions
from kvspec.conformance.verdicts.failures import CallerContractBroken, ConformanceFailure
from kvspec.conformance.verdicts.replay_file import write_replay
from kvspec.conformance.verdicts.replay_store import Target, replay_command
from kvspec.reference import RouterView, make_model
from kvspec.reference.caller_contracts import ContractBreak, broken_contracts, settle
from kvspec.reference.g1 import G1Model
from kvspec.reference.labels import StepLabels
from kvspec.spec.config import ManagerConfig
from kvspec.spec.deviations import Deviation, Site
from kvspec.spec.errors import AdapterError, InvalidOperation
from kvspec.spec.profiles import Profile, profile
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Counters, ErrorInfo, KvEvent, Operation, StepOutcome


def _removed_device(events: list[KvEvent]) -> set[int]:
    out: set[int] = set()
    for e in events:
        if e.kind == "removed" and e.storage_tier == "device":
            out.update(e.hashes())
    return out


class Lockstep:
    """Drive one implementation and the reference model with the same operations.

    ``replay_path``: where a failure writes its replay file (None: nowhere;
    a callable is asked only when a failure is written, so that a run's
    replay folder is made only when something fails); ``replay_target``: the
    implementation as the file records it (``replay_store.Target``).
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
        replay_path: Path | Callable[[], Path] | None = None,
        replay_target: Target | None = None,
        protocol_only: bool = False,
        event_token_ids: bool = True,
        deviations: Sequence[Deviation] = (),
        on_deviation: Callable[[int, Site], None] | None = None,
        caller_contracts: bool = False,
    ) -> None:
        self.impl = impl
        self.caller_contracts = caller_contracts
        #: operations whose caller contracts were evaluated (every accepted one)
        self.contracts_checked = 0
        self.event_token_ids = event_token_ids
        self.config = config
        self.adapter = adapter
        self.replay_path = replay_path
        self.replay_target = replay_target
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
        #: the manifest's declared deviations, and a callback told the index
        #: of each one observed (with the failure's site)
        self.deviations = list(deviations)
        self.on_deviation = on_deviation
        #: declared deviations observed: (step, site, index into deviations)
        self.adopted: list[tuple[int, Site, int]] = []
        #: event ids: the implementation's numbering minus the model's (adopted)
        self.id_offset = 0
        self._next_ids = (0, 0)  # (model, implementation) next event id
        self._events_seen = False
        #: the rules behind the model's last step (None: it rejected the operation)
        self.labels: StepLabels | None = None

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
    def step(self, op: Operation, *, contracts: bool = True) -> StepOutcome:
        """Apply ``op`` to both sides and check; returns the model's outcome.
        ``contracts=False``: the caller knows ``op`` may step outside the
        caller contracts (traffic.Planned.unheld_anchor), so they are not
        checked on it."""
        before = Before.of(self.model, op, self.before)
        breaks = self._contract_breaks(op) if contracts else None
        try:
            actual = self.impl.step(op)
        except AdapterError as e:
            e.add_note(unfinished_note([*self.ops, op], self.expected))
            raise
        expected = self._model_step(op, prefer=_removed_device(actual.events))
        self.ops.append(op)
        self.expected.append(expected)
        self.actual.append(actual)
        if breaks is not None and expected.error is None:
            self.contracts_checked += 1
            breaks = settle(breaks, expected.result.status if expected.result is not None else "ok")
            if breaks:
                raise CallerContractBroken(breaks[0].id, self._contract_report(breaks))
        self.before = expected.counters
        adopted = False
        for div in self.checker.divergences(op, expected, actual, before.counters, self.model, self.labels):
            if adopted and div.rule == RuleId.INV_ROUTER_MATCH:
                continue  # the consequence of this step's adopted departure (module doc)
            site = self.site_of(div, op, expected, actual)
            i = next((k for k, d in enumerate(self.deviations) if d.covers(site)), None)
            if i is None:
                self.fail(div, site)
            assert i is not None
            self.adopted.append((len(self.ops) - 1, site, i))
            if self.on_deviation is not None:
                self.on_deviation(i, site)
            adopted = True
        self._track_ids(expected, actual, adopt=adopted)
        if adopted:
            self.stream.adopt(self.model)
        cover_step(self.coverage, op, expected, before, offload=self.config.offload is not None)
        return expected

    def _contract_breaks(self, op: Operation) -> list[ContractBreak] | None:
        """The caller contracts ``op`` breaks in the model's state before it
        (None: not evaluated, off or not a G1 model)."""
        if not self.caller_contracts or not isinstance(self.model, G1Model):
            return None
        return broken_contracts(self.model, op)

    def _contract_report(self, breaks: list[ContractBreak]) -> str:
        i = len(self.ops) - 1
        lines = [f"step {i} ({self.ops[-1].op}): " + "; ".join(str(b) for b in breaks)]
        lines.append(
            "the lockstep's traffic is meant to keep every caller contract (spec/SPEC.md, 'Caller contracts'):"
            " a bug of the suite's traffic, not of the implementation"
        )
        start = max(0, i - 5)
        lines += [f"  {k}: {o.model_dump_json(exclude_none=True)}" for k, o in enumerate(self.ops[start:], start)]
        return "\n".join(lines)

    def site_of(self, div: Divergence, op: Operation, expected: StepOutcome, actual: StepOutcome) -> Site:
        """Where ``div`` happened, with the named conditions that hold for it."""
        conds = step_conditions(div.rule, expected.events, actual.events, first_events=not self._events_seen)
        return site_of(div.rule, config=self.config, op=op, conditions=conds)

    def _track_ids(self, expected: StepOutcome, actual: StepOutcome, *, adopt: bool) -> None:
        """Follow both sides' event numbering; after an adopted departure the
        model's later events are renumbered to continue the implementation's."""
        model_next, impl_next = self._next_ids
        if expected.events:
            model_next = max(e.event_id for e in expected.events) - self.id_offset + 1
        if actual.events:
            impl_next = max(e.event_id for e in actual.events) + 1
        self._next_ids = (model_next, impl_next)
        self._events_seen = self._events_seen or bool(expected.events or actual.events)
        if adopt:
            self.id_offset = impl_next - model_next

    def _model_step(self, op: Operation, *, prefer: set[int]) -> StepOutcome:
        """The model's outcome of ``op`` (following the implementation's
        victims where the policy allows)."""
        self.labels = None
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
        self.labels = step.labels
        events = step.events
        if not self.event_token_ids:
            events = [e.model_copy(update={"block_token_ids": None}) if e.block_token_ids else e for e in events]
        if self.id_offset:
            events = [e.model_copy(update={"event_id": e.event_id + self.id_offset}) for e in events]
        return StepOutcome.model_construct(
            result=step.result,
            error=None,
            counters=self.model.counters(),
            events=events,
            earliest_deadline_ms=self.model.earliest_deadline(),
        )

    # --------------------------------------------------------------- failure
    def _replay_command(self, path: Path) -> str:
        """The command that replays ``path`` against this implementation."""
        return replay_command(path, self.replay_target)

    def fail(self, div: Divergence, site: Site | None = None) -> None:
        """Raise the ConformanceFailure for ``div`` (writing the replay file)."""
        raise ConformanceFailure(div.rule, self.report(div, site), site=site)

    def report(self, div: Divergence, site: Site | None = None) -> str:
        """The readable report of ``div`` at the last step (writes the replay file)."""
        text = divergence_report(
            div,
            config=self.config,
            adapter=self.adapter,
            protocol_only=self.protocol_only,
            ops=self.ops,
            expected=self.expected,
            actual=self.actual,
            replay_path=self.write_replay(div),
            replay_command=self._replay_command,
        )
        if site is not None and self.deviations:
            text += f"\nnot a declared deviation: {site.describe()}"
        if self.adopted:
            seen = ", ".join(f"step {k} {self.deviations[i].rule}" for k, _, i in self.adopted[:8])
            more = f" and {len(self.adopted) - 8} more" if len(self.adopted) > 8 else ""
            text += f"\nfollowed after declared deviations: {seen}{more}"
        return text

    def write_replay(self, div: Divergence) -> Path | None:
        """Write the replay file of the run so far (None: no replay path)."""
        if self.replay_path is None:
            return None
        path = self.replay_path() if callable(self.replay_path) else self.replay_path
        return write_replay(
            path,
            adapter=self.adapter,
            target=self.replay_target,
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
