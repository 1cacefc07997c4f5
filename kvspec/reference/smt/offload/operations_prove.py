"""Operation-level proofs: invariant and whole operation imply invariant.

The step-level proofs (``prover.py``) show that every one-block step keeps
the invariants. The model's operations are sequences of such steps
(``ops.py``) whose events are assembled differently from the steps' own: a
Use publishes *one* device Stored for all its new blocks, whose parent is the
batch's final anchor (the last block it reused, or the caller's parent), and
then one Removed of its victims. A step-level proof says nothing about that
assembled event. Here each operation of the model is applied as a whole to
a fully symbolic pre-state:

- ``use``: a batch of ``n`` blocks, each full or partial (the solver picks),
  any hashes and uuids, any parent, the victims any inactive blocks;
- ``deref``: ``n`` blocks, full or partial;
- ``promote``; ``swap_in`` of ``n`` blocks (reserve or blocked evictions);
- ``tick``: a forward Tick completing every pending transfer in queue order,
  offloads and whole swap-in jobs (every slot of a job, registered or
  skipped), or a backward one.

Hypothesis: every invariant and lemma, every field in its type, and
``OP-IDLE`` (no swap-in registration in progress: the model registers a job
within one Tick, so between operations none is). Assumed of the operation:
its rules' choices are ones they allow and the caller keeps the contracts
its steps name (``OpOutcome.contracts``). Obligations on the post-state:
every invariant and lemma, ``OP-IDLE``; of the transition: INV-QUARANTINE's
transition part (pre to post), INV-ANCHOR for the events as the operation
publishes them (``OpOutcome.anchor_ok``: the Use's one Stored names its final
anchor, which the router must hold when it applies it), and
``OP-STORE-REMOVE-DISJOINT`` (no block is both stored and removed on the
device by one operation, so publishing the Stored before the Removed, as the
model does, leaves the router where the steps' own order does).

Bounded, like the step-level proofs: the universe's slots and hashes, and
``n`` blocks per batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import z3

from kvspec.reference.smt import solving
from kvspec.reference.smt.concrete import ConcreteState, evaluate
from kvspec.reference.smt.offload.invariants import ALL_PROPERTIES, Conjuncts, Property, assumed, step_quarantine
from kvspec.reference.smt.offload.ops import (
    BlockArg,
    Chooser,
    DerefOp,
    Op,
    OpOutcome,
    PromoteOp,
    SwapInOp,
    TickOp,
    UseOp,
    _Run,
    apply_op,
    job_slot,
)
from kvspec.reference.smt.offload.state import Rigid, State
from kvspec.reference.smt.offload.step import EncodedStep
from kvspec.reference.smt.offload.transitions import offload_complete, swapin_register
from kvspec.reference.smt.terms import sel
from kvspec.reference.smt.universe import NONE, Bound

#: operation-level bound used by ``kvspec prove`` (the batch length is an option)
DEFAULT_OP_BOUND = Bound(3, 5)
DEFAULT_BATCH = 3

OP_IDLE = "OP-IDLE"
#: a change to every step an operation takes (an operation-level mutant, ``op_mutants.py``)
Mutate = Callable[[EncodedStep], EncodedStep]
#: a change to a whole operation's outcome, given the pre-state and the operation (None: a Tick unit)
Reshape = Callable[[State, Op | None, OpOutcome], OpOutcome]
OP_DISJOINT = "OP-STORE-REMOVE-DISJOINT"


def op_idle(S: State) -> Conjuncts:
    """OP-IDLE: between operations no swap-in registration is in progress."""
    return [("no registration in progress", S.busy == NONE)]


@dataclass
class OpInputs:
    """The fresh constants of one symbolic operation, by name."""

    consts: dict[str, z3.ExprRef] = field(default_factory=dict)
    domain: list[z3.BoolRef] = field(default_factory=list)

    def int(self, name: str, lo: int, hi: int) -> z3.ArithRef:
        c = z3.Int(name)
        self.consts[name] = c
        self.domain.append(z3.And(lo <= c, c < hi))
        return c

    def bool(self, name: str) -> z3.BoolRef:
        c = z3.Bool(name)
        self.consts[name] = c
        return c


def shapes(n: int) -> list[str]:
    """Every batch shape of 1..n blocks: ``F`` a full block, ``P`` a partial
    one (any order: a Use may mix them). One proof per shape keeps each
    query small; together they cover every batch of up to ``n`` blocks."""
    out = [""]
    for _ in range(n):
        out += [x + c for x in out if len(x) == len(out[-1]) for c in "FP"]
    return [x for x in out if x]


def _blocks(inp: OpInputs, bound: Bound, shape: str) -> list[BlockArg]:
    out = []
    for i, kind in enumerate(shape):
        if kind == "F":
            out.append(BlockArg(True, h=inp.int(f"op_h{i}", 0, bound.hashes)))
        else:
            out.append(BlockArg(False, u=inp.int(f"op_u{i}", 0, bound.uuids)))
    return out


def make_use(inp: OpInputs, bound: Bound, shape: str, *, validate: bool = True) -> Op:
    """A Use of the given shape. ``validate``: USE-VALIDATE, the model
    rejects a batch naming one lineage hash twice (in the universe a hash has
    one lineage hash), so its full blocks differ. Without it the proof finds
    a batch that stores a block and then reuses it, so that its one Stored
    names the block itself as parent (tests/test_smt_prove.py)."""
    blocks = _blocks(inp, bound, shape)
    for i, a in enumerate(blocks):
        for b in blocks[i + 1 :]:
            if validate and a.full and b.full:
                inp.domain.append(a.h != b.h)
    return UseOp(blocks, inp.int("op_parent", NONE, bound.hashes))


def make_deref(inp: OpInputs, bound: Bound, shape: str) -> Op:
    return DerefOp(_blocks(inp, bound, shape))


def make_promote(inp: OpInputs, bound: Bound, shape: str) -> Op:
    return PromoteOp(
        inp.int("op_u", 0, bound.uuids), inp.int("op_h", 0, bound.hashes), inp.int("op_p", NONE, bound.hashes)
    )


def make_swap_in(inp: OpInputs, bound: Bound, shape: str) -> Op:
    return SwapInOp(
        [inp.int(f"op_h{i}", 0, bound.hashes) for i in range(len(shape))], inp.int("op_parent", NONE, bound.hashes)
    )


def make_tick(inp: OpInputs, bound: Bound, shape: str) -> Op:
    return TickOp(inp.bool("op_forward"))


def complete_offload(S: State, inp: OpInputs, mutate: Mutate | None = None) -> OpOutcome:
    """One unit of a forward Tick: the offload out of any pending slot
    completes (any completion order; any G2 victim)."""
    run = _Run(S, concrete=False, mutate=mutate)
    s = inp.int("op_slot", 0, S.bound.slots)
    w = inp.int("op_g2_victim", 0, S.bound.hashes)
    run.take(lambda St: offload_complete(St, s, w=w))
    return _unit("tick", run, S, [])


def complete_swap_in(S: State, inp: OpInputs, mutate: Mutate | None = None) -> OpOutcome:
    """One unit of a forward Tick: every slot of a pending swap-in job
    registers (or is skipped as present), in the job's order, with nothing
    else in between, as the model completes a job within one Tick."""
    run = _Run(S, concrete=False)
    j = inp.int("op_job", 0, S.bound.jobs)
    run.constraints.append(S.job_live(j))
    anchor_ok: list[z3.BoolRef] = []
    for i in range(S.bound.slots):
        cond = z3.BoolVal(True) if i == 0 else run.state.busy == j
        step = run.take(lambda St: swapin_register(St, j, k=job_slot(St, j), ordered=True), cond)
        assert step is not None
        anchor_ok += [
            z3.Implies(z3.And(cond, a.when), z3.Or(a.parent == NONE, sel(a.view, a.parent))) for a in step.anchors
        ]
    return _unit("tick", run, S, anchor_ok)


def _unit(kind: str, run: _Run, S: State, anchor_ok: list[z3.BoolRef]) -> OpOutcome:
    return OpOutcome(
        kind,
        run.state,
        z3.BoolVal(True),
        None,
        None,
        z3.IntVal(0),
        run.frags,
        constraints=run.constraints,
        anchor_ok=z3.And(anchor_ok) if anchor_ok else z3.BoolVal(True),
        contracts={cid: z3.And(cs) for cid, cs in run.contracts.items()},
    )


#: the units of a forward Tick: a Tick completes its due transfers one after
#: the other, each unit from the state the previous one left, so a Tick keeps
#: what every unit keeps (a backward Tick changes nothing: TIME-MONOTONIC)
TICK_UNITS: dict[str, Callable[[State, OpInputs, Mutate | None], OpOutcome]] = {
    "offload": complete_offload,
    "swap_in job": complete_swap_in,
}


#: operation name -> how to build it with symbolic inputs, for a batch shape
OPERATIONS: dict[str, Callable[[OpInputs, Bound, str], Op]] = {
    "use": make_use,
    "deref": make_deref,
    "promote": make_promote,
    "swap_in": make_swap_in,
    "tick": make_tick,
}


def variants(n: int, operations: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(operation, shape) pairs covering every operation with batches of up
    to ``n`` blocks: every shape for Use and Deref, every length for SwapIn."""
    out: list[tuple[str, str]] = []
    for name in OPERATIONS if operations is None else operations:
        if name not in OPERATIONS:
            raise KeyError(f"unknown operation {name!r}; known: {list(OPERATIONS)}")
        if name in ("use", "deref"):
            out += [(name, sh) for sh in shapes(n)]
        elif name == "swap_in":
            out += [(name, "F" * k) for k in range(1, n + 1)]
        elif name == "tick":
            out += [(name, unit) for unit in TICK_UNITS]
        else:
            out.append((name, ""))
    return out


