"""Freeing a block two requests share (DEREF-OWNER), step by step.

The request-level exploration never frees a shared block where it could
see the consequence: a sequential workload runs one request at a time, so a
prompt block has at most one owner (a later hit finds it freed), and a
concurrent workload, where two requests do hold one block, is checked
against the protocol rules only, with room to spare after it. So a free
that drops no owner of a block another request also holds (the block
stays held for good: never evicted, its slot never reused) passed the
request layer. This check drives one engine session call by call
(``RequestImplementation.add`` / ``step``, the step-by-step interface of
capability ``reset``) next to the reference engine
(``reference.requests.RequestEngine``) doing the same calls:

1. requests ``a`` and ``b`` with one prompt of two full blocks and a tail
   are added together and stepped once: neither has finished, so both hold
   the prompt's two blocks (``b`` hits what ``a`` cached: two owners each);
2. both run to the end: each free drops one owner, so the two blocks have
   none and are evictable (their cached-token counts are compared with the
   model's, under VLLM-PREFIX-HIT: that is how the check knows ``b`` hit);
3. request ``c`` with a disjoint prompt that needs every block of the pool
   (prompt + max_tokens = capacity x block_size tokens) runs alone: it must
   generate its tokens, and every cached block must be Removed to make room,
   the two shared ones included, as many as the model removes.

A difference in 3. is a ``ConformanceFailure`` under DEREF-OWNER whose
report lists the calls so far with the implementation's answers; so is an
error the engine answers while running ``c`` (nothing else is held then: an
engine that refuses ``c`` kept an owner that no request has).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec.conformance.requests.interface import STALLED
from kvspec.conformance.requests.scripted import ScriptedRequestCheck
from kvspec.conformance.requests.scripted import brief as _brief
from kvspec.conformance.transport.engine import step_budget
from kvspec.reference.requests import RequestSpec
from kvspec.spec.errors import AdapterError
from kvspec.spec.hashing import block_hashes
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Removed

R = RuleId


def _removed(events: list[KvEvent]) -> list[int]:
    return [h for e in events if e.storage_tier == "device" and isinstance(e.data, Removed) for h in e.hashes()]


@dataclass
class SharedFreeCheck(ScriptedRequestCheck):
    """One session's shared-free script against the reference engine (module doc); ``record`` is
    told each time the script compared a free of shared blocks."""

    def run(self) -> None:
        bs, cap = self.setup.manager.block_size, self.setup.manager.capacity
        shared = RequestSpec(prompt=[1 + k for k in range(2 * bs + 1)], max_tokens=bs + 2)
        big = RequestSpec(prompt=[10_001 + k for k in range(cap * bs - 1)], max_tokens=1)
        for rid in ("a", "b"):
            self.impl.add(rid, shared)
            self.model.add(rid, shared)
        self.log.append(f"add a and b: the same prompt of {len(shared.prompt)} tokens, max_tokens {shared.max_tokens}")
        evs, done, _ = self.impl.step()
        self.model.step()
        self.log.append(f"one step: {_brief(evs)}")
        if done:
            raise AdapterError(
                f"shared-free check: the engine finished {[d.get('id') for d in done]} in one step "
                f"(max_tokens {shared.max_tokens}), so a and b never held their prompt blocks together"
            )
        impl_done, model_done, _ = self.until_idle([shared, shared], "a and b finished")
        for rid in ("a", "b"):
            got, want = impl_done.get(rid, {}).get("cached_tokens"), model_done.get(rid)
            if got is not None and got != want:
                self.fail(
                    R.VLLM_PREFIX_HIT,
                    f"request {rid} of two sharing one prompt: its prefix hit",
                    f"{want} cached tokens",
                    f"{got} cached tokens",
                )
        self.impl.add("c", big)
        self.model.add("c", big)
        self.log.append(f"add c: a disjoint prompt of {len(big.prompt)} tokens, max_tokens 1 (the whole pool)")
        try:
            impl_done, _, (events, want_events) = self.until_idle([big], "c finished", need="c")
        except AdapterError as e:
            self.fail(
                R.DEREF_OWNER,
                "request c needs every block of the pool; a and b freed everything they held, so it must run",
                "c runs and generates its token",
                f"the engine answered an error: {e}",
            )
        self.record(str(R.DEREF_OWNER))
        finish = impl_done.get("c", {}).get("finish", "length")
        if finish != "length":
            self.fail(
                R.DEREF_OWNER,
                "request c needs every block of the pool; after a and b finished no request holds a block, "
                "so the blocks they shared must have no owner left and be evictable",
                "c generates its token",
                f"c ended with {finish!r}" + (" (the engine could not schedule it)" if finish == STALLED else ""),
            )
        prompt = [seq for seq, _ in block_hashes(shared.prompt, self.setup.manager.block_size)]
        got_removed, want_removed = _removed(events), _removed(want_events)
        assert set(prompt) <= set(want_removed), "the script's model run must evict the shared blocks"
        kept = [h for h in prompt if h not in got_removed]
        if kept or len(got_removed) != len(want_removed):
            self.fail(
                R.DEREF_OWNER,
                "request c takes every block of the pool: every cached block must be evicted (Removed), the two "
                "a and b shared (freed by both, so with no owner) included",
                f"{len(want_removed)} blocks Removed, among them {prompt}: {_brief(want_events)}",
                f"{len(got_removed)} blocks Removed"
                + (f", not the shared {kept}" if kept else "")
                + f": {_brief(events)}",
            )

    def until_idle(
        self, specs: list[RequestSpec], what: str, need: str | None = None
    ) -> tuple[dict[str, dict[str, Any]], dict[str, int], tuple[list[KvEvent], list[KvEvent]]]:
        """Step both sides until idle: the implementation's finished requests
        by id, the model's cached tokens by id, and both sides' events."""
        impl_done: dict[str, dict[str, Any]] = {}
        events: list[KvEvent] = []
        for _ in range(step_budget(specs)):
            evs, done, idle = self.impl.step()
            events += evs
            impl_done.update((str(d.get("id")), d) for d in done)
            if idle:
                break
        else:
            if need is None:
                raise AdapterError(f"shared-free check: the engine was not idle within {step_budget(specs)} steps")
            impl_done.setdefault(need, {"id": need, "finish": f"not finished within {step_budget(specs)} steps"})
        model_done: dict[str, int] = {}
        want: list[KvEvent] = []
        while not self.model.idle:
            call = self.model.step()
            want += call.events
            model_done.update((f.request_id, f.result.cached_tokens) for f in call.finished)
        ends = ", ".join(
            f"{k}: {v.get('cached_tokens')} cached, {v.get('finish', 'length')}" for k, v in impl_done.items()
        )
        self.log.append(f"steps until {what}: {_brief(events)} ({ends})")
        return impl_done, model_done, (events, want)

    def fail(self, rule: RuleId, what: str, expected: object, actual: object) -> None:
        self.fail_under(rule, what, expected, actual)


__all__ = ["SharedFreeCheck"]
