"""The radix encoding agrees with the radix model (``reference/radix.py``) on sampled operations.

The proofs in ``profile_radix.py`` are about the encoding; this binds the
encoding to the model. Random operation sequences run through ``RadixModel``;
after every operation its state is read as a page-level state (a slot per
live page, its parent page, tokens, node start, lock count; held locks at
the last page of their node; free slots in pages), and the operation is
replayed through the encoding as the steps it is made of:

- the splits it made (pages that became a node start);
- for a ``lock``, a lock step at the node it locked; for a ``request``, a
  lock step at its match (on a handle kept for requests) and, at the end,
  the unlock;
- its Removed pages as evict steps, each evicted node from its last page up;
- its Stored pages as one ``add_head`` then ``add_cont`` steps;
- a Cleared as ``reset``; an ``unlock`` as an unlock step.

Each step must be enabled in the encoding (its guard evaluates to true), and
after the operation the encoding's state must equal the model's read state,
field by field, with the router count of each page equal to the count of
the events the model published. A rejected operation must leave both
unchanged (a request refused for capacity keeps its splits). An encoding
that computes a different successor (a mutant of ``profile_radix.MUTANTS``
that changes a post-state) disagrees on some sampled sequence.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import z3

from kvspec.reference.radix import RadixModel, RadixTreeNode
from kvspec.reference.smt.radix.encoding import ROOT, STEPS, RadixBound, RState
from kvspec.spec.hashing import local_block_hash, sequence_hash
from kvspec.spec.radix_wire import (
    RadixConfig,
    RadixEvict,
    RadixInsert,
    RadixLock,
    RadixMatch,
    RadixOp,
    RadixRequest,
    RadixReset,
    RadixUnlock,
)
from kvspec.spec.wire import Removed, Stored

#: lock names the sampler uses; the last handle is the one requests lock with
NAMES = ("a", "b")


class Disagreement(AssertionError):
    """The encoding and the model differ; the message says where."""

    #: operations run when it was found (set by ``check_agreement``)
    operations: int = 0


@dataclass
class Concrete:
    """The encoding's state as Python values (one per slot)."""

    live: list[bool]
    pp: list[int]
    tok: list[int]
    head: list[bool]
    lock: list[int]
    pub: list[int]
    held: list[bool]
    at: list[int]
    free: int


def _z3(c: Concrete, b: RadixBound, cap: int, anc: list[list[bool]], dep: list[int]) -> RState:
    return RState(
        live=tuple(z3.BoolVal(x) for x in c.live),
        pp=tuple(z3.IntVal(x) for x in c.pp),
        tok=tuple(z3.IntVal(x) for x in c.tok),
        head=tuple(z3.BoolVal(x) for x in c.head),
        lock=tuple(z3.IntVal(x) for x in c.lock),
        pub=tuple(z3.IntVal(x) for x in c.pub),
        held=tuple(z3.BoolVal(x) for x in c.held),
        at=tuple(z3.IntVal(x) for x in c.at),
        free=z3.IntVal(c.free),
        cap=z3.IntVal(cap),
        dep=tuple(z3.IntVal(x) for x in dep),
        anc=tuple(tuple(z3.BoolVal(x) for x in row) for row in anc),
    )


def _ghosts(c: Concrete) -> tuple[list[list[bool]], list[int]]:
    """The ancestry and depth ghosts of a concrete tree (computed, not tracked)."""
    n = len(c.live)
    anc = [[False] * n for _ in range(n)]
    dep = [0] * n
    for p in range(n):
        if not c.live[p]:
            continue
        x, d = p, 0
        while x != ROOT:
            anc[p][x] = True
            x = c.pp[x]
            d += 1
        dep[p] = d - 1
    return anc, dep


def _val(e: z3.ExprRef) -> int | bool:
    v = z3.simplify(e)
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    if z3.is_int_value(v):
        return int(v.as_long())
    raise Disagreement(f"the encoding left a term unevaluated: {v}")


