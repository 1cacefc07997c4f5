"""The witnesses: interesting states found by bounded model checking, written
as golden scenarios under spec/scenarios/witnesses/ (``kvspec witnesses``).

Each witness names a target, in terms of the model, and the universe it is
searched in. ``bmc.search`` finds the shortest sequence of operations that
reaches it; ``derive`` then replays those operations through the encoding
alone and reads every expected value (results, statuses, events, counters,
owners, G2) from the solver's trace. A value goes into the scenario only if
the spec determines it: where the policy leaves a choice (a tie under the
``unordered`` policy), the solver is asked for a trace that differs in that
value, and if one exists the value is left unchecked. The Python model is not
consulted; tests/test_smt_agreement.py then checks that it agrees.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import z3

from kvspec.reference.smt.bmc import KINDS, BmcStep, BmcTrace, Found, extend, search
from kvspec.reference.smt.offload.agreement.sampled import (
    Universe,
    deref_op,
    promote_op,
    swap_in_op,
    to_encoding,
    use_op,
)
from kvspec.reference.smt.offload.events import assemble, model_eval
from kvspec.reference.smt.offload.ops import (
    STATUS_BLOCKED,
    STATUS_CAPACITY,
    STATUS_NAMES,
    STATUS_OK,
    Chooser,
    OpOutcome,
    apply_op,
    counters,
)
from kvspec.reference.smt.offload.state import State
from kvspec.reference.smt.solving import check
from kvspec.reference.smt.universe import ACTIVE, INACTIVE, NONE
from kvspec.spec.display import format_op
from kvspec.spec.rules import RuleId as R
from kvspec.spec.scenario import SCENARIO_DIR, Expect, Scenario, ScenarioStep, dump_scenario
from kvspec.spec.wire import Deref, FullBlock, Operation, PartialBlock, Promote, SwapIn, Tick, Use, event_to_json

WITNESS_DIR = SCENARIO_DIR / "witnesses"


@dataclass(frozen=True)
class Witness:
    name: str
    description: str
    rules: tuple[str, ...]
    universe: Universe
    target: Callable[[BmcTrace], z3.BoolRef]
    max_depth: int
    kinds: tuple[str, ...] = KINDS
    requires: tuple[str, ...] = ("offload", "swap_in", "tier:host_pinned")
    #: which step of the trace reached the target (for the note)
    target_step: Callable[[int], int] = lambda depth: depth - 1
    target_note: str = "the target"


# ----------------------------------------------------------------- targets


def _same_args(a: BmcStep, b: BmcStep) -> z3.BoolRef:
    va, vb = a.vars, b.vars
    return z3.And(va.kind == vb.kind, va.h1 == vb.h1, va.h2 == vb.h2, va.u == vb.u, va.full2 == vb.full2, va.p == vb.p)


def _stalled_mid_batch(status: int) -> Callable[[BmcTrace], z3.BoolRef]:
    """A Use of two blocks places the first and stops at the second (``status``)
    while an offload transfer started earlier is still pending; then a Tick
    completes the transfers and the same Use places both blocks."""

    def target(t: BmcTrace) -> z3.BoolRef:
        if len(t.steps) < 3:
            return z3.BoolVal(False)
        use, tick, retry = t.steps[-3], t.steps[-2], t.steps[-1]
        return z3.And(
            use.vars.is_("use2"),
            use.pre.quar_c >= 1,
            use.result == 1,
            use.status == status,
            tick.vars.is_("tick"),
            _same_args(use, retry),
            retry.result == 2,
            retry.status == STATUS_OK,
        )

    return target


def _swapin_parent_evicted(t: BmcTrace) -> z3.BoolRef:
    """A swap-in is scheduled with a parent the caller holds; before its
    transfer completes, the caller releases the parent and an eviction takes
    it; the Tick that completes the swap-in registers the blocks with a
    device Stored anchored to the evicted parent."""
    if len(t.steps) < 2:
        return z3.BoolVal(False)
    last = t.steps[-1]
    return z3.And(last.vars.is_("tick"), z3.Not(last.anchor_ok))


def _eviction_tie(t: BmcTrace) -> z3.BoolRef:
    """A Use that needs a slot finds none free and at least two inactive
    blocks the policy may evict (a tie: the ``unordered`` policy allows every
    inactive block); the eviction blocks it on an offload; a Tick completes it."""
    if len(t.steps) < 2:
        return z3.BoolVal(False)
    use, tick = t.steps[-2], t.steps[-1]
    inactive = z3.Sum([z3.If(use.pre.st[k] == INACTIVE, 1, 0) for k in use.pre.slots])
    return z3.And(
        use.vars.is_("use1"), use.status == STATUS_BLOCKED, use.pre.free_c == 0, inactive >= 2, tick.vars.is_("tick")
    )


FOREST = (NONE, 0, 1, NONE, 3)  # two chains: 0 <- 1 <- 2 and 3 <- 4

WITNESSES: list[Witness] = [
    Witness(
        "capacity_mid_batch_quarantine_held",
        "Capacity exhausted mid-batch with an offload pending: a Use of two blocks places the first and stops at "
        "the second with status capacity, because the only other slot is quarantined until its transfer to G2 "
        "completes and nothing is left to evict (QUARANTINE-HOLD, USE-CAPACITY). A Tick completes the transfer, "
        "frees the slot exactly once (QUARANTINE-RELEASE) and publishes the host-pinned Stored; the same Use then "
        "places both blocks.",
        (
            R.QUARANTINE_HOLD,
            R.QUARANTINE_RELEASE,
            R.USE_CAPACITY,
            R.OFFLOAD_BLOCKS_USE,
            R.G2_STORE_ON_COMPLETE,
            R.DEVICE_REMOVE_IMMEDIATE,
            R.USE_HIT_ACTIVE,
            R.COUNTERS,
            R.INV_QUARANTINE,
            R.INV_CONSERVE,
        ),
        Universe(2, FOREST, 2, "lru"),
        _stalled_mid_batch(STATUS_CAPACITY),
        max_depth=8,
        target_step=lambda d: d - 3,
        target_note="capacity exhausted mid-batch while an offload is pending",
    ),
    Witness(
        "blocked_mid_batch_offload_pending",
        "A Use of two blocks places the first and, finding no free slot for the second while an earlier offload "
        "is still pending, evicts an inactive block: the eviction starts a second offload and the Use stops "
        "blocked on it (OFFLOAD-BLOCKS-USE), with the device Removed published at once (DEVICE-REMOVE-IMMEDIATE). "
        "A Tick completes both transfers in queue order (host-pinned Stored each, G2 evicting by LRU when full); "
        "the same Use then places both blocks.",
        (
            R.OFFLOAD_BLOCKS_USE,
            R.QUARANTINE_HOLD,
            R.QUARANTINE_RELEASE,
            R.DEVICE_REMOVE_IMMEDIATE,
            R.G2_STORE_ON_COMPLETE,
            R.G2_EVICT,
            R.EVICT_POLICY,
            R.COUNTERS,
            R.INV_QUARANTINE,
            R.INV_ROUTER_MATCH,
        ),
        Universe(3, FOREST, 1, "lru"),
        _stalled_mid_batch(STATUS_BLOCKED),
        max_depth=9,
        target_step=lambda d: d - 3,
        target_note="blocked on an offload mid-batch while another offload is pending",
    ),
    Witness(
        "swapin_parent_evicted_before_registration",
        "A swap-in racing an eviction of its parent: a swap-in of a G2 block is scheduled with the parent the "
        "caller holds; before its transfer completes the caller releases the parent and a Use evicts it "
        "(device Removed). The Tick that completes the swap-in registers the block with a device Stored anchored "
        "to the parent given at swap-in (SWAPIN-ANCHOR, as the kvbm mocker does), which a router no longer holds: "
        "the router view reports PARENT-ANCHOR. This is why the proof of INV-ANCHOR assumes the caller keeps a "
        "pending swap-in's parent (ASSUME-SWAPIN-PARENT-HELD, spec/INVARIANTS.md).",
        (
            R.SWAPIN_RESERVE,
            R.SWAPIN_ANCHOR,
            R.EVICT_POLICY,
            R.DEVICE_REMOVE_IMMEDIATE,
            R.QUARANTINE_HOLD,
            R.G2_STORE_ON_COMPLETE,
            R.INV_ANCHOR,
        ),
        Universe(2, FOREST, 2, "lru"),
        _swapin_parent_evicted,
        max_depth=10,
        kinds=("use1", "use2", "deref1", "deref2", "tick", "swap_in1"),
        target_note="the swap-in registers with a Stored whose parent was evicted",
    ),
    Witness(
        "eviction_tie_unordered",
        "An eviction tie: under the unordered policy every inactive block may be evicted, and a Use that needs a "
        "slot finds none free and two or more inactive blocks. Any of them may go (EVICT-POLICY); whichever it is, "
        "its slot is quarantined and the Use blocks (OFFLOAD-BLOCKS-USE). The scenario checks only what the spec "
        "determines: results, statuses and counters; the events and contents that name the chosen victim are "
        "left unchecked from the tie on (the lockstep checker follows the implementation's choice instead).",
        (R.EVICT_POLICY, R.OFFLOAD_BLOCKS_USE, R.QUARANTINE_HOLD, R.QUARANTINE_RELEASE, R.COUNTERS),
        Universe(2, FOREST, 2, "unordered"),
        _eviction_tie,
        max_depth=7,
        kinds=("use1", "use2", "deref1", "deref2", "tick"),
        requires=("offload", "tier:host_pinned"),
        target_step=lambda d: d - 2,
        target_note="an eviction with two or more allowed victims",
    ),
]


def witness(name: str) -> Witness:
    for w in WITNESSES:
        if w.name == name:
            return w
    raise KeyError(f"unknown witness {name!r}; known: {[w.name for w in WITNESSES]}")


# ------------------------------------------------------------- ops of a trace


def wire_ops(found: Found) -> list[Any]:
    """The operations of a found trace, as wire operations."""
    u = found.trace.universe
    ev = model_eval(found.model)
    out: list[Any] = []
    now = 0.0
    for step in found.trace.steps:
        v = step.vars
        kind = KINDS[ev(v.kind)]
        h1, h2, uu, p = ev(v.h1), ev(v.h2), ev(v.u), ev(v.p)
        parent = None if p == NONE else p
        if kind == "use1":
            out.append(use_op(u, [h1], parent))
        elif kind == "use2":
            out.append(use_op(u, [h1, h2 if ev(v.full2) else f"u{uu}"], parent))
        elif kind == "use_partial":
            out.append(use_op(u, [f"u{uu}"]))
        elif kind == "deref1":
            out.append(deref_op([h1 if ev(v.full1) else f"u{uu}"]))
        elif kind == "deref2":
            out.append(deref_op([h2, h1]))
        elif kind == "promote":
            out.append(promote_op(u, f"u{uu}", h1))
        elif kind == "tick":
            now += 1.0
            out.append(Tick(now_ms=now))
        elif kind == "swap_in1":
            out.append(swap_in_op(u, [h1], parent))
        else:
            out.append(swap_in_op(u, [h1, h2], parent))
    return out


# --------------------------------------------------- expectations from z3


@dataclass
class _Replayed:
    outcome: OpOutcome
    pre: State
    post: State


def _replay(universe: Universe, ops: Sequence[Any]) -> tuple[list[_Replayed], list[z3.BoolRef]]:
    """The encoding run over concrete operations, with every choice the policy
    leaves open left to the solver."""
    free = universe.policy == "unordered"
    ch = Chooser(universe.encoding_policy, free_victims=free, prefix="rp")
    S = universe.initial()
    steps: list[_Replayed] = []
    constraints: list[z3.BoolRef] = []
    for i, op in enumerate(ops):
        out = apply_op(S, to_encoding(op), ch)
        post = State.fresh(S.bound, S.rigid, f"rp{i + 1}_")
        constraints += [out.valid, *out.constraints, post.equals(out.post)]
        steps.append(_Replayed(out, S, post))
        S = post
    return steps, constraints


def _frag_terms(out: OpOutcome) -> list[z3.ExprRef]:
    terms: list[z3.ExprRef] = []
    for w, f in out.frags:
        terms.append(w)
        terms.append(z3.If(w, f.block, -2))
        if f.parent is not None:
            terms.append(z3.If(w, f.parent, -2))
        if not isinstance(f.starts_group, bool):
            terms.append(z3.And(w, f.starts_group))
    if out.stored_parent is not None:
        terms.append(out.stored_parent)
    return terms


def _state_terms(S: State) -> dict[str, list[z3.ExprRef]]:
    owners = [z3.Sum([z3.If(z3.And(S.st[k] == ACTIVE, S.blk[k] == h), S.own[k], 0) for k in S.slots]) for h in S.hashes]
    inactive = [z3.Or([z3.And(S.st[k] == INACTIVE, S.blk[k] == h) for k in S.slots]) for h in S.hashes]
    return {"active": owners, "inactive": inactive, "g2": list(S.g2)}


def _determined(s: z3.Solver, m: z3.ModelRef, terms: Sequence[z3.ExprRef]) -> bool:
    """Does every trace of the operations give ``terms`` the values of ``m``?"""
    if not terms:
        return True
    s.push()
    s.add(z3.Or([t != m.eval(t, model_completion=True) for t in terms]))
    r = check(s)
    s.pop()
    return r.unsat


def derive(universe: Universe, ops: Sequence[Any]) -> list[Expect]:
    """Every step's expectations, from the encoding alone (see module doc)."""
    steps, constraints = _replay(universe, ops)
    s = z3.Solver()
    s.add(*constraints)
    a = check(s)
    if a.model is None:
        raise RuntimeError(f"the operations have no trace in the encoding ({a.verdict})")
    m = a.model
    ev = model_eval(m)
    out: list[Expect] = []
    next_id = 0
    ids_known = True
    for rp in steps:
        o = rp.outcome
        exp: dict[str, Any] = {}
        if o.value is not None and _determined(s, m, [o.value, o.status]):
            exp["result"] = ev(o.value)
            exp["status"] = STATUS_NAMES[ev(o.status)]
        events = assemble(o, ev, next_id, 0)
        if ids_known and _determined(s, m, _frag_terms(o)):
            exp["events"] = [event_to_json(e) for e in events]
        else:
            ids_known = False
        next_id += len(events)
        cterms = counters(rp.post)
        if _determined(s, m, list(cterms.values())):
            exp["counters"] = {k: ev(t) for k, t in cterms.items()}
        st = _state_terms(rp.post)
        if _determined(s, m, st["active"] + st["inactive"]):
            exp["active"] = {str(h): ev(t) for h, t in enumerate(st["active"]) if ev(t) > 0}
            exp["inactive"] = [h for h, t in enumerate(st["inactive"]) if ev(t)]
        if _determined(s, m, st["g2"]):
            exp["g2"] = [h for h, t in enumerate(st["g2"]) if ev(t)]
        out.append(Expect.model_validate(exp))
    return out


