"""Traffic that looks like an inference engine's, for the lockstep machine.

Random block hashes would almost never share a prefix, hit an inactive block,
or make a lineage forest deep enough to exercise eviction order. So the
traffic here is built the way a scheduler produces it:

- a **token tree**: every full block is a node holding ``block_size`` real
  token ids; its local hash and sequence hash are computed with
  ``spec/hashing.py`` (HASH-LOCAL, HASH-SEQUENCE), its positional lineage hash
  is (position, its hash, its parent's hash). A request is a path from the
  root, so requests share prefixes whenever they pick the same children.
  Token blocks come from a small palette, so the same tokens also appear
  under different parents (same local hash, different sequence hash);
- **requests** that are admitted (a Use of their path, often ending with a
  partial block), extended (chunked prefill: the next blocks with ``parent``
  set to the last block they hold, or a retry of what did not fit), promoted
  when their partial block fills (Promote with the block's sequence, parent
  and local hashes, lineage hash and token ids), finished (Deref of
  everything, leaf first as schedulers do, sometimes root first), preempted
  (Deref in reverse) and re-admitted later (a Use of the whole path again);
- requests over a **cached prefix they do not hold** (a suffix Use anchored
  with ``parent`` on a block another request holds or the pool keeps
  inactive), requests that **release part** of what they hold (their tail,
  sent again later), and requests whose path runs through a block the cache
  lost into blocks it still has (**gapped**: a capacity stop there lands
  before blocks that need no slot);
- **invalid operations** (short token ids, wrong numbers of hashes, a partial
  block as parent, Deref of blocks nobody holds, Promote of an unknown uuid,
  two blocks at one position under ``atomic``), each expected to be rejected
  with a given rule id and to change nothing.

``Traffic`` is plain Python driven by small integers ("choices"), so that
Hypothesis shrinks a failure toward shared prefixes, first requests and short
paths; the strategies at the bottom produce those integers. Each builder
returns a ``Planned`` operation; after the lockstep step the machine calls
``commit`` with the model's outcome, which updates what each request holds.
Operations are valid for the profile: a hash-cache profile (``Profile.use_shape``:
legacy) gets local hashes always and never a ``parent``; no batch repeats a position.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from hypothesis import strategies as st

from kvspec.conformance.block.coverage import use_placed
from kvspec.spec.config import ManagerConfig
from kvspec.spec.hashing import local_block_hash, sequence_hash
from kvspec.spec.profiles import Profile
from kvspec.spec.profiles import profile as get_profile
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import (
    BlockRef,
    Counters,
    Deref,
    Destroy,
    FullBlock,
    Operation,
    PartialBlock,
    Plh,
    Promote,
    StepOutcome,
    Use,
)

#: how many distinct token blocks the palette holds
PALETTE = 48
#: a hash no traffic block ever has (for Deref of an unknown block)
UNKNOWN_HASH = 0xDEAD_BEEF_0000_0001

Meta = Literal["tokens", "hashes", "none"]


class TrafficError(AssertionError):
    """The generator produced an operation the model did not treat as
    intended (a valid one rejected, an invalid one accepted): a kvspec bug."""


def palette_tokens(k: int, block_size: int) -> tuple[int, ...]:
    """The token ids of palette entry ``k`` (a vocabulary of 32000)."""
    return tuple((k * 7919 + j * 104729 + 17) % 32000 for j in range(block_size))


@dataclass(slots=True)
class TreeBlock:
    """One full block of the token tree."""

    seq: int
    local: int
    tokens: tuple[int, ...]
    position: int
    parent: int | None
    children: list[int] = field(default_factory=list)
    #: the wire objects naming this block, built once (pydantic construction
    #: is a large part of a step's cost)
    ref: FullBlock = field(init=False)
    lineage: Plh = field(init=False)

    def __post_init__(self) -> None:
        self.ref = FullBlock(full=self.seq)
        self.lineage = Plh(hash=self.seq, parent=self.parent, position=self.position)

    def plh(self) -> Plh:
        return self.lineage


class TokenTree:
    """All token blocks seen so far, as a prefix tree keyed by sequence hash."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.nodes: dict[int, TreeBlock] = {}
        self.roots: list[int] = []
        self._palette_cache: dict[int, tuple[tuple[int, ...], int]] = {}

    def _palette(self, k: int) -> tuple[tuple[int, ...], int]:
        """Palette entry ``k``: its tokens and their local hash (cached)."""
        hit = self._palette_cache.get(k)
        if hit is None:
            tokens = palette_tokens(k, self.block_size)
            hit = self._palette_cache[k] = (tokens, local_block_hash(tokens))
        return hit

    def child(self, parent: TreeBlock | None, choice: int) -> TreeBlock:
        """The ``choice``-th child of ``parent`` (None: the root); past the
        existing children, the palette entry ``choice - len(children)``."""
        kids = self.roots if parent is None else parent.children
        if choice < len(kids):
            return self.nodes[kids[choice]]
        tokens, local = self._palette(choice - len(kids))
        seq = sequence_hash(parent.seq if parent is not None else None, local)
        node = self.nodes.get(seq)
        if node is None:
            node = TreeBlock(
                seq,
                local,
                tokens,
                0 if parent is None else parent.position + 1,
                parent.seq if parent is not None else None,
            )
            self.nodes[seq] = node
            kids.append(seq)
        return node

    def sibling(self, node: TreeBlock) -> TreeBlock:
        """A block at the same position as ``node`` under the same parent,
        with other tokens."""
        parent = self.nodes[node.parent] if node.parent is not None else None
        kids = self.roots if parent is None else parent.children
        for k in range(PALETTE):
            other = self.child(parent, len(kids) + k)
            if other.seq != node.seq:
                return other
        raise AssertionError("the palette has more than one token block")

    def path(self, start: TreeBlock | None, choices: Sequence[int]) -> list[TreeBlock]:
        out: list[TreeBlock] = []
        node = start
        for c in choices:
            node = self.child(node, c)
            out.append(node)
        return out


