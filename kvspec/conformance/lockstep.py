"""The differential checker: an implementation and the reference model in lockstep.

``Lockstep.step(op)`` sends one operation to the implementation first, then
applies it to the reference model with ``prefer=`` the blocks the
implementation evicted, so that where the policy allows several victims
(``policies.allowed()``) the model follows the implementation's choice and
both keep the same state. It then compares, in this order:

1. the error: an operation the model rejects must come back as a typed error
   with the same rule id, publish nothing and leave the counters unchanged;
   one the model accepts must not be rejected;
2. the result (value and status);
3. the event stream as a router sees it: the implementation's events go into
   a strict ``RouterView``, the model's into a second one in the same state
   (in full mode, a copy made only when the streams differ), both told the
   true parent of every block of the operation (``expect_parent``). A violation the
   implementation's stream produces and the model's does not at the same step
   is a failure; one both produce is a known break of the profile
   (``spec/profiles.py``), counted as coverage (``known_breaks``; those the
   profile table does not list, which arise as consequences of a listed
   break, in ``cascaded_breaks``);
4. the events themselves, exactly (``diff.event_divergence``);
5. the counters, and the earliest pending transfer deadline;
6. INV-ROUTER-MATCH: after the step the router view of the implementation's
   stream holds exactly the blocks the model says a router was told about
   (``Model.announced``), per tier.

The first difference raises ``ConformanceFailure(rule, report)``. The report
is written for a person: the operations so far as a table with their
outcomes, the first diverging result or event (expected vs actual) and the
rule; and a replay file (JSON lines, see ``conformance/replay.py``) is written
so that ``kvspec replay`` can run the sequence again.

``protocol_only=True`` keeps only the checks a router cares about (3 and 6,
plus rejections): for implementations whose events may differ in detail from
the model's but must still keep a router's view right.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvspec.reference import RouterView, Violation, make_model
from kvspec.spec.config import ManagerConfig
from kvspec.spec.display import format_op, format_ops
from kvspec.spec.errors import AdapterError, InvalidOperation
from kvspec.spec.hashing import local_block_hash
from kvspec.spec.profiles import Profile, profile
from kvspec.spec.rules import RuleId, rule
from kvspec.spec.wire import (
    Deref,
    Destroy,
    ErrorInfo,
    FullBlock,
    KvEvent,
    OpResult,
    PartialBlock,
    Promote,
    StepOutcome,
    SwapIn,
    Tick,
    Use,
    event_to_json,
)

from .diff import Divergence, counters_divergence, event_divergence, op_rule, result_divergence
from .failures import ConformanceFailure
from .implementation import Implementation

REPLAY_FORMAT = 1
_HASH_RE = re.compile(r"\b\d{5,20}\b")


def tokens_hash_check(parent: int | None, block_hash: int, tokens_hash: int, token_ids: list[int] | None) -> str | None:
    """STORE-TOKENS-HASH as a router can check it: a stored block that carries
    its token ids must carry their local hash (HASH-LOCAL)."""
    if token_ids is None:
        return None
    want = local_block_hash(token_ids)
    if want != tokens_hash:
        return f"block {block_hash}: tokens_hash {tokens_hash} is not the local hash {want} of its token ids"
    return None


def parent_hints(op: Any) -> Iterator[tuple[int, int | None]]:
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


def _removed_device(events: list[KvEvent]) -> set[int]:
    out: set[int] = set()
    for e in events:
        if e.kind == "removed" and e.storage_tier == "device":
            out.update(e.hashes())
    return out


def outcome_json(o: StepOutcome) -> dict[str, Any]:
    """Canonical JSON of a step outcome (events in their canonical form)."""
    out: dict[str, Any] = {}
    if o.error is not None:
        out["error"] = o.error.model_dump(mode="json")
    else:
        assert o.result is not None
        out["result"] = o.result.model_dump(mode="json")
    out["counters"] = o.counters.model_dump(mode="json")
    out["events"] = [event_to_json(e) for e in o.events]
    if o.earliest_deadline_ms is not None:
        out["earliest_deadline_ms"] = o.earliest_deadline_ms
    return out


def use_placed(op: Use, result: OpResult, refs_delta: int) -> int:
    """How many blocks of ``op`` (a prefix) a Use placed. A count result says
    so; a boolean (legacy) true means all, false means as many as the active
    references grew by (each placed block adds exactly one, and a legacy Use
    never names a partial block it already holds)."""
    v = result.value
    if isinstance(v, bool):
        return len(op.blocks) if v else max(0, refs_delta)
    return int(v or 0)


def brief_outcome(o: StepOutcome) -> str:
    res = f"error [{o.error.rule}]" if o.error is not None else f"{o.result.value} {o.result.status}"  # type: ignore[union-attr]
    return f"{res} | {'; '.join(e.brief() for e in o.events) or '-'}"


class Lockstep:
    """Drive one implementation and the reference model with the same operations.

    ``replay_path``: where a failure writes its replay file (None: nowhere).
    ``on_known_break(rule)``: called for each known break of the profile seen.
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
        """``event_token_ids=False``: the implementation does not publish
        token ids in its events (manifest capability), so the model's events
        are compared without them."""
        self.impl = impl
        self.event_token_ids = event_token_ids
        self.config = config
        self.adapter = adapter
        self.replay_path = replay_path
        self.protocol_only = protocol_only
        self.model = make_model(config)
        self.profile: Profile = profile(config.profile)
        self.view = self._new_view()
        #: the model's stream's view (protocol-only mode; see _check_stream)
        self.model_view = self._new_view()
        self.stored_first = self.profile.removed_timing == "after_stored"
        self.tiers = ["device", "host_pinned"] if config.offload is not None else ["device"]
        self.ops: list[Any] = []
        self.expected: list[StepOutcome] = []
        self.actual: list[StepOutcome] = []
        self.coverage: Counter[str] = Counter()
        self.known_breaks: Counter[str] = Counter()
        #: violations of the model's own stream that the profile does not list
        #: (cascades of a listed break); excused too, reported as coverage
        self.cascaded_breaks: Counter[str] = Counter()
        self.before = self.model.counters()

    def _new_view(self) -> RouterView:
        return RouterView(
            mode=self.profile.view_mode,
            strict=True,
            expect_dp_rank=self.config.dp_rank,
            hash_check=tokens_hash_check,
        )

    # ------------------------------------------------------------------ step
    def step(self, op: Any) -> StepOutcome:
        """Apply ``op`` to both sides and check; returns the model's outcome."""
        before = self.before
        # what the coverage labels and the rule of a counters divergence need
        # to know about the state before (only Use and Promote ask)
        if isinstance(op, Use | Promote):
            pre_registered = self.model.registered()
            pre_owners: dict[int, int] = getattr(self.model, "owners", dict)()
        else:
            pre_registered, pre_owners = set(), {}
        try:
            actual = self.impl.step(op)
        except AdapterError as e:
            e.add_note(self._table_note(op))
            raise
        prefer = _removed_device(actual.events)
        try:
            step = self.model.apply(op, prefer=prefer)
            events = step.events
            if not self.event_token_ids:
                events = [e.model_copy(update={"block_token_ids": None}) if e.block_token_ids else e for e in events]
            expected = StepOutcome.model_construct(
                result=step.result,
                error=None,
                counters=self.model.counters(),
                events=events,
                earliest_deadline_ms=self.model.earliest_deadline(),
            )
        except InvalidOperation as err:
            expected = StepOutcome.model_construct(
                result=None,
                error=ErrorInfo(rule=str(err.rule), message=err.message),
                counters=self.model.counters(),
                events=[],
                earliest_deadline_ms=self.model.earliest_deadline(),
            )
        self.ops.append(op)
        self.expected.append(expected)
        self.actual.append(actual)
        self.before = expected.counters
        div = self._check(op, expected, actual, before)
        if div is not None:
            self.fail(div)
        self._cover(op, expected, before, pre_registered, pre_owners)
        return expected

    # -------------------------------------------------------------- checking
    def _check(self, op: Any, exp: StepOutcome, act: StepOutcome, before: Any) -> Divergence | None:
        if exp.error is not None:
            rid = RuleId(exp.error.rule)
            if act.error is None:
                return Divergence(rid, "the operation must be rejected", f"error [{rid}]", brief_outcome(act))
            if act.error.rule != exp.error.rule:
                got = f"[{act.error.rule}] {act.error.message}"
                return Divergence(rid, "rejected under the wrong rule", f"[{rid}]", got)
            if act.events:
                return Divergence(rid, "a rejected operation published events", "-", [e.brief() for e in act.events])
            d = counters_divergence(before, act.counters)
            if d is not None:
                return Divergence(rid, "a rejected operation changed the counters", d.expected, d.actual)
            return None
        if act.error is not None:
            got = f"error [{act.error.rule}] {act.error.message}"
            return Divergence(op_rule(op), "the operation was rejected", brief_outcome(exp), got)
        assert exp.result is not None and act.result is not None
        if not self.protocol_only:
            d = result_divergence(exp.result, act.result, op)
            if d is not None:
                return d
        same_events = act.events == exp.events
        d = self._check_stream(op, exp, act, same_events)
        if d is not None:
            return d
        if not self.protocol_only:
            if not same_events:
                d = event_divergence(exp.events, act.events, op, offload=self.config.offload is not None)
                if d is not None:
                    return d
            if act.counters != exp.counters:
                stored = any(e.kind == "stored" for e in exp.events)
                d = counters_divergence(exp.counters, act.counters, op, stored=stored)
                if d is not None:
                    return d
            if act.earliest_deadline_ms != exp.earliest_deadline_ms:
                return Divergence(
                    RuleId.TIME_MONOTONIC,
                    "earliest pending deadline",
                    exp.earliest_deadline_ms,
                    act.earliest_deadline_ms,
                )
        for tier in self.tiers:
            held = self.view.stored(tier, dp_rank=self.config.dp_rank)
            want = self.model.announced(tier)
            if held != want:
                return Divergence(
                    RuleId.INV_ROUTER_MATCH,
                    f"the router view of the {tier} tier after the step",
                    f"announced {sorted(want)}",
                    f"router holds {sorted(held)} (missing {sorted(want - held)}, extra {sorted(held - want)})",
                )
        return None

    def _check_stream(self, op: Any, exp: StepOutcome, act: StepOutcome, same_events: bool) -> Divergence | None:
        """Both streams through router views in the same state; violations of
        the implementation's that the model's stream does not share fail.

        In full mode every earlier step had identical events, so the model's
        view would be in the same state as the implementation's: one view
        suffices while the events agree (then every violation is shared), and
        a copy taken before this step stands in for the model's otherwise. In
        protocol-only mode the streams may differ, so the model keeps its own
        view throughout."""
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
            return self._violation_divergence(v, exp, act, op)
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

    def _violation_divergence(self, v: Violation, exp: StepOutcome, act: StepOutcome, op: Any) -> Divergence:
        """A router-view violation of the implementation's stream. Its rule is
        the one reported (it says what a router would get wrong), except when
        the events show a different victim (EVICT-POLICY: the Removed that
        orphans a child or names an unannounced block is the symptom) or the
        violated rule is a strict one (REMOVE-NO-ORPHAN): then the event
        diff's rule, the root cause, is reported."""
        offload = self.config.offload is not None
        ed = event_divergence(exp.events, act.events, op, offload=offload) if not self.protocol_only else None
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

    # -------------------------------------------------------------- coverage
    def _cover(self, op: Any, exp: StepOutcome, before: Any, registered: set[int], owners: dict[int, int]) -> None:
        """Which rules this step exercised (as judged from the model's side)."""
        c = self.coverage
        c[RuleId.COUNTERS] += 1
        c[RuleId.INV_ROUTER_MATCH] += 1
        if exp.error is not None:
            c[exp.error.rule] += 1
            return
        res = exp.result
        assert res is not None
        if isinstance(op, Use):
            placed = use_placed(op, res, exp.counters.active_refs - before.active_refs)
            if res.status != "ok":
                c[RuleId.USE_CAPACITY] += 1
            if res.status == "blocked_on_offload":
                c[RuleId.OFFLOAD_BLOCKS_USE] += 1
            for b in op.blocks[:placed]:
                if isinstance(b, PartialBlock):
                    c[RuleId.USE_PARTIAL] += 1
                elif b.full in registered:
                    c[RuleId.USE_HIT_ACTIVE if owners.get(b.full, 0) else RuleId.USE_HIT_INACTIVE] += 1
                else:
                    c[RuleId.USE_NEW] += 1
        elif isinstance(op, Deref):
            for b in op.blocks:
                c[RuleId.DEREF_PARTIAL if isinstance(b, PartialBlock) else RuleId.DEREF_OWNER] += 1
        elif isinstance(op, Promote):
            c[RuleId.PROMOTE_EXISTING if op.seq_hash in registered else RuleId.PROMOTE_NEW] += 1
        elif isinstance(op, Destroy):
            c[RuleId.DESTROY_ACTIVE] += 1
        elif isinstance(op, Tick):
            c[RuleId.TIME_MONOTONIC] += 1
            if exp.counters.quarantined_blocks < before.quarantined_blocks:
                c[RuleId.QUARANTINE_RELEASE] += 1
        elif isinstance(op, SwapIn):
            c[RuleId.SWAPIN_RESERVE] += 1
        if exp.counters.quarantined_blocks:
            c[RuleId.QUARANTINE_HOLD] += 1
        for e in exp.events:
            c[RuleId.EVENT_ID] += 1
            c[RuleId.EVENT_SOURCE] += 1
            if e.storage_tier == "host_pinned":
                c[RuleId.G2_STORE_ON_COMPLETE if e.kind == "stored" else RuleId.G2_EVICT] += 1
            elif e.kind == "stored":
                c[RuleId.STORE_NEW_ONLY] += 1
                c[RuleId.PARENT_ANCHOR] += 1
                c[RuleId.STORE_NO_DUP] += 1
                if e.block_token_ids is not None:
                    c[RuleId.STORE_TOKENS_HASH] += 1
            elif e.kind == "removed":
                c[RuleId.REMOVE_EXACT] += 1
                c[RuleId.EVICT_POLICY] += 1
                c[RuleId.REMOVE_NO_ORPHAN] += 1
                if isinstance(op, Use | SwapIn):
                    c[RuleId.DEVICE_REMOVE_IMMEDIATE if self.config.offload is not None else RuleId.EVENT_ORDER] += 1

    # --------------------------------------------------------------- failure
    def _table_note(self, op: Any) -> str:
        return "operations so far (the last one did not complete):\n" + format_ops([*self.ops, op], [*self.expected])

    def fail(self, div: Divergence) -> None:
        """Raise the ConformanceFailure for ``div`` (writing the replay file)."""
        raise ConformanceFailure(div.rule, self.report(div))

    def aliases(self) -> dict[int, str]:
        """Short names (b1, b2, ...) for the block hashes of the operations,
        in order of first appearance: 20-digit hashes make a table unreadable."""
        names: dict[int, str] = {}

        def add(h: int | None) -> None:
            if h is not None and h not in names and h >= 10_000:
                names[h] = f"b{len(names) + 1}"

        for op in self.ops:
            if isinstance(op, Use | Deref | Destroy):
                if isinstance(op, Use) and isinstance(op.parent, FullBlock):
                    add(op.parent.full)
                for b in op.blocks:
                    if isinstance(b, FullBlock):
                        add(b.full)
            elif isinstance(op, Promote):
                add(op.parent_hash)
                add(op.seq_hash)
            elif isinstance(op, SwapIn):
                add(op.parent)
                for sb in op.blocks:
                    add(sb.seq_hash)
        for o in (*self.expected, *self.actual):
            for e in o.events:
                for h in e.hashes():
                    add(h)
        return names

    def report(self, div: Divergence) -> str:
        i = len(self.ops) - 1
        cfg = self.config
        head = (
            f"{'protocol-only ' if self.protocol_only else ''}lockstep divergence at step {i} "
            f"(adapter {self.adapter}, profile {cfg.profile}, policy {cfg.eviction}, capacity {cfg.capacity}"
            + (f", dp_rank {cfg.dp_rank}" if cfg.dp_rank else "")
            + (", offload tier" if cfg.offload is not None else "")
            + ")"
        )
        try:
            title = rule(div.rule).title
        except KeyError:
            title = ""
        lines = [
            head,
            f"rule: {div.rule} - {title}",
            "operations (model's outcomes; the last row is what the implementation returned):",
            format_ops(self.ops, [*self.expected[:i], self.actual[i]]),
            f"  the model expected at step {i}: {brief_outcome(self.expected[i])}",
            f"first divergence at step {i} ({format_op(self.ops[i])}): {div.describe()}",
        ]
        names = self.aliases()
        text = _HASH_RE.sub(lambda m: names.get(int(m.group(0)), m.group(0)), "\n".join(lines))
        if names:
            text += "\nblock names: " + ", ".join(f"{n} = {h}" for h, n in names.items())
        path = self.write_replay(div)
        if path is not None:
            text += f"\nreplay file: {path}\n  run again with: kvspec replay {path} --impl=<adapter folder>"
        return text

    def write_replay(self, div: Divergence) -> Path | None:
        """Write the replay file: a header line, then one line per operation
        with the model's expected outcome. Returns its path."""
        if self.replay_path is None:
            return None
        header = {
            "kvspec_replay": REPLAY_FORMAT,
            "adapter": self.adapter,
            "config": self.config.model_dump(mode="json"),
            "protocol_only": self.protocol_only,
            "failure": {"rule": str(div.rule), "step": len(self.ops) - 1, "what": div.what},
        }
        path = self.replay_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with tmp.open("w") as f:
            f.write(json.dumps(header) + "\n")
            for op, exp in zip(self.ops, self.expected, strict=True):
                f.write(json.dumps({"op": op.model_dump(mode="json"), "expect": outcome_json(exp)}) + "\n")
        tmp.replace(path)
        return path


def run_ops(
    impl: Implementation,
    config: ManagerConfig,
    ops: list[Any],
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


__all__ = [
    "REPLAY_FORMAT",
    "Lockstep",
    "outcome_json",
    "parent_hints",
    "run_ops",
    "tokens_hash_check",
    "use_placed",
]