class Replayer:
    """Runs the model and the encoding side by side on one configuration."""

    def __init__(self, page: int, pages: int, tw: frozenset[str] = frozenset()) -> None:
        self.page, self.pages, self.tw = page, pages, tw
        self.bound = RadixBound(pages=pages, handles=len(NAMES) + 1)
        self.model = RadixModel(RadixConfig(page_size=page, capacity=page * pages))
        self.slot: dict[int, int] = {}  # sequence hash -> page slot
        self.handle: dict[str, int] = {}
        self.router: dict[int, int] = {}  # sequence hash -> Stored minus Removed
        n, k = pages, self.bound.handles
        self.enc = Concrete([False] * n, [ROOT] * n, [0] * n, [False] * n, [0] * n, [0] * n, [False] * k, [ROOT] * k, n)
        self.trace: list[str] = []

    # ------------------------------------------------------------ reading
    def _read(self) -> Concrete:
        """The model's state read at page level, in the encoding's slots."""
        n, k = self.pages, self.bound.handles
        c = Concrete([False] * n, [ROOT] * n, [0] * n, [False] * n, [0] * n, [0] * n, [False] * k, [ROOT] * k, 0)
        for node in self.model.nodes():
            assert node.parent is not None
            parent = node.parent.last_hash()
            for i, (h, local) in enumerate(node.pages):
                s = self.slot[h]
                c.live[s], c.tok[s], c.head[s], c.lock[s] = True, local, i == 0, node.lock_ref
                c.pp[s] = ROOT if parent is None else self.slot[parent]
                c.pub[s] = self.router.get(h, 0)
                parent = h
        for name, node in self.model.locks.items():
            j = self.handle[name]
            c.held[j] = True
            c.at[j] = self._tail(node)
        c.free = self.model.free // self.page
        return c

    def _tail(self, node: RadixTreeNode) -> int:
        h = node.last_hash()
        return ROOT if h is None else self.slot[h]

    # ------------------------------------------------------------ stepping
    def _step(self, name: str, **choices: int) -> None:
        pre = self.enc
        anc, dep = _ghosts(pre)
        step = STEPS[name](_z3(pre, self.bound, self.pages, anc, dep), self.tw)
        subst = [(z3.Int(f"in_{k}"), z3.IntVal(v)) for k, v in choices.items()]

        def ev(e: z3.ExprRef) -> int | bool:
            return _val(z3.substitute(e, *subst) if subst else e)

        self.trace.append(f"{name}({', '.join(f'{k}={v}' for k, v in choices.items())})")
        for r in step.requires:
            if ev(r) is not True:
                raise Disagreement(f"the model did {self.trace[-1]}, which the encoding does not allow: {r}")
        q = step.post
        self.enc = Concrete(
            [bool(ev(x)) for x in q.live],
            [int(ev(x)) for x in q.pp],
            [int(ev(x)) for x in q.tok],
            [bool(ev(x)) for x in q.head],
            [int(ev(x)) for x in q.lock],
            [int(ev(x)) for x in q.pub],
            [bool(ev(x)) for x in q.held],
            [int(ev(x)) for x in q.at],
            int(ev(q.free)),
        )

    def _free_slot(self) -> int:
        return next(i for i in range(self.pages) if not self.enc.live[i])

    def _match_end(self, key: list[int], matched: int) -> int:
        """The page a match of ``matched`` tokens of ``key`` ends at (ROOT: none)."""
        h: int | None = None
        for start in range(0, matched, self.page):
            h = sequence_hash(h, local_block_hash(key[start : start + self.page]))
        return ROOT if h is None else self.slot[h]

    def apply(self, op: RadixOp) -> None:
        """One operation on both sides, then compare."""
        before = self._read()
        out = self.model.step(op)
        self.trace.append(f"-- {op.model_dump_json()}")
        # splits: a live page of both states that became a node start
        heads_after = {n.pages[0][0] for n in self.model.nodes()}
        for ev in out.events:  # a node split by this operation's match, then evicted by it
            if isinstance(ev.data, Removed):
                heads_after |= {c[0] for c in self._chunks(ev.data.removed.block_hashes)}
        for h, s in list(self.slot.items()):
            if before.live[s] and not before.head[s] and h in heads_after:
                self._step("split", p=s)
        if out.error is not None:
            self._compare(op)
            return
        if isinstance(op, RadixLock):
            j = next(i for i in range(len(NAMES)) if i not in self.handle.values())
            self.handle[op.name] = j
            self._step("lock", k=j, e=self._tail(self.model.locks[op.name]))
        req = len(NAMES)
        if isinstance(op, RadixRequest):
            cut = (len(op.prompt) - 1) // self.page * self.page
            self._step("lock", k=req, e=self._match_end(op.prompt, min(out.value or 0, cut)))
        for ev in out.events:
            if isinstance(ev.data, Removed):
                self._evict(ev.data.removed.block_hashes)
            elif isinstance(ev.data, Stored):
                d = ev.data.stored
                e = ROOT if d.parent_hash is None else self.slot[d.parent_hash]
                for i, blk in enumerate(d.blocks):
                    q = self._free_slot()
                    self._step("add_head" if i == 0 else "add_cont", q=q, e=e, t=blk.tokens_hash)
                    self.slot[blk.block_hash] = q
                    self.router[blk.block_hash] = self.router.get(blk.block_hash, 0) + 1
                    e = q
            else:
                self._step("reset")
                self.router.clear()
                self.slot.clear()
                self.handle.clear()
        if isinstance(op, RadixRequest):
            self._step("unlock", k=req)
        if isinstance(op, RadixUnlock):
            self._step("unlock", k=self.handle.pop(op.name))
        self._compare(op)

    def _chunks(self, hashes: list[int]) -> list[list[int]]:
        """A Removed's pages cut into nodes: a node's pages chain one to the next,
        and the next node never hangs under the one before it (that one was a
        leaf when it went)."""
        chunks: list[list[int]] = []
        for h in hashes:
            if not chunks or self.enc.pp[self.slot[h]] != self.slot[chunks[-1][-1]]:
                chunks.append([])
            chunks[-1].append(h)
        return chunks

    def _evict(self, hashes: list[int]) -> None:
        """One Removed: node by node, each node from its last page up."""
        for chunk in self._chunks(hashes):
            for h in reversed(chunk):
                self._step("evict", t=self.slot[h])
                self.router[h] = self.router.get(h, 0) - 1
                if self.router[h] == 0:
                    del self.router[h]
                del self.slot[h]

    def _compare(self, op: RadixOp) -> None:
        want, got = self._read(), self.enc
        for s in range(self.pages):
            if want.live[s] != got.live[s] or want.pub[s] != got.pub[s]:
                self._fail(op, f"page slot {s}: model live={want.live[s]} router={want.pub[s]}, encoding {got}")
            if not want.live[s]:
                continue
            for f in ("pp", "tok", "head", "lock"):
                if getattr(want, f)[s] != getattr(got, f)[s]:
                    self._fail(op, f"page slot {s}: {f} is {getattr(want, f)[s]} in the model, {getattr(got, f)[s]}")
        for j in range(len(got.held)):
            if want.held[j] != got.held[j] or (want.held[j] and want.at[j] != got.at[j]):
                self._fail(
                    op, f"lock handle {j}: model {want.held[j]}@{want.at[j]}, encoding {got.held[j]}@{got.at[j]}"
                )
        if want.free != got.free:
            self._fail(op, f"free pages: model {want.free}, encoding {got.free}")

    def _fail(self, op: RadixOp, what: str) -> None:
        raise Disagreement(f"after {op.model_dump_json()}: {what}\nsteps:\n  " + "\n  ".join(self.trace[-12:]))


