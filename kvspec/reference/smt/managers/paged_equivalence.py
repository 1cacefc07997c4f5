"""paged: the INV-PAGED-REFS encoding and the model have the same successors (``EQUIV-PAGED``).

Every state ``reference/paged.py`` reaches from an empty allocator of 2
device and 2 host blocks (block size 1, one prefix entry at most) within the
explored depth, over an alphabet naming the sequences ``a`` and ``b`` and the
prefix ``p``: allocate of 0-2 tokens, extend by 0-2, fork (all, 0 or 1
blocks) either way, a write at position 0, swap out, swap in, free, store
the prefix from either sequence (1 or 2 blocks), match it into either. In
each state, for each operation, the model's outcome set must equal the
encoding's (``managers/paged.py``, the transitions ``kvspec prove
--profile paged`` proves) from the same concrete pre-state.

The encoding acts on holder 0 (``fork`` also on holder 1), a sequence and a
prefix entry alike: the operation's names are put at those indices (a
store or a match is a share from the sequence to the prefix or back, a
free a free), the operation's argument (tokens, blocks) is fixed and the
blocks the encoding takes are left free. The model takes the lowest free
block, the spec any: an outcome is the state up to a renaming of each
pool's block ids (every name's pool and block table, every block's
reference count and free bit), so a step that takes a held block, leaves
one out of a table or keeps a reference differs, while the id it picks does
not. A refused operation has no outcome.

Not in the encoding, so not compared: the blocks' contents (a write's
value), the prefix cache's LRU order and its eviction (``evict_prefixes``,
and a store into a full cache; with one key the cache is never full when a
store is accepted), and the pressure (a function of the free count).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import z3

from kvspec.reference.paged import PagedModel, Seq
from kvspec.reference.smt.equivalence import all_values
from kvspec.reference.smt.managers import paged
from kvspec.reference.smt.managers.paged import PagedBound, PState, Transition
from kvspec.spec.manager_wire import (
    PagedAllocate,
    PagedConfig,
    PagedExtend,
    PagedFork,
    PagedFree,
    PagedMatchPrefix,
    PagedOp,
    PagedStorePrefix,
    PagedSwapIn,
    PagedSwapOut,
    PagedWrite,
)
from kvspec.spec.registry import PAGED

SEQS = ("a", "b")
KEY = "p"
NAMES = (*SEQS, KEY)
BOUND = PagedBound(device=2, host=2, holders=3, length=2)

#: one name's part of an outcome: (live, on device, block table)
Entry = tuple[bool, bool, tuple[int, ...]]


def fork_shares_all(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    """Encoding mutant: a fork shares every block of its source, whatever ``n`` says
    (the reference counts stay right: only the comparison with the model finds it)."""
    n = z3.Int(f"{t}n")
    en = z3.And(s.live[0], s.on_device[0], z3.Not(s.live[1]), n >= 0, n <= s.length[0])
    post = paged._copy(s)
    post.live[1], post.on_device[1], post.length[1] = z3.BoolVal(True), z3.BoolVal(True), s.length[0]
    post.table[1] = list(s.table[0])
    for x in range(b.device):
        shared = z3.Sum([z3.If(z3.And(j < s.length[0], s.table[0][j] == x), 1, 0) for j in range(b.length)])
        post.refs_d[x] = s.refs_d[x] + shared
    return post, en


def cow_copies_unshared(s: PState, b: PagedBound, t: str) -> tuple[PState, z3.BoolRef]:
    """Encoding mutant: a write copies its block even when no other holder has it (the
    reference counts stay right: the original goes back to the free set)."""
    nb = z3.Int(f"{t}nb")
    old = s.table[0][0]
    en = z3.And(s.live[0], s.on_device[0], s.length[0] >= 1, paged._take(s.free_d, nb))
    post = paged._copy(s)
    post.table[0][0] = nb
    for x in range(b.device):
        r = z3.If(x == nb, 1, z3.If(old == x, s.refs_d[x] - 1, s.refs_d[x]))
        post.refs_d[x] = r
        post.free_d[x] = z3.If(x == nb, z3.BoolVal(False), z3.If(old == x, r == 0, s.free_d[x]))
    return post, en


#: encoding mutants the exhaustive check must catch (``--mutant``), beside ``cli/managers.PAGED_MUTANTS``
EQUIVALENCE_MUTANTS: dict[str, tuple[str, Transition]] = {
    "fork-shares-all": ("fork/prefix share", fork_shares_all),
    "cow-copies-unshared": ("write (copy-on-write)", cow_copies_unshared),
}


class CowLeaksOriginal(PagedModel):
    """Model bug (PAGED-COW): a copy-on-write takes the copy but keeps the writer's hold on the original."""

    def copy_on_write(self, op: PagedWrite) -> int:
        before = self.seqs[op.seq].blocks[op.position // self.bs]
        copied = super().copy_on_write(op)
        self.device.refs[before] = self.device.refs.get(before, 0) + 1
        self.device.free.discard(before)
        return copied


MODEL_BUGS: dict[str, type[PagedModel]] = {"cow-leaks-original": CowLeaksOriginal}


@dataclass
class PNode:
    model: PagedModel


def _entries(m: PagedModel) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    for name in SEQS:
        s: Seq | None = m.seqs.get(name)
        out[name] = (False, False, ()) if s is None else (True, s.tier == "device", tuple(s.blocks))
    blocks = m.prefixes.get(KEY)
    out[KEY] = (False, False, ()) if blocks is None else (True, True, tuple(blocks))
    return out


def canonical(
    entries: dict[str, Entry],
    refs_d: Sequence[int],
    refs_h: Sequence[int],
    free_d: Sequence[bool],
    free_h: Sequence[bool],
) -> Hashable:
    """The state up to a renaming of each pool's block ids: the least image over every renaming."""
    best: tuple | None = None
    for pd in itertools.permutations(range(len(refs_d))):
        for ph in itertools.permutations(range(len(refs_h))):
            es = tuple(
                (n, live, dev, tuple((pd if dev else ph)[x] for x in blocks))
                for n, (live, dev, blocks) in sorted(entries.items())
            )
            rd, fd = [0] * len(refs_d), [False] * len(refs_d)
            for x in range(len(refs_d)):
                rd[pd[x]], fd[pd[x]] = refs_d[x], free_d[x]
            rh, fh = [0] * len(refs_h), [False] * len(refs_h)
            for x in range(len(refs_h)):
                rh[ph[x]], fh[ph[x]] = refs_h[x], free_h[x]
            img = (es, tuple(rd), tuple(fd), tuple(rh), tuple(fh))
            if best is None or repr(img) < repr(best):
                best = img
    assert best is not None
    return best


def _concrete(m: PagedModel) -> tuple[dict[str, Entry], list[int], list[int], list[bool], list[bool]]:
    refs_d = [m.device.refs.get(x, 0) for x in range(m.device.size)]
    refs_h = [m.host.refs.get(x, 0) for x in range(m.host.size)]
    return (_entries(m), refs_d, refs_h, [x in m.device.free for x in range(m.device.size)],
            [x in m.host.free for x in range(m.host.size)])  # fmt: skip


@dataclass
class PagedSubject:
    """The paged profile at ``BOUND`` (``mutant``: an encoding mutant in force; ``model_class``: a model bug)."""

    mutant: str | None = None
    model_class: type[PagedModel] = PagedModel
    name: str = PAGED
    table: dict[str, Transition] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.table = dict(paged.TRANSITIONS)
        if self.mutant is not None:
            from kvspec.reference.smt.cli.managers import PAGED_MUTANTS

            where, broken = {**PAGED_MUTANTS, **EQUIVALENCE_MUTANTS}[self.mutant]
            self.table[where] = broken

    def initial(self) -> list[PNode]:
        cfg = PagedConfig(device_blocks=BOUND.device, host_blocks=BOUND.host, block_size=1, max_prefixes=1)
        return [PNode(self.model_class(cfg))]

    def key(self, n: PNode) -> Hashable:
        return canonical(*_concrete(n.model))

    def alphabet(self, n: PNode) -> Sequence[PagedOp]:
        out: list[PagedOp] = []
        for s in SEQS:
            out += [PagedAllocate(seq=s, tokens=t) for t in range(3)]
            out += [PagedExtend(seq=s, tokens=t) for t in range(3)]
            out += [PagedWrite(seq=s, position=0, value=7), PagedSwapOut(seq=s), PagedSwapIn(seq=s), PagedFree(seq=s)]
            out += [PagedStorePrefix(key=KEY, seq=s, blocks=k) for k in (1, 2)]
            out.append(PagedMatchPrefix(key=KEY, dst=s))
        for src, dst in itertools.permutations(SEQS):
            out += [PagedFork(src=src, dst=dst, blocks=k) for k in (None, 0, 1)]
        return out

    # ------------------------------------------------------------------ model
    def model_outcomes(self, n: PNode, op: PagedOp) -> list[tuple[Hashable, PNode]]:
        m = copy.deepcopy(n.model)
        if m.step(op).error is not None:
            return []
        nxt = PNode(m)
        return [(self.key(nxt), nxt)]

    # --------------------------------------------------------------- encoding
    def _plan(self, m: PagedModel, op: PagedOp) -> tuple[str, list[str], dict[str, int]]:
        """The transition, the names at holders 0 and 1, and the operation's arguments as its inputs."""
        ent = _entries(m)

        def length(name: str) -> int:
            return len(ent[name][2])

        if isinstance(op, PagedAllocate):
            return "allocate", [op.seq], {"n": op.tokens}
        if isinstance(op, PagedExtend):
            return "extend", [op.seq], {"m": op.tokens}
        if isinstance(op, PagedFork):
            k = length(op.src) if op.blocks is None else min(op.blocks, length(op.src))
            return "fork/prefix share", [op.src, op.dst], {"n": k}
        if isinstance(op, PagedStorePrefix):
            return "fork/prefix share", [op.seq, op.key], {"n": op.blocks}
        if isinstance(op, PagedMatchPrefix):
            return "fork/prefix share", [op.key, op.dst], {"n": length(op.key)}
        if isinstance(op, PagedWrite):
            return "write (copy-on-write)", [op.seq], {}
        if isinstance(op, PagedSwapOut):
            return "swap_out", [op.seq], {}
        if isinstance(op, PagedSwapIn):
            return "swap_in", [op.seq], {}
        if isinstance(op, PagedFree):
            return "free/prefix evict", [op.seq], {}
        raise ValueError(f"no encoding transition for {op!r}")

    def encoding_outcomes(self, n: PNode, op: PagedOp) -> set[Hashable]:
        m = n.model
        name, roles, args = self._plan(m, op)
        order = [*roles, *(x for x in NAMES if x not in roles)]
        ent, refs_d, refs_h, free_d, free_h = _concrete(m)
        b = BOUND
        pre = PState(
            live=[z3.BoolVal(ent[x][0]) for x in order],
            on_device=[z3.BoolVal(ent[x][1] or not ent[x][0]) for x in order],
            length=[z3.IntVal(len(ent[x][2])) for x in order],
            table=[[z3.IntVal(ent[x][2][j] if j < len(ent[x][2]) else 0) for j in range(b.length)] for x in order],
            refs_d=[z3.IntVal(r) for r in refs_d],
            refs_h=[z3.IntVal(r) for r in refs_h],
            free_d=[z3.BoolVal(f) for f in free_d],
            free_h=[z3.BoolVal(f) for f in free_h],
        )
        tag = "eq_"
        post, enabled = self.table[name](pre, b, tag)
        req = [enabled, *(z3.Int(f"{tag}{k}") == v for k, v in args.items())]
        terms: list[z3.ExprRef] = []
        for i in range(b.holders):
            terms += [post.live[i], z3.And(post.live[i], post.on_device[i]), z3.If(post.live[i], post.length[i], 0)]
            terms += [z3.If(z3.And(post.live[i], j < post.length[i]), post.table[i][j], -1) for j in range(b.length)]
        terms += [*post.refs_d, *post.refs_h, *post.free_d, *post.free_h]
        out: set[Hashable] = set()
        for vals in all_values(req, terms):
            it = iter(vals)
            entries: dict[str, Entry] = {}
            for x in order:
                live, dev, ln = next(it), next(it), next(it)
                table = [next(it) for _ in range(b.length)]
                entries[x] = (bool(live), bool(dev), tuple(table[:ln]) if live else ())
            rd = [next(it) for _ in range(b.device)]
            rh = [next(it) for _ in range(b.host)]
            fd = [next(it) for _ in range(b.device)]
            fh = [next(it) for _ in range(b.host)]
            if any(not (0 <= x < (b.device if dev else b.host)) for live, dev, t in entries.values() for x in t):
                out.add(("a block id outside its pool", repr(entries)))
                continue
            out.add(canonical(entries, rd, rh, fd, fh))
        return out
