"""kvbm-offload: an operation mutant's counterexample as wire operations from an empty cache.

``system`` is the operation-level transition table of ``op_reach.py`` (a Use
or Deref of every batch shape up to 2 blocks, Promote, a SwapIn of 1 or 2
blocks; 3 slots, 4 hashes, any G2 capacity and hash forest) with the
operation mutant in force and the model's own choices: the LRU victim (not
any inactive block) and a whole forward Tick (every pending transfer
completes in queue order, as the model's Tick with instant transfers does,
not one unit of it). So every trace of it is a run the model can make, and
its inputs are the operations' concrete inputs. ``find`` asks for the
shortest trace from the empty cache whose last operation breaks an
operation-level row (``operations_prove.obligations``: every INV-* and
LEMMA-* row, INV-QUARANTINE's and INV-ANCHOR's operation parts, OP-IDLE,
OP-STORE-REMOVE-DISJOINT), greedy to ``GREEDY_DEPTH`` operations, then
along the sequences of ``GUIDE`` (operations fixed, inputs left to z3: an
offload completed and a swap-in scheduled lie 5-7 operations deep).
``operations`` reads the trace back as wire operations of the universe z3
chose (``agreement/sampled.Universe``: its hash forest gives every full
block's lineage hash; the k-th Tick is at ``now_ms = k``).

What such a file replays. The mutant is a bug of the encoding, which no
variant of ``adapters/mutants`` has, so the file records the reference and
the operations are a run of the rules as written (``kvspec replay`` passes
on the reference). What failed is the encoding with the mutant in force on
those operations: ``divergence`` runs them through ``EncodingLockstep`` (the
check that binds the operation encoding to ``G1Model``: state, events,
result, counters, router views, caller contracts) with the mutant in force,
and names the first operation at which the encoding departs from the model;
the file is cut after it and records it, with the mutant's rule, as its
failure. The unmutated encoding must agree on every operation, else no
replay file is written (the text file says where they part).
"""

from __future__ import annotations

from pathlib import Path

import z3

from kvspec.reference.smt.offload.agreement.sampled import (
    EncodingLockstep,
    Universe,
    deref_op,
    promote_op,
    swap_in_op,
    use_op,
)
from kvspec.reference.smt.offload.op_mutants import OffloadOpMutant
from kvspec.reference.smt.offload.op_reach import REACH_BATCH, REACH_BOUND, _Named, label
from kvspec.reference.smt.offload.operations_prove import OPERATIONS, make_use, obligations, variants
from kvspec.reference.smt.offload.ops import Chooser, Op, TickOp, apply_op
from kvspec.reference.smt.offload.state import Rigid, State
from kvspec.reference.smt.reach import Move, ReachStart, ReachTrace, System, violation
from kvspec.reference.smt.universe import NONE, Bound
from kvspec.spec.registry import KVBM_OFFLOAD
from kvspec.spec.wire import Operation, Promote, Tick

#: per solver call of the search (each depth, each guide sequence, is one call)
TIMEOUT_MS = 30_000
#: the greedy search's depth: the violations of one or two operations (a Use, a Deref) are found there
GREEDY_DEPTH = 3
TICK = "tick"


def transitions(n: int = REACH_BATCH) -> dict[str, tuple[str, str]]:
    """Label -> (operation, shape): ``op_reach``'s, with one whole forward Tick for its units."""
    out = {label(name, shape): (name, shape) for name, shape in variants(n) if name != "tick"}
    out[TICK] = ("tick", "")
    return out


def system(m: OffloadOpMutant | None = None, bound: Bound = REACH_BOUND, n: int = REACH_BATCH) -> System[State]:
    """The operation-level table with the model's choices and ``m`` in force (see the module doc)."""
    table = transitions(n)

    def start() -> ReachStart[State]:
        rigid = Rigid.fresh(bound, "cx_")
        params: dict[str, z3.ExprRef] = {"cap2": rigid.cap2, **{f"par{h}": p for h, p in enumerate(rigid.par)}}
        init = State.initial(bound, rigid)
        return ReachStart(init, rigid.domain(), lambda tag: State.fresh(bound, rigid, tag), params)

    def move(t: str, pre: State, prefix: str) -> Move:
        name, shape = table[t]
        inp = _Named(prefix)
        op: Op = TickOp(True) if name == "tick" else (
            make_use(inp, bound, shape) if name == "use" else OPERATIONS[name](inp, bound, shape)
        )  # fmt: skip
        out = apply_op(pre, op, Chooser("lru", prefix=f"{prefix}ch", mutate=m.mutate if m else None))
        if m is not None and m.reshape is not None:
            out = m.reshape(pre, op, out)
        # the LRU victim is a slot when an eviction is taken (else the rule's choice is unused)
        victims = [z3.Implies(w, z3.And(0 <= v, v < bound.slots)) for w, v in out.victims]
        enabled = z3.And([*inp.domain, *victims, *out.constraints, *out.contracts.values()] or [z3.BoolVal(True)])
        return Move(out.post, enabled, {}, dict(inp.consts), (pre, out))

    return System(
        KVBM_OFFLOAD,
        "operation (the model's choices)",
        f"{bound}, any G2 capacity and hash forest, batches <= {n}",
        list(table),
        start,
        State.equals,
        move,
        GREEDY_DEPTH,
        co_enabled=False,
    )


