"""Request-level mutants: bugs of a vLLM-style engine, served through protocol v2.

Each is one realistic bug of a request-level port of the ``vllm`` profile:
a request driver (``reference.requests.RequestDriver``) or pool
(``reference.vllm_pool.VllmPoolModel``) subclass that overrides the one
method where the bug lives. They run only in request-level sessions: the
mutant campaign serves them from the reference JSON-lines server
(``python -m kvspec.adapters.reference_jsonl.server --mutant NAME``), so a
kill proves that the request-level suite catches the bug *through the
protocol* (version 2), as it would in a port written in another language.
At block level a request-level mutant is the unmutated reference.

``catalogue.py`` registers ``MUTANTS`` in one line; ``open_request_mutant``
is the mutants adapter's request-level factory (``start.requests``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvspec.api import (
    SPEC_VARIANT,
    HostTier,
    Manifest,
    PoolSetup,
    PoolVariant,
    RequestDriver,
    RequestImplementation,
    Step,
    VllmPoolModel,
)
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import ConfigError
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import Deref, FullBlock, OpResult, Reset, Use, make_cleared

R = RuleId


class PrefixHitUncapped(RequestDriver):
    """A block-aligned prompt hits every cached block of it: the hit is not
    capped at ``num_tokens - 1`` tokens, so the last block is not recomputed."""

    def hit_cap(self, num_tokens: int) -> int:
        return num_tokens // self.block_size


class FreeForwardOrder(VllmPoolModel):
    """A freed block table is released first block first (parents before
    leaves), so under pressure a request's parents are evicted before its
    leaves."""

    def _deref(self, op: Deref) -> Step:
        return super()._deref(Deref(blocks=list(reversed(op.blocks))))


class FreeKeepsShared(VllmPoolModel):
    """A free does not drop the owner of a block another request also holds
    (vLLM's ``BlockPool.free_blocks`` skipping the ``ref_cnt`` decrement of a
    shared block): the block keeps an owner nobody has, is never evicted, and
    its slot is lost to the pool."""

    def _deref(self, op: Deref) -> Step:
        held = set(self.held.values())
        kept = [
            ref
            for ref in op.blocks
            if not (
                isinstance(ref, FullBlock)
                and any(self.copies[c].owners > 1 for c in self.by_hash.get(ref.full, ()) if self._hash_owners(c, held))
            )
        ]
        return super()._deref(Deref(blocks=kept))


class StoredBeforeRemoved(VllmPoolModel):
    """An allocation that reuses cached blocks publishes the Stored of its new
    blocks before the Removed of the blocks whose slots it took."""

    def _use(self, op: Use) -> Step:
        step = super()._use(op)
        if len(step.events) == 2 and step.events[0].kind == "removed":
            first, second = step.events
            swapped = [
                second.model_copy(update={"event_id": first.event_id}),
                first.model_copy(update={"event_id": second.event_id}),
            ]
            return Step(step.result, swapped)
        return step


class RootFirstHostTier(HostTier):
    """Inside one host batch the root block is evicted first, not the leaf."""

    def _victim_key(self, h: int) -> tuple[int, int, int]:
        clock, pos = self.entries[h]
        return (clock, pos, h)


class HostBatchRootFirst(VllmPoolModel):
    """The host tier evicts a batch root first (its parents before its leaves)."""

    def __init__(
        self, config: ManagerConfig, *, host_blocks: int | None = None, variant: PoolVariant = SPEC_VARIANT
    ) -> None:
        super().__init__(config, host_blocks=host_blocks, variant=variant)
        if self.host is not None:
            self.host = RootFirstHostTier(self.host.capacity, self.host.order)


class ResetNoCleared(VllmPoolModel):
    """The prefix-cache reset forgets every cached block but publishes no
    Cleared (AllBlocksCleared), so a router keeps every block it was told of."""

    def _reset(self) -> Step:
        step = super()._reset()
        if step.events:
            self.next_event_id -= len(step.events)
        return Step(step.result, [])


class ResetWhileHeld(VllmPoolModel):
    """The reset is not refused while a request holds blocks: it drops the
    cached blocks nobody holds, reports success and publishes a Cleared,
    though the held blocks stay cached (the router forgets them too)."""

    def _refuse_reset(self, op: Reset) -> Step:
        for cid in list(self.inactive):
            c = self.copies.pop(cid)
            self.inactive.pop(cid)
            self.free += 1
            if c.seq is not None:
                ids = self.by_hash[c.seq]
                ids.remove(cid)
                if not ids:
                    del self.by_hash[c.seq]
        return Step(OpResult(value=True), [make_cleared(self._next_id(), dp_rank=self.dp_rank)])


class ResetKeepsCache(VllmPoolModel):
    """The reset reports success and publishes a Cleared but forgets nothing:
    the next request hits blocks the router was told are gone."""

    def _clear_all(self, op: Reset) -> Step:
        return Step(OpResult(value=True), [make_cleared(self._next_id(), dp_rank=self.dp_rank)])


@dataclass(frozen=True, slots=True)
class RequestMutant:
    id: str
    description: str
    rule: RuleId
    driver: type[RequestDriver] = RequestDriver
    model: type[VllmPoolModel] = VllmPoolModel
    needs: tuple[str, ...] = ()


#: the request-level mutants (``catalogue.py`` registers them)
REQUEST_MUTANTS: tuple[RequestMutant, ...] = (
    RequestMutant(
        "prefix_hit_uncapped",
        "request level: a block-aligned prompt hits all its cached blocks (no recompute of the last)",
        R.VLLM_PREFIX_HIT,
        driver=PrefixHitUncapped,
    ),
    RequestMutant(
        "free_forward_order",
        "request level: a finished request frees its blocks first to last (parents evicted first)",
        R.VLLM_FREE_ORDER,
        model=FreeForwardOrder,
    ),
    RequestMutant(
        "free_keeps_shared",
        "request level: a free drops no owner of a block another request also holds (it is never evicted)",
        R.DEREF_OWNER,
        model=FreeKeepsShared,
        needs=("reset",),
    ),
    RequestMutant(
        "stored_before_removed",
        "request level: an allocation publishes its Stored before the Removed of the slots it reused",
        R.EVENT_ORDER,
        model=StoredBeforeRemoved,
    ),
    RequestMutant(
        "reset_no_cleared",
        "request level: the prefix-cache reset forgets every block but publishes no Cleared",
        R.CLEAR_ALL,
        model=ResetNoCleared,
        needs=("reset",),
    ),
    RequestMutant(
        "reset_while_held",
        "request level: the reset is not refused while a request holds blocks (drops the rest, publishes Cleared)",
        R.CLEAR_ALL,
        model=ResetWhileHeld,
        needs=("reset",),
    ),
    RequestMutant(
        "reset_keeps_cache",
        "request level: the reset publishes Cleared and reports success but forgets no cached block",
        R.CLEAR_ALL,
        model=ResetKeepsCache,
        needs=("reset",),
    ),
    RequestMutant(
        "host_batch_root_first",
        "request level: the host tier evicts a batch's root block first, not its leaf",
        R.G2_EVICT,
        model=HostBatchRootFirst,
        needs=("tier:host_pinned",),
    ),
)
BY_ID: dict[str, RequestMutant] = {m.id: m for m in REQUEST_MUTANTS}


def engine_types(name: str | None) -> tuple[type[RequestDriver], type[VllmPoolModel]]:
    """The request driver and pool of request-level mutant ``name`` (``none``
    or None: the reference's)."""
    if name is None or name == "none":
        return RequestDriver, VllmPoolModel
    m = BY_ID.get(name)
    if m is None:
        raise ConfigError(f"unknown request-level mutant {name!r}; known: none, {', '.join(sorted(BY_ID))}")
    return m.driver, m.model


def server_command(name: str | None) -> list[str]:
    """argv of the reference JSON-lines server running mutant ``name`` (None:
    the unmutated engine)."""
    argv = ["{python}", "-m", "kvspec.adapters.reference_jsonl.server"]
    return argv if name is None else [*argv, "--mutant", name]


def open_request_mutant(
    setup: PoolSetup, manifest: Manifest, adapter_dir: Path, variant: str | None = None
) -> RequestImplementation:
    """The mutants adapter's request level: a request-level mutant (and the
    unmutated reference, no variant: the campaign's sanity run) through
    protocol v2 from the reference server; any other mutant is a block-level
    bug, so its request level is the in-process reference."""
    name = variant
    if name is not None and name != "none" and name not in BY_ID:
        from kvspec.adapters.reference_requests.adapter import open_reference_requests

        return open_reference_requests(setup, manifest, adapter_dir)
    from kvspec.api import open_engine_command

    return open_engine_command(manifest, adapter_dir, setup, server_command(name))