@dataclass(slots=True)
class TrafficRequest:
    """One request as the scheduler sees it."""

    rid: int
    path: list[TreeBlock]
    meta: Meta
    #: how many blocks of ``path`` it holds (always a prefix)
    held: int = 0
    #: the uuid of the partial block it holds
    partial: str | None = None
    #: False once preempted: it holds nothing and waits to be re-admitted
    running: bool = True
    #: a fork names some blocks twice (two sequences of one prompt in one
    #: Use); its ``path`` is the batch, not a chain, so it never extends
    forked: bool = False
    #: the cached block its path continues, which it does not hold (a suffix
    #: request: its Uses are anchored there until it holds a block of its own)
    base: TreeBlock | None = None

    def anchor(self) -> TreeBlock | None:
        """The block its next Use is anchored to: its last held, else its base."""
        return self.path[self.held - 1] if self.held else self.base

    def refs(self) -> list[BlockRef]:
        out: list[BlockRef] = [n.ref for n in self.path[: self.held]]
        if self.partial is not None:
            out.append(PartialBlock(partial=self.partial))
        return out

    def holds_anything(self) -> bool:
        return self.held > 0 or self.partial is not None


@dataclass(slots=True)
class Planned:
    """An operation and what to do with the model's outcome of it."""

    op: Operation
    kind: str
    commit: Callable[[StepOutcome, Counters], None]
    #: the rule id the operation must be rejected with (invalid traffic)
    expect_error: RuleId | None = None
    #: a Use anchored with ``parent`` to a block its request does not hold
    #: (a suffix request's base): a real scheduler holds its prefix, this
    #: traffic does not, so the base may have been evicted since. Such a Use
    #: is outside the caller contracts the proofs assume
    #: (ASSUME-PARENT-REGISTERED), and the lockstep does not check them on it.
    unheld_anchor: bool = False


#: each kind of invalid traffic, and the rule it must be rejected with. Which profiles are sent a kind
#: is the profile's declaration (spec/profiles.py): the malformed Uses its source rejects
#: (``invalid_uses``, those needing ``strict_validation`` in ``strict_only_uses``), and the Deref, Promote
#: and Destroy kinds where their rule applies (Destroy also needs the capability destroy: a Destroy of a
#: block that is not active, or naming a block twice, rejects the whole Destroy)
INVALID_KINDS: dict[str, RuleId] = {
    "short_token_lists": RuleId.USE_VALIDATE,
    "short_block_tokens": RuleId.USE_VALIDATE,
    "extra_local_hash": RuleId.USE_VALIDATE,
    "missing_plh": RuleId.USE_VALIDATE,
    "partial_parent": RuleId.USE_VALIDATE,
    "duplicate_position": RuleId.USE_VALIDATE,
    "deref_unknown": RuleId.DEREF_UNKNOWN,
    "deref_unheld": RuleId.DEREF_UNKNOWN,
    "deref_twice": RuleId.DEREF_UNKNOWN,
    "promote_unknown": RuleId.PROMOTE_UNKNOWN,
    "destroy_unheld": RuleId.DESTROY_ACTIVE,
    "destroy_twice": RuleId.DESTROY_ACTIVE,
}


