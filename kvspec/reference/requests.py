"""The request driver: a request-level workload as the vllm model's operations.

Engines such as the Dynamo mocker take requests (prompt tokens and a token
budget), not block operations. This module turns one request into the
operations the ``vllm`` profile's model (``reference.vllm_pool``) applies,
step by step the way a vLLM-style scheduler runs it:

1. Prefill. The prompt's full blocks are hashed (``spec.hashing``). The prefix
   hit is the longest run of leading blocks cached on the device, continued on
   the host tier, and capped at ``(n - 1) // block_size`` blocks: whole blocks
   only, and at most ``n - 1`` tokens, so a block-aligned prompt always
   recomputes its last block (VLLM-PREFIX-HIT). One ``Use`` holds the block
   table: the device hits, then every other full prompt block (onboarded from
   the host or computed: allocated and cached together, one Stored), then the
   partial tail. A last block that is cached on the device but beyond the cap
   is recomputed into a fresh block and cached as another copy (``Use`` of a
   partial block, then ``Promote``).
2. Host write-through: every full prompt block goes to the host tier.
3. Decode. Each generated token but the last is computed into the KV cache:
   a token that starts a block takes a fresh block (``Use`` of a partial
   block, which may evict), and a block that fills up is cached (``Promote``).
   Decode blocks are hashed over tokens the caller cannot see (the Dynamo
   mocker appends hidden random tokens), so their hashes come from a
   ``DecodeHashes`` source: synthetic tokens for the reference adapter, the
   implementation's own hashes when the checker follows an implementation.
4. Finish: the request frees its blocks in reverse order, leaf first
   (``Deref``), so that its leaves age before its parents (VLLM-FREE-ORDER).

A request may only be as large as the pool: ``prompt + max_tokens - 1`` tokens
must fit in ``capacity * block_size`` (the Dynamo mocker stalls forever on a
request whose decode outgrows its pool); the driver refuses larger ones.

``run_sequential`` runs requests one after another. ``RequestEngine`` takes
requests and runs them by engine steps, one step per running request in
turn, admitting a request only when its whole budget is guaranteed (no
preemption); ``interleave`` runs a batch concurrently on it, for protocol
checks.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Protocol

import xxhash
from pydantic import Field, model_validator

from kvspec.reference.caller_contracts import ContractBroken, vllm_broken_contracts
from kvspec.reference.outcome import Step as ModelStep
from kvspec.reference.vllm_pool import SPEC_VARIANT, HostBlock, PoolVariant, VllmPoolModel
from kvspec.spec.config import ManagerConfig
from kvspec.spec.engine_wire import MAX_TOKENS_LIMIT
from kvspec.spec.errors import ConfigError
from kvspec.spec.hashing import block_hashes, local_block_hash, sequence_hash
from kvspec.spec.registry import VLLM_NAME
from kvspec.spec.rules import RuleId, rid
from kvspec.spec.wire import U32, BlockRef, Deref, FullBlock, KvEvent, PartialBlock, Plh, Promote, Reset, Use, Wire


class RequestSpec(Wire):
    """One request: prompt tokens and how many tokens to generate."""

    prompt: Annotated[list[U32], Field(min_length=1)]
    max_tokens: int = Field(ge=1, le=MAX_TOKENS_LIMIT)


class PoolSetup(Wire):
    """What a request-level implementation is started with: the device pool
    (a ``vllm`` manager configuration) and the optional host tier size."""

    manager: ManagerConfig
    host_blocks: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _vllm(self) -> PoolSetup:
        if self.manager.profile != VLLM_NAME:
            raise ValueError(f"request-level runs use the vllm profile, not {self.manager.profile!r}")
        return self

    @property
    def pool_tokens(self) -> int:
        return self.manager.capacity * self.manager.block_size

    def check_fits(self, index: int, req: RequestSpec) -> None:
        """Refuse a request whose prompt and decode cannot fit in the pool."""
        need = len(req.prompt) + req.max_tokens - 1
        if need > self.pool_tokens:
            raise ConfigError(
                f"request {index}: prompt ({len(req.prompt)}) + max_tokens ({req.max_tokens}) - 1 = {need} tokens "
                f"exceeds the pool ({self.manager.capacity} blocks x {self.manager.block_size} = "
                f"{self.pool_tokens} tokens); a vLLM-style engine cannot run it (the Dynamo mocker stalls)"
            )


@dataclass(slots=True)
class RequestResult:
    """What one request produced: its cached-token count and its events,
    with the request-level rules the driver applied (``rules``; the pool's
    own labels are in ``VllmPoolModel.event_labels``)."""

    cached_tokens: int
    events: list[KvEvent] = field(default_factory=list)
    rules: list[RuleId] = field(default_factory=list)
    #: the rule behind ``cached_tokens``
    cached_rule: RuleId = RuleId.VLLM_PREFIX_HIT


class DecodeHashes(Protocol):
    """Hashes of a decode-filled block: ``(request index, block index,
    parent sequence hash, the prompt tokens at the block's start)`` ->
    ``(sequence hash, local hash)``."""

    def __call__(self, request: int, block: int, parent: int | None, known: Sequence[int]) -> tuple[int, int]: ...


class SyntheticDecode:
    """Decode tokens drawn deterministically from (request index, position):
    hidden from the caller like the mocker's random tokens, but reproducible,
    and hashed with kvspec's own hashing."""

    def __init__(self, block_size: int, salt: int = 0) -> None:
        self.block_size = block_size
        self.salt = salt

    def token(self, request: int, position: int) -> int:
        return xxhash.xxh3_64_intdigest(struct.pack("<QQQ", self.salt, request, position)) & 0xFFFFFFFF

    def __call__(self, request: int, block: int, parent: int | None, known: Sequence[int]) -> tuple[int, int]:
        start = block * self.block_size
        tokens = list(known) + [self.token(request, start + i) for i in range(len(known), self.block_size)]
        local = local_block_hash(tokens)
        return sequence_hash(parent, local), local


Step = list[KvEvent]
#: a request generator yields the events of each engine step, or BLOCKED when
#: it could not allocate and must be retried; it returns its RequestResult
BLOCKED: Step = []
RequestSteps = Generator[Step | None, None, RequestResult]


class RequestDriver:
    """Runs requests against one ``VllmPoolModel``."""

    def __init__(self, model: VllmPoolModel, decode: DecodeHashes, *, check_contracts: bool = False) -> None:
        self.model = model
        self.decode = decode
        self.block_size = model.block_size
        #: check, before every Use and Promote it sends, the caller contract
        #: the vllm proofs assume (``caller_contracts.vllm_broken_contracts``):
        #: the driver holds its prefix by construction, and this makes it show
        #: it on every run of the checker (a break raises ``ContractBroken``)
        self.check_contracts = check_contracts
        #: operations whose contract was checked
        self.contracts_checked = 0

    def _apply(self, op: Use | Promote) -> ModelStep:
        """``model.apply(op)``, after the contract check when it is on."""
        if self.check_contracts:
            for brk in vllm_broken_contracts(self.model, op):
                raise ContractBroken(brk, op)
            self.contracts_checked += 1
        return self.model.apply(op)

    def hit_cap(self, num_tokens: int) -> int:
        """The most prompt blocks a prefix hit may cover: whole blocks of at
        most ``num_tokens - 1`` tokens (VLLM-PREFIX-HIT); the whole prompt
        under the ``full_prompt_hit`` departure (``PoolVariant``)."""
        if self.model.variant.full_prompt_hit:
            return num_tokens // self.block_size
        return (num_tokens - 1) // self.block_size

    def budget_blocks(self, req: RequestSpec) -> int:
        """Physical blocks the request holds at its peak."""
        tokens = len(req.prompt) + req.max_tokens - 1
        return -(-tokens // self.block_size)

    def _use(
        self,
        uid: str,
        hashes: Sequence[tuple[int, int]],
        fulls: Sequence[int],
        partials: Sequence[int],
        parent: int | None = None,
    ) -> Use:
        """The Use of full blocks ``fulls`` then partial blocks ``partials``
        (block indices of the request; a partial is named ``{uid}b{index}``)."""
        refs: list[BlockRef] = [FullBlock(full=hashes[i][0]) for i in fulls]
        refs += [PartialBlock(partial=f"{uid}b{i}") for i in partials]
        plhs = [Plh(hash=hashes[i][0], parent=hashes[i - 1][0] if i else None, position=i) for i in fulls]
        return Use(
            blocks=refs,
            local_hashes=[hashes[i][1] for i in fulls],
            plhs=plhs,
            parent=FullBlock(full=parent) if parent is not None else None,
        )

    def steps(self, index: int, req: RequestSpec) -> RequestSteps:
        """The request, one engine step per ``next()``; None means blocked."""
        m = self.model
        bs = self.block_size
        n = len(req.prompt)
        hashes = block_hashes(req.prompt, bs)
        full = len(hashes)
        cap = self.hit_cap(n)
        uid = f"r{index}"
        # ---- prefill
        seq_list = [s for s, _ in hashes]
        while True:  # the first allocation is retried (in a concurrent run) until it fits
            on_device = m.prefix_hits(seq_list)
            split = True
            if on_device > cap:  # the capped last block is cached: recompute it into a fresh copy
                cached = cap
                first, rest = list(range(full - 1)), [full - 1]
            else:
                on_host = m.host.prefix(seq_list, on_device) if m.host is not None else 0
                cached = min(on_device + on_host, cap)
                # the host prefix is loaded (onboarded) as far as the tokens before the last one reach
                onboard = max(0, min(on_host, -(-(n - 1) // bs) - on_device))
                if onboard:
                    first, rest = list(range(on_device + onboard)), list(range(on_device + onboard, full))
                else:
                    first, rest, split = list(range(full)), [], False
            tail = n % bs != 0 and not split
            step = self._apply(self._use(uid, hashes, first, [full] if tail else []))
            if step.result.status != "capacity":
                break
            yield None
        refs: list[BlockRef] = [FullBlock(full=seq_list[i]) for i in first] + (
            [PartialBlock(partial=f"{uid}b{full}")] if tail else []
        )
        events = list(step.events)
        if split:
            # after a load, or around a cached last block: the computed blocks
            # are allocated fresh, from the first one cached on the device on as copies
            cut = next((k for k, i in enumerate(rest) if m.cached(seq_list[i])), len(rest))
            fresh, copies = rest[:cut], rest[cut:]
            partials = copies + ([full] if n % bs else [])
            while fresh or partials:
                step = self._apply(
                    self._use(uid, hashes, fresh, partials, parent=seq_list[first[-1]] if first else None)
                )
                if step.result.status != "capacity":
                    events += step.events
                    break
                yield None
            refs += [FullBlock(full=seq_list[i]) for i in fresh]
            refs += [PartialBlock(partial=f"{uid}b{i}") for i in partials]
            for i in copies:
                parent = seq_list[i - 1] if i else None
                events += self._apply(
                    Promote(
                        uuid=f"{uid}b{i}",
                        seq_hash=seq_list[i],
                        parent_hash=parent,
                        local_hash=hashes[i][1],
                        plh=Plh(hash=seq_list[i], parent=parent, position=i),
                    )
                ).events
        hits = min(on_device, cap)  # written through too, unless the variant says otherwise
        events += m.host_write_through([HostBlock(s, loc, i) for i, (s, loc) in enumerate(hashes)], hits)
        # the prompt hashed by kvspec's hashing; the hit capped and whole blocks only
        prefill_rules = [rid("HASH-LOCAL"), rid("HASH-SEQUENCE"), rid("VLLM-PREFIX-HIT")]
        result = RequestResult(cached_tokens=cached * bs, rules=prefill_rules, cached_rule=rid("VLLM-PREFIX-HIT"))
        result.events.extend(events)
        yield events
        # ---- decode: every generated token but the last is computed
        seqs: list[int | None] = [s for s, _ in hashes] + ([None] if n % bs else [])
        computed = n
        for _ in range(req.max_tokens - 1):
            events = []
            if computed % bs == 0:  # this token starts a new block
                k = computed // bs
                while True:
                    step = m.apply(Use(blocks=[PartialBlock(partial=f"{uid}b{k}")]))
                    if step.result.status != "capacity":
                        break
                    yield None
                refs.append(PartialBlock(partial=f"{uid}b{k}"))
                seqs.append(None)
                events += step.events
            computed += 1
            if computed % bs == 0:  # a block filled up: cache it
                k = computed // bs - 1
                parent = seqs[k - 1] if k else None
                known = req.prompt[k * bs : min(n, (k + 1) * bs)]
                s, loc = self.decode(index, k, parent, known)
                seqs[k] = s
                events += self._apply(
                    Promote(
                        uuid=f"{uid}b{k}",
                        seq_hash=s,
                        parent_hash=parent,
                        local_hash=loc,
                        plh=Plh(hash=s, parent=parent, position=k),
                    )
                ).events
            result.events.extend(events)
            yield events
        # ---- finish: free in reverse order, leaf first
        result.rules.append(rid("VLLM-FREE-ORDER"))
        m.apply(Deref(blocks=list(reversed(refs))))
        return result


def run_to_end(gen: RequestSteps, what: str) -> RequestResult:
    """Drive one request alone; a blocked step means it can never run."""
    try:
        while True:
            if next(gen) is None:
                raise ConfigError(f"{what} cannot be allocated even with every other block free")
    except StopIteration as stop:
        return stop.value


def make_driver(
    setup: PoolSetup,
    decode: DecodeHashes | None = None,
    variant: PoolVariant = SPEC_VARIANT,
    *,
    check_contracts: bool = False,
) -> RequestDriver:
    model = VllmPoolModel(setup.manager, host_blocks=setup.host_blocks, variant=variant)
    return RequestDriver(model, decode or SyntheticDecode(setup.manager.block_size), check_contracts=check_contracts)


def run_sequential(
    setup: PoolSetup,
    requests: Sequence[RequestSpec],
    decode: DecodeHashes | None = None,
    variant: PoolVariant = SPEC_VARIANT,
    on_request: Callable[[int], None] | None = None,
) -> list[RequestResult]:
    """Run ``requests`` one after another on a fresh model; one result each.
    ``on_request(i)`` is called before request ``i`` starts (a checker uses it
    to point a following ``DecodeHashes`` at that request's events)."""
    for i, r in enumerate(requests):
        setup.check_fits(i, r)
    driver = make_driver(setup, decode, variant)
    out: list[RequestResult] = []
    for i, r in enumerate(requests):
        if on_request is not None:
            on_request(i)
        out.append(run_to_end(driver.steps(i, r), f"request {i}"))
    return out


@dataclass(slots=True)
class Finished:
    """A request that finished in one engine call: its id, its result, and
    whether it was refused at admission (it can never fit the pool)."""

    request_id: str
    spec: RequestSpec
    result: RequestResult
    rejected: bool = False


@dataclass(slots=True)
class EngineCall:
    """What one engine call did: the events it published, in order, and the
    requests that finished."""

    events: list[KvEvent] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)


class RequestEngine:
    """The reference engine: requests are added, then run by steps.

    Each ``step()`` first admits waiting requests in arrival order while the
    next one's whole budget (``budget_blocks``) fits beside the running
    requests' remaining budgets (so no request ever blocks and none is
    preempted), then lets every running request take one engine step, in
    admission order (a request whose generator is exhausted has freed its
    blocks and finishes in that step). A request that can never fit the pool
    is refused at ``add`` (it finishes at once, rejected). This is the
    engine behind the JSON-lines server's request-level sessions
    (spec/PROTOCOL.md, version 2) and behind ``interleave``.
    """

    def __init__(self, setup: PoolSetup, driver: RequestDriver) -> None:
        self.setup = setup
        self.driver = driver
        self.model: VllmPoolModel = driver.model
        self.specs: list[RequestSpec] = []
        self.ids: dict[str, int] = {}
        self.waiting: list[int] = []
        self.running: dict[int, RequestSteps] = {}
        self.held: dict[int, int] = {}

    def _budget_left(self) -> int:
        c = self.model.counters()
        return (
            c.free_blocks
            + c.inactive_blocks
            - sum(self.driver.budget_blocks(self.specs[i]) - self.held[i] for i in self.running)
        )

    def add(self, request_id: str, spec: RequestSpec) -> EngineCall:
        """Queue a request (ConfigError for an id already in use)."""
        if request_id in self.ids:
            raise ConfigError(f"request id {request_id!r} is already in use in this session")
        index = len(self.specs)
        self.ids[request_id] = index
        self.specs.append(spec)
        try:
            self.setup.check_fits(index, spec)
        except ConfigError:
            return EngineCall(finished=[Finished(request_id, spec, RequestResult(cached_tokens=0), rejected=True)])
        self.waiting.append(index)
        return EngineCall()

    def step(self) -> EngineCall:
        """One engine step (see the class docstring)."""
        while self.waiting and self.driver.budget_blocks(self.specs[self.waiting[0]]) <= self._budget_left():
            i = self.waiting.pop(0)
            self.running[i] = self.driver.steps(i, self.specs[i])
            self.held[i] = 0
        if self.waiting and not self.running:
            raise ConfigError(f"request {self.waiting[0]} can never be admitted")
        names = list(self.ids)
        out = EngineCall()
        for i in list(self.running):
            before = self.model.counters()
            try:
                events = next(self.running[i])
            except StopIteration as stop:
                out.finished.append(Finished(names[i], self.specs[i], stop.value))
                del self.running[i], self.held[i]
                continue
            if events is None:
                raise ConfigError(f"request {i} blocked although its budget was reserved")
            after = self.model.counters()
            self.held[i] += after.active_blocks - before.active_blocks
            out.events.extend(events)
        return out

    def reset_prefix_cache(self) -> tuple[bool, EngineCall]:
        """The prefix-cache reset (CLEAR-ALL): whether it happened, and its events."""
        step = self.model.apply(Reset())
        return step.result.value is True, EngineCall(events=list(step.events))

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running


def make_engine(
    setup: PoolSetup,
    decode: DecodeHashes | None = None,
    variant: PoolVariant = SPEC_VARIANT,
    driver_type: type[RequestDriver] = RequestDriver,
    model_type: type[VllmPoolModel] = VllmPoolModel,
) -> RequestEngine:
    """A reference engine on a fresh model; ``driver_type`` and ``model_type``
    let a request-level mutant (``adapters/mutants/request_bugs.py``) swap
    the request driver or the pool."""
    model = model_type(setup.manager, host_blocks=setup.host_blocks, variant=variant)
    return RequestEngine(setup, driver_type(model, decode or SyntheticDecode(setup.manager.block_size)))


def interleave(
    setup: PoolSetup, requests: Sequence[RequestSpec], decode: DecodeHashes | None = None
) -> tuple[list[RequestResult], list[KvEvent]]:
    """Run ``requests`` concurrently on a ``RequestEngine``: all are added,
    then it steps until every one has finished. Returns each request's
    result and the whole stream."""
    for i, r in enumerate(requests):
        setup.check_fits(i, r)
    engine = make_engine(setup, decode)
    for i, r in enumerate(requests):
        engine.add(f"r{i}", r)
    results: dict[str, RequestResult] = {}
    stream: list[KvEvent] = []
    while not engine.idle:
        call = engine.step()
        stream.extend(call.events)
        results.update((f.request_id, f.result) for f in call.finished)
    return [results[f"r{i}"] for i in range(len(requests))], stream
