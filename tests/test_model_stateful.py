"""A Hypothesis state machine over the reference model itself.

Requests walk a small token tree (shared prefixes, real Dynamo hashes), get
placed with Use (sometimes in chunks, with the caller's parent), hold a
partial tail block that they promote when it fills, and finish or get
preempted with a reverse-order Deref. After every operation the invariants
check the counters, owner counts and pool membership, and that a router view
fed with the model's own events holds exactly the blocks the model has
announced, with no protocol violation beyond the profile's known breaks.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvspec.reference import G1Model, LegacyModel, RouterView, make_model
from kvspec.spec.config import ManagerConfig
from kvspec.spec.hashing import local_block_hash, sequence_hash
from kvspec.spec.profiles import profile as get_profile
from kvspec.spec.wire import Deref, FullBlock, Operation, PartialBlock, Plh, Promote, Use

BS = 2
# A token tree: each node is one block of BS tokens; a request is a root-to-node path.
TREE_TOKENS = {  # node -> (parent node, its tokens)
    0: (None, [1, 2]),
    1: (0, [3, 4]),
    2: (1, [5, 6]),
    3: (1, [7, 8]),
    4: (0, [9, 9]),
    5: (4, [2, 2]),
    6: (None, [8, 8]),
    7: (6, [4, 4]),
    8: (7, [6, 6]),
    9: (2, [1, 1]),
}


def _path(node: int) -> list[int]:
    out = []
    cur: int | None = node
    while cur is not None:
        out.append(cur)
        cur = TREE_TOKENS[cur][0]
    return out[::-1]


SEQ: dict[int, int] = {}
LOCAL: dict[int, int] = {}
for _n in sorted(TREE_TOKENS, key=lambda n: len(_path(n))):
    _p, _toks = TREE_TOKENS[_n]
    LOCAL[_n] = local_block_hash(_toks)
    SEQ[_n] = sequence_hash(None if _p is None else SEQ[_p], LOCAL[_n])


def plh(node: int) -> Plh:
    parent = TREE_TOKENS[node][0]
    return Plh(hash=SEQ[node], parent=None if parent is None else SEQ[parent], position=len(_path(node)) - 1)


class ModelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model: Any = None
        self.view: RouterView | None = None
        self.requests: dict[int, dict[str, Any]] = {}
        self.next_req = 0

    @initialize(
        profile=st.sampled_from(["kvbm", "atomic", "legacy"]),
        policy=st.sampled_from(["lineage", "lru", "multi_lru"]),
        capacity=st.integers(3, 8),
    )
    def setup(self, profile: str, policy: str, capacity: int) -> None:
        if profile == "legacy":
            policy = "lru"
        self.cfg = ManagerConfig(profile=profile, capacity=capacity, block_size=BS, eviction=policy)  # type: ignore[arg-type]
        self.profile = get_profile(profile)
        self.model = make_model(self.cfg)
        self.view = RouterView(mode="set", strict=True)
        for node, (parent, _) in TREE_TOKENS.items():  # the true lineage, for PARENT-ANCHOR
            self.view.expect_parent(SEQ[node], None if parent is None else SEQ[parent])

    # ------------------------------------------------------------ helpers
    def _apply(self, op: Operation) -> Any:
        step = self.model.apply(op)
        assert self.view is not None
        for v in self.view.apply_batch(step.events, stored_first=self.profile.removed_timing == "after_stored"):
            reason = self.profile.known_break(v.rule, self.cfg.eviction)
            assert reason is not None, f"{v} (profile {self.profile.name} is not known to break it)"
        return step

    def _use(self, nodes: list[int], parent: int | None, partial: str | None) -> int:
        blocks: list[Any] = [FullBlock(full=SEQ[n]) for n in nodes]
        if partial is not None:
            blocks.append(PartialBlock(partial=partial))
        legacy = self.profile.name == "legacy"
        op = Use(
            blocks=blocks,
            plhs=[plh(n) for n in nodes],
            local_hashes=[LOCAL[n] for n in nodes],
            token_ids=[TREE_TOKENS[n][1] for n in nodes],
            parent=None if parent is None or legacy else FullBlock(full=SEQ[parent]),
        )
        step = self._apply(op)
        value = step.result.value
        if value is True:
            return len(blocks)
        if value is False:
            return -1  # legacy failure: which blocks stayed is not reported
        return int(value)

    # -------------------------------------------------------------- rules
    @rule(node=st.sampled_from(sorted(TREE_TOKENS)), chunked=st.booleans(), with_partial=st.booleans())
    def admit(self, node: int, chunked: bool, with_partial: bool) -> None:
        path = _path(node)
        rid = self.next_req
        self.next_req += 1
        partial = f"r{rid}" if with_partial and self.model.config.profile != "legacy" else None
        first = path[: len(path) // 2] if chunked and len(path) > 1 else path
        placed = self._use(first, None, None if first is not path else partial)
        req: dict[str, Any] = {"path": path, "held": [], "partial": None}
        if placed < 0:  # legacy failure leaves an unknown prefix held: drop the request
            return
        req["held"] = first[:placed] if placed <= len(first) else list(first)
        if partial is not None and first is path and placed == len(path) + 1:
            req["partial"] = partial
        if chunked and first is not path and placed == len(first):
            rest = path[len(first) :]
            more = self._use(rest, first[-1], None)
            if more >= 0:
                req["held"] = first + rest[:more]
        self.requests[rid] = req

    @precondition(lambda self: any(r["partial"] for r in self.requests.values()))
    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(r for r, v in self.requests.items() if v["partial"])))
        req = self.requests[rid]
        last = req["path"][-1]
        kids = [n for n, (p, _) in TREE_TOKENS.items() if p == last]
        if not kids:
            return
        child = kids[0]
        self._apply(
            Promote(
                uuid=req["partial"],
                seq_hash=SEQ[child],
                parent_hash=SEQ[last],
                local_hash=LOCAL[child],
                plh=plh(child),
                token_ids=TREE_TOKENS[child][1],
            )
        )
        req["held"].append(child)
        req["path"] = [*req["path"], child]
        req["partial"] = None

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        req = self.requests.pop(rid)
        refs: list[Any] = [FullBlock(full=SEQ[n]) for n in reversed(req["held"])]
        if req["partial"]:
            refs.insert(0, PartialBlock(partial=req["partial"]))
        if refs:
            self._apply(Deref(blocks=refs))

    # ---------------------------------------------------------- invariants
    @invariant()
    def counters_add_up(self) -> None:
        if self.model is None:
            return
        c = self.model.counters()
        assert c.active_blocks + c.inactive_blocks + c.free_blocks == self.cfg.capacity
        assert min(c.active_blocks, c.inactive_blocks, c.free_blocks, c.active_refs) >= 0
        owners = self.model.owners()
        assert all(n > 0 for n in owners.values())
        if isinstance(self.model, G1Model):
            assert c.active_refs == len(self.model.partial) + sum(owners.values())
            assert c.active_blocks == len(self.model.partial) + len(owners)
            inactive = set(self.model.inactive())
            assert len(inactive) == c.inactive_blocks
            assert not inactive & set(owners), "a block is both inactive and owned"
            assert inactive | set(owners) == self.model.registered()
        elif isinstance(self.model, LegacyModel):
            assert c.active_refs == sum(self.model.active.values())

    @invariant()
    def router_view_matches_announced_blocks(self) -> None:
        if self.model is None or self.view is None:
            return
        assert self.view.stored() == self.model.announced()

    @invariant()
    def held_blocks_are_owned(self) -> None:
        if self.model is None:
            return
        need: dict[int, int] = {}
        for req in self.requests.values():
            for n in req["held"]:
                need[SEQ[n]] = need.get(SEQ[n], 0) + 1
        owners = self.model.owners()
        for h, n in need.items():
            assert owners.get(h, 0) >= n, f"block {h} is held by {n} requests but has {owners.get(h, 0)} owners"


ModelMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestModelMachine = ModelMachine.TestCase