def build_scenario(w: Witness, ops: Sequence[Any], depth: int) -> Scenario:
    expects = derive(w.universe, ops)
    at = w.target_step(depth)
    steps = []
    for i, (op, exp) in enumerate(zip(ops, expects, strict=True)):
        note = format_op(op)
        if i == at:
            note += f" -- {w.target_note}"
        steps.append(ScenarioStep(op=op, expect=exp, note=note))
    requires = list(w.requires)
    requires.append(f"policy:{w.universe.policy}")
    if any(isinstance(op, Use) and any(not hasattr(b, "full") for b in op.blocks) for op in ops):
        requires.append("partial_blocks")
    return Scenario(
        name=w.name,
        description=w.description,
        source=(
            f"bounded model checking (z3): reference/smt/witnesses.py, witness {w.name!r}, shortest trace "
            f"({depth} operations) in a universe of {w.universe.slots} slots and block hashes forming "
            f"the forest {list(w.universe.par)}; expected values from the solver's trace"
        ),
        rules=[R(r) for r in dict.fromkeys(w.rules)],
        config=w.universe.config(),
        requires=sorted(set(requires)),
        steps=steps,
    )


def find(w: Witness) -> Found | None:
    ch = Chooser(w.universe.encoding_policy, free_victims=w.universe.policy == "unordered", prefix="bmc")
    return search(w.universe, w.target, max_depth=w.max_depth, kinds=w.kinds, chooser=ch)


