"""The radix model with a scheduler-driven engine's known departures, as options.

An engine that runs requests through a scheduler (SGLang, Dynamo's mocker with its SGLang-style
backend) caches and evicts in steps the plain radix model (``reference.radix``) does not take: it
inserts a request in parts, caches its last token, evicts part of a leaf, extends a leaf in place,
keeps a split node's access time, or takes the prompt into the tree late. ``Flow`` names each as an
option and ``FlowModel`` is the radix model with the chosen options on; the request-level checker
(``kvspec.conformance.radix.requests``) turns an option on only when a departure is seen and
declared under its named condition, and documents each option there.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.reference.radix import RadixModel, RadixTreeNode
from kvspec.spec.radix_wire import RadixConfig, RadixRequest
from kvspec.spec.wire import KvEvent, Removed, Stored, make_removed, make_stored

#: the value an output token never cached stands for (it is never seen)
UNSEEN = 0


@dataclass(frozen=True)
class Flow:
    """The scheduler-flow departures the checker follows (module docstring)."""

    in_parts: bool = False
    last_token: bool = False
    leaf_suffix: bool = False
    extend_leaf: bool = False
    split_keeps_time: bool = False
    late_prompt: bool = False


class FlowModel(RadixModel):
    """The radix model with the ``Flow`` options on (module docstring)."""

    def __init__(self, config: RadixConfig, flow: Flow) -> None:
        super().__init__(config)
        self.flow = flow

    def _walk(self, key: list[int]) -> tuple[int, RadixTreeNode]:
        """``split_keeps_time``: a node a walk splits keeps its access time in
        its lower half (the upper half, new, takes a tick of its own)."""
        if not self.flow.split_keeps_time:
            return super()._walk(key)
        now = self._tick()
        node, pos = self.root, 0
        node.last_access = now
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._common(child.tokens, key, pos)
            pos += n
            if n < len(child.tokens):
                node = self._split(child, n)
                break
            child.last_access = now
            node = child
        return pos, node

    def _insert(self, key: list[int], events: list[KvEvent]) -> tuple[int, RadixTreeNode]:
        """``extend_leaf``: pages that continue a leaf (not the root, no
        children) join that leaf's node instead of hanging under it as a
        new one; the Stored names the new pages only."""
        if not self.flow.extend_leaf:
            return super()._insert(key, events)
        pos, node = self._walk(key)
        if pos == len(key):
            return pos, node
        rest = key[pos:]
        pages = self._hash_pages(node.last_hash(), rest)
        if node.parent is None or node.children:
            leaf = RadixTreeNode(tokens=rest, parent=node, pages=pages, last_access=self._tick())
            node.children[self._child_key(rest, 0)] = leaf
            self._emit_stored(leaf, events)
            return pos, leaf
        anchor = node.last_hash()
        node.tokens = node.tokens + rest
        node.pages = node.pages + pages
        node.last_access = self._tick()
        toks = [rest[i : i + self.page] for i in range(0, len(rest), self.page)]
        events.append(
            make_stored(self._event_id(), [h for h, _ in pages], [loc for _, loc in pages], anchor, token_ids=toks)
        )
        return pos, node

    def _evict(self, tokens: int, events: list[KvEvent]) -> int:
        """``leaf_suffix``: from a least recently used leaf longer than what is
        still lacking, only its newest pages go (in their order); the rest of
        the leaf stays, with its access time."""
        if not self.flow.leaf_suffix:
            return super()._evict(tokens, events)
        evicted = 0
        removed: list[int] = []
        while evicted < tokens:
            leaves = [n for n in self.nodes() if not n.children and n.lock_ref == 0]
            if not leaves:
                break
            victim = min(leaves, key=lambda n: n.last_access)
            assert victim.parent is not None
            pages = len(victim.pages)
            take = min(pages, -(-(tokens - evicted) // self.page))
            if take == pages:
                del victim.parent.children[self._child_key(victim.tokens, 0)]
                removed.extend(s for s, _ in victim.pages)
            else:
                removed.extend(s for s, _ in victim.pages[pages - take :])
                victim.pages = victim.pages[: pages - take]
                victim.tokens = victim.tokens[: (pages - take) * self.page]
            evicted += take * self.page
            self.free += take * self.page
        if removed:
            events.append(make_removed(self._event_id(), removed))
        return evicted

    def _path_hashes(self, key: list[int]) -> set[int]:
        """The hashes of the cached pages along the page-aligned ``key`` (the tree untouched)."""
        out: set[int] = set()
        node, pos = self.root, 0
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._common(child.tokens, key, pos)
            out.update(s for s, _ in child.pages[: n // self.page])
            pos += n
            if n < len(child.tokens):
                break
            node = child
        return out

    def _request_need(self, op: RadixRequest, cached: int) -> int:
        """``last_token``: a request that decodes takes a slot for its last token too;
        ``in_parts``: whole pages, the pages found cached aside."""
        last = self.flow.last_token and len(op.output) > 1
        n = len(op.prompt) + len(op.output) - (0 if last else 1)
        if not self.flow.in_parts:
            return n - cached
        return (-(-n // self.page) - cached // self.page) * self.page

    def request(self, op: RadixRequest) -> int:
        if not (self.flow.in_parts or self.flow.last_token):
            return super().request(op)
        last = self.flow.last_token and len(op.output) > 1  # a request that decodes
        seq = op.prompt + (op.output if last else op.output[:-1])
        if not self.flow.in_parts:
            if not last:
                return super().request(op)
            return super().request(op.model_copy(update={"output": [*op.output, UNSEEN]}))
        return self._scheduled(op.prompt, seq, self._events, len(op.prompt))

    def _scheduled(self, prompt: list[int], seq: list[int], events: list[KvEvent], prefill: int) -> int:
        """``in_parts``: the request as a scheduler runs it, token by token: the
        pages of its first ``prefill`` tokens (the prompt) are allocated (evicting what
        the free slots lack) and its whole pages cached; then each decode token that starts a page
        allocates one (evicting), and each page it completes is cached (one
        insert, one Stored); the request's path stays locked (the lock moves
        to each new last node); at the end the partial page and the pages
        found cached already go back. (That it fits, ``_request_need``, the
        table's guard checked.)"""
        page = self.page
        cached, node = self._match(self._hit_key(prompt))
        self._lock(node, +1)
        held = node
        key = self._aligned(seq)
        prompt_pages = -(-prefill // page) - cached // page
        pending = 0

        def allocate(pages: int) -> None:
            nonlocal pending
            lack = pages * page - self.free
            if lack > 0:
                self._evict(lack, events)
            self.free -= pages * page
            pending += pages * page

        done = cached  # the key's tokens inserted (or found cached) so far

        dups = 0  # slots of pages found cached already, not given back yet

        silent: set[int] = set()  # own prompt pages evicted while the request holds their copies

        def insert(end: int) -> None:
            nonlocal held, pending, done, dups
            before = len(events)
            _, last = self._insert(key[:end], events)
            new = sum(len(e.data.stored.blocks) for e in events[before:] if isinstance(e.data, Stored)) * page
            dups += (end - done) - new
            pending -= end - done
            done = end
            self._lock(last, +1)
            self._lock(held, -1)
            held = last

        allocate(prompt_pages)
        allocated = (cached // page + prompt_pages) * page
        late = self.flow.late_prompt and prefill < len(seq) and prefill // page * page > cached
        if late:
            # ``late_prompt``: the prompt's new pages are announced now, but the tree
            # takes them (and the lock moves down) only after the first decode page is
            # reserved: the Stored events come from a copy of the model
            shadow = copy.deepcopy(self)
            shadow._insert(key[: prefill // page * page], events)
            self.next_event_id = shadow.next_event_id
        elif prefill // page * page > cached:
            insert(prefill // page * page)
        for t in range(prefill, len(seq)):
            if t >= allocated:
                if late and t == prefill:
                    # the request locks only its match: the eviction may take the
                    # prompt's cached pages past it, which the request holds copies of,
                    # so neither their eviction nor their return is announced
                    own = self._path_hashes(key[: prefill // page * page])
                    before = len(events)
                    allocate(1)
                    gone = {
                        h for e in events[before:] if isinstance(e.data, Removed) for h in e.data.removed.block_hashes
                    }
                    silent.update(gone & own)
                    if silent:
                        events[before:] = _without_hashes(events[before:], silent)
                else:
                    allocate(1)
                allocated += page
            if late and t == prefill:
                before = len(events)
                insert(prefill // page * page)
                del events[before:]  # announced at prefill (or silent)
            if t == prefill or dups:  # prefill ends after the first decode page is reserved
                self.free += dups
                dups = 0
            if (t + 1) % page == 0:
                insert(t + 1)
                self.free += dups
                dups = 0
        self.free += pending + dups
        self._lock(held, -1)
        return cached


def _without_hashes(events: Sequence[KvEvent], hashes: set[int]) -> list[KvEvent]:
    """``events`` without the pages ``hashes`` names (``late_prompt``: pages whose
    other copy stays, so that the engine announces neither their eviction nor their
    return); an event left with no page goes."""
    out: list[KvEvent] = []
    for ev in events:
        if isinstance(ev.data, Removed):
            keep = [h for h in ev.data.removed.block_hashes if h not in hashes]
            if keep:
                out.append(make_removed(ev.event_id, keep, dp_rank=ev.dp_rank, tier=ev.storage_tier))
        elif isinstance(ev.data, Stored):
            blocks = ev.data.stored.blocks
            drop = 0
            while drop < len(blocks) and blocks[drop].block_hash in hashes:
                drop += 1
            if drop == 0:
                out.append(ev)
            elif drop < len(blocks):
                toks = ev.block_token_ids[drop:] if ev.block_token_ids is not None else None
                out.append(
                    make_stored(
                        ev.event_id,
                        [b.block_hash for b in blocks[drop:]],
                        [b.tokens_hash for b in blocks[drop:]],
                        blocks[drop - 1].block_hash,
                        dp_rank=ev.dp_rank,
                        tier=ev.storage_tier,
                        token_ids=toks,
                    )
                )
        else:
            out.append(ev)
    return out