def broken(_t: str, mv: Move) -> z3.BoolRef:
    """The operation breaks some operation-level row (``operations_prove.obligations``)."""
    pre, out = mv.step
    return z3.Not(z3.And([c for conj in obligations(pre, out).values() for _l, c in conj]))


def _walk(*names: str) -> tuple[str, ...]:
    return names


#: fill the cache (3 slots), release two blocks, a Use that must evict: an offload is pending
_PENDING = ("use[FF]", "use[F]", "deref[FF]", "use[F]")
#: sequences of operations from the empty cache, their inputs left to z3 (see the module doc)
GUIDE: list[tuple[str, ...]] = [
    *[_walk(*_PENDING[:k]) for k in range(3, 5)],
    _walk(*_PENDING, TICK),
    _walk("use[FF]", "use[F]", "deref[FF]", "use[FF]"),
    _walk("use[FF]", "use[F]", "deref[FF]", "use[FF]", TICK),
    _walk(*_PENDING, TICK, "swap_in[F]"),
    _walk(*_PENDING, TICK, "swap_in[F]", TICK),
    _walk("use[FF]", "use[F]", "deref[FF]", "use[FF]", TICK, "swap_in[FF]"),
    _walk("use[FF]", "use[F]", "deref[FF]", "use[FF]", TICK, "swap_in[FF]", TICK),
    _walk("use[FF]", "use[F]", "deref[FF]", "use[FF]", TICK, "swap_in[F]", TICK),
]


def find(
    m: OffloadOpMutant | None, depth: int = GREEDY_DEPTH, timeout_ms: int = TIMEOUT_MS, why: list[str] | None = None
) -> ReachTrace | None:
    """The shortest trace from the empty cache (greedy to ``depth`` operations) whose last operation breaks a row."""
    trace, _ = violation(system(m), broken, depth=depth, timeout_ms=timeout_ms, why=why)
    return trace


def guided(m: OffloadOpMutant | None, timeout_ms: int = TIMEOUT_MS, why: list[str] | None = None) -> ReachTrace | None:
    """The shortest trace along the sequences of ``GUIDE`` one of whose operations breaks a row."""
    from kvspec.reference.smt import solving
    from kvspec.reference.smt.reach import _Unrolling

    sysm = system(m)
    best: ReachTrace | None = None
    for seq in sorted(GUIDE, key=len):
        if best is not None and len(best) <= len(seq):
            continue
        s = z3.Solver()
        s.set("timeout", timeout_ms)
        u = _Unrolling(sysm, s)
        while len(u.choice) < len(seq):
            u.extend()
        for j, t in enumerate(seq, 1):
            s.add(u.takes(j, t))
        bad = {j: broken(t, u.moves[j - 1][t]) for j, t in enumerate(seq, 1)}
        a = solving.check(s, z3.Or(list(bad.values())), timeout_ms=timeout_ms)
        if a.model is None:
            if a.unknown and why is not None:
                why.append(a.reason)
            continue
        last = next(j for j in bad if z3.is_true(a.model.eval(bad[j], model_completion=True)))
        best = u.trace(a.model, last)
    return best


def universe(trace: ReachTrace, slots: int = REACH_BOUND.slots) -> Universe:
    """The concrete universe z3 chose for ``trace``: its G2 capacity and hash forest; the LRU policy."""
    par = tuple(int(trace.params[f"par{h}"]) for h in range(REACH_BOUND.hashes))
    return Universe(slots=slots, par=par, cap2=int(trace.params["cap2"]), policy="lru")


def _ref(inputs: dict[str, int | bool | str], kind: str, i: int) -> int | str:
    return int(inputs[f"op_h{i}"]) if kind == "F" else f"u{inputs[f'op_u{i}']}"