def _tokens(rng: random.Random, most: int) -> list[int]:
    return [rng.randint(1, 3) for _ in range(rng.randint(0, most))]


def sample_ops(rng: random.Random, length: int) -> Iterator[RadixOp]:
    """Operations over a small alphabet (1-3), so prefixes are shared often."""
    for _ in range(length):
        kind = rng.choices(["match", "insert", "lock", "unlock", "evict", "reset", "request"], [2, 3, 2, 2, 2, 1, 4])[0]
        if kind == "match":
            yield RadixMatch(tokens=_tokens(rng, 6))
        elif kind == "insert":
            yield RadixInsert(tokens=_tokens(rng, 6))
        elif kind == "lock":
            yield RadixLock(name=rng.choice(NAMES), tokens=_tokens(rng, 6))
        elif kind == "unlock":
            yield RadixUnlock(name=rng.choice(NAMES))
        elif kind == "evict":
            yield RadixEvict(tokens=rng.randint(0, 4))
        elif kind == "reset":
            yield RadixReset()
        else:
            yield RadixRequest(prompt=[rng.randint(1, 3), *_tokens(rng, 5)], output=[1, *_tokens(rng, 2)])


def sample_locked_splits(rng: random.Random, length: int) -> Iterator[RadixOp]:
    """A held lock on a whole node, then a walk that ends inside it (a match,
    an insert, a lock or a request of a cut of its key), then random
    operations: the split of a locked node, which the uniform sampler rarely
    draws (a split that forgot the lock count went unseen in 240 of them)."""
    key = [rng.randint(1, 3) for _ in range(rng.randint(2, 6))]
    yield RadixInsert(tokens=key)
    yield RadixLock(name=NAMES[0], tokens=key)
    cut, other = key[: rng.randint(1, len(key) - 1)], [rng.randint(4, 5)]
    kind = rng.choice(["match", "insert", "lock", "request"])
    if kind == "match":
        yield RadixMatch(tokens=cut)
    elif kind == "insert":
        yield RadixInsert(tokens=cut + other)
    elif kind == "lock":
        yield RadixLock(name=NAMES[1], tokens=cut)
    else:
        yield RadixRequest(prompt=cut + other + [1], output=[1])
    yield from sample_ops(rng, length - 3)