def sends(profile: Profile, kind: str) -> bool:
    """Whether the invalid ``kind`` is sent to an implementation of ``profile`` (before its capabilities)."""
    rule = INVALID_KINDS[kind]
    return kind in profile.invalid_uses if rule == RuleId.USE_VALIDATE else profile.applies(rule)


class Traffic:
    """The scheduler side of the machine: the token tree and the requests.
    ``strict_validation``: the adapter's capability (the legacy Uses its
    profile's source accepts and kvspec refuses are sent only with it)."""

    def __init__(
        self,
        config: ManagerConfig,
        *,
        partial_blocks: bool = True,
        promote: bool = True,
        strict_validation: bool = True,
        destroy: bool = False,
    ) -> None:
        self.config = config
        self.profile = config.profile
        semantics = get_profile(config.profile)
        #: the 1.0.2 hash cache's Use: no parent, local hashes always given (``Profile.use_shape``)
        self.hash_cache = semantics.use_shape == "hash_cache"
        #: Destroy is one of its operations
        self.destroys = "destroy" in semantics.operations
        self.partial_blocks = partial_blocks
        self.tree = TokenTree(config.block_size)
        self.requests: list[TrafficRequest] = []
        self._next_rid = 0
        self._next_uuid = 0
        self.invalid_kinds = [
            k
            for k, rule in INVALID_KINDS.items()
            if sends(semantics, k)
            and (promote or rule != RuleId.PROMOTE_UNKNOWN)
            and (strict_validation or k not in semantics.strict_only_uses)
            and (destroy or rule != RuleId.DESTROY_ACTIVE)
        ]

    # ---------------------------------------------------------------- helpers
    def _uuid(self) -> str:
        self._next_uuid += 1
        return f"r{self._next_uuid}"

    def _meta(self, meta: int) -> Meta:
        options: tuple[Meta, ...] = ("tokens", "hashes") if self.hash_cache else ("tokens", "hashes", "none")
        return options[meta % len(options)]

    def _use(self, nodes: list[TreeBlock], meta: Meta, parent: TreeBlock | None, partial: str | None) -> Use:
        blocks: list[BlockRef] = [n.ref for n in nodes]
        if partial is not None:
            blocks.append(PartialBlock(partial=partial))
        return Use(
            blocks=blocks,
            local_hashes=[n.local for n in nodes] if meta != "none" else [],
            plhs=[n.lineage for n in nodes],
            token_ids=[list(n.tokens) for n in nodes] if meta == "tokens" else None,
            parent=parent.ref if parent is not None and not self.hash_cache else None,
        )

    def pick(self, reqs: list[TrafficRequest], choice: int) -> TrafficRequest:
        return reqs[choice % len(reqs)]

    def holds(self) -> dict[int, int]:
        """How many owners each full block has, summed over the requests."""
        out: dict[int, int] = {}
        for r in self.requests:
            for n in r.path[: r.held]:
                out[n.seq] = out.get(n.seq, 0) + 1
        return out

    # ------------------------------------------------------ request queries
    def running(self) -> list[TrafficRequest]:
        return [r for r in self.requests if r.running]

    def extendable(self) -> list[TrafficRequest]:
        """Running requests that may send their next chunk (no partial held)."""
        return [r for r in self.requests if r.running and r.partial is None and not r.forked]

    def promotable(self) -> list[TrafficRequest]:
        return [r for r in self.requests if r.partial is not None]

    def holding(self) -> list[TrafficRequest]:
        return [r for r in self.requests if r.holds_anything()]

    def preempted(self) -> list[TrafficRequest]:
        return [r for r in self.requests if not r.running]

    def destroyable(self) -> list[TrafficRequest]:
        """Legacy: requests whose every held block no other request holds."""
        if not self.destroys:
            return []
        counts = self.holds()
        return [r for r in self.requests if r.holds_anything() and all(counts[n.seq] == 1 for n in r.path[: r.held])]

    def shared_destroyable(self) -> list[TrafficRequest]:
        """Legacy: requests holding a block some other request holds too."""
        if not self.destroys:
            return []
        counts = self.holds()
        return [r for r in self.requests if any(counts[n.seq] > 1 for n in r.path[: r.held])]

    def sharing_group(self, req: TrafficRequest) -> list[TrafficRequest]:
        """``req`` and every request that holds a block of the group (closed
        over): what a Destroy of all their blocks leaves nobody holding."""
        group = [req]
        seqs = {n.seq for n in req.path[: req.held]}
        grew = True
        while grew:
            grew = False
            for r in self.requests:
                if r not in group and any(n.seq in seqs for n in r.path[: r.held]):
                    group.append(r)
                    seqs |= {n.seq for n in r.path[: r.held]}
                    grew = True
        return group

    # ------------------------------------------------------------- commits
    def _placed(
        self, req: TrafficRequest, op: Use, n_full: int, uuid: str | None
    ) -> Callable[[StepOutcome, Counters], None]:
        def commit(out: StepOutcome, before: Counters) -> None:
            if out.error is not None:
                raise TrafficError(f"valid traffic rejected: [{out.error.rule}] {out.error.message}")
            assert out.result is not None
            placed = use_placed(op, out.result, out.counters.active_refs - before.active_refs)
            req.held += min(placed, n_full)
            if uuid is not None and placed > n_full:
                req.partial = uuid
            req.running = True

        return commit

    @staticmethod
    def _ok(out: StepOutcome) -> None:
        if out.error is not None:
            raise TrafficError(f"valid traffic rejected: [{out.error.rule}] {out.error.message}")

    # ------------------------------------------------------------ builders
    def new_request(self, choices: Sequence[int], partial: bool, meta: int) -> Planned:
        """Admit a request: a Use of a path from the root (+ a partial block)."""
        nodes = self.tree.path(None, choices)
        partial = (partial or not nodes) and self.partial_blocks
        req = TrafficRequest(self._next_rid, nodes, self._meta(meta))
        self._next_rid += 1
        self.requests.append(req)
        uuid = self._uuid() if partial else None
        op = self._use(nodes, req.meta, None, uuid)
        return Planned(op, "new", self._placed(req, op, len(nodes), uuid))

    def fork(self, choices: Sequence[int], meta: int) -> Planned:
        """Two sequences of one prompt admitted in one Use (parallel sampling):
        the prompt's blocks, then the same prefix again with another last
        block, e.g. [A, B, A, B']. The repeated blocks are hits on blocks the
        same batch placed (kvbm, legacy; ``atomic`` rejects the repeated
        positions, see the invalid traffic)."""
        base = self.tree.path(None, [*choices, 0] if len(choices) < 2 else choices)
        nodes = [*base, *base[:-1], self.tree.sibling(base[-1])]
        req = TrafficRequest(self._next_rid, nodes, self._meta(meta), forked=True)
        self._next_rid += 1
        self.requests.append(req)
        op = self._use(nodes, req.meta, None, None)
        return Planned(op, "fork", self._placed(req, op, len(nodes), None))

    def extend(self, req: TrafficRequest, choices: Sequence[int], partial: bool) -> Planned | None:
        """The request's next chunk: what did not fit last time, then new
        blocks below its last one; anchored with ``parent`` to the last block
        it holds (chunked prefill)."""
        last = req.path[-1] if req.path else None
        req.path.extend(self.tree.path(last, choices))
        pending = req.path[req.held :]
        partial = partial and self.partial_blocks
        if not pending and not partial:
            return None
        uuid = self._uuid() if partial else None
        op = self._use(pending, req.meta, req.anchor(), uuid)
        unheld = req.held == 0 and req.base is not None
        return Planned(op, "extend", self._placed(req, op, len(pending), uuid), unheld_anchor=unheld)

    def promote(self, req: TrafficRequest, choice: int) -> Planned:
        """The request's partial block filled: it becomes a full block (an
        existing child of its last block, or a new one)."""
        assert req.partial is not None and req.held == len(req.path)
        last = req.path[-1] if req.path else None
        node = self.tree.child(last, choice)
        uuid = req.partial
        op = Promote(
            uuid=uuid,
            seq_hash=node.seq,
            parent_hash=node.parent,
            local_hash=node.local,
            plh=node.plh(),
            token_ids=list(node.tokens) if req.meta == "tokens" else None,
        )

        def commit(out: StepOutcome, before: Counters) -> None:
            self._ok(out)
            req.path.append(node)
            req.held += 1
            req.partial = None

        return Planned(op, "promote", commit)

    def _deref_all(self, req: TrafficRequest, forward: bool) -> Deref:
        refs = req.refs()
        if not forward:
            refs.reverse()
        return Deref(blocks=refs)

    def finish(self, req: TrafficRequest, forward: bool) -> Planned | None:
        """The request completes: Deref of all it holds, leaf first (or root
        first). A request that holds nothing just goes (no operation)."""
        if not req.holds_anything():
            self.requests.remove(req)
            return None
        op = self._deref_all(req, forward)

        def commit(out: StepOutcome, before: Counters) -> None:
            self._ok(out)
            self.requests.remove(req)

        return Planned(op, "finish", commit)

    def preempt(self, req: TrafficRequest) -> Planned:
        """The scheduler preempts the request: Deref in reverse; it keeps its
        path (its tokens) to be re-admitted later. A partial block's contents
        are lost and recomputed then."""
        op = self._deref_all(req, forward=False)

        def commit(out: StepOutcome, before: Counters) -> None:
            self._ok(out)
            req.held = 0
            req.partial = None
            req.running = False

        return Planned(op, "preempt", commit)

    def readmit(self, req: TrafficRequest, partial: bool) -> Planned | None:
        """A preempted request comes back: a Use of its whole path again."""
        partial = partial and self.partial_blocks
        if not req.path and not partial:
            return None
        uuid = self._uuid() if partial else None
        op = self._use(req.path, req.meta, req.base, uuid)
        unheld = req.base is not None
        return Planned(op, "readmit", self._placed(req, op, len(req.path), uuid), unheld_anchor=unheld)

    def suffix(self, base: TreeBlock, choices: Sequence[int], partial: bool, meta: int) -> Planned:
        """A request whose prefix is cached but not held by it (another
        request holds it, or the pool keeps it inactive): a Use of only its
        own blocks below ``base``, anchored to ``base`` with ``parent``."""
        nodes = self.tree.path(base, choices)
        partial = (partial or not nodes) and self.partial_blocks
        req = TrafficRequest(self._next_rid, nodes, self._meta(meta), base=base)
        self._next_rid += 1
        self.requests.append(req)
        uuid = self._uuid() if partial else None
        op = self._use(nodes, req.meta, base, uuid)
        return Planned(op, "suffix", self._placed(req, op, len(nodes), uuid), unheld_anchor=True)

    def gapped(self, target: TreeBlock, partial: bool, meta: int) -> Planned:
        """A request whose path (root to ``target``) runs through blocks the
        cache lost into blocks it still has (an LRU policy evicts a parent
        before its child; a suffix request holds a child without its
        parent): its Use needs slots for the lost blocks and none for the
        cached ones after them."""
        path: list[TreeBlock] = []
        node: TreeBlock | None = target
        while node is not None:
            path.append(node)
            node = self.tree.nodes[node.parent] if node.parent is not None else None
        path.reverse()
        partial = partial and self.partial_blocks
        req = TrafficRequest(self._next_rid, path, self._meta(meta))
        self._next_rid += 1
        self.requests.append(req)
        uuid = self._uuid() if partial else None
        op = self._use(path, req.meta, None, uuid)
        return Planned(op, "gapped", self._placed(req, op, len(path), uuid))

    def release_part(self, req: TrafficRequest, n: int) -> Planned | None:
        """The request releases part of what it holds: its partial block and
        its last ``n`` full blocks, leaf first (a scheduler trimming a
        request: a rejected speculative tail, a sliding window). It keeps
        their tokens, so a later extend sends them again."""
        k = min(n, req.held)
        refs: list[BlockRef] = [PartialBlock(partial=req.partial)] if req.partial is not None else []
        refs.extend(nd.ref for nd in reversed(req.path[req.held - k : req.held]))
        if not refs or len(refs) == len(req.refs()):
            return None  # all of it: that is a finish or a preemption
        op = Deref(blocks=refs)

        def commit(out: StepOutcome, before: Counters) -> None:
            self._ok(out)
            req.held -= k
            req.partial = None

        return Planned(op, "release_part", commit)

    def destroy(self, req: TrafficRequest) -> Planned:
        """Legacy: the request's blocks are destroyed outright."""
        op = Destroy(blocks=req.refs())

        def commit(out: StepOutcome, before: Counters) -> None:
            self._ok(out)
            self.requests.remove(req)

        return Planned(op, "destroy", commit)

    def destroy_shared(self, req: TrafficRequest) -> Planned:
        """Legacy: a Destroy of blocks several requests hold (each removed
        outright, whatever its owner count): ``req``'s and those of every
        request sharing one of them, each named once; all of them end."""
        group = self.sharing_group(req)
        refs: list[BlockRef] = []
        seen: set[int | str] = set()
        for r in group:
            for ref in r.refs():
                key = ref.full if isinstance(ref, FullBlock) else ref.partial
                if key not in seen:
                    seen.add(key)
                    refs.append(ref)
        op = Destroy(blocks=refs)

        def commit(out: StepOutcome, before: Counters) -> None:
            self._ok(out)
            for r in group:
                self.requests.remove(r)

        return Planned(op, "destroy_shared", commit)

    # ------------------------------------------------------------- invalid
    def invalid(self, kind_choice: int, choices: Sequence[int], req_choice: int) -> Planned:
        """An operation the profile must reject (rule id in ``expect_error``)."""
        kind = self.invalid_kinds[kind_choice % len(self.invalid_kinds)]
        rule_id = INVALID_KINDS[kind]
        nodes = self.tree.path(None, choices or [0])
        op: Operation
        if kind == "short_token_lists":
            good = self._use(nodes, "tokens", None, None)
            assert good.token_ids is not None
            op = good.model_copy(update={"token_ids": good.token_ids[:-1]})
        elif kind == "short_block_tokens":
            good = self._use(nodes, "tokens", None, None)
            assert good.token_ids is not None
            toks = [list(t) for t in good.token_ids]
            toks[-1] = toks[-1][:-1]
            op = good.model_copy(update={"token_ids": toks})
        elif kind == "extra_local_hash":
            good = self._use(nodes, "hashes", None, None)
            op = good.model_copy(update={"local_hashes": [*good.local_hashes, nodes[-1].local]})
        elif kind == "missing_plh":
            good = self._use(nodes, "hashes", None, None)
            op = good.model_copy(update={"plhs": good.plhs[:-1]})
        elif kind == "partial_parent":
            good = self._use(nodes, "hashes", None, None)
            op = good.model_copy(update={"parent": PartialBlock(partial=self._uuid())})
        elif kind == "duplicate_position":
            op = self._use([*nodes, self.tree.sibling(nodes[-1])], "hashes", None, None)
        elif kind == "deref_unknown":
            op = Deref(blocks=[FullBlock(full=UNKNOWN_HASH)])
        elif kind == "deref_unheld":
            counts = self.holds()
            free = [n for n in self.tree.nodes.values() if n.seq not in counts]
            target = free[req_choice % len(free)].seq if free else UNKNOWN_HASH
            op = Deref(blocks=[FullBlock(full=target)])
        elif kind == "deref_twice":
            counts = self.holds()
            once = [s for s, c in counts.items() if c == 1]
            if once:
                s = once[req_choice % len(once)]
                op = Deref(blocks=[FullBlock(full=s), FullBlock(full=s)])
            else:
                op = Deref(blocks=[FullBlock(full=UNKNOWN_HASH)])
        elif kind == "destroy_unheld":
            counts = self.holds()
            free = [n for n in self.tree.nodes.values() if n.seq not in counts]
            target = free[req_choice % len(free)].seq if free else UNKNOWN_HASH
            op = Destroy(blocks=[FullBlock(full=target)])
        elif kind == "destroy_twice":
            held = sorted(self.holds())
            if held:
                s = held[req_choice % len(held)]
                op = Destroy(blocks=[FullBlock(full=s), FullBlock(full=s)])
            else:
                op = Destroy(blocks=[FullBlock(full=UNKNOWN_HASH)])
        elif kind == "promote_unknown":
            n = nodes[0]
            op = Promote(
                uuid=f"never-{self._next_uuid + 1}",
                seq_hash=n.seq,
                parent_hash=n.parent,
                local_hash=n.local,
                plh=n.plh(),
                token_ids=list(n.tokens),
            )
        else:  # pragma: no cover - the table above is the list
            raise AssertionError(kind)

        def commit(out: StepOutcome, before: Counters) -> None:
            if out.error is None:
                raise TrafficError(f"invalid traffic ({kind}) accepted by the model: {op!r}")
            if out.error.rule != rule_id:
                raise TrafficError(f"invalid traffic ({kind}) rejected under {out.error.rule}, not {rule_id}")

        return Planned(op, f"invalid:{kind}", commit, expect_error=rule_id)


