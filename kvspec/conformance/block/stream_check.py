"""The event stream as a router sees it: the lockstep's stream checks.

Each step's events go into a strict ``RouterView`` (the implementation's),
told the true parent of every block the operation names
(``expect_parent``). The model's events go into a second view in the same
state: in full mode every earlier step had identical events, so one view
suffices while the events agree (then every violation is the model's own),
and a copy taken before the step stands in for the model's view when they
differ; in protocol-only mode the streams may differ, so the model keeps a
view of its own throughout.

A violation the implementation's stream produces and the model's does not
at the same step is a divergence. One both produce is a known break of the
profile (``spec/profiles.py``), counted as coverage (``known_breaks``;
those the profile table does not list, which arise as consequences of a
listed break, in ``cascaded_breaks``).

After the step, INV-ROUTER-MATCH: the implementation's view holds exactly
the blocks the model says a router was told about (``Model.announced``),
per tier. After a declared deviation the lockstep calls ``adopt``: the
blocks the implementation's view then holds beyond the model's
announcement, or lacks, are taken as the implementation's outcome, each
until the model's own announcement catches up with it (the model announces
a lacking block no more, or the view no longer holds an extra one).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator

from kvspec.conformance.block.diff import Divergence, event_divergence
from kvspec.reference import Model, RouterView, Violation
from kvspec.reference.labels import StepLabels
from kvspec.spec.config import ManagerConfig
from kvspec.spec.hashing import local_block_hash
from kvspec.spec.profiles import Profile
from kvspec.spec.rules import RuleId, rule
from kvspec.spec.wire import FullBlock, Operation, Promote, StepOutcome, Use


def tokens_hash_check(parent: int | None, block_hash: int, tokens_hash: int, token_ids: list[int] | None) -> str | None:
    """STORE-TOKENS-HASH as a router can check it: a stored block that carries
    its token ids must carry their local hash (HASH-LOCAL)."""
    if token_ids is None:
        return None
    want = local_block_hash(token_ids)
    if want != tokens_hash:
        return f"block {block_hash}: tokens_hash {tokens_hash} is not the local hash {want} of its token ids"
    return None


def parent_hints(op: Operation) -> Iterator[tuple[int, int | None]]:
    """The true parent of each block an operation names: in a Use, the full
    block before it in the batch (or the caller's parent for the first); for
    a Promote, its ``parent_hash``."""
    if isinstance(op, Use):
        prev = op.parent.full if isinstance(op.parent, FullBlock) else None
        seen: set[int] = set()
        for b in op.blocks:
            if isinstance(b, FullBlock):
                if b.full not in seen:  # a repeated block keeps its first parent
                    seen.add(b.full)
                    yield b.full, prev
                prev = b.full
    elif isinstance(op, Promote):
        yield op.seq_hash, op.parent_hash


class StreamCheck:
    """The two router views of a lockstep run and the checks made with them."""

    def __init__(self, config: ManagerConfig, profile: Profile, *, protocol_only: bool) -> None:
        self.config = config
        self.profile = profile
        self.protocol_only = protocol_only
        self.stored_first = profile.removed_timing == "after_stored"
        self.tiers = ["device", "host_pinned"] if config.offload is not None else ["device"]
        #: the implementation's stream's view
        self.view = self._new_view()
        #: the model's stream's view (protocol-only mode; see ``check``)
        self.model_view = self._new_view()
        self.known_breaks: Counter[str] = Counter()
        #: violations of the model's own stream that the profile does not list
        #: (cascades of a listed break); excused too, reported as coverage
        self.cascaded_breaks: Counter[str] = Counter()
        #: adopted differences per tier: (extra blocks, lacking blocks)
        self.adopted: dict[str, tuple[set[int], set[int]]] = {}

    def _new_view(self) -> RouterView:
        return RouterView(
            mode=self.profile.view_mode,
            strict=True,
            expect_dp_rank=self.config.dp_rank,
            hash_check=tokens_hash_check,
        )

    def check(
        self, op: Operation, exp: StepOutcome, act: StepOutcome, same_events: bool, labels: StepLabels | None = None
    ) -> Divergence | None:
        """Apply both streams of one step; the first violation of the
        implementation's that the model's stream does not share
        (``labels``: the model's labels of the step, to name an event diff)."""
        hints = list(parent_hints(op))
        for h, parent in hints:
            self.view.expect_parent(h, parent)
        if self.protocol_only:
            model_view = self.model_view
            for h, parent in hints:
                model_view.expect_parent(h, parent)
        elif same_events:
            self._excuse(self.view.apply_batch(act.events, stored_first=self.stored_first))
            return None
        else:
            model_view = copy.deepcopy(self.view)
        got = self.view.apply_batch(act.events, stored_first=self.stored_first)
        known = model_view.apply_batch(exp.events, stored_first=self.stored_first)
        pool = self._excuse(known, count=False)
        for v in got:
            if pool[v.rule] > 0:
                pool[v.rule] -= 1
                self.known_breaks[str(v.rule)] += 1
                continue
            return self._violation_divergence(v, exp, act, labels)
        return None

    def _excuse(self, known: list[Violation], *, count: bool = True) -> Counter[RuleId]:
        """Violations of the model's own stream: the profile's known breaks.
        Returns them by rule (and counts them as coverage when ``count``)."""
        policy = self.config.eviction
        for v in known:
            if self.profile.known_break(v.rule, policy) is None:
                # not in the profile's table: a consequence of an earlier known
                # break (a wrong parent corrupts the router's lineage, so a
                # later Removed orphans). Excused like a known break, counted.
                self.cascaded_breaks[str(v.rule)] += 1
            if count:
                self.known_breaks[str(v.rule)] += 1
        return Counter(v.rule for v in known)

    def _violation_divergence(
        self, v: Violation, exp: StepOutcome, act: StepOutcome, labels: StepLabels | None
    ) -> Divergence:
        """A router-view violation of the implementation's stream. Its rule is
        the one reported (it says what a router would get wrong), except when
        the events show a different victim (EVICT-POLICY: the Removed that
        orphans a child or names an unannounced block is the symptom) or the
        violated rule is a strict one (REMOVE-NO-ORPHAN): then the event
        diff's rule, the root cause, is reported."""
        ed = event_divergence(exp.events, act.events, labels) if not self.protocol_only else None
        detail = f"router view: {v}"
        if ed is not None:
            detail += f"\n  first differing event ({ed.what}, rule {ed.rule}):"
            detail += f"\n    expected: {ed.expected}\n    actual:   {ed.actual}"
        rid = v.rule
        if ed is not None and (rule(v.rule).strict or ed.rule == RuleId.EVICT_POLICY):
            rid = ed.rule
        return Divergence(
            rid,
            detail,
            "; ".join(e.brief() for e in exp.events) or "(no events)",
            "; ".join(e.brief() for e in act.events) or "(no events)",
        )

    def adopt(self, model: Model) -> None:
        """Take what the implementation's view holds now as its outcome (a
        declared deviation was just observed): see the module doc."""
        if self.protocol_only:
            self.model_view = copy.deepcopy(self.view)
        for tier in self.tiers:
            held = set(self.view.stored(tier, dp_rank=self.config.dp_rank))
            want = set(model.announced(tier))
            extra, lacking = self.adopted.get(tier, (set(), set()))
            self.adopted[tier] = (extra | (held - want), lacking | (want - held))

    def _adopted_want(self, tier: str, held: set[int], want: set[int]) -> set[int]:
        adopted = self.adopted.get(tier)
        if adopted is None:
            return want
        extra, lacking = adopted
        extra &= held
        lacking &= want
        return (want - lacking) | extra

    def router_match(self, model: Model) -> Divergence | None:
        """INV-ROUTER-MATCH after a step: per tier, the implementation's view
        holds exactly what the model announced (with what was adopted)."""
        for tier in self.tiers:
            held = self.view.stored(tier, dp_rank=self.config.dp_rank)
            want = self._adopted_want(tier, set(held), set(model.announced(tier)))
            if held != want:
                return Divergence(
                    RuleId.INV_ROUTER_MATCH,
                    f"the router view of the {tier} tier after the step",
                    f"announced {sorted(want)}",
                    f"router holds {sorted(held)} (missing {sorted(want - held)}, extra {sorted(held - want)})",
                )
        return None