def operations(trace: ReachTrace, u: Universe) -> list[Operation]:
    """The wire operations a trace stands for (see the module doc)."""
    table = transitions()
    out: list[Operation] = []
    ticks = 0
    for st in trace.steps:
        name, shape = table[st.transition]
        i = st.inputs
        if name == "use":
            p = int(i["op_parent"])
            out.append(use_op(u, [_ref(i, k, n) for n, k in enumerate(shape)], None if p == NONE else p))
        elif name == "deref":
            out.append(deref_op([_ref(i, k, n) for n, k in enumerate(shape)]))
        elif name == "promote":
            h, p = int(i["op_h"]), int(i["op_p"])
            base = promote_op(u, f"u{i['op_u']}", h)
            out.append(Promote(**{**base.model_dump(), "parent_hash": None if p == NONE else p}))
        elif name == "swap_in":
            p = int(i["op_parent"])
            out.append(swap_in_op(u, [int(i[f"op_h{n}"]) for n in range(len(shape))], None if p == NONE else p))
        else:
            ticks += 1
            out.append(Tick(now_ms=float(ticks)))
    return out


def divergence(ops: list[Operation], u: Universe, m: OffloadOpMutant | None) -> tuple[int, str] | None:
    """The first operation (its index, and what differs) at which the operation encoding with ``m``
    in force departs from the model (``EncodingLockstep``); None when it agrees on every one."""
    ls = EncodingLockstep(u)
    if m is not None:
        ls.mutate, ls.reshape = m.mutate, m.reshape
    for n, op in enumerate(ops):
        problems = ls.step(op)
        if problems:
            return n, "; ".join(f"{p.what}: model {p.model}, encoding {p.encoding}" for p in problems)[:600]
    return None


def emit(folder: Path, m: OffloadOpMutant, *, name: str | None = None, guide: bool = True) -> list[str]:
    """Search (greedy, then along ``GUIDE``), write the replay file (or the statement that none
    was found within the bound) into ``folder``, and return the lines to print."""
    from kvspec.reference.smt import counterexamples as cx

    name = name or f"kvbm-offload-{m.name.replace(':', '-')}"
    bound = f"{REACH_BOUND}, any G2 capacity and hash forest, batches <= {REACH_BATCH}"
    why: list[str] = []
    trace = find(m, why=why)
    if trace is None and guide:
        trace = guided(m, why=why)
    head = f"{name}: {m.description} (breaks {m.rule}; operation row {m.expect})"
    if trace is None:
        kind = f"unknown ({why[0]})" if why else "induction only"
        searched = f"no trace of <= {GREEDY_DEPTH} operations breaks a row"
        if guide:
            searched += f", nor one along the {len(GUIDE)} sequences of offload/counterexample.GUIDE"
        statement = (
            f"{kind}: from the empty cache ({bound}, the model's choices) {searched}; the induction"
            " counterexample's pre-state is not shown reachable within that bound"
        )
        path = cx.not_reachable(folder, name, f"{head}\n{statement}")
        return [statement, f"  (written to {path})"]
    u = universe(trace)
    ops = operations(trace, u)
    found = [
        f"reachable: from the empty cache ({bound}; z3 chose G2 capacity {u.cap2}, parents {list(u.par)}),"
        f" {len(ops)} operations, the last breaks an operation row ({m.expect}):",
        trace.render("  "),
    ]
    unmutated = divergence(ops, u, None)
    if unmutated is not None:
        n, diff = unmutated
        text = [
            head,
            *found,
            f"not a replay file: the unmutated encoding departs from the model at operation {n}: {diff}",
        ]
        path = cx.not_reachable(folder, name, "\n".join(text))
        return [*text[1:], f"  (written to {path})"]
    departs = divergence(ops, u, m)
    if departs is None:
        note = (
            f"  the encoding with {m.name} makes the model's move on every operation as well: the broken row is"
            " one the comparison with the model does not see, so the reference and the mutated encoding do not"
            " differ on these operations"
        )
    else:
        n, diff = departs
        ops = ops[: n + 1]
        note = f"  the encoding with {m.name} departs from the model at operation {n}: {diff}"
    what = (
        f"{m.description}: an encoding bug no adapter has; the reference passes these operations, the"
        f" operation encoding with {m.name} in force "
        + (f"departs from the model at operation {departs[0]}" if departs else "breaks the row on them")
    )
    w = cx.write(folder, name, u.config(), ops, rule=m.rule, what=what)
    return [*found, note, *w.lines()]


__all__ = ["GUIDE", "broken", "divergence", "emit", "find", "guided", "operations", "system", "universe"]
