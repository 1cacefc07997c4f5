"""The radix profile at request level: a sequential run of an engine checked against ``reference.radix``.

For an engine that takes requests (prompt tokens, a token budget) and keeps
its prefix cache as a radix tree (SGLang, or Dynamo's mocker with its
SGLang-style backend), ``check_radix_sequential`` runs the radix model's
``request`` operation once per request of a sequential run and compares, in
this order, naming the rule of the first difference:

1. the events through the router view (set counting, strict: EVENT-ID,
   STORE-NO-DUP, PARENT-ANCHOR, REMOVE-EXACT, REMOVE-NO-ORPHAN);
2. the cached-token count the engine reported with the model's hit
   (RADIX-PREFIX-HIT);
3. the request's events with the model's, ids aside (EVENT-ID is the
   router view's): RADIX-INSERT, RADIX-EVICT-LRU, RADIX-REMOVE,
   RADIX-LOCKED-KEPT, RADIX-SPLIT-SILENT as in ``radix_check``.

Generated tokens are the engine's own and nobody outside sees them but
through its events: the tokens of a request's Stored pages beyond its prompt
are taken as its output (``outputs_from_events``); the output tokens never
cached (the partial last page, and the last token, which is never computed)
do not change what the model publishes, so any value stands for them. The
pool is ``capacity`` token slots in pages of ``page_size`` (for a block
pool: blocks times block size).

A whole run (``check_radix_run``, the request-level layer's radix check)
follows the known departures of a scheduler-driven engine, as the vllm
layer follows its pool's (``request_check``): when a request differs, the
checker looks for the fewest ``Flow`` options not yet on with which the
model gets past that request; if there are some, it records each departure
with its named condition (``kvspec.spec.deviations``), turns them on and
compares the run again from the start; if not, the difference is the
finding, with no condition. A stream numbered from 1 is followed the same
way (``event_ids_from_1``). The options (``FlowModel``):

- ``in_parts`` (``request_inserts_in_parts``, RADIX-INSERT): the engine
  runs a request as a scheduler does (``FlowModel._scheduled``): prefill
  allocates the prompt's pages and caches its whole pages, then each decode
  token that starts a page allocates one and each page decode completes is
  cached, each part one insert and one Stored, each allocation evicting
  what the free slots lack right then; the events are compared with
  consecutive ones of a kind merged (``coalesce``), as an event plane
  batches them;
- ``last_token`` (``request_caches_last_token``, RADIX-INSERT): a request
  that decodes (more than one output token) caches its last output token
  too, whose KV is never computed (it takes a slot and fills a page like
  every other token);
- ``leaf_suffix`` (``evicts_leaf_suffix``, RADIX-REMOVE): an eviction that
  needs fewer pages than the least recently used leaf holds takes only the
  leaf's newest pages and keeps the rest of it, where SGLang
  evicts whole leaves;
- ``extend_leaf`` (``insert_extends_leaf``, RADIX-INSERT): pages that
  continue a leaf join the leaf's node (SGLang hangs a new node under it),
  which shows in what later evictions take and in which order;
- ``split_keeps_time`` (``split_keeps_access_time``, RADIX-MATCH): the
  lower half of a node a match splits keeps its old access time (SGLang
  stamps every node the match passes, the split one included);
- ``late_prompt`` (``prompt_cached_after_first_decode_page``,
  RADIX-EVICT-LRU): the prompt's new pages are announced when prefill
  allocates them, but the tree takes the prompt (and the request's lock moves
  down its path) only after the first decode page is reserved, so that
  reservation's eviction may take the prompt's own cached pages past the
  match (the request holds copies of them: their eviction and their return
  are not announced) and otherwise takes another leaf than the model's.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from kvspec.conformance.radix.check import _locked_hashes, _node_hashes, check_events
from kvspec.conformance.requests.check import Finding, RunCheck
from kvspec.conformance.requests.interface import STALLED, ConcurrentRun, RequestOutcome
from kvspec.conformance.requests.workloads import Workload
from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.reference.radix import RadixModel
from kvspec.reference.radix_flow import UNSEEN, Flow, FlowModel
from kvspec.reference.router_view import RouterView
from kvspec.spec.deviations import Site
from kvspec.spec.radix_wire import RadixConfig, RadixRequest
from kvspec.spec.registry import RADIX
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Removed, Stored, make_removed, make_stored

R = RuleId


def outputs_from_events(
    prompt: Sequence[int], output_tokens: int, events: Sequence[KvEvent], page: int, *, last_token: bool = False
) -> list[int]:
    """The request's output tokens as far as its Stored pages show them
    (module docstring); ``last_token``: the engine caches the last one too."""
    flat = [t for ev in events if isinstance(ev.data, Stored) for toks in ev.block_token_ids or [] for t in toks]
    total = len(prompt) + output_tokens - (0 if last_token and output_tokens > 1 else 1)
    end = total // page * page
    start = end - len(flat)
    out = [UNSEEN] * output_tokens
    if flat and 0 <= start <= len(prompt) and list(flat[: len(prompt) - start]) == list(prompt[start:]):
        seen = flat[len(prompt) - start :]
        out[: len(seen)] = seen
    return out


def _without_id(ev: KvEvent) -> KvEvent:
    return ev.model_copy(update={"event_id": 0})


class RadixRequestFailure(ConformanceFailure):
    """A ``ConformanceFailure`` of one request of a run (``request``: its index)."""

    def __init__(self, rule: RuleId | str, report: str, *, request: int, conditions: frozenset[str] = frozenset()):
        rid = RuleId(rule)
        super().__init__(rid, report, site=Site(rid, operation="request", conditions=conditions, profile=RADIX))
        self.request = request


def _exercise(events: Sequence[KvEvent], reported_hit: bool, exercised: Counter[RuleId]) -> None:
    """What one request's expected events (and a reported hit) exercise."""
    exercised[R.RADIX_CAPACITY] += 1
    if reported_hit:
        exercised[R.RADIX_PREFIX_HIT] += 1
    for ev in events:
        exercised[R.EVENT_ID] += 1
        if isinstance(ev.data, Stored):
            exercised[R.RADIX_INSERT] += 1
            exercised[R.STORE_NO_DUP] += 1
            exercised[R.HASH_LOCAL] += len(ev.data.stored.blocks)
            exercised[R.HASH_SEQUENCE] += len(ev.data.stored.blocks)
            if ev.data.stored.parent_hash is not None:
                exercised[R.PARENT_ANCHOR] += 1
        elif isinstance(ev.data, Removed):
            for rule in (R.RADIX_EVICT_LRU, R.RADIX_REMOVE, R.RADIX_LOCKED_KEPT, R.REMOVE_EXACT, R.REMOVE_NO_ORPHAN):
                exercised[rule] += 1


