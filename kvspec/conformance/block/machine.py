"""The lockstep state machine: Hypothesis drives an implementation and the model.

``LockstepMachine`` is a ``RuleBasedStateMachine`` with one rule, ``step``:
each step draws one integer, whose lowest digit picks a scheduler action
(admit, extend, promote, finish, preempt, re-admit, fork, destroy, invalid
operations; ``conformance/block/traffic.py``) among those enabled and ready, and
whose other digits are the action's arguments. One rule rather than one per
action because Hypothesis's rule selection and per-argument draws cost more
than the lockstep check itself. Every operation goes through
``conformance/block/lockstep.py``, which checks the implementation against the
model and raises ``ConformanceFailure`` at the first divergence; Hypothesis
shrinks the sequence, and its final (shrunk) run writes the replay file.

Per example the machine draws a configuration (capacity 4..16, the policy
among those the adapter and the profile share, weighted toward the subtle
ones, a dp_rank) and a set of enabled kinds (swarm testing: some examples
never finish a request, others never promote, some release root first), so
that each kind of bug meets the traffic that shows it. A run reports how
often each rule id was exercised (and each known break of the profile
seen) through the plugin's rule counter (the ``kvspec: rules exercised``
summary) and ``hypothesis.event``.

A transport failure (``AdapterError``) is not shrunk: see
``LockstepMachine.adapter_failure`` and ``run_machine``.

Extra rule groups. A module adds actions (for example tick to the next
deadline, tick later, swap-in for the offload tier) by subclassing
``RuleGroup`` with methods decorated ``@action(kind, weight=, ready=)``
that take the packed argument as ``Digits`` and return a ``Planned``
operation; it declares the swarm ``kinds`` it adds, the adapter
capabilities it ``requires`` and the ``profiles`` it applies to, and may
override the cooperative hooks ``configure`` (attach an ``OffloadConfig``),
``kind_available``, ``start``, ``run`` and ``after_step``. ``machine_class``
mixes in every registered group whose capabilities the adapter declares;
the modules in ``GROUP_MODULES`` are imported (if present) so that their
groups register.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from kvspec.conformance.block.lockstep import Lockstep
from kvspec.conformance.block.opener import Implementation, open_implementation
from kvspec.conformance.block.traffic import (
    MAX_CHUNK,
    MAX_LIVE,
    MAX_PATH,
    PROMOTE_BRANCH,
    Digits,
    Planned,
    Traffic,
    TreeBlock,
    configs,
    packed,
)
from kvspec.conformance.run.manifest import Manifest
from kvspec.conformance.verdicts.replay_store import Target
from kvspec.spec import registry
from kvspec.spec.config import ManagerConfig
from kvspec.spec.deviations import Site
from kvspec.spec.errors import AdapterError
from kvspec.spec.profiles import profile as get_profile
from kvspec.spec.wire import StepOutcome

#: modules that define extra rule groups; imported when present
GROUP_MODULES = ("kvspec.conformance.block.machine_offload",)

#: steps run by every lockstep machine in this process (the benchmark reads it)
STATS: Counter[str] = Counter()
#: called after each example (the plugin's progress line, ``progress.py``)
ON_EXAMPLE: list[Callable[[], None]] = []


@dataclass(frozen=True)
class MachineSetup:
    """What a machine class is built for: the adapter, the profile, where a
    failure writes its replay file and how rule coverage is reported."""

    manifest: Manifest
    adapter_dir: Path
    profile: str
    #: the replay file, or what makes it at the first failure (``Lockstep``)
    replay_path: Path | Callable[[], Path] | None = None
    replay_target: Target | None = None
    record: Callable[[str, int], None] | None = None
    protocol_only: bool = False
    #: told of each declared deviation observed (its index in the manifest)
    record_deviation: Callable[[int, Site], None] | None = None


@dataclass(frozen=True)
class Action:
    """One kind of scheduler action: ``fn(machine, digits) -> Planned | None``,
    picked with ``weight`` among the enabled actions whose ``ready`` holds."""

    kind: str
    weight: int
    fn: Callable[[Any, Digits], Planned | None]
    ready: Callable[[Any], bool]

    def __call__(self, machine: Any, d: Digits) -> Planned | None:
        return self.fn(machine, d)


def action(kind: str, *, weight: int = 1, ready: Callable[[Any], bool] | None = None) -> Callable[[Any], Action]:
    """Declare a method of a rule group as an action of kind ``kind``.

    The method takes the packed argument as ``Digits`` and returns the
    ``Planned`` operation to check (or None to do nothing). ``ready(machine)``
    says whether it can run in the current state."""

    def deco(fn: Callable[[Any, Digits], Planned | None]) -> Action:
        return Action(kind, weight, fn, ready or (lambda self: True))

    return deco


class RuleGroup:
    """Base of rule groups mixed into the lockstep machine (see module doc).

    Hooks are cooperative: an override calls ``super()`` and passes its
    result on.
    """

    #: swarm kinds this group adds (each example enables a subset)
    kinds: ClassVar[tuple[str, ...]] = ()
    #: adapter capabilities every rule of the group needs
    requires: ClassVar[tuple[str, ...]] = ()
    #: profiles the group applies to
    profiles: ClassVar[tuple[str, ...]] = registry.names("block", stateful=True)
    _registry: ClassVar[list[type[RuleGroup]]] = []

    # set on the machine instance by LockstepMachine
    check: Lockstep | None
    traffic: Traffic | None
    enabled: frozenset[str]

    def __init_subclass__(cls, register: bool = True, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if register and cls not in RuleGroup._registry:
            RuleGroup._registry.append(cls)

    @classmethod
    def applies_to(cls, manifest: Manifest, profile: str) -> bool:
        caps = manifest.capabilities
        return profile in cls.profiles and all(caps.has(c) for c in cls.requires)

    # ---------------------------------------------------------------- hooks
    def configure(self, config: ManagerConfig, data: Any) -> ManagerConfig:
        """Adjust the drawn configuration (``data`` is Hypothesis's st.data())."""
        return config

    @classmethod
    def kind_available(cls, kind: str) -> bool:
        """Can this adapter and profile run rule kind ``kind`` at all?"""
        return True

    def after_step(self, planned: Planned, expected: StepOutcome) -> None:
        """Called after every checked operation."""

    def start(self, config: ManagerConfig, swarm: frozenset[str]) -> None:
        """Called when an example starts (the machine implements it; a group
        extends it to reset its own state)."""

    @property
    def t(self) -> Traffic:
        """The example's traffic (set while an example runs)."""
        assert self.traffic is not None
        return self.traffic

    def run(self, planned: Planned | None) -> StepOutcome | None:
        """Check one planned operation in lockstep (the machine implements it;
        a group may wrap it to run something first)."""
        raise NotImplementedError

    def on(self, kind: str) -> bool:
        """Is rule kind ``kind`` enabled in this example (and the machine open)?"""
        return self.traffic is not None and kind in self.enabled


def load_group_modules() -> None:
    for name in GROUP_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise


class LockstepMachine(RuleGroup, RuleBasedStateMachine, register=False):
    """Scheduler traffic against an implementation and the model, in lockstep."""

    setup: ClassVar[MachineSetup]
    kinds = (
        "admit",
        "extend",
        "promote",
        "finish",
        "preempt",
        "readmit",
        "fork",
        "invalid",
        "destroy",
        "root_first",
        "suffix",
        "release_part",
        "gapped",
    )
    #: kinds on in every example (the rest are drawn per example: swarm testing)
    always: ClassVar[frozenset[str]] = frozenset({"admit"})
    #: the first AdapterError (crash, hang, garbage on a pipe) of a run. It is
    #: not raised inside Hypothesis: shrinking it would restart a broken
    #: process (or wait out a hang) hundreds of times. The machine stops
    #: touching the adapter, later examples do nothing, and ``run_machine``
    #: raises it, with the operations that led to it, once Hypothesis is done.
    adapter_failure: ClassVar[AdapterError | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.check = None
        self.traffic = None
        self.impl: Implementation | None = None
        self.enabled = frozenset()
        self._actions: list[Action] = []
        self.steps = 0

    # -------------------------------------------------------------- set up
    @classmethod
    def all_actions(cls) -> list[Action]:
        """Every action of the machine and its groups (a group may override
        an action of the base by defining one under the same name)."""
        seen: dict[str, Action] = {}
        for klass in reversed(cls.__mro__):
            for name, v in vars(klass).items():
                if isinstance(v, Action):
                    seen[name] = v
        return list(seen.values())

    @classmethod
    def all_kinds(cls) -> list[str]:
        out: list[str] = []
        for klass in reversed(cls.__mro__):
            if isinstance(klass, type) and issubclass(klass, RuleGroup):
                out.extend(k for k in klass.__dict__.get("kinds", ()) if k not in out)
        for a in cls.all_actions():
            if a.kind not in out:
                out.append(a.kind)
        return out

    @classmethod
    def kind_available(cls, kind: str) -> bool:
        caps = cls.setup.manifest.capabilities
        prof = get_profile(cls.setup.profile)
        if kind == "promote" and not (caps.promote and caps.partial_blocks):
            return False
        if kind == "invalid" and not caps.typed_errors:
            return False
        if kind == "destroy" and not (caps.destroy and "destroy" in prof.operations):
            return False
        if kind == "fork" and "duplicate_position" in prof.invalid_uses:
            return False  # repeated positions are invalid there (injected as invalid traffic)
        if kind == "suffix" and prof.use_shape == "hash_cache":
            return False  # a hash-cache Use carries no parent to anchor a suffix to
        return super().kind_available(kind)

    @initialize(data=st.data())
    def open(self, data: Any) -> None:
        """Draw the configuration and the swarm set, start the implementation."""
        cls = type(self)
        config = data.draw(cls.config_strategy(), label="config")
        config = self.configure(config, data)
        swarm = data.draw(cls.swarm_strategy(), label="enabled kinds")
        if cls.adapter_failure is not None:
            return  # the adapter already failed in this run: do nothing (see adapter_failure)
        try:
            self.start(config, swarm)
        except AdapterError as e:
            self._halt(e)

    def start(self, config: ManagerConfig, swarm: frozenset[str]) -> None:
        """Open the implementation with ``config`` and enable ``swarm`` (plus
        the kinds always on). Also the entry point of drivers without
        Hypothesis (the benchmark)."""
        s = self.setup
        self.enabled = frozenset(swarm) | self.always
        self._actions = [a for a in self.all_actions() if a.kind in self.enabled]
        self.impl = open_implementation(s.manifest, s.adapter_dir, config)
        caps = s.manifest.capabilities
        self.check = Lockstep(
            self.impl,
            config,
            adapter=s.manifest.name,
            replay_path=s.replay_path,
            replay_target=s.replay_target,
            protocol_only=s.protocol_only,
            event_token_ids=caps.event_token_ids,
            deviations=s.manifest.deviations,
            on_deviation=s.record_deviation,
            caller_contracts=True,  # the traffic is a well-behaved caller: check it is
        )
        self.traffic = Traffic(
            config,
            partial_blocks=caps.partial_blocks,
            promote=caps.promote,
            strict_validation=caps.strict_validation,
            destroy=caps.destroy,
        )

    @classmethod
    def policies(cls) -> list[str]:
        """The policies this example may draw: the profile's that the adapter declares."""
        caps = cls.setup.manifest.capabilities
        return [p for p in get_profile(cls.setup.profile).policies if p in caps.policies]

    @classmethod
    def config_strategy(cls) -> st.SearchStrategy[ManagerConfig]:
        caps = cls.setup.manifest.capabilities
        return configs(cls.setup.profile, tuple(cls.policies()), max_capacity=caps.max_capacity)

    @classmethod
    def optional_kinds(cls) -> list[str]:
        return [k for k in cls.all_kinds() if k not in cls.always and cls.kind_available(k)]

    @classmethod
    def swarm_strategy(cls) -> st.SearchStrategy[frozenset[str]]:
        """Which optional kinds an example enables (built once per class)."""
        strat = cls.__dict__.get("_swarm")
        if strat is None:
            strat = swarm_sets(tuple(cls.optional_kinds()))
            cls._swarm = strat
        return strat

    def run(self, planned: Planned | None) -> StepOutcome | None:
        """Check one planned operation in lockstep and let the traffic see the
        model's outcome."""
        if planned is None:
            return None
        assert self.check is not None
        before = self.check.before
        try:
            expected = self.check.step(planned.op, contracts=not planned.unheld_anchor)
        except AdapterError as e:
            self._halt(e)
            raise _Halted from e
        followed = bool(self.check.followed) and self.check.followed[-1][0] == len(self.check.ops) - 1
        if not followed or (expected.error is None) == (planned.expect_error is None):
            # a followed step (a declared deviation) that refused valid traffic
            # or accepted invalid traffic did nothing the traffic planned: it
            # keeps its own bookkeeping as it was
            planned.commit(expected, before)
        self.steps += 1
        self.after_step(planned, expected)
        return expected

    def _halt(self, e: AdapterError) -> None:
        """Record the run's first adapter failure; this machine stops here."""
        cls = type(self)
        if cls.adapter_failure is None:
            cls.adapter_failure = e
        self.traffic = None

    def teardown(self) -> None:
        if self.impl is not None:
            try:
                self.impl.close()
            except AdapterError as e:
                self._halt(e)
        STATS["steps"] += self.steps
        STATS["examples"] += 1
        for hook in ON_EXAMPLE:
            hook()
        if self.check is None:
            return
        record = self.setup.record
        if record is not None:
            for r, n in self.check.coverage.items():
                record(str(r), n)
            profile = self.setup.profile
            for r, n in self.check.known_breaks.items():
                record(f"{r} (known break, {profile})", n)
            for r, n in self.check.cascaded_breaks.items():
                record(f"{r} (cascade of a known break, {profile})", n)
        if currently_in_test_context():
            for r in self.check.coverage:
                event(f"rule {r}")
            for r in self.check.known_breaks:
                event(f"known break {r} ({self.setup.profile})")
            for r in self.check.cascaded_breaks:
                event(f"cascaded break {r} ({self.setup.profile}, {self.check.config.eviction})")
            event(f"policy {self.check.config.eviction}")

    # ------------------------------------------------------------- actions
    @property
    def t(self) -> Traffic:
        assert self.traffic is not None
        return self.traffic

    @rule(x=packed)
    def step(self, x: int) -> None:
        """One scheduler action: the lowest digit of ``x`` picks one of the
        enabled actions that can run now (weighted), the rest are its arguments.

        One rule instead of one per action: Hypothesis's rule selection and
        per-argument draws cost more than the lockstep check itself, and
        choosing here lets the swarm set and the weights shape the mix."""
        if self.traffic is None:
            return  # halted by an adapter failure
        d = Digits(x)
        ready = [a for a in self._actions if a.ready(self)]
        pick = d.take(sum(a.weight for a in ready))  # admit is always ready
        for a in ready:
            if pick < a.weight:
                with contextlib.suppress(_Halted):  # the adapter failed: recorded, stop
                    self.run(a.fn(self, d))
                return
            pick -= a.weight

    def _root_first(self, d: Digits) -> bool:
        """Does this release go root first? Schedulers that free a request's
        blocks in reverse age its leaves first; one that drops a block list
        front to back ages the root first, which is what tells lineage and
        multi-LRU apart from plain LRU. The swarm kind ``root_first`` makes
        an example mostly the latter."""
        return d.take(6) < (4 if "root_first" in self.enabled else 1)

    def _make_room(self, d: Digits) -> None:
        """Continuous batching: a full batch admits a new request only after
        its oldest request finishes (Deref of all it holds)."""
        t = self.t
        while len(t.requests) >= MAX_LIVE:
            self.run(t.finish(t.requests[0], forward=self._root_first(d)))

    @action("admit", weight=4)
    def admit(self, d: Digits) -> Planned | None:
        """A new request: its path from the root, often with a partial block."""
        self._make_room(d)
        choices = d.branches(1, MAX_PATH)
        return self.t.new_request(choices, partial=d.flag(), meta=d.take(3))

    @action("fork", weight=1)
    def fork(self, d: Digits) -> Planned | None:
        """Two sequences of one prompt in one Use: blocks named twice."""
        self._make_room(d)
        return self.t.fork(d.branches(2, MAX_PATH - 2), meta=d.take(3))

    @action("extend", weight=3, ready=lambda self: bool(self.t.extendable()))
    def extend(self, d: Digits) -> Planned | None:
        """Chunked prefill: the request's next blocks, anchored to its last one."""
        t = self.t
        req = t.pick(t.extendable(), d.take(64))
        return t.extend(req, d.branches(0, MAX_CHUNK), partial=d.flag())

    @action("promote", weight=4, ready=lambda self: bool(self.t.promotable()))
    def promote(self, d: Digits) -> Planned | None:
        """A partial block filled: promote it to a full block."""
        t = self.t
        req = t.pick(t.promotable(), d.take(64))
        return t.promote(req, PROMOTE_BRANCH[d.take(len(PROMOTE_BRANCH))])

    @action("finish", weight=3, ready=lambda self: bool(self.t.requests))
    def finish(self, d: Digits) -> Planned | None:
        """A request completes: Deref all, leaf first or root first."""
        t = self.t
        req = t.pick(t.requests, d.take(64))
        return t.finish(req, forward=self._root_first(d))

    @action("preempt", weight=1, ready=lambda self: bool(self.t.holding()))
    def preempt(self, d: Digits) -> Planned | None:
        """The scheduler preempts a request: Deref in reverse."""
        t = self.t
        return t.preempt(t.pick(t.holding(), d.take(64)))

    @action("readmit", weight=2, ready=lambda self: bool(self.t.preempted()))
    def readmit(self, d: Digits) -> Planned | None:
        """A preempted request comes back with its whole path."""
        t = self.t
        req = t.pick(t.preempted(), d.take(64))
        return t.readmit(req, partial=d.flag())

    @action("destroy", weight=1, ready=lambda self: bool(self.t.destroyable()))
    def destroy(self, d: Digits) -> Planned | None:
        """Legacy: destroy a request's blocks outright."""
        t = self.t
        return t.destroy(t.pick(t.destroyable(), d.take(64)))

    @action("destroy", weight=1, ready=lambda self: bool(self.t.shared_destroyable()))
    def destroy_shared(self, d: Digits) -> Planned | None:
        """Legacy: destroy blocks several requests hold (removed outright, not dereferenced)."""
        t = self.t
        return t.destroy_shared(t.pick(t.shared_destroyable(), d.take(64)))

    def _cached(self) -> list[TreeBlock]:
        """Tree blocks the model has registered (device tier), in tree order."""
        assert self.check is not None
        registered = self.check.model.registered()
        return [n for n in self.t.tree.nodes.values() if n.seq in registered]

    def _gapped_targets(self) -> list[TreeBlock]:
        """Cached blocks with an ancestor the cache no longer has."""
        assert self.check is not None
        registered = self.check.model.registered()
        nodes = self.t.tree.nodes
        out: list[TreeBlock] = []
        for n in nodes.values():
            if n.seq not in registered:
                continue
            p = n.parent
            while p is not None and p in registered:
                p = nodes[p].parent
            if p is not None:
                out.append(n)
        return out

    @action("suffix", weight=2, ready=lambda self: bool(self._cached()))
    def suffix(self, d: Digits) -> Planned | None:
        """A request over a cached prefix it does not hold: a Use of only its
        own blocks, anchored to the last cached one (held by another request
        or inactive in the pool)."""
        self._make_room(d)
        cached = self._cached()
        if not cached:
            return None  # making room released them
        choices = d.branches(1, MAX_CHUNK)
        if d.flag():
            # take an inactive block with inactive children out of the pool
            # under its inactive parent: the lineage forest keeps it as a
            # ghost that still links the parent to the children
            assert self.check is not None
            owners = self.t.holds()  # equal to the model's owners (the traffic tracks them)
            seqs = {n.seq for n in cached}
            nodes = self.t.tree.nodes
            pairs = [
                (n, i)
                for n in cached
                if not owners.get(n.seq)
                for i, k in enumerate(n.children)
                if k in seqs and not owners.get(k) and any(g in seqs for g in nodes[k].children)
            ]
            if pairs:
                base, i = pairs[d.take(64) % len(pairs)]
                return self.t.suffix(base, [i, *choices[1:]], partial=d.flag(), meta=d.take(3))
        base = cached[d.take(64) % len(cached)]
        return self.t.suffix(base, choices, partial=d.flag(), meta=d.take(3))

    @action("release_part", weight=1, ready=lambda self: bool(self.t.holding()))
    def release_part(self, d: Digits) -> Planned | None:
        """A request releases its tail (and partial block), keeping the rest."""
        t = self.t
        cands = [r for r in t.holding() if not r.forked]
        if not cands:
            return None
        return t.release_part(t.pick(cands, d.take(64)), 1 + d.take(3))

    @action("gapped", weight=2, ready=lambda self: bool(self._gapped_targets()))
    def gapped(self, d: Digits) -> Planned | None:
        """A request whose path runs through lost blocks into cached ones:
        slots for the lost blocks, none for the cached ones after them."""
        self._make_room(d)
        targets = self._gapped_targets()
        if not targets:
            return None
        return self.t.gapped(targets[d.take(64) % len(targets)], partial=d.flag(), meta=d.take(3))

    @action("invalid", weight=1, ready=lambda self: bool(self.t.invalid_kinds))
    def invalid(self, d: Digits) -> Planned | None:
        """An operation the profile rejects: the rule id must match, nothing changes."""
        kind = d.take(len(self.t.invalid_kinds))
        req = d.take(64)
        return self.t.invalid(kind, d.branches(1, MAX_PATH), req)


def swarm_sets(kinds: tuple[str, ...]) -> st.SearchStrategy[frozenset[str]]:
    """Swarm testing: each optional kind on or off per example, each with
    probability 1/2 whatever its place in the list, shrinking toward no
    optional kind. One boolean draw per kind: a single integer used as a bit
    mask (what this replaced) is not uniform under Hypothesis, which favours
    small integers, so the kinds on the high bits (the late-listed ones) were
    almost never enabled (benchmarks/swarm_enablement.py measures both)."""
    return st.tuples(*(st.booleans() for _ in kinds)).map(
        lambda on: frozenset(k for k, flag in zip(kinds, on, strict=True) if flag)
    )


class _Halted(Exception):
    """Unwinds an action after the adapter failed (see adapter_failure)."""


def run_machine(cls: type[LockstepMachine], settings: Any = None) -> None:
    """Run the machine under Hypothesis; then raise the adapter failure it
    recorded, if any (conformance failures are raised, shrunk, by Hypothesis):
    as the lockstep's verdict on it when it came in answer to an operation
    (a ``ConformanceFailure`` naming the rule, with the operations and a
    replay file: ``Lockstep.crash_verdict``), else as it is."""
    cls.adapter_failure = None
    try:
        run_state_machine_as_test(cls, settings=settings)
    finally:
        failure, cls.adapter_failure = cls.adapter_failure, None
    if failure is not None:
        if failure.verdict is not None:
            raise failure.verdict from failure
        raise failure


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:120]


def machine_class(setup: MachineSetup, groups: list[type[RuleGroup]] | None = None) -> type[LockstepMachine]:
    """The machine class for one adapter and profile, with every applicable
    rule group mixed in (or exactly ``groups`` when given)."""
    if groups is None:
        load_group_modules()
        groups = [g for g in RuleGroup._registry if g.applies_to(setup.manifest, setup.profile)]
    name = f"Lockstep_{_slug(setup.manifest.name)}_{setup.profile}"

    def body(ns: dict[str, Any]) -> None:
        ns["setup"] = setup
        ns["adapter_failure"] = None

    cls = types.new_class(name, (*groups, LockstepMachine), {"register": False}, body)
    return cls