def generate(w: Witness) -> tuple[Scenario, Found]:
    found = find(w)
    if found is None:
        raise RuntimeError(f"witness {w.name}: no trace of up to {w.max_depth} operations reaches the target")
    return build_scenario(w, wire_ops(found), found.depth), found


def path_of(w: Witness, directory: Path = WITNESS_DIR) -> Path:
    return directory / f"{w.name}.json"


def write(scenario: Scenario, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_scenario(scenario))


def _op_values(op: Operation) -> tuple[str, dict[str, Any]]:
    """The BMC kind and argument values of a wire operation of a witness."""
    if isinstance(op, Tick):
        return "tick", {}
    if isinstance(op, Use):
        parent = op.parent.full if isinstance(op.parent, FullBlock) else NONE
        b = op.blocks
        first = b[0]
        if len(b) == 1 and isinstance(first, PartialBlock):
            return "use_partial", {"u": int(first.partial[1:])}
        assert isinstance(first, FullBlock), "a witness's Use starts with a full block"
        if len(b) == 1:
            return "use1", {"h1": first.full, "p": parent}
        second = b[1]
        if isinstance(second, FullBlock):
            return "use2", {"h1": first.full, "h2": second.full, "full2": True, "p": parent}
        return "use2", {"h1": first.full, "u": int(second.partial[1:]), "full2": False, "p": parent}
    if isinstance(op, Deref):
        b = op.blocks
        if len(b) == 2:
            h2, h1 = b
            assert isinstance(h2, FullBlock) and isinstance(h1, FullBlock), "a witness's Deref of two names full blocks"
            return "deref2", {"h2": h2.full, "h1": h1.full}
        if hasattr(b[0], "full"):
            return "deref1", {"h1": b[0].full, "full1": True}
        return "deref1", {"u": int(b[0].partial[1:]), "full1": False}
    if isinstance(op, Promote):
        parent = NONE if op.parent_hash is None else op.parent_hash
        return "promote", {"u": int(op.uuid[1:]), "h1": op.seq_hash, "p": parent}
    assert isinstance(op, SwapIn)
    hs = [blk.seq_hash for blk in op.blocks]
    vals: dict[str, Any] = {"h1": hs[0], "p": NONE if op.parent is None else op.parent}
    if len(hs) == 2:
        vals["h2"] = hs[1]
    return ("swap_in2" if len(hs) == 2 else "swap_in1"), vals