#: each Flow option: its named condition and the rule its departure is filed under
FLOW_OPTIONS: dict[str, tuple[str, RuleId]] = {
    "in_parts": ("request_inserts_in_parts", R.RADIX_INSERT),
    "last_token": ("request_caches_last_token", R.RADIX_INSERT),
    "leaf_suffix": ("evicts_leaf_suffix", R.RADIX_REMOVE),
    "extend_leaf": ("insert_extends_leaf", R.RADIX_INSERT),
    "split_keeps_time": ("split_keeps_access_time", R.RADIX_MATCH),
    "late_prompt": ("prompt_cached_after_first_decode_page", R.RADIX_EVICT_LRU),
}


def check_radix_sequential(
    config: RadixConfig,
    prompts: Sequence[Sequence[int]],
    outcomes: Sequence[RequestOutcome],
    *,
    first_event_id: int = 0,
    exercised: Counter[RuleId] | None = None,
    flow: Flow = Flow(),
) -> RadixModel:
    """Raise ``RadixRequestFailure`` at the first request that differs from the
    radix model (with the ``flow`` departures followed); returns the model
    after the run. ``first_event_id``: the id the stream is compared from.
    A request the engine kept without finishing (``STALLED``) ends the
    comparison after its own check: the engine still holds it."""
    model = FlowModel(config, flow)
    view = RouterView(mode="set", strict=True, first_event_id=first_event_id)
    count: Counter[RuleId] = Counter() if exercised is None else exercised
    for i, (prompt, got) in enumerate(zip(prompts, outcomes, strict=True)):
        n_out = max(1, got.output_tokens)
        output = outputs_from_events(prompt, n_out, got.events, config.page_size, last_token=flow.last_token)
        op = RadixRequest(prompt=list(prompt), output=output)
        locked, nodes = _locked_hashes(model), _node_hashes(model)
        want = model.step(op)
        try:
            for v in view.apply_batch(got.events):
                raise ConformanceFailure(v.rule, f"the stream: {v}")
            if want.error is not None:
                raise ConformanceFailure(
                    R.RADIX_CAPACITY, f"the model refuses this request ({want.error.message}); the engine ran it"
                )
            if got.finish != "length":
                raise RadixRequestFailure(
                    R.RADIX_CAPACITY,
                    f"request {i} (prompt of {len(prompt)} tokens): the model runs it, the engine ended it with"
                    f" {got.finish!r} instead of generating its tokens",
                    request=i,
                    conditions=frozenset({"request_stalled"}) if got.finish == STALLED else frozenset(),
                )
            _exercise(want.events, got.cached_tokens is not None, count)
            if got.cached_tokens is not None and got.cached_tokens != want.value:
                raise ConformanceFailure(
                    R.RADIX_PREFIX_HIT, f"{got.cached_tokens} cached tokens, the model hits {want.value}"
                )
            after = {s for n in model.nodes() for s, _ in n.pages}
            got_e, want_e = [_without_id(e) for e in got.events], [_without_id(e) for e in want.events]
            if flow.in_parts:  # how the parts' events were batched is the publisher's business
                got_e, want_e = coalesce(got_e), coalesce(want_e)
            check_events(op, got_e, want_e, locked, nodes, after)
        except RadixRequestFailure:
            raise
        except ConformanceFailure as e:
            raise RadixRequestFailure(
                e.rule,
                f"request {i} (prompt of {len(prompt)} tokens): {e.report}\n"
                f"  expected (radix model):\n{_show(want.events)}\n  actual (implementation):\n{_show(got.events)}",
                request=i,
            ) from None
    return model


