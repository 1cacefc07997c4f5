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

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from kvspec.conformance.managers.check import check_expect, check_paged, check_session
from kvspec.conformance.managers.interface import ManagerImplementation
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference.paged import PagedModel
from kvspec.reference.session import SessionModel
from kvspec.spec.errors import ConfigError
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


def open_manager(manifest: Manifest, adapter_dir: Path, config: ManagerConfigKind) -> ManagerImplementation:
    """Start the manager a manifest describes, configured with ``config``."""
    if manifest.start.managers:
        mod_name, _, attr = manifest.start.managers.partition(":")
        factory = getattr(importlib.import_module(mod_name), attr)
        extra = {"variant": manifest.variant} if manifest.variant else {}
        impl: ManagerImplementation = factory(config, manifest, adapter_dir, **extra)
        return impl
    if manifest.kind == "subprocess":
        from kvspec.conformance.transport.manager import JsonlManager

        return JsonlManager(manifest, adapter_dir, config)
    raise ConfigError(f"{manifest.name}: no start.managers factory and kind {manifest.kind!r} has no manager session")


@dataclass
class ManagerLockstep:
    """One implementation and its model, driven together."""

    impl: ManagerImplementation
    config: ManagerConfigKind
    model: PagedModel | SessionModel = field(init=False)
    log: list[str] = field(default_factory=list)
    #: session: every admission the model granted, per session, in order
    handles: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model = PagedModel(self.config) if isinstance(self.config, PagedConfig) else SessionModel(self.config)

    def step(self, op: ManagerOp) -> PagedOutcome | SessionOutcome:
        got = self.impl.step(op)
        self.log.append(op.model_dump_json())
        try:
            if isinstance(self.model, PagedModel):
                if not is_paged_op(op):
                    raise ConformanceFailure("PAGED-VALIDATE", f"a {op.op!r} operation sent to a paged manager")
                before = self.model.snapshot()
                want_p = self.model.step(op)
                if not isinstance(got, PagedOutcome):
                    raise ConformanceFailure("PAGED-VALIDATE", f"answered {type(got).__name__} to a paged op")
                cfg = self.model.config
                check_paged(op, got, want_p, before, (cfg.device_blocks, cfg.host_blocks))
            else:
                if not is_session_op(op):
                    raise ConformanceFailure("SESSION-VALIDATE", f"a {op.op!r} operation sent to a session manager")
                conditions = handle_conditions(self.model, op)
                want_s = self.model.step(op)
                if not isinstance(got, SessionOutcome):
                    raise ConformanceFailure("SESSION-VALIDATE", f"answered {type(got).__name__} to a session op")
                check_session(op, got, want_s, conditions)
                if isinstance(op, SessionAdmit) and want_s.admission is not None:
                    a = want_s.admission
                    self.handles.setdefault(op.session, []).append((a.slot, a.generation))
        except ConformanceFailure as e:
            trail = "\n".join(f"  {i + 1:>3}. {line}" for i, line in enumerate(self.log[-40:]))
            raise ConformanceFailure(e.rule, f"{e.report}\noperations (last 40):\n{trail}", site=e.site) from None
        return got


def handle_conditions(model: SessionModel, op: ManagerOp) -> frozenset[str]:
    """The named conditions of a session step, from the model's state before it."""
    if isinstance(op, SessionFinalize | SessionReset) and op.slot < len(model.slots):
        s = model.slots[op.slot]
        if s.state == "free" and s.generation == op.generation:
            return frozenset({"handle_of_free_slot"})
    return frozenset()


def run_golden(scenario: ManagerScenario, impl: ManagerImplementation) -> None:
    """Every step against its ``expect`` and, in lockstep, against the model."""
    ls = ManagerLockstep(impl, scenario.config)
    for i, s in enumerate(scenario.steps):
        out = ls.step(s.op)
        try:
            check_expect(list(scenario.rules), s.op, out, s.expect)
        except ConformanceFailure as e:
            raise ConformanceFailure(e.rule, f"{scenario.name} step {i + 1}: {e.report}", site=e.site) from None


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
