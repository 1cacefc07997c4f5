"""The reference model of the ``paged`` profile: a paged KV allocator.

Two pools of fixed-size blocks (device and host), sequences that map logical
blocks to physical ones through a block table, forks that share a prefix,
copy-on-write on a shared block, swap of a whole sequence between the pools,
and a small prefix cache that holds blocks like a sequence does. The model
is the spec of SPEC.md "Paged allocator" written as code: pure, deterministic
(the lowest free block is taken; implementations may take any free block,
the checker matches ids), and every operation either applies completely or
raises ``InvalidOperation`` with the rule and changes nothing.

Written from the semantics of the ferrum inference engine's paged manager
(sizzlecar/ferrum-infer-rs crates/ferrum-kv/src/managers/paged.rs,
``PagedKvCacheManager``), with its questionable swap and copy-on-write paths
replaced by what the rules require (SPEC.md says where they differ).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from kvspec.reference.labels import applies
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.manager_wire import (
    OpError,
    PagedAllocate,
    PagedConfig,
    PagedEvictPrefixes,
    PagedExtend,
    PagedFork,
    PagedFree,
    PagedMatchPrefix,
    PagedOp,
    PagedOutcome,
    PagedPrefixView,
    PagedSeqView,
    PagedSnapshot,
    PagedStorePrefix,
    PagedSwapIn,
    PagedSwapOut,
    PagedWrite,
    Pressure,
    Tier,
)
from kvspec.spec.rules import RuleId, rid


@dataclass
class Pool:
    """One pool: reference counts and contents of the blocks in use, the free ids."""

    size: int
    block_size: int
    refs: dict[int, int] = field(default_factory=dict)
    #: None: a slot not written since the block was taken (its value is unspecified)
    data: dict[int, list[int | None]] = field(default_factory=dict)
    free: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.free = set(range(self.size))

    @applies("PAGED-NO-REUSE", "PAGED-CONSERVE", "PAGED-REFCOUNT")
    def take(self) -> int:
        """A free block, with one holder and nothing written in it."""
        b = min(self.free)
        self.free.remove(b)
        self.refs[b] = 1
        self.data[b] = [None] * self.block_size
        return b

    @applies("PAGED-FREE", "PAGED-NO-REUSE", "PAGED-CONSERVE", "PAGED-REFCOUNT")
    def drop(self, b: int) -> bool:
        """One holder less; True when the block went back to the free set."""
        self.refs[b] -= 1
        if self.refs[b] == 0:
            # the contents stay until the block is taken again (as in memory):
            # a holder left dangling by a broken allocator reads stale data
            del self.refs[b]
            self.free.add(b)
            return True
        return False


@dataclass
class Seq:
    tier: Tier
    tokens: int
    blocks: list[int]


def _ceil(n: int, d: int) -> int:
    return -(-n // d)


class PagedModel:
    """The paged allocator. ``apply(op)`` returns the op's value or raises.

    ``FOLLOW``: the departures the lockstep can follow when a manifest declares
    them (``kvspec.conformance.managers.follow``): condition -> (the rule it
    breaks, the switch that runs it). ``write_in_place``: a write to a shared
    block writes into it instead of copying it first, as the ferrum seed's
    ``PagedKvCacheManager::write_kv`` does (every holder then reads the value,
    nothing is taken, the block keeps its holders)."""

    FOLLOW: ClassVar[dict[str, tuple[RuleId, str]]] = {"write_in_place": (rid("PAGED-COW"), "write_in_place")}

    def __init__(self, config: PagedConfig) -> None:
        self.config = config
        self.write_in_place = False
        self.bs = config.block_size
        self.device = Pool(config.device_blocks, self.bs)
        self.host = Pool(config.host_blocks, self.bs)
        self.seqs: dict[str, Seq] = {}
        #: key -> device blocks, least recently used first (dict order)
        self.prefixes: dict[str, list[int]] = {}

    # ------------------------------------------------------------ helpers

    def pool(self, tier: Tier) -> Pool:
        return self.device if tier == "device" else self.host

    @applies("PAGED-VALIDATE")
    def _seq(self, name: str, *, tier: Tier | None = "device") -> Seq:
        s = self.seqs.get(name)
        if s is None:
            raise InvalidOperation(rid("PAGED-VALIDATE"), f"no sequence {name!r}")
        if tier is not None and s.tier != tier:
            raise InvalidOperation(rid("PAGED-VALIDATE"), f"sequence {name!r} is in the {s.tier} pool, not {tier}")
        return s

    def _new_name(self, name: str) -> None:
        if name in self.seqs:
            raise InvalidOperation(rid("PAGED-VALIDATE"), f"sequence {name!r} already exists")

    def _need(self, pool: Pool, n: int, rule: RuleId, what: str) -> None:
        if n > len(pool.free):
            raise InvalidOperation(rule, f"{what} needs {n} free blocks, {len(pool.free)} free")

    def _held_by_sequence(self, blocks: list[int]) -> bool:
        held = {b for s in self.seqs.values() if s.tier == "device" for b in s.blocks}
        return any(b in held for b in blocks)

    @applies("PAGED-PRESSURE")
    def pressure(self) -> Pressure:
        frac = len(self.device.free) / self.config.device_blocks
        if frac < self.config.critical_below:
            return "critical"
        if frac < self.config.high_below:
            return "high"
        return "low"

    # ------------------------------------------------------------ operations

    def apply(self, op: PagedOp) -> int:
        handler: Callable[..., int] = getattr(self, f"_op_{op.op}")
        return handler(op)

    @applies("PAGED-EXTEND")
    def _op_allocate(self, op: PagedAllocate) -> int:
        self._new_name(op.seq)
        n = _ceil(op.tokens, self.bs)
        self._need(self.device, n, rid("PAGED-EXTEND"), f"allocate {op.seq!r} ({op.tokens} tokens)")
        self.seqs[op.seq] = Seq("device", op.tokens, [self.device.take() for _ in range(n)])
        return n

    @applies("PAGED-EXTEND")
    def _op_extend(self, op: PagedExtend) -> int:
        s = self._seq(op.seq)
        n = _ceil(s.tokens + op.tokens, self.bs) - len(s.blocks)
        self._need(self.device, n, rid("PAGED-EXTEND"), f"extend {op.seq!r} by {op.tokens} tokens")
        s.blocks.extend(self.device.take() for _ in range(n))
        s.tokens += op.tokens
        return n

    @applies("PAGED-SHARE", "PAGED-REFCOUNT")
    def _op_fork(self, op: PagedFork) -> int:
        src = self._seq(op.src)
        self._new_name(op.dst)
        n = len(src.blocks) if op.blocks is None else min(op.blocks, len(src.blocks))
        shared = src.blocks[:n]
        for b in shared:
            self.device.refs[b] += 1
        self.seqs[op.dst] = Seq("device", min(src.tokens, n * self.bs), list(shared))
        return n

    @applies("PAGED-COW")
    def _op_write(self, op: PagedWrite) -> int:
        s = self._seq(op.seq)
        if op.position >= s.tokens:
            raise InvalidOperation(
                rid("PAGED-VALIDATE"), f"position {op.position} is past {op.seq!r}'s {s.tokens} tokens"
            )
        i, slot = divmod(op.position, self.bs)
        b = s.blocks[i]
        copied = 0
        if self.device.refs[b] > 1 and not self.write_in_place:
            self._need(self.device, 1, rid("PAGED-COW"), f"copy-on-write of block {b} for {op.seq!r}")
            nb = self.device.take()
            self.device.data[nb] = list(self.device.data[b])
            self.device.drop(b)
            s.blocks[i] = nb
            b, copied = nb, 1
        self.device.data[b][slot] = op.value
        return copied

    def _move(self, s: Seq, src: Pool, dst: Pool) -> int:
        moved = []
        for b in s.blocks:
            nb = dst.take()
            dst.data[nb] = list(src.data[b])
            moved.append(nb)
        for b in s.blocks:
            src.drop(b)
        s.blocks = moved
        return len(moved)

    @applies("PAGED-SWAP")
    def _op_swap_out(self, op: PagedSwapOut) -> int:
        s = self._seq(op.seq)
        self._need(self.host, len(s.blocks), rid("PAGED-SWAP"), f"swap out {op.seq!r}")
        n = self._move(s, self.device, self.host)
        s.tier = "host"
        return n

    @applies("PAGED-SWAP")
    def _op_swap_in(self, op: PagedSwapIn) -> int:
        s = self._seq(op.seq, tier="host")
        self._need(self.device, len(s.blocks), rid("PAGED-SWAP"), f"swap in {op.seq!r}")
        n = self._move(s, self.host, self.device)
        s.tier = "device"
        return n

    @applies("PAGED-FREE")
    def _op_free(self, op: PagedFree) -> int:
        s = self._seq(op.seq, tier=None)
        pool = self.pool(s.tier)
        del self.seqs[op.seq]
        return sum(pool.drop(b) for b in s.blocks)

    def _evictable(self) -> list[str]:
        return [k for k, blocks in self.prefixes.items() if not self._held_by_sequence(blocks)]

    def _evict(self, key: str) -> None:
        for b in self.prefixes.pop(key):
            self.device.drop(b)

    @applies("PAGED-PREFIX-EVICT", "PAGED-REFCOUNT")
    def _op_store_prefix(self, op: PagedStorePrefix) -> int:
        s = self._seq(op.seq)
        if op.key in self.prefixes:
            raise InvalidOperation(rid("PAGED-VALIDATE"), f"prefix {op.key!r} is already cached")
        if op.blocks > len(s.blocks):
            raise InvalidOperation(rid("PAGED-VALIDATE"), f"{op.seq!r} has {len(s.blocks)} blocks, not {op.blocks}")
        if self.config.max_prefixes == 0:
            raise InvalidOperation(rid("PAGED-VALIDATE"), "the prefix cache is disabled (max_prefixes = 0)")
        evicted = 0
        if len(self.prefixes) >= self.config.max_prefixes:
            victims = self._evictable()
            if not victims:
                raise InvalidOperation(
                    rid("PAGED-PREFIX-EVICT"), f"prefix cache full ({len(self.prefixes)}) and every entry is in use"
                )
            self._evict(victims[0])
            evicted = 1
        blocks = s.blocks[: op.blocks]
        for b in blocks:
            self.device.refs[b] += 1
        self.prefixes[op.key] = list(blocks)
        return evicted

    @applies("PAGED-PREFIX-EVICT", "PAGED-SHARE")
    def _op_match_prefix(self, op: PagedMatchPrefix) -> int:
        blocks = self.prefixes.get(op.key)
        if blocks is None:
            raise InvalidOperation(rid("PAGED-VALIDATE"), f"no cached prefix {op.key!r}")
        self._new_name(op.dst)
        for b in blocks:
            self.device.refs[b] += 1
        self.prefixes[op.key] = self.prefixes.pop(op.key)  # most recently used
        self.seqs[op.dst] = Seq("device", len(blocks) * self.bs, list(blocks))
        return len(blocks)

    @applies("PAGED-PREFIX-EVICT")
    def _op_evict_prefixes(self, op: PagedEvictPrefixes) -> int:
        victims = self._evictable()[: op.count]
        for k in victims:
            self._evict(k)
        return len(victims)

    # ------------------------------------------------------------ observation

    def snapshot(self) -> PagedSnapshot:
        seqs = {}
        for name, s in sorted(self.seqs.items()):
            pool = self.pool(s.tier)
            data = [pool.data[s.blocks[p // self.bs]][p % self.bs] for p in range(s.tokens)]
            seqs[name] = PagedSeqView(tier=s.tier, tokens=s.tokens, blocks=list(s.blocks), data=data)
        return PagedSnapshot(
            sequences=seqs,
            device_refs={str(b): n for b, n in sorted(self.device.refs.items())},
            host_refs={str(b): n for b, n in sorted(self.host.refs.items())},
            free_device=len(self.device.free),
            free_host=len(self.host.free),
            prefixes=[PagedPrefixView(key=k, blocks=list(v)) for k, v in self.prefixes.items()],
            pressure=self.pressure(),
        )

    def step(self, op: PagedOp) -> PagedOutcome:
        """Apply ``op`` as an implementation would answer it: value or error, then the state."""
        saved = copy.deepcopy((self.device, self.host, self.seqs, self.prefixes))
        try:
            value = self.apply(op)
        except InvalidOperation as e:
            # every handler validates before it mutates; restoring guards the model's own promise
            self.device, self.host, self.seqs, self.prefixes = saved
            return PagedOutcome(error=OpError(rule=str(e.rule), message=e.message), state=self.snapshot())
        return PagedOutcome(value=value, state=self.snapshot())