def coalesce(events: Sequence[KvEvent]) -> list[KvEvent]:
    """Consecutive events merged as an event plane batches them: a Removed
    right after a Removed joins it, a Stored right after a Stored it
    continues (its parent is that one's last page) joins it (ids: the
    first's)."""
    out: list[KvEvent] = []
    for ev in events:
        prev = out[-1] if out else None
        if prev is not None and isinstance(prev.data, Removed) and isinstance(ev.data, Removed):
            hashes = [*prev.data.removed.block_hashes, *ev.data.removed.block_hashes]
            out[-1] = make_removed(prev.event_id, hashes, dp_rank=prev.dp_rank, tier=prev.storage_tier)
            continue
        if (
            prev is not None
            and isinstance(prev.data, Stored)
            and isinstance(ev.data, Stored)
            and prev.data.stored.blocks
            and ev.data.stored.parent_hash == prev.data.stored.blocks[-1].block_hash
        ):
            blocks = [*prev.data.stored.blocks, *ev.data.stored.blocks]
            toks = None
            if prev.block_token_ids is not None and ev.block_token_ids is not None:
                toks = [*prev.block_token_ids, *ev.block_token_ids]
            out[-1] = make_stored(
                prev.event_id,
                [b.block_hash for b in blocks],
                [b.tokens_hash for b in blocks],
                prev.data.stored.parent_hash,
                dp_rank=prev.dp_rank,
                tier=prev.storage_tier,
                token_ids=toks,
            )
            continue
        out.append(ev)
    return out