def _disjoint(out: OpOutcome) -> Conjuncts:
    dev = [(w, f) for w, f in out.frags if f.tier == "device"]
    stored = [(w, f) for w, f in dev if f.kind == "stored"]
    removed = [(w, f) for w, f in dev if f.kind == "removed"]
    return [
        (f"device Stored #{i} and Removed #{k} name different blocks", z3.Not(z3.And(ws, wr, fs.block == fr.block)))
        for i, (ws, fs) in enumerate(stored)
        for k, (wr, fr) in enumerate(removed)
    ]


def obligations(pre: State, out: OpOutcome) -> dict[str, Conjuncts]:
    """Property id -> the conjuncts the operation must keep."""
    post = out.post
    ob: dict[str, Conjuncts] = {str(p.id): p.state_conjuncts(post) for p in ALL_PROPERTIES}
    ob["INV-QUARANTINE"] = ob["INV-QUARANTINE"] + step_quarantine(EncodedStep("op", pre, post))
    ob["INV-ANCHOR"] = [("the operation's device Stored events name parents the router holds", out.anchor_ok)]
    ob[OP_IDLE] = op_idle(post)
    ob[OP_DISJOINT] = _disjoint(out)
    return ob


@dataclass
class OffloadOpProof:
    operation: str
    property_id: str
    proven: bool
    seconds: float
    bound: Bound
    batch: int
    unknown: bool = False
    counterexample: str | None = None
    #: why an unknown is one (``solving.Answer.reason``)
    reason: str = ""

    @property
    def verdict(self) -> str:
        if self.unknown:
            return "unknown" if self.reason.startswith("timeout") or not self.reason else f"unknown ({self.reason})"
        return "proven" if self.proven else "counterexample"


