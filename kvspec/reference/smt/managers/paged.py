"""``INV-PAGED-REFS``: the paged allocator's block accounting, proven inductive with z3.

The universe: a device pool of ``device`` blocks, a host pool of ``host``
blocks, ``holders`` holder slots (a live sequence or a prefix-cache entry;
for reference counts the two are alike) of at most ``length`` logical blocks
each. A state is fully symbolic: every holder's liveness, pool, length and
block table, every block's reference count and free bit.

The invariant, per pool and block: the reference count equals the number of
table entries of live holders in that pool naming the block, and the block
is free exactly when that count is zero (so free + in use = the pool's size:
``PAGED-CONSERVE``, ``PAGED-REFCOUNT``). For each operation of the profile
(allocate, fork / store or match a prefix, copy-on-write, swap out, swap in,
free / evict), from any state satisfying the invariant, the operation's
successor satisfies it: ``unsat`` of the negation is the proof.

The same encoding of the ferrum seed's ``swap_out`` (each device block loses
the sequence's hold and a host block is taken, but the block table still
names the device blocks) and of its copy in ``extend`` (fresh blocks taken
and installed nowhere) yields a counterexample: those rows must be refuted,
so the proof cannot pass vacuously.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import z3

from kvspec.reference.smt import solving


@dataclass(frozen=True)
class PagedBound:
    device: int = 3
    host: int = 2
    holders: int = 3
    length: int = 2

    def __str__(self) -> str:
        return f"{self.device}+{self.host} blocks, {self.holders}x{self.length}"


@dataclass
class PState:
    live: list[z3.BoolRef]
    on_device: list[z3.BoolRef]
    length: list[z3.ArithRef]
    table: list[list[z3.ArithRef]]
    refs_d: list[z3.ArithRef]
    refs_h: list[z3.ArithRef]
    free_d: list[z3.BoolRef]
    free_h: list[z3.BoolRef]


def fresh(b: PagedBound, p: str) -> PState:
    k, n = range(b.holders), range(b.length)
    return PState(
        live=[z3.Bool(f"{p}live{i}") for i in k],
        on_device=[z3.Bool(f"{p}dev{i}") for i in k],
        length=[z3.Int(f"{p}len{i}") for i in k],
        table=[[z3.Int(f"{p}t{i}_{j}") for j in n] for i in k],
        refs_d=[z3.Int(f"{p}rd{x}") for x in range(b.device)],
        refs_h=[z3.Int(f"{p}rh{x}") for x in range(b.host)],
        free_d=[z3.Bool(f"{p}fd{x}") for x in range(b.device)],
        free_h=[z3.Bool(f"{p}fh{x}") for x in range(b.host)],
    )


def _entries(s: PState, b: PagedBound, device: bool, blk: int) -> z3.ArithRef:
    """How many live table entries of the pool name block ``blk``."""
    terms = [
        z3.If(
            z3.And(s.live[i], s.on_device[i] == device, j < s.length[i], s.table[i][j] == blk),
            1,
            0,
        )
        for i in range(b.holders)
        for j in range(b.length)
    ]
    return z3.Sum(terms) if terms else z3.IntVal(0)


def well_formed(s: PState, b: PagedBound) -> z3.BoolRef:
    c = []
    for i in range(b.holders):
        c.append(z3.And(s.length[i] >= 0, s.length[i] <= b.length))
        for j in range(b.length):
            size = z3.If(s.on_device[i], b.device, b.host)
            c.append(z3.Implies(z3.And(s.live[i], j < s.length[i]), z3.And(s.table[i][j] >= 0, s.table[i][j] < size)))
    return z3.And(c)


def invariant(s: PState, b: PagedBound) -> z3.BoolRef:
    c = [well_formed(s, b)]
    for device, refs, free in ((True, s.refs_d, s.free_d), (False, s.refs_h, s.free_h)):
        for x in range(len(refs)):
            c.append(refs[x] == _entries(s, b, device, x))
            c.append(free[x] == (refs[x] == 0))
    return z3.And(c)


def _copy(s: PState) -> PState:
    return PState(
        list(s.live),
        list(s.on_device),
        list(s.length),
        [list(r) for r in s.table],
        list(s.refs_d),
        list(s.refs_h),
        list(s.free_d),
        list(s.free_h),
    )


def _take(pool_free: list[z3.BoolRef], choice: z3.ArithRef) -> z3.BoolRef:
    """``choice`` names a free block of the pool."""
    return z3.Or([z3.And(choice == x, f) for x, f in enumerate(pool_free)])


# each transition: (pre, bound, tag) -> (post, enabled)
Transition = Callable[[PState, PagedBound, str], tuple[PState, z3.BoolRef]]


def _set_table(post: PState, k: int, j: int, v: z3.ArithRef) -> None:
    post.table[k][j] = v


def allocate(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    """Holder 0 (not live) takes ``n`` distinct free device blocks (``n`` symbolic)."""
    n = z3.Int(f"{t}n")
    picks = [z3.Int(f"{t}pick{j}") for j in range(b.length)]
    en = [z3.Not(s.live[0]), n >= 0, n <= b.length, z3.Distinct(picks) if len(picks) > 1 else z3.BoolVal(True)]
    for j, pk in enumerate(picks):
        en.append(z3.Implies(j < n, _take(s.free_d, pk)))
    post = _copy(s)
    post.live[0], post.on_device[0], post.length[0] = z3.BoolVal(True), z3.BoolVal(True), n
    post.table[0] = list(picks)
    for x in range(b.device):
        taken = z3.Or([z3.And(j < n, pk == x) for j, pk in enumerate(picks)])
        post.refs_d[x] = z3.If(taken, 1, s.refs_d[x])
        post.free_d[x] = z3.If(taken, z3.BoolVal(False), s.free_d[x])
    return post, z3.And(en)


def extend(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    """Holder 0 (live, on device) appends ``m`` distinct free device blocks to its table."""
    m = z3.Int(f"{t}m")
    picks = [z3.Int(f"{t}pick{j}") for j in range(b.length)]
    en = [s.live[0], s.on_device[0], m >= 0, s.length[0] + m <= b.length]
    if len(picks) > 1:
        en.append(z3.Distinct(picks))
    post = _copy(s)
    post.length[0] = s.length[0] + m
    new_at = [z3.And(j >= s.length[0], j < s.length[0] + m) for j in range(b.length)]
    for j, pk in enumerate(picks):
        en.append(z3.Implies(new_at[j], _take(s.free_d, pk)))
        post.table[0][j] = z3.If(new_at[j], pk, s.table[0][j])
    for x in range(b.device):
        taken = z3.Or([z3.And(new_at[j], pk == x) for j, pk in enumerate(picks)])
        post.refs_d[x] = z3.If(taken, 1, s.refs_d[x])
        post.free_d[x] = z3.If(taken, z3.BoolVal(False), s.free_d[x])
    return post, z3.And(en)


def fork(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    """Holder 1 (not live) shares the first ``n`` blocks of holder 0 (live, on device)."""
    n = z3.Int(f"{t}n")
    en = z3.And(s.live[0], s.on_device[0], z3.Not(s.live[1]), n >= 0, n <= s.length[0])
    post = _copy(s)
    post.live[1], post.on_device[1], post.length[1] = z3.BoolVal(True), z3.BoolVal(True), n
    post.table[1] = list(s.table[0])
    for x in range(b.device):
        shared = z3.Sum([z3.If(z3.And(j < n, s.table[0][j] == x), 1, 0) for j in range(b.length)])
        post.refs_d[x] = s.refs_d[x] + shared
    return post, en


def cow(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    """Holder 0 writes logical block ``j0`` (0): if shared, a copy replaces it in its table."""
    nb = z3.Int(f"{t}nb")
    old = s.table[0][0]
    shared = z3.Or([z3.And(old == x, s.refs_d[x] > 1) for x in range(b.device)])
    en = z3.And(s.live[0], s.on_device[0], s.length[0] >= 1, z3.Implies(shared, _take(s.free_d, nb)))
    post = _copy(s)
    post.table[0][0] = z3.If(shared, nb, old)
    for x in range(b.device):
        post.refs_d[x] = z3.If(
            z3.And(shared, x == nb), 1, z3.If(z3.And(shared, old == x), s.refs_d[x] - 1, s.refs_d[x])
        )
        post.free_d[x] = z3.If(z3.And(shared, x == nb), z3.BoolVal(False), s.free_d[x])
    return post, en


def _swap(s: PState, b: PagedBound, t: str, *, out: bool, seed: bool = False) -> tuple[PState, z3.BoolRef]:
    """Holder 0 moves to the other pool: a fresh block per entry, one holder less on each source block."""
    src_refs, dst_refs = (s.refs_d, s.refs_h) if out else (s.refs_h, s.refs_d)
    dst_free = s.free_h if out else s.free_d
    picks = [z3.Int(f"{t}pick{j}") for j in range(b.length)]
    en = [s.live[0], s.on_device[0] == out]
    if len(picks) > 1:
        en.append(z3.Distinct(picks))
    for j, pk in enumerate(picks):
        en.append(z3.Implies(j < s.length[0], _take(dst_free, pk)))
    post = _copy(s)
    if not seed:  # the seed leaves the sequence's block table as it was
        post.on_device[0] = z3.BoolVal(not out)
        post.table[0] = list(picks)
    new_src, new_src_free, new_dst, new_dst_free = [], [], [], []
    for x in range(len(src_refs)):
        mine = z3.Sum([z3.If(z3.And(j < s.length[0], s.table[0][j] == x), 1, 0) for j in range(b.length)])
        r = src_refs[x] - mine
        new_src.append(r)
        new_src_free.append(r == 0)
    for x in range(len(dst_refs)):
        taken = z3.Or([z3.And(j < s.length[0], pk == x) for j, pk in enumerate(picks)])
        new_dst.append(z3.If(taken, 1, dst_refs[x]))
        new_dst_free.append(z3.If(taken, z3.BoolVal(False), dst_free[x]))
    if out:
        post.refs_d, post.free_d, post.refs_h, post.free_h = new_src, new_src_free, new_dst, new_dst_free
    else:
        post.refs_h, post.free_h, post.refs_d, post.free_d = new_src, new_src_free, new_dst, new_dst_free
    return post, z3.And(en)


def swap_out(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    return _swap(s, b, t, out=True)


def swap_in(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    return _swap(s, b, t, out=False)


def seed_swap_out(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    return _swap(s, b, t, out=True, seed=True)


def _free(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    """Holder 0 ends: one holder less on each of its blocks."""
    post = _copy(s)
    post.live[0] = z3.BoolVal(False)
    for refs, free, device in ((post.refs_d, post.free_d, True), (post.refs_h, post.free_h, False)):
        for x in range(len(refs)):
            mine = z3.Sum(
                [
                    z3.If(z3.And(s.on_device[0] == device, j < s.length[0], s.table[0][j] == x), 1, 0)
                    for j in range(b.length)
                ]
            )
            r = refs[x] - mine
            refs[x] = r
            free[x] = r == 0
    return post, s.live[0]


def free(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    return _free(s, b, t)


def seed_extend_copy(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    """The seed's copy-on-write in ``extend``: a fresh device block taken and installed nowhere."""
    nb = z3.Int(f"{t}nb")
    post = _copy(s)
    for x in range(b.device):
        post.refs_d[x] = z3.If(nb == x, 1, s.refs_d[x])
        post.free_d[x] = z3.If(nb == x, z3.BoolVal(False), s.free_d[x])
    return post, z3.And(s.live[0], s.on_device[0], _take(s.free_d, nb))