@dataclass(frozen=True)
class AgreementRun:
    sequences: int
    operations: int
    steps: int


def check_agreement(
    sequences: int = 40, length: int = 12, seed: int = 0, tw: frozenset[str] = frozenset()
) -> AgreementRun:
    """Run ``sequences`` random sequences of ``length`` operations at page sizes
    1 and 2 (capacity 4 to 8 pages), then a quarter as many that split a
    locked node first (``sample_locked_splits``, their own random stream, so
    the first part draws what it drew before they existed); raise
    ``Disagreement`` at the first difference."""
    rng, aimed = random.Random(seed), random.Random(seed + 1_000_003)
    plan = [(rng, sample_ops)] * sequences + [(aimed, sample_locked_splits)] * max(1, sequences // 4)
    ops = steps = 0
    for i, (src, sampler) in enumerate(plan):
        r = Replayer(page=1 + i % 2, pages=src.randint(4, 8), tw=tw)
        for op in sampler(src, length):
            try:
                r.apply(op)
            except Disagreement as e:
                e.operations = ops + 1
                raise
            ops += 1
        steps += sum(1 for t in r.trace if not t.startswith("--"))
    return AgreementRun(len(plan), ops, steps)


def catches(mutant: str, sequences: int = 40, seed: int = 0) -> Disagreement | None:
    """The disagreement the sampled sequences find with a mutant's encoding
    (None: not caught); its ``operations`` say how many it took."""
    try:
        check_agreement(sequences=sequences, seed=seed, tw=frozenset({mutant}))
    except Disagreement as e:
        return e
    return None