def verify(w: Witness, scenario: Scenario) -> list[str]:
    """Without searching: the scenario's operations are a trace that reaches
    the witness's target, and its expectations are what the encoding derives
    from them. Returns the problems (empty: the file is good)."""
    problems: list[str] = []
    ops = [st.op for st in scenario.steps]
    ch = Chooser(w.universe.encoding_policy, free_victims=w.universe.policy == "unordered", prefix="vf")
    trace = BmcTrace(w.universe, ch, KINDS)
    for _ in ops:
        extend(trace)
    pins: list[z3.BoolRef] = []
    for step, op in zip(trace.steps, ops, strict=True):
        kind, vals = _op_values(op)
        pins.append(step.vars.kind == KINDS.index(kind))
        pins += [getattr(step.vars, k) == v for k, v in vals.items()]
    s = z3.Solver()
    s.add(*trace.constraints, *pins, w.target(trace))
    if not check(s).sat:
        problems.append("its operations do not reach the target (or are not requests a scheduler could make)")
    derived = derive(universe_of(scenario), ops)
    for i, (st, exp) in enumerate(zip(scenario.steps, derived, strict=True)):
        if st.expect != exp:
            problems.append(f"step {i} ({st.note}): the expected values are not the encoding's")
    return problems


def universe_of(scenario: Scenario) -> Universe:
    """The universe a witness scenario runs in, read back from its operations
    (the forest from the lineage hashes, G2 from the configuration)."""
    par: dict[int, int] = {}
    for step in scenario.steps:
        op = step.op
        plhs = (
            op.plhs
            if isinstance(op, Use)
            else [op.plh]
            if isinstance(op, Promote)
            else [b.plh for b in op.blocks]
            if isinstance(op, SwapIn)
            else []
        )
        for plh in plhs:
            par[plh.hash] = NONE if plh.parent is None else plh.parent
    n = max(par, default=0) + 1
    cfg = scenario.config
    assert cfg.offload is not None
    assert cfg.eviction in ("lru", "unordered"), f"witnesses use the lru or unordered policy, not {cfg.eviction}"
    return Universe(cfg.capacity, tuple(par.get(h, NONE) for h in range(n)), cfg.offload.num_g2_blocks, cfg.eviction)


__all__ = ["WITNESSES", "Witness", "build_scenario", "derive", "generate", "json"]