TRANSITIONS: dict[str, Transition] = {
    "allocate": allocate,
    "extend": extend,
    "fork/prefix share": fork,
    "write (copy-on-write)": cow,
    "swap_out": swap_out,
    "swap_in": swap_in,
    "free/prefix evict": free,
}
#: the seed's paths, which must be refuted
SEED_TRANSITIONS: dict[str, Transition] = {"seed swap_out": seed_swap_out, "seed extend copy": seed_extend_copy}


@dataclass
class PagedProof:
    transition: str
    proven: bool
    seconds: float
    counterexample: str | None = None
    unknown: bool = False
    #: why z3's answer is unknown (``solving.Answer.reason``)
    reason: str = ""


def check(name: str, tr: Transition, b: PagedBound, timeout_ms: int | None = None) -> PagedProof:
    t0 = time.perf_counter()
    pre = fresh(b, "pre_")
    post, enabled = tr(pre, b, "x_")
    solver = z3.Solver()
    if timeout_ms:
        solver.set("timeout", timeout_ms)
    solver.add(invariant(pre, b), enabled, z3.Not(invariant(post, b)))
    res = solving.check(solver, timeout_ms=timeout_ms)
    cex = None
    if res.model is not None:
        m = res.model
        before = [m.eval(v, model_completion=True) for v in [*pre.refs_d, *pre.refs_h]]
        after = [m.eval(v, model_completion=True) for v in [*post.refs_d, *post.refs_h]]
        cex = f"reference counts (device blocks, then host) before {before}, after {after}"
    return PagedProof(name, res.unsat, time.perf_counter() - t0, cex, res.unknown, res.reason)


def initial_holds(b: PagedBound) -> solving.Answer:
    """unsat: the initial state satisfies the invariant."""
    s = fresh(b, "init_")
    init = z3.And(
        [z3.Not(x) for x in s.live]
        + [r == 0 for r in [*s.refs_d, *s.refs_h]]
        + list(s.free_d)
        + list(s.free_h)
        + [ln == 0 for ln in s.length]
    )
    solver = z3.Solver()
    solver.add(init, z3.Not(invariant(s, b)))
    return solving.check(solver)


def prove_paged(
    b: PagedBound = PagedBound(), transitions: dict[str, Transition] | None = None, timeout_ms: int | None = None
) -> tuple[list[PagedProof], list[PagedProof]]:
    """(the profile's transitions, all to be proven; the seed's, all to be refuted).
    ``transitions``: the table to prove (a mutant replaces one)."""
    init = initial_holds(b)
    ok = [PagedProof("initial state", init.unsat, 0.0, None, init.unknown, init.reason)]
    ok += [check(n, tr, b, timeout_ms) for n, tr in (TRANSITIONS if transitions is None else transitions).items()]
    return ok, [check(n, tr, b, timeout_ms) for n, tr in SEED_TRANSITIONS.items()]