@dataclass
class BuiltOp:
    name: str
    pre: State
    inputs: OpInputs
    outcome: OpOutcome
    base: list[z3.BoolRef]


def build_op(
    name: str,
    bound: Bound,
    shape: str,
    assume: list[Property] | None = None,
    *,
    use_validate: bool = True,
    mutate: Mutate | None = None,
    reshape: Reshape | None = None,
) -> BuiltOp:
    """The symbolic operation ``name`` from a symbolic pre-state, with its
    hypothesis (``base``): invariants, lemmas, OP-IDLE, domains, the rules'
    choices and the caller contracts. ``mutate`` and ``reshape``: an
    operation-level mutant in force (``op_mutants.py``)."""
    rigid = Rigid.fresh(bound)
    pre = State.fresh(bound, rigid, "pre_")
    inp = OpInputs()
    op: Op | None = None
    if name == "tick":
        out = TICK_UNITS[shape](pre, inp, mutate)
    else:
        op = (
            make_use(inp, bound, shape, validate=use_validate) if name == "use" else OPERATIONS[name](inp, bound, shape)
        )
        out = apply_op(pre, op, Chooser("unordered", free_victims=True, prefix="op", mutate=mutate))
    if reshape is not None:
        out = reshape(pre, op, out)
    victims = [z3.And(0 <= v, v < bound.slots) for _w, v in out.victims]
    base = [
        *rigid.domain(),
        *pre.domain(),
        *inp.domain,
        *victims,
        assumed(pre, ALL_PROPERTIES if assume is None else assume),
        *[c for _l, c in op_idle(pre)],
        *out.constraints,
        *out.contracts.values(),
    ]
    return BuiltOp(f"{name}[{shape}]" if shape else name, pre, inp, out, base)


