"""Running a paged or session manager in lockstep with its reference model.

``open_manager`` starts what a manifest describes for one configuration (an
in-process ``start.managers`` factory, or a child process over protocol
version 3). ``ManagerLockstep`` sends each operation to the implementation and to
the model and checks the pair (``manager_check``); ``run_golden`` also holds
each step to the scenario's hand-written ``expect``.

The traffic is drawn by Hypothesis (``paged_ops`` / ``session_ops``): small
name pools so that operations collide (forks of forks, writes to shared
blocks, swaps of shared sequences, prefixes in use; sessions that come back,
steal idle slots, and use handles from earlier leases). A session handle is
drawn as "the latest one this session got" or "an older one", and turned
into a slot and generation from the model's history when the op is sent.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from kvspec.conformance.managers.check import check_expect, check_paged, check_session
from kvspec.conformance.managers.follow import ManagerModel, candidates, model_step
from kvspec.conformance.managers.interface import ManagerImplementation
from kvspec.conformance.opener import open_adapter
from kvspec.conformance.verdicts.failures import ConformanceFailure, DeviationNotFollowed
from kvspec.reference.paged import PagedModel
from kvspec.reference.session import SessionModel
from kvspec.spec.deviations import Deviation, Site, covering
from kvspec.spec.manager_scenario import ManagerScenario
from kvspec.spec.manager_wire import (
    ManagerConfigKind,
    ManagerOp,
    PagedConfig,
    PagedOutcome,
    SessionAdmit,
    SessionConfig,
    SessionDrain,
    SessionEvictAll,
    SessionFinalize,
    SessionOp,
    SessionOutcome,
    SessionReset,
    SessionSnapshot,
    is_paged_op,
    is_session_op,
)
from kvspec.spec.manifest import Manifest
from kvspec.spec.rules import RuleId


def open_manager(manifest: Manifest, adapter_dir: Path, config: ManagerConfigKind) -> ManagerImplementation:
    """Start the manager a manifest describes, configured with ``config`` (through the one opener,
    ``kvspec.conformance.opener.open_adapter``)."""
    return open_adapter(manifest, adapter_dir, config)


@dataclass
class ManagerLockstep:
    """One implementation and its model, driven together.

    ``deviations`` (the manifest's) are contained (spec/SPEC.md, "Declared
    deviations are followed"): at a step whose difference a follow mode of
    the model reproduces exactly (``follow``) and a declared deviation covers
    (its rule, the mode's condition), the model takes the implementation's
    state, ``on_deviation`` is told, and every rule is checked again from the
    next step on. A difference a declaration covers that no mode reproduces
    fails with ``DeviationNotFollowed``: the rest of the run could not be
    checked honestly. Without declarations nothing is followed, and a
    failure a mode explains names the condition to declare."""

    impl: ManagerImplementation
    config: ManagerConfigKind
    deviations: Sequence[Deviation] = ()
    on_deviation: Callable[[int, Site], None] | None = None
    model: PagedModel | SessionModel = field(init=False)
    log: list[str] = field(default_factory=list)
    #: session: every admission the model granted, per session, in order
    handles: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    #: steps at which the model followed a declared departure: (step index, condition)
    followed: list[tuple[int, str]] = field(default_factory=list)
    #: the golden scenario id (``FOLDER/NAME``) a failure's site carries, if a golden runs
    scenario_id: str | None = None

    def __post_init__(self) -> None:
        self.model = PagedModel(self.config) if isinstance(self.config, PagedConfig) else SessionModel(self.config)

    def step(self, op: ManagerOp) -> PagedOutcome | SessionOutcome:
        got = self.impl.step(op)
        self.log.append(op.model_dump_json())
        try:
            self._kinds(op, got)
            before = copy.deepcopy(self.model)
            want = model_step(self.model, op)
            try:
                self._check(op, got, want, before)
            except ConformanceFailure as e:
                want = self._follow(before, op, got, e)
            if isinstance(op, SessionAdmit) and isinstance(want, SessionOutcome) and want.admission is not None:
                a = want.admission
                self.handles.setdefault(op.session, []).append((a.slot, a.generation))
        except ConformanceFailure as e:
            trail = "\n".join(f"  {i + 1:>3}. {line}" for i, line in enumerate(self.log[-40:]))
            raise type(e)(e.rule, f"{e.report}\noperations (last 40):\n{trail}", site=e.site) from None
        return got

    def _kinds(self, op: ManagerOp, got: PagedOutcome | SessionOutcome) -> None:
        """The operation is the model's profile's and the answer is of that profile."""
        if isinstance(self.model, PagedModel):
            if not is_paged_op(op):
                raise ConformanceFailure("PAGED-VALIDATE", f"a {op.op!r} operation sent to a paged manager")
            if not isinstance(got, PagedOutcome):
                raise ConformanceFailure("PAGED-VALIDATE", f"answered {type(got).__name__} to a paged op")
        else:
            if not is_session_op(op):
                raise ConformanceFailure("SESSION-VALIDATE", f"a {op.op!r} operation sent to a session manager")
            if not isinstance(got, SessionOutcome):
                raise ConformanceFailure("SESSION-VALIDATE", f"answered {type(got).__name__} to a session op")

    def _check(
        self,
        op: ManagerOp,
        got: PagedOutcome | SessionOutcome,
        want: PagedOutcome | SessionOutcome,
        before: ManagerModel,
    ) -> None:
        """``got`` against ``want``, the model's answer from ``before`` (the profile's check)."""
        if isinstance(before, PagedModel):
            assert is_paged_op(op) and isinstance(got, PagedOutcome) and isinstance(want, PagedOutcome)
            cfg = before.config
            check_paged(op, got, want, before.snapshot(), (cfg.device_blocks, cfg.host_blocks))
        else:
            assert isinstance(got, SessionOutcome) and isinstance(want, SessionOutcome)
            check_session(op, got, want, handle_conditions(before, op))

    def _site(self, rule: RuleId, op: ManagerOp, conditions: frozenset[str]) -> Site:
        return Site(
            RuleId(rule),
            scenario=self.scenario_id,
            operation=str(op.op),
            conditions=conditions,
            profile=self.config.kind,
        )

    def _follow(
        self, before: ManagerModel, op: ManagerOp, got: PagedOutcome | SessionOutcome, failure: ConformanceFailure
    ) -> PagedOutcome | SessionOutcome:
        """The step differs (``failure``): follow a declared departure that
        reproduces it (the model takes the implementation's state; the
        followed outcome is returned), or raise (module doc)."""
        step = len(self.log) - 1
        modes = list(candidates(before, op, got, self._check))
        for alt in modes:
            i = covering(list(self.deviations), self._site(alt.rule, op, frozenset({alt.condition})))
            if i is not None:
                self.model = alt.model
                self.followed.append((step, alt.condition))
                if self.on_deviation is not None:
                    self.on_deviation(i, self._site(alt.rule, op, frozenset({alt.condition})))
                return alt.outcome
        site = self._site(failure.rule, op, failure.site.conditions)
        note = ""
        if modes:
            m = modes[0]
            site = self._site(m.rule, op, failure.site.conditions | {m.condition})
            note = (
                f"\nthe implementation's answer is the model's under condition {m.condition} (declare it to follow it)"
            )
        i = covering(list(self.deviations), site)
        if i is not None:
            d = self.deviations[i]
            raise DeviationNotFollowed(
                site.rule,
                f"{failure.report}\ndeclared deviation {d.rule} ({d.describe_scope()}) covers this step, but no "
                "follow mode of the model reproduces the implementation's answer: its state after the step is not "
                "one the model can take, so the rest of the run cannot be checked (spec/ADAPTERS.md, 'Declared "
                "deviations')",
                site=site,
            )
        if self.deviations and self.followed:
            seen = ", ".join(f"step {k + 1} {c}" for k, c in self.followed[:8])
            note += f"\nfollowed after declared deviations: {seen}"
        raise ConformanceFailure(site.rule, failure.report + note, site=site)


def handle_conditions(model: SessionModel, op: ManagerOp) -> frozenset[str]:
    """The named conditions of a session step, from the model's state before it."""
    if isinstance(op, SessionFinalize | SessionReset) and op.slot < len(model.slots):
        s = model.slots[op.slot]
        if s.state == "free" and s.generation == op.generation:
            return frozenset({"handle_of_free_slot"})
    return frozenset()


def run_golden(
    scenario: ManagerScenario,
    impl: ManagerImplementation,
    *,
    deviations: Sequence[Deviation] = (),
    on_deviation: Callable[[int, Site], None] | None = None,
    scenario_id: str | None = None,
) -> None:
    """Every step against its ``expect`` and, in lockstep, against the model.

    Once the lockstep has followed a declared departure (``deviations``), the
    file's expectations (which describe the spec's run) are no longer held
    against the implementation: every later step is checked against the
    followed model, whole, so that a bug after the departure is still caught
    under its own rule (``scenario_id``: the golden's id for the sites)."""
    ls = ManagerLockstep(impl, scenario.config, deviations, on_deviation, scenario_id=scenario_id)
    for i, s in enumerate(scenario.steps):
        out = ls.step(s.op)
        if ls.followed:
            continue
        try:
            check_expect(list(scenario.rules), s.op, out, s.expect)
        except ConformanceFailure as e:
            site = replace(e.site, scenario=scenario_id, operation=str(s.op.op), profile=scenario.config.kind)
            raise ConformanceFailure(e.rule, f"{scenario.name} step {i + 1}: {e.report}", site=site) from None


# ----------------------------------------------------------------- traffic

SEQS = ("s0", "s1", "s2", "s3")
KEYS = ("p0", "p1")
SESSIONS = ("a", "b", "c", "d")


def paged_configs() -> st.SearchStrategy[PagedConfig]:
    return st.builds(
        PagedConfig,
        device_blocks=st.integers(2, 8),
        host_blocks=st.integers(0, 6),
        block_size=st.integers(1, 4),
        max_prefixes=st.integers(0, 2),
    )


def paged_ops() -> st.SearchStrategy[Any]:
    seq, key = st.sampled_from(SEQS), st.sampled_from(KEYS)
    return st.one_of(
        st.fixed_dictionaries({"op": st.just("allocate"), "seq": seq, "tokens": st.integers(0, 10)}),
        st.fixed_dictionaries({"op": st.just("extend"), "seq": seq, "tokens": st.integers(0, 6)}),
        st.fixed_dictionaries({"op": st.just("fork"), "src": seq, "dst": seq, "blocks": st.none() | st.integers(0, 3)}),
        st.fixed_dictionaries(
            {"op": st.just("write"), "seq": seq, "position": st.integers(0, 12), "value": st.integers(1, 99)}
        ),
        st.fixed_dictionaries({"op": st.just("swap_out"), "seq": seq}),
        st.fixed_dictionaries({"op": st.just("swap_in"), "seq": seq}),
        st.fixed_dictionaries({"op": st.just("free"), "seq": seq}),
        st.fixed_dictionaries({"op": st.just("store_prefix"), "key": key, "seq": seq, "blocks": st.integers(1, 3)}),
        st.fixed_dictionaries({"op": st.just("match_prefix"), "key": key, "dst": seq}),
        st.fixed_dictionaries({"op": st.just("evict_prefixes"), "count": st.integers(0, 2)}),
    )


def session_configs() -> st.SearchStrategy[SessionConfig]:
    return st.builds(SessionConfig, slots=st.integers(1, 3))


#: an abstract session op: (kind, session, flag, which handle: -1 latest / 0 oldest, tokens)
AbstractSessionOp = tuple[str, str, bool, int, tuple[int, ...]]


def session_ops() -> st.SearchStrategy[AbstractSessionOp]:
    return st.tuples(
        st.sampled_from(("admit", "admit", "finalize", "finalize", "reset", "evict_all", "snapshot", "drain")),
        st.sampled_from(SESSIONS),
        st.booleans(),
        st.sampled_from((-1, -1, 0)),
        st.lists(st.integers(0, 9), max_size=3).map(tuple),
    )


def concrete_session_op(ls: ManagerLockstep, a: AbstractSessionOp) -> SessionOp:
    kind, s, flag, which, tokens = a
    if kind == "admit":
        return SessionAdmit(session=s, warm=flag)
    if kind == "evict_all":
        return SessionEvictAll()
    if kind == "drain":
        return SessionDrain()
    history = ls.handles.get(s) or [(0, 0)]
    slot, gen = history[which]
    if kind == "finalize":
        return SessionFinalize(session=s, slot=slot, generation=gen, keep=flag, tokens=list(tokens))
    if kind == "reset":
        return SessionReset(session=s, slot=slot, generation=gen)
    return SessionSnapshot(slot=slot, generation=gen)