def _show(events: Sequence[KvEvent]) -> str:
    if not events:
        return "      (none)"
    return "\n".join(f"      {k:>3}: {ev.brief()}" for k, ev in enumerate(events))


def follow_run(
    config: RadixConfig, prompts: Sequence[Sequence[int]], outcomes: Sequence[RequestOutcome], first_event_id: int = 0
) -> tuple[Flow, list[tuple[str, RadixRequestFailure]], RadixRequestFailure | None, Counter[RuleId]]:
    """Compare a sequential run, following the ``Flow`` departures: the flow
    it ended with, each departure followed (its option and the failure it
    explained), the failure nothing explains (None: the rest matched), and
    what the final comparison exercised."""
    flow = Flow()
    followed: list[tuple[str, RadixRequestFailure]] = []
    while True:
        count: Counter[RuleId] = Counter()
        try:
            check_radix_sequential(config, prompts, outcomes, first_event_id=first_event_id, exercised=count, flow=flow)
            return flow, followed, None, count
        except RadixRequestFailure as e:
            step = _next_flow(config, prompts, outcomes, first_event_id, flow, e.request)
            if step is None:
                return flow, followed, e, count
            followed.extend((option, e) for option in step[0])
            flow = step[1]


def _next_flow(
    config: RadixConfig,
    prompts: Sequence[Sequence[int]],
    outcomes: Sequence[RequestOutcome],
    first_event_id: int,
    flow: Flow,
    failed_at: int,
) -> tuple[list[str], Flow] | None:
    """The fewest options not yet on with which the run gets past ``failed_at``
    (one at a time first, then pairs, ...)."""
    off = [o for o in FLOW_OPTIONS if not getattr(flow, o)]
    for n in range(1, len(off) + 1):
        for options in itertools.combinations(off, n):
            trial = replace(flow, **dict.fromkeys(options, True))
            try:
                check_radix_sequential(config, prompts, outcomes, first_event_id=first_event_id, flow=trial)
            except RadixRequestFailure as e:
                if e.request <= failed_at:
                    continue
            return list(options), trial
    return None


# ------------------------------------------------------------ a whole run

#: the rules the radix request layer checks and reports one by one
RADIX_LAYER_RULES: tuple[RuleId, ...] = (
    R.EVENT_ID,
    R.STORE_NO_DUP,
    R.PARENT_ANCHOR,
    R.REMOVE_EXACT,
    R.REMOVE_NO_ORPHAN,
    R.RADIX_PREFIX_HIT,
    R.RADIX_MATCH,
    R.RADIX_INSERT,
    R.RADIX_SPLIT_SILENT,
    R.RADIX_EVICT_LRU,
    R.RADIX_REMOVE,
    R.RADIX_LOCKED_KEPT,
    R.RADIX_CAPACITY,
    R.HASH_LOCAL,
    R.HASH_SEQUENCE,
)


def radix_config(workload: Workload) -> RadixConfig:
    """The radix pool of a workload's setup: blocks times block size token slots in pages of a block."""
    m = workload.setup.manager
    return RadixConfig(page_size=m.block_size, capacity=m.capacity * m.block_size)


def ids_from_1(events: Sequence[KvEvent]) -> bool:
    """Condition ``event_ids_from_1``: the stream's ids are 1, 2, 3, ... (contiguous from 1)."""
    return bool(events) and all(ev.event_id == k + 1 for k, ev in enumerate(events))


