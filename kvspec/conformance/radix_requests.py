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
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.reference.radix import RadixModel
from kvspec.reference.router_view import RouterView
from kvspec.spec.deviations import Site
from kvspec.spec.radix_wire import RadixConfig, RadixRequest
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Stored

from .failures import ConformanceFailure
from .radix_check import _locked_hashes, _node_hashes, check_events
from .request_interface import RequestOutcome

#: the value an output token never cached stands for (it is never seen)
UNSEEN = 0


def outputs_from_events(prompt: Sequence[int], output_tokens: int, events: Sequence[KvEvent], page: int) -> list[int]:
    """The request's output tokens as far as its Stored pages show them (module docstring)."""
    flat = [t for ev in events if isinstance(ev.data, Stored) for toks in ev.block_token_ids or [] for t in toks]
    total = len(prompt) + output_tokens - 1
    end = total // page * page
    start = end - len(flat)
    out = [UNSEEN] * output_tokens
    if flat and 0 <= start <= len(prompt) and list(flat[: len(prompt) - start]) == list(prompt[start:]):
        seen = flat[len(prompt) - start :]
        out[: len(seen)] = seen
    return out


def _without_id(ev: KvEvent) -> KvEvent:
    return ev.model_copy(update={"event_id": 0})


def check_radix_sequential(
    config: RadixConfig, prompts: Sequence[Sequence[int]], outcomes: Sequence[RequestOutcome]
) -> RadixModel:
    """Raise ``ConformanceFailure`` at the first request that differs from the radix model;
    returns the model after the run."""
    model = RadixModel(config)
    view = RouterView(mode="set", strict=True)
    for i, (prompt, got) in enumerate(zip(prompts, outcomes, strict=True)):
        op = RadixRequest(
            prompt=list(prompt),
            output=outputs_from_events(prompt, max(1, got.output_tokens), got.events, config.page_size),
        )
        locked, nodes = _locked_hashes(model), _node_hashes(model)
        want = model.step(op)
        try:
            for v in view.apply_batch(got.events):
                raise ConformanceFailure(
                    v.rule, f"the stream: {v}", site=Site(v.rule, operation="request", profile="radix")
                )
            if want.error is not None:
                raise ConformanceFailure(
                    RuleId.RADIX_CAPACITY,
                    f"the model refuses this request ({want.error.message}); the engine ran it",
                    site=Site(RuleId.RADIX_CAPACITY, operation="request", profile="radix"),
                )
            if got.cached_tokens is not None and got.cached_tokens != want.value:
                rule = RuleId.RADIX_PREFIX_HIT
                raise ConformanceFailure(
                    rule,
                    f"{got.cached_tokens} cached tokens, the model hits {want.value}",
                    site=Site(rule, operation="request", profile="radix"),
                )
            after = {s for n in model.nodes() for s, _ in n.pages}
            check_events(
                op, [_without_id(e) for e in got.events], [_without_id(e) for e in want.events], locked, nodes, after
            )
        except ConformanceFailure as e:
            raise ConformanceFailure(
                e.rule, f"request {i} (prompt of {len(prompt)} tokens): {e.report}", site=e.site
            ) from None
    return model