# ---------------------------------------------------------------------------
# Hypothesis strategies: the small integers that drive ``Traffic``.
# ---------------------------------------------------------------------------

#: which child to take at each level, by digit: mostly an existing one
#: (shared prefixes), sometimes a new palette block. Digit 0 is the first child.
BRANCH = (0, 0, 0, 1, 1, 2, 3, 4, 5, 6)
#: which block a partial block becomes when it fills: mostly the first
#: existing child (another request got there first: PROMOTE-EXISTING)
PROMOTE_BRANCH = (0, 0, 0, 0, 1, 1, 2, 3)
MAX_PATH = 6
MAX_CHUNK = 4
#: the scheduler's batch: requests admitted and not finished (the machine
#: admits no more until one finishes)
MAX_LIVE = 4


class Digits:
    """A packed rule argument, read as mixed-radix digits.

    Every rule takes one integer instead of lists and booleans: each extra
    draw costs Hypothesis time and buffer, and a long buffer ends examples
    early. Digits are read least significant first, so the ones that matter
    most (how many blocks, which request) sit where shrinking the integer
    toward 0 changes them least abruptly; 0 decodes to the simplest choice
    (one block, first child, no partial block, first request).
    """

    __slots__ = ("x",)

    def __init__(self, x: int) -> None:
        self.x = x

    def take(self, n: int) -> int:
        v = self.x % n
        self.x //= n
        return v

    def flag(self) -> bool:
        return self.take(2) == 1

    def branches(self, lo: int, hi: int) -> list[int]:
        n = lo + self.take(hi - lo + 1)
        return [BRANCH[self.take(len(BRANCH))] for _ in range(n)]


