"""The vllm step encoding (``vllm/copies.py``) simulates the operation encoding (``vllm/ops.py``).

``copies.py`` proves INV-VLLM-COPIES one block at a time with every event
applied at once; ``ops.py`` is the encoding bound to the model both ways
(``vllm/equivalence.py``). This module binds the first to the second, so the
step proofs are about the model too: every step of the operation encoding,
from any state satisfying its invariants, is matched by zero, one or two
steps of the step encoding on the *projection* of the state: the pool as it
is (state, hash, owners of every block, the copy counts and the block
census) and the router's counts as they will be once the pending Removed and
Stored are published (``view - prem + psto``). ``use(begin)``, ``use(check)``
and ``use(close)`` are stutters (the projection does not move); a fresh block
placed in a free block is ``use(new)`` or ``use(partial)``, one that evicts an
unowned copy is ``evict`` then that step; a hit, Promote, Deref and Reset are
their namesakes. Each obligation (the matching steps enabled, their
post-state equal to the projection of the operation step's) is proven by z3
for any pool size and any hashes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import z3

from kvspec.reference.smt.solving import decide
from kvspec.reference.smt.vllm import copies, ops
from kvspec.reference.smt.vllm.copies import V_CACHED, V_FREE, VState


def project(S: ops.VllmOpState) -> VState:
    """The step encoding's view of an operation-encoding state."""
    x = z3.Int("xproj")
    view = z3.Lambda([x], S.view[x] - S.prem[x] + S.psto[x])
    cnt = {k: S.cnt[k] for k in copies.STATES}
    n = S.cnt["free"] + S.cnt["held"] + S.cnt["cached"]
    return VState(S.st, S.hsh, S.own, S.ccnt, view, cnt, n)


def _same(a: VState, b: VState) -> list[z3.BoolRef]:
    return [
        a.st == b.st,
        a.hsh == b.hsh,
        a.own == b.own,
        a.ccnt == b.ccnt,
        a.view == b.view,
        *[a.cnt[k] == b.cnt[k] for k in copies.STATES],
    ]


def _matched(name: str, step: ops.VllmOpStep, inp: dict[str, z3.ExprRef]) -> list[tuple[z3.BoolRef, z3.BoolRef]]:
    """The step encoding's steps for ``step`` are enabled and end in its projection, as
    (case, conjunct) obligations (one small query each: stable verdicts)."""
    pre, post = project(step.pre), project(step.post)
    true = z3.BoolVal(True)
    if name in ("use(begin)", "use(check)", "use(close)"):
        return [(true, c) for c in _same(pre, post)]
    if name in ("use(new)", "use(partial)"):
        b = inp["b"]
        evicts = step.pre.st[b] == V_CACHED
        out: list[tuple[z3.BoolRef, z3.BoolRef]] = [(z3.Not(evicts), step.pre.st[b] == V_FREE)]
        for case in (z3.Not(evicts), evicts):
            start = pre
            if z3.is_true(z3.simplify(case == evicts)):
                ev = _with_block(copies.evict, pre, b)
                out += [(case, r) for r in ev.requires]
                start = ev.post
            if name == "use(new)":
                st = _with_block(copies.use_new, start, b, h=inp["h"])
            else:
                st = _with_block(copies.use_partial, start, b)
            out += [(case, r) for r in st.requires]
            out += [(case, c) for c in _same(st.post, post)]
        return out
    target = {
        "use(hit)": copies.use_hit,
        "promote": copies.promote,
        "deref(full)": copies.deref_full,
        "deref(promoted)": copies.deref_full,
        "deref(partial)": copies.deref_partial,
        "reset": copies.reset,
    }[name]
    st = _with_block(target, pre, inp["b"], h=inp["h"])
    return [(true, c) for c in [*st.requires, *_same(st.post, post)]]


def _with_block(tr: object, S: VState, b: z3.ExprRef, h: z3.ArithRef | None = None) -> copies.VStep:
    """A step of the step encoding with its block (and hash) inputs set to ``b`` (and ``h``)."""
    step = tr(S, frozenset())  # type: ignore[operator]
    subs = [(z3.Const("in_b", copies.Block), b)]
    if h is not None:
        subs.append((z3.Int("in_h"), h))

    def sub(e: z3.ExprRef) -> z3.ExprRef:
        return z3.substitute(e, *subs)

    post = step.post
    step.requires = [sub(r) for r in step.requires]
    step.post = VState(
        sub(post.st), sub(post.hsh), sub(post.own), sub(post.ccnt), sub(post.view),
        {k: sub(v) for k, v in post.cnt.items()}, sub(post.n),
    )  # fmt: skip
    return step


@dataclass
class Simulation:
    transition: str
    verdict: str  # proven | refuted | unknown (REASON)
    seconds: float


def _obligations(hyp: list[z3.BoolRef], matched: list[tuple[z3.BoolRef, z3.BoolRef]], timeout_ms: int) -> str:
    """The verdict of one transition's obligations, one query each (``solving.decide``: a sat
    only with a model that shows it, a seed portfolio); the first refutation ends the search.
    (One query over their disjunction is not used: with the lambda-built views z3 can answer
    "sat" with a model that satisfies none of the disjuncts.)"""
    verdicts = set()
    for case, conj in matched:
        answer = decide(hyp, z3.And(case, z3.Not(conj)), timeout_ms)
        if answer.sat:
            return answer.verdict
        verdicts.add(answer.verdict)
    unknown = sorted(v for v in verdicts if v != "proven")
    return unknown[0] if unknown else "proven"


def prove_simulation(timeout_ms: int = 60_000) -> list[Simulation]:
    """One obligation per operation-encoding step: from any state of its invariants, with the
    step enabled, the matching steps of the step encoding are enabled and agree."""
    out = []
    for name in ops.TRANSITIONS:
        t0 = time.perf_counter()
        inp = ops.inputs()
        step, hyp = ops.base(name, ops.VllmOpState.fresh("pre_"), inp, frozenset(), "pre_")
        worst = _obligations(hyp, _matched(name, step, inp), timeout_ms)
        out.append(Simulation(name, worst, time.perf_counter() - t0))
    return out