def check_radix_run(workload: Workload, result: Sequence[RequestOutcome] | ConcurrentRun) -> RunCheck:
    """All checks of one run against the radix profile (module docstring).

    A sequential run is compared request by request (``check_radix_sequential``);
    a concurrent one, whose interleaving only the engine knows, through the
    router view and its requests' ends. A stream numbered from 1 is the
    EVENT-ID departure ``event_ids_from_1``, which is followed: the rest of
    the run is compared with ids from 1."""
    out = RunCheck()
    outcomes = list(result.outcomes) if isinstance(result, ConcurrentRun) else list(result)
    events = list(result.events) if isinstance(result, ConcurrentRun) else [e for o in outcomes for e in o.events]
    if len(outcomes) != len(workload.requests):
        raise ValueError(f"{len(outcomes)} outcomes for {len(workload.requests)} requests")
    first = 0
    if events and events[0].event_id != 0 and ids_from_1(events):
        first = 1
        out.add(
            Finding(
                R.EVENT_ID,
                "the stream numbers its events from 1, not 0",
                workload,
                detail=f"  first event: {events[0].brief()}",
                conditions=frozenset({"event_ids_from_1"}),
                profile=RADIX,
            )
        )
    if isinstance(result, ConcurrentRun):
        _check_concurrent(workload, events, outcomes, first, out)
        return out
    flow, followed, failure, count = follow_run(
        radix_config(workload), [r.prompt for r in workload.requests], outcomes, first
    )
    out.exercised.update(count)
    for option, e in followed:
        cond, rule = FLOW_OPTIONS[option]
        head, _, detail = e.report.partition("\n")
        out.add(
            Finding(
                rule,
                f"{head} [followed: {cond}]",
                workload,
                request=e.request,
                detail=detail,
                conditions=frozenset({cond}),
                profile=RADIX,
            )
        )
    if failure is not None:
        head, _, detail = failure.report.partition("\n")
        conditions = failure.site.conditions
        if "request_stalled" in conditions and admission_refuses(workload, outcomes, flow, failure.request):
            conditions = conditions | {"prefill_admission_refused"}
        out.add(
            Finding(
                failure.rule,
                head,
                workload,
                request=failure.request,
                detail=detail,
                conditions=conditions,
                profile=RADIX,
            )
        )
    return out


def admission_refuses(workload: Workload, outcomes: Sequence[RequestOutcome], flow: Flow, stalled: int) -> bool:
    """Condition ``prefill_admission_refused``: replaying the requests before
    ``stalled`` with ``flow``, its prompt past the hit (the prompt but its last
    token, cut to pages, that is cached), rounded up to whole pages, plus its
    max_tokens is at least the free and evictable slots then: an SGLang-style
    prefill admission (the new tokens and the whole output budget must stay
    under what is left) never lets it in, and in a sequential run nothing frees."""
    config = radix_config(workload)
    model = FlowModel(config, flow)
    for req, got in zip(workload.requests[:stalled], outcomes[:stalled], strict=True):
        n_out = max(1, got.output_tokens)
        output = outputs_from_events(req.prompt, n_out, got.events, config.page_size, last_token=flow.last_token)
        if model.step(RadixRequest(prompt=list(req.prompt), output=output)).error is not None:
            return False
    req = workload.requests[stalled]
    page = config.page_size
    hit = len(model._path_hashes(model._hit_key(list(req.prompt)))) * page
    charged = -(-(len(req.prompt) - hit) // page) * page + req.max_tokens
    return charged >= model.free + model.evictable_size()


def _check_concurrent(
    workload: Workload, events: Sequence[KvEvent], outcomes: Sequence[RequestOutcome], first: int, out: RunCheck
) -> None:
    view = RouterView(mode="set", strict=True, first_event_id=first)
    for i, ev in enumerate(events):
        out.exercised[R.EVENT_ID] += 1
        for v in view.apply(ev):
            out.add(
                Finding(
                    v.rule,
                    f"router view: {v.message}",
                    workload,
                    detail=f"  stream index {i}: {ev.brief()}",
                    profile=RADIX,
                )
            )
    for i, o in enumerate(outcomes):
        out.exercised[R.RADIX_CAPACITY] += 1
        if o.finish != "length":
            out.add(
                Finding(
                    R.RADIX_CAPACITY,
                    f"a request that fits the pool alone ended with {o.finish!r} instead of generating its tokens",
                    workload,
                    request=i,
                    conditions=frozenset({"request_stalled", "concurrent_run"}) if o.finish == STALLED else frozenset(),
                    profile=RADIX,
                )
            )