def _render(m: z3.ModelRef, b: BuiltOp, failed: list[str]) -> str:
    pre = ConcreteState.from_model(m, b.pre)
    post = ConcreteState.from_model(m, b.outcome.post)
    args = ", ".join(f"{k}={evaluate(m, v)}" for k, v in b.inputs.consts.items())
    return "\n".join(
        [
            f"  operation: {b.name}({args})",
            "  broken: " + "; ".join(failed),
            "  pre-state:",
            pre.render("    "),
            "  changes:",
            pre.diff(post, "    "),
        ]
    )


def prove_operations(
    bound: Bound = DEFAULT_OP_BOUND,
    n: int = DEFAULT_BATCH,
    *,
    operations: Iterable[str] | None = None,
    timeout_ms: int | None = None,
    on_result: Callable[[OffloadOpProof], None] | None = None,
    assume: list[Property] | None = None,
    use_validate: bool = True,
    mutate: Mutate | None = None,
    reshape: Reshape | None = None,
) -> list[OffloadOpProof]:
    """Prove every property kept by every whole operation; one result per
    (operation, property). ``mutate``, ``reshape``: an operation-level mutant in force."""
    results: list[OffloadOpProof] = []
    for name, shape in variants(n, operations):
        b = build_op(name, bound, shape, assume, use_validate=use_validate, mutate=mutate, reshape=reshape)
        s = z3.Solver()
        if timeout_ms:
            s.set("timeout", timeout_ms)
        s.add(*b.base)
        for pid, conj in obligations(b.pre, b.outcome).items():
            t0 = time.perf_counter()
            res = OffloadOpProof(b.name, pid, True, 0.0, bound, n)
            if conj:
                s.push()
                s.add(z3.Not(z3.And([c for _l, c in conj])))
                verdict = solving.check(s, timeout_ms=timeout_ms)
                if verdict.model is not None:
                    m = verdict.model
                    failed = [lb for lb, c in conj if not z3.is_true(m.eval(c, model_completion=True))]
                    res.proven, res.counterexample = False, _render(m, b, failed)
                elif verdict.unknown:
                    res.proven, res.unknown, res.reason = False, True, verdict.reason
                s.pop()
            res.seconds = time.perf_counter() - t0
            results.append(res)
            if on_result is not None:
                on_result(res)
    return results