#: the packed argument of every traffic rule (decoded with ``Digits``)
packed = st.integers(0, 2**40 - 1)


#: how often each policy is drawn, relative to the others: the ones whose
#: order depends on more than age (lineage: leaves first; multi-LRU: touch
#: counts) need more traffic before a wrong order shows
POLICY_WEIGHT = {"lineage": 2, "multi_lru": 2, "lru": 2, "unordered": 1}


def config_from(
    x: int, profile: str, policies: Sequence[str], *, max_capacity: int = 16, block_size: int = 4
) -> ManagerConfig:
    """The configuration packed in ``x`` (0: the smallest capacity, dp_rank 0,
    the first policy)."""
    d = Digits(x)
    cap_hi = max(1, min(16, max_capacity))
    cap_lo = min(4, cap_hi)
    capacity = cap_lo + d.take(cap_hi - cap_lo + 1)
    dp_rank = (0, 2)[d.take(2)]
    weighted = [p for p in policies for _ in range(POLICY_WEIGHT.get(p, 1))]
    eviction = weighted[d.take(len(weighted))]
    return ManagerConfig.model_validate(
        {"profile": profile, "capacity": capacity, "block_size": block_size, "dp_rank": dp_rank, "eviction": eviction}
    )


@functools.lru_cache(maxsize=64)
def configs(
    profile: str,
    policies: tuple[str, ...],
    *,
    max_capacity: int = 16,
    block_size: int = 4,
) -> st.SearchStrategy[ManagerConfig]:
    """Manager configurations with small capacities (4..16), so that eviction
    and exhaustion happen often; the policy is drawn per example. One integer
    draw, mapped (cheap for Hypothesis, and it shrinks toward capacity 4)."""
    return st.integers(0, 2**16 - 1).map(
        lambda x: config_from(x, profile, policies, max_capacity=max_capacity, block_size=block_size)
    )
