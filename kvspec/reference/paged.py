"""The reference model of the ``paged`` profile: a paged KV allocator.

Two pools of fixed-size blocks (device and host), sequences that map logical
blocks to physical ones through a block table, forks that share a prefix,
copy-on-write on a shared block, swap of a whole sequence between the pools,
and a small prefix cache that holds blocks like a sequence does. The model
is the spec of SPEC.md "Paged allocator" written as code: pure, deterministic
(the lowest free block is taken; implementations may take any free block,
the checker matches ids), and every operation either applies completely or
is rejected with the rule and changes nothing.

Written from the semantics of the ferrum inference engine's paged manager
(sizzlecar/ferrum-infer-rs crates/ferrum-kv/src/managers/paged.rs,
``PagedKvCacheManager``), with its questionable swap and copy-on-write paths
replaced by what the rules require (SPEC.md says where they differ).

The model is a transition table (``reference.transitions``): per operation,
the rules in the order they are tried, each with its guard (which reads the
state) and its effect (which changes it and returns the operation's value).
A rejection is a transition whose effect returns the error and changes
nothing, so every check comes before any change. The invariants an effect
keeps (PAGED-CONSERVE, PAGED-NO-REUSE, PAGED-REFCOUNT, PAGED-PRESSURE) are
the further rules of the transitions whose effects take or drop blocks.
Guards and effects are named by method, so a variant (the mutant zoo's)
overrides one method and keeps the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvspec.reference.transitions import Transition, TransitionModel, always
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

#: the operations that name an existing sequence in ``seq`` (a fork names it in ``src``)
Named = PagedExtend | PagedFork | PagedWrite | PagedSwapOut | PagedSwapIn | PagedFree | PagedStorePrefix
#: the operations that create a sequence (an allocation names it in ``seq``, the others in ``dst``)
Creating = PagedAllocate | PagedFork | PagedMatchPrefix
#: what an effect returns: the operation's value, or the error of a rejection
Answer = int | OpError


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

    def take(self) -> int:
        """A free block, with one holder and nothing written in it."""
        b = min(self.free)
        self.free.remove(b)
        self.refs[b] = 1
        self.data[b] = [None] * self.block_size
        return b

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


def _reject(rule: str, message: Callable[[PagedModel, Any], str]) -> Callable[[PagedModel, Any], OpError]:
    """The effect of a rejection: nothing changes, the error names the rule."""
    return lambda m, op: OpError(rule=rule, message=message(m, op))


def _needs(what: str, n: int, free: int) -> str:
    return f"{what} needs {n} free blocks, {free} free"


#: the rules an effect that takes or drops blocks keeps besides its own
KEEPS = ("PAGED-NO-REUSE", "PAGED-CONSERVE", "PAGED-REFCOUNT", "PAGED-PRESSURE")


class PagedModel(TransitionModel[PagedOutcome]):
    """The paged allocator. ``step(op)`` answers like an implementation: value or error, then the state.

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

    def _held_by_sequence(self, blocks: list[int]) -> bool:
        held = {b for s in self.seqs.values() if s.tier == "device" for b in s.blocks}
        return any(b in held for b in blocks)

    def pressure(self) -> Pressure:
        frac = len(self.device.free) / self.config.device_blocks
        if frac < self.config.critical_below:
            return "critical"
        if frac < self.config.high_below:
            return "high"
        return "low"

    @staticmethod
    def named(op: Named) -> str:
        """The existing sequence an operation names."""
        return op.src if isinstance(op, PagedFork) else op.seq

    @staticmethod
    def created(op: Creating) -> str:
        """The sequence an operation creates."""
        return op.seq if isinstance(op, PagedAllocate) else op.dst

    def _evictable(self) -> list[str]:
        return [k for k, blocks in self.prefixes.items() if not self._held_by_sequence(blocks)]

    def _evict(self, key: str) -> None:
        for b in self.prefixes.pop(key):
            self.device.drop(b)

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

    def _allocation(self, op: PagedAllocate) -> int:
        return _ceil(op.tokens, self.bs)

    def _extension(self, op: PagedExtend) -> int:
        s = self.seqs[op.seq]
        return _ceil(s.tokens + op.tokens, self.bs) - len(s.blocks)

    def _written(self, op: PagedWrite) -> int:
        """The block a write lands in."""
        return self.seqs[op.seq].blocks[op.position // self.bs]

    # ------------------------------------------------------------ guards

    def name_taken(self, op: Creating) -> bool:
        return self.created(op) in self.seqs

    def no_such_sequence(self, op: Named) -> bool:
        return self.named(op) not in self.seqs

    def not_on_device(self, op: Named) -> bool:
        return self.seqs[self.named(op)].tier != "device"

    def not_on_host(self, op: PagedSwapIn) -> bool:
        return self.seqs[op.seq].tier != "host"

    def allocation_too_big(self, op: PagedAllocate) -> bool:
        return self._allocation(op) > len(self.device.free)

    def extension_too_big(self, op: PagedExtend) -> bool:
        return self._extension(op) > len(self.device.free)

    def past_the_end(self, op: PagedWrite) -> bool:
        return op.position >= self.seqs[op.seq].tokens

    def shared(self, op: PagedWrite) -> bool:
        """The write lands in a block another holder reads: it copies first (but under ``write_in_place``)."""
        return self.device.refs[self._written(op)] > 1 and not self.write_in_place

    def shared_without_room(self, op: PagedWrite) -> bool:
        return self.shared(op) and not self.device.free

    def host_too_small(self, op: PagedSwapOut) -> bool:
        return len(self.seqs[op.seq].blocks) > len(self.host.free)

    def device_too_small(self, op: PagedSwapIn) -> bool:
        return len(self.seqs[op.seq].blocks) > len(self.device.free)

    def key_cached(self, op: PagedStorePrefix) -> bool:
        return op.key in self.prefixes

    def key_not_cached(self, op: PagedMatchPrefix) -> bool:
        return op.key not in self.prefixes

    def too_many_blocks(self, op: PagedStorePrefix) -> bool:
        return op.blocks > len(self.seqs[op.seq].blocks)

    def cache_disabled(self, op: PagedStorePrefix) -> bool:
        return self.config.max_prefixes == 0

    def cache_full(self, op: PagedStorePrefix) -> bool:
        return len(self.prefixes) >= self.config.max_prefixes

    def cache_full_and_held(self, op: PagedStorePrefix) -> bool:
        return self.cache_full(op) and not self._evictable()

    # ------------------------------------------------------------ effects

    def allocate(self, op: PagedAllocate) -> int:
        n = self._allocation(op)
        self.seqs[op.seq] = Seq("device", op.tokens, [self.device.take() for _ in range(n)])
        return n

    def extend(self, op: PagedExtend) -> int:
        s = self.seqs[op.seq]
        n = self._extension(op)
        s.blocks.extend(self.device.take() for _ in range(n))
        s.tokens += op.tokens
        return n

    def fork(self, op: PagedFork) -> int:
        src = self.seqs[op.src]
        n = len(src.blocks) if op.blocks is None else min(op.blocks, len(src.blocks))
        shared = src.blocks[:n]
        for b in shared:
            self.device.refs[b] += 1
        self.seqs[op.dst] = Seq("device", min(src.tokens, n * self.bs), list(shared))
        return n

    def copy_on_write(self, op: PagedWrite) -> int:
        """The writer's private copy of the shared block, then the write into it."""
        s = self.seqs[op.seq]
        i = op.position // self.bs
        b = s.blocks[i]
        nb = self.device.take()
        self.device.data[nb] = list(self.device.data[b])
        self.device.drop(b)
        s.blocks[i] = nb
        self.write(op)
        return 1

    def write(self, op: PagedWrite) -> int:
        self.device.data[self._written(op)][op.position % self.bs] = op.value
        return 0

    def swap_out(self, op: PagedSwapOut) -> int:
        s = self.seqs[op.seq]
        n = self._move(s, self.device, self.host)
        s.tier = "host"
        return n

    def swap_in(self, op: PagedSwapIn) -> int:
        s = self.seqs[op.seq]
        n = self._move(s, self.host, self.device)
        s.tier = "device"
        return n

    def free(self, op: PagedFree) -> int:
        s = self.seqs.pop(op.seq)
        pool = self.pool(s.tier)
        return sum(pool.drop(b) for b in s.blocks)

    def evict_and_store(self, op: PagedStorePrefix) -> int:
        """A full cache makes room: its least recently used entry no sequence holds goes."""
        self._evict(self._evictable()[0])
        return 1 + self.store(op)

    def store(self, op: PagedStorePrefix) -> int:
        blocks = self.seqs[op.seq].blocks[: op.blocks]
        for b in blocks:
            self.device.refs[b] += 1
        self.prefixes[op.key] = list(blocks)
        return 0

    def match(self, op: PagedMatchPrefix) -> int:
        blocks = self.prefixes[op.key]
        for b in blocks:
            self.device.refs[b] += 1
        self.prefixes[op.key] = self.prefixes.pop(op.key)  # most recently used
        self.seqs[op.dst] = Seq("device", len(blocks) * self.bs, list(blocks))
        return len(blocks)

    def evict_prefixes(self, op: PagedEvictPrefixes) -> int:
        victims = self._evictable()[: op.count]
        for k in victims:
            self._evict(k)
        return len(victims)

    # ------------------------------------------------------------ the table

    TRANSITIONS: ClassVar[Sequence[Transition[Any, Any]]] = (
        # allocate
        Transition(
            "PAGED-VALIDATE",
            PagedAllocate,
            "name_taken",
            _reject("PAGED-VALIDATE", lambda m, op: f"sequence {op.seq!r} already exists"),
        ),
        Transition(
            "PAGED-EXTEND",
            PagedAllocate,
            "allocation_too_big",
            _reject(
                "PAGED-EXTEND",
                lambda m, op: _needs(
                    f"allocate {op.seq!r} ({op.tokens} tokens)", m._allocation(op), len(m.device.free)
                ),
            ),
        ),
        Transition("PAGED-EXTEND", PagedAllocate, always, "allocate", also=KEEPS),
        # the other operations name an existing sequence, on the device (a swap-in: on the host)
        Transition(
            "PAGED-VALIDATE",
            (PagedExtend, PagedFork, PagedWrite, PagedSwapOut, PagedSwapIn, PagedFree, PagedStorePrefix),
            "no_such_sequence",
            _reject("PAGED-VALIDATE", lambda m, op: f"no sequence {m.named(op)!r}"),
        ),
        Transition(
            "PAGED-VALIDATE",
            (PagedExtend, PagedFork, PagedWrite, PagedSwapOut, PagedStorePrefix),
            "not_on_device",
            _reject(
                "PAGED-VALIDATE",
                lambda m, op: f"sequence {m.named(op)!r} is in the {m.seqs[m.named(op)].tier} pool, not device",
            ),
        ),
        Transition(
            "PAGED-VALIDATE",
            PagedSwapIn,
            "not_on_host",
            _reject("PAGED-VALIDATE", lambda m, op: f"sequence {op.seq!r} is in the device pool, not host"),
        ),
        # extend
        Transition(
            "PAGED-EXTEND",
            PagedExtend,
            "extension_too_big",
            _reject(
                "PAGED-EXTEND",
                lambda m, op: _needs(f"extend {op.seq!r} by {op.tokens} tokens", m._extension(op), len(m.device.free)),
            ),
        ),
        Transition("PAGED-EXTEND", PagedExtend, always, "extend", also=KEEPS),
        # fork
        Transition(
            "PAGED-VALIDATE",
            PagedFork,
            "name_taken",
            _reject("PAGED-VALIDATE", lambda m, op: f"sequence {op.dst!r} already exists"),
        ),
        Transition("PAGED-SHARE", PagedFork, always, "fork", also=("PAGED-REFCOUNT",)),
        # write
        Transition(
            "PAGED-VALIDATE",
            PagedWrite,
            "past_the_end",
            _reject(
                "PAGED-VALIDATE",
                lambda m, op: f"position {op.position} is past {op.seq!r}'s {m.seqs[op.seq].tokens} tokens",
            ),
        ),
        Transition(
            "PAGED-COW",
            PagedWrite,
            "shared_without_room",
            _reject(
                "PAGED-COW",
                lambda m, op: _needs(f"copy-on-write of block {m._written(op)} for {op.seq!r}", 1, 0),
            ),
        ),
        Transition("PAGED-COW", PagedWrite, "shared", "copy_on_write", also=KEEPS),
        Transition("PAGED-COW", PagedWrite, always, "write"),
        # swaps move the whole sequence between the pools
        Transition(
            "PAGED-SWAP",
            PagedSwapOut,
            "host_too_small",
            _reject(
                "PAGED-SWAP",
                lambda m, op: _needs(f"swap out {op.seq!r}", len(m.seqs[op.seq].blocks), len(m.host.free)),
            ),
        ),
        Transition("PAGED-SWAP", PagedSwapOut, always, "swap_out", also=KEEPS),
        Transition(
            "PAGED-SWAP",
            PagedSwapIn,
            "device_too_small",
            _reject(
                "PAGED-SWAP",
                lambda m, op: _needs(f"swap in {op.seq!r}", len(m.seqs[op.seq].blocks), len(m.device.free)),
            ),
        ),
        Transition("PAGED-SWAP", PagedSwapIn, always, "swap_in", also=KEEPS),
        # free
        Transition("PAGED-FREE", PagedFree, always, "free", also=KEEPS),
        # the prefix cache
        Transition(
            "PAGED-VALIDATE",
            PagedStorePrefix,
            "key_cached",
            _reject("PAGED-VALIDATE", lambda m, op: f"prefix {op.key!r} is already cached"),
        ),
        Transition(
            "PAGED-VALIDATE",
            PagedStorePrefix,
            "too_many_blocks",
            _reject(
                "PAGED-VALIDATE",
                lambda m, op: f"{op.seq!r} has {len(m.seqs[op.seq].blocks)} blocks, not {op.blocks}",
            ),
        ),
        Transition(
            "PAGED-VALIDATE",
            PagedStorePrefix,
            "cache_disabled",
            _reject("PAGED-VALIDATE", lambda m, op: "the prefix cache is disabled (max_prefixes = 0)"),
        ),
        Transition(
            "PAGED-PREFIX-EVICT",
            PagedStorePrefix,
            "cache_full_and_held",
            _reject(
                "PAGED-PREFIX-EVICT",
                lambda m, op: f"prefix cache full ({len(m.prefixes)}) and every entry is in use",
            ),
        ),
        Transition("PAGED-PREFIX-EVICT", PagedStorePrefix, "cache_full", "evict_and_store", also=KEEPS),
        Transition("PAGED-REFCOUNT", PagedStorePrefix, always, "store"),
        Transition(
            "PAGED-VALIDATE",
            PagedMatchPrefix,
            "key_not_cached",
            _reject("PAGED-VALIDATE", lambda m, op: f"no cached prefix {op.key!r}"),
        ),
        Transition(
            "PAGED-VALIDATE",
            PagedMatchPrefix,
            "name_taken",
            _reject("PAGED-VALIDATE", lambda m, op: f"sequence {op.dst!r} already exists"),
        ),
        Transition("PAGED-SHARE", PagedMatchPrefix, always, "match", also=("PAGED-REFCOUNT",)),
        Transition("PAGED-PREFIX-EVICT", PagedEvictPrefixes, always, "evict_prefixes", also=KEEPS),
    )

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
        answer: Answer = self.fire(op)
        if isinstance(answer, OpError):
            return PagedOutcome(error=answer, state=self.snapshot())
        return PagedOutcome(value=answer, state=self.snapshot())
