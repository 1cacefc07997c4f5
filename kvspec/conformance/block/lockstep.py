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
  never shrinks into it, and the model is **resynchronised** to the
  implementation (``follow``), so that one root cause needs one
  declaration and every rule is checked again from the next step on:

  - when the manifest declares deviations, the lockstep keeps a copy of the
    model from before each step. At a step that differs, it first asks
    ``follow.candidates`` for a way to run the step again from that copy
    that gives the implementation's outcome exactly: a refusal taken back,
    or one of the model's follow modes (a named condition, e.g.
    ``legacy_source_validation``, ``offload_job_fails_whole``). If a
    declared deviation covers that departure (its rule, the operation,
    the condition now established), the model becomes that copy: it holds
    the implementation's state, and the step is checked again against it;
  - otherwise each difference is judged as before; one in scope is
    *adopted*: the router view keeps the implementation's stream,
    INV-ROUTER-MATCH is compared against what the model announced
    corrected by the blocks the departure added or left out (until the
    model itself stores or removes them), and later events are expected
    with the implementation's event numbering. That contains a departure
    of the stream only. If the implementation's state differs too (it
    refused what the model accepted or the other way round, or its
    counters or earliest deadline differ) and nothing followed it, the
    run fails with ``DeviationNotFollowed``: the rest of it could not be
    checked, and a declaration never hides what it does not explain.

  At the step of an adopted departure, INV-ROUTER-MATCH is its consequence
  and is recorded with it.

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

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from kvspec.conformance.block.coverage import Before, cover_step
from kvspec.conformance.block.diff import Divergence, op_rule
from kvspec.conformance.block.follow import BlockFollowed, Past, candidates, nearest, same_outcome
from kvspec.conformance.block.interface import Implementation
from kvspec.conformance.block.lockstep_report import divergence_report, unfinished_note
from kvspec.conformance.block.step_check import StepCheck, brief_outcome
from kvspec.conformance.block.stream_check import StreamCheck
from kvspec.conformance.run.deviation_scope import site_of, step_conditions
from kvspec.conformance.verdicts.failures import CallerContractBroken, ConformanceFailure, DeviationNotFollowed
from kvspec.conformance.verdicts.replay_file import write_replay
from kvspec.conformance.verdicts.replay_store import Target, replay_command
from kvspec.reference import Model, RouterView, make_model
from kvspec.reference.caller_contracts import ContractBreak, broken_contracts, settle
from kvspec.reference.g1 import G1Model
from kvspec.reference.labels import StepLabels
from kvspec.spec.config import ManagerConfig
from kvspec.spec.deviations import Deviation, Site, covering
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
        #: steps at which the model was resynchronised to the implementation
        #: (``follow``): (step, the condition followed, or None for a refusal)
        self.followed: list[tuple[int, str | None]] = []
        #: a follow mode that reproduced the last failing step, though no
        #: declaration covered it (a hint for the report)
        self._unclaimed: BlockFollowed | None = None
        #: what following needs (only kept when deviations are declared):
        #: the initial model, every step so far, the modes' switches followed
        self._initial: Model | None = copy.deepcopy(self.model) if self.deviations else None
        self._past: list[Past] = []
        self._switches: set[str] = set()
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
            # not raised here: the machine stops the run and raises the verdict
            # after Hypothesis (shrinking would restart a broken process)
            e.add_note(unfinished_note([*self.ops, op], self.expected))
            e.verdict = self.crash_verdict(op, e)
            raise
        except Exception as e:  # an in-process implementation's own assert or crash
            raise self.crash_verdict(op, e) from e
        # the model before the step, to follow a declared deviation (``follow``)
        saved = copy.deepcopy(self.model) if self._initial is not None else None
        prefer = _removed_device(actual.events)
        expected = self._model_step(op, prefer=prefer)
        now = Past(op, prefer, self.id_offset, expected)
        self.ops.append(op)
        self.expected.append(expected)
        self.actual.append(actual)
        if breaks is not None and expected.error is None:
            self.contracts_checked += 1
            breaks = settle(breaks, expected.result.status if expected.result is not None else "ok")
            if breaks:
                raise CallerContractBroken(breaks[0].id, self._contract_report(breaks))
        self.before = expected.counters
        if saved is not None:
            if not same_outcome(expected, actual):
                expected = self._follow(saved, now, actual)
            now.expected = expected
            self._past.append(now)
        adopted: Site | None = None
        for div in self.checker.divergences(op, expected, actual, before.counters, self.model, self.labels):
            if adopted is not None and div.rule == RuleId.INV_ROUTER_MATCH:
                continue  # the consequence of this step's adopted departure (module doc)
            site = self.site_of(div, op, expected, actual)
            i = covering(self.deviations, site)
            if i is None:
                self.fail(div, site)
            assert i is not None
            self._observed(site, i)
            if adopted is None and not self.protocol_only and _state_differs(expected, actual):
                self._not_followed(div, site, i)
            adopted = site
        self._track_ids(expected, actual, adopt=adopted is not None)
        if adopted:
            self.stream.adopt(self.model)
        cover_step(
            self.coverage, op, expected, before, offload=self.config.offload is not None, profile=self.config.profile
        )
        return expected

    def _observed(self, site: Site, i: int) -> None:
        self.adopted.append((len(self.ops) - 1, site, i))
        if self.on_deviation is not None:
            self.on_deviation(i, site)

    def _follow(self, saved: Model, now: Past, actual: StepOutcome) -> StepOutcome:
        """The step differs: if a declared deviation covers a way of running
        it that gives the implementation's outcome (``follow``), the model
        becomes that run (resynchronised) and its outcome is returned; else
        the model's own outcome as it was."""
        self._unclaimed = None
        op, expected = now.op, now.expected
        found = candidates(
            saved, now, actual, self._run, initial=self._initial, past=self._past, followed=self._switches
        )
        for alt in found:
            conds = step_conditions(alt.rule, expected.events, actual.events, first_events=not self._events_seen)
            if alt.condition is not None:
                conds.add(alt.condition)
            site = site_of(alt.rule, config=self.config, op=op, conditions=conds)
            i = covering(self.deviations, site)
            if i is None:
                self._unclaimed = self._unclaimed or alt
                continue
            self._observed(site, i)
            self.followed.append((len(self.ops) - 1, alt.condition))
            now.refused = alt.condition is None
            if alt.switch is not None:
                self._switches.add(alt.switch)
            return self._take(alt)
        near = nearest(saved, now, actual, self._run)
        if near is not None:
            site = site_of(near.rule, config=self.config, op=op, conditions={near.condition or ""} - {""})
            i = covering(self.deviations, site)
            if i is not None:
                # the declared departure explains the acceptance (or refusal);
                # the rest of the step is judged against it (module doc)
                self._observed(site, i)
                return self._take(near)
        return expected

    def _take(self, alt: BlockFollowed) -> StepOutcome:
        """The model becomes ``alt``'s (resynchronised); its outcome is the step's."""
        self.model = alt.model
        self.labels = alt.labels
        self.expected[-1] = alt.outcome
        self.before = alt.outcome.counters
        return alt.outcome

    def _not_followed(self, div: Divergence, site: Site, i: int) -> None:
        """A declared deviation covers ``div``, but the implementation's state
        differs from the model's and nothing followed it: fail (module doc)."""
        d = self.deviations[i]
        text = self.report(div, site)
        text += (
            f"\ndeclared deviation {d.rule} ({d.describe_scope()}) covers this step, but the implementation's state "
            "after it differs from the model's (it refused what the model accepted or the other way round, or its "
            "counters or earliest deadline differ), and no follow mode of the model reproduces its outcome: kvspec "
            "cannot check the rest of the run against it. Either the step breaks a rule outside the declared cause "
            "(a bug), or the departure is one kvspec cannot follow yet (spec/ADAPTERS.md, 'Declared deviations')."
        )
        raise DeviationNotFollowed(div.rule, text, site=site)

    def crash_verdict(self, op: Operation, e: Exception) -> ConformanceFailure:
        """The verdict on an implementation that crashed (or hung, or
        answered garbage) at ``op``: the rule the model says decides the
        operation's result (its rejection rule for an operation the model
        refuses: a port must refuse it, not crash) whose precondition the
        crash reveals, the operations so far and a replay file. The model
        applies ``op`` here; the run ends with this step."""
        expected = self._model_step(op, prefer=set())
        if expected.error is not None:
            rid = RuleId(expected.error.rule)
            why = f"the model rejects this operation under {rid}; the implementation must reject it, not crash"
        else:
            rid = (self.labels.result if self.labels is not None else None) or op_rule(op)
            why = (
                f"the model answers this operation ({brief_outcome(expected)}): the implementation's state left the "
                f"model's before this step, or it does not keep {rid}'s precondition"
            )
        first = (str(e).strip().splitlines() or ["(no message)"])[0]
        crashed = StepOutcome.model_construct(
            result=None,
            error=ErrorInfo.model_construct(rule="(crashed)", message=first),
            counters=expected.counters,
            events=[],
            earliest_deadline_ms=None,
        )
        self.ops.append(op)
        self.expected.append(expected)
        self.actual.append(crashed)
        div = Divergence(rid, "the implementation crashed instead of answering", brief_outcome(expected), first)
        text = self.report(div, Site(rid, operation=op.op))
        text += (
            f"\nthe implementation crashed at step {len(self.ops) - 1}: {why}\n"
            f"--- its error ({type(e).__name__}) ---\n{e}"
        )
        return ConformanceFailure(rid, text, site=Site(rid, operation=op.op, profile=self.config.profile))

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
        out, self.labels = self._run(self.model, op, prefer, self.id_offset)
        return out

    def _run(self, model: Model, op: Operation, prefer: set[int], offset: int) -> tuple[StepOutcome, StepLabels | None]:
        """``model``'s outcome of ``op`` as the implementation's is compared
        (event ids shifted by ``offset``, what was adopted; token ids as the
        manifest says) and the labels of its step (None: it rejected ``op``)."""
        try:
            step = model.apply(op, prefer=prefer)
        except InvalidOperation as err:
            rejected = StepOutcome.model_construct(
                result=None,
                error=ErrorInfo(rule=str(err.rule), message=err.message),
                counters=model.counters(),
                events=[],
                earliest_deadline_ms=model.earliest_deadline(),
            )
            return rejected, None
        events = step.events
        if not self.event_token_ids:
            events = [e.model_copy(update={"block_token_ids": None}) if e.block_token_ids else e for e in events]
        if offset:
            events = [e.model_copy(update={"event_id": e.event_id + offset}) for e in events]
        out = StepOutcome.model_construct(
            result=step.result,
            error=None,
            counters=model.counters(),
            events=events,
            earliest_deadline_ms=model.earliest_deadline(),
        )
        return out, step.labels

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
        alt = self._unclaimed
        if alt is not None and alt.condition is not None:
            text += (
                f"\nthe step is what the model does under condition {alt.condition} (rule {alt.rule}): if that is "
                f'a known departure of the implementation, declare rule = "{alt.rule}" with '
                f'scope = {{ conditions = ["{alt.condition}"] }}'
            )
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


def _state_differs(expected: StepOutcome, actual: StepOutcome) -> bool:
    """Does the implementation's state after a step differ from the model's
    in what the step shows of it (a refusal on one side only, the counters,
    the earliest pending deadline)?"""
    return (
        (expected.error is None) != (actual.error is None)
        or expected.counters != actual.counters
        or expected.earliest_deadline_ms != actual.earliest_deadline_ms
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