def outcomes(name: str, shape: str, out: OpOutcome, inputs: OpInputs) -> dict[str, z3.BoolRef]:
    """The outcomes of one operation variant that matter (each must happen in
    some state: ``check_operations_enabled``, and from the initial state:
    ``offload/op_reach.py``): a Use that stores and evicts, one whose Stored
    names a reused block, one that places its whole batch; a Tick that
    completes an offload and registers a swap-in; a whole swap-in scheduled; a
    valid Deref."""

    def any_of(tier: str, kind: str) -> z3.BoolRef:
        ws = [w for w, f in out.frags if f.tier == tier and f.kind == kind]
        return z3.Or(ws) if ws else z3.BoolVal(False)

    stored, removed = any_of("device", "stored"), any_of("device", "removed")
    fulls = shape.count("F")
    wants: dict[str, z3.BoolRef] = {}
    if name == "use" and out.value is not None:
        if fulls:
            wants["every block placed"] = out.value == len(shape)
            wants["a device Stored"] = stored
        if "F" in shape[:-1]:
            wants["a device Stored and an eviction"] = z3.And(stored, removed)
        if fulls >= 2:
            wants["a Stored whose parent is a block it reused"] = z3.And(
                stored, out.stored_parent != inputs.consts["op_parent"]
            )
    if name == "tick":
        wants["a Stored"] = z3.Or(stored, any_of("host_pinned", "stored"))
    if (name, shape) == ("tick", "swap_in job"):
        regs = [z3.If(w, 1, 0) for w, f in out.frags if f.tier == "device" and f.kind == "stored"]
        wants["a job registers two blocks"] = z3.Sum(regs) >= 2
    if name == "swap_in" and out.value is not None:
        wants["the whole swap-in scheduled"] = out.value == len(shape)
    if name in ("deref", "promote"):
        wants["the operation is valid"] = out.valid
    return wants


def check_operations_enabled(bound: Bound = DEFAULT_OP_BOUND, n: int = DEFAULT_BATCH) -> list[str]:
    """Sanity: the operation-level hypothesis is satisfiable for every
    variant, and the outcomes that matter happen in some covered state (a Use
    that stores and evicts, one whose Stored names a reused block, one that
    places its whole batch; a Tick that completes an offload and registers a
    swap-in; a whole swap-in scheduled; a valid Deref), so the
    operation-level proofs are not vacuous."""
    problems: list[str] = []
    for name, shape in variants(n):
        b = build_op(name, bound, shape)
        s = z3.Solver()
        s.add(*b.base)
        wants = {"enabled": z3.BoolVal(True), **outcomes(name, shape, b.outcome, b.inputs)}
        for what, cond in wants.items():
            s.push()
            s.add(cond)
            if not solving.check(s).sat:
                problems.append(f"operation {b.name}: never {what}")
            s.pop()
    return problems


def operation_rows(
    emit: Callable[[list[str]], None],
    bound: Bound = DEFAULT_OP_BOUND,
    n: int = DEFAULT_BATCH,
    *,
    sanity: bool = True,
    timeout_ms: int | None = None,
) -> list[str]:
    """The operation-level rows of ``kvspec prove``: one per property (proven
    when every operation variant keeps it), then ``SANITY-OPERATIONS``.
    Prints through ``emit([id, result, where, time])``; returns the problems
    found (each with its counterexample)."""
    where = f"operation: {bound}, batches <= {n}"
    by_prop: dict[str, list[OffloadOpProof]] = {}
    for r in prove_operations(bound, n, timeout_ms=timeout_ms):
        by_prop.setdefault(r.property_id, []).append(r)
    problems: list[str] = []
    for pid, rs in by_prop.items():
        bad = [r for r in rs if not r.proven]
        verdict = "proven" if not bad else ("unknown" if all(r.unknown for r in bad) else "counterexample")
        emit([pid, verdict, where, f"{sum(r.seconds for r in rs):.2f}s"])
        for r in bad:
            what = r.counterexample or "the solver gave up (unknown)"
            problems.append(f"{pid} not kept by the operation {r.operation}:\n{what}")
    if sanity:
        t0 = time.perf_counter()
        found = check_operations_enabled(bound, n)
        emit(["SANITY-OPERATIONS", "ok" if not found else "FAILED", where, f"{time.perf_counter() - t0:.2f}s"])
        problems += found
    return problems
