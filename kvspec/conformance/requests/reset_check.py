"""The prefix-cache reset at request level (CLEAR-ALL), step by step.

The request-level exploration runs whole workloads; a reset only means
something between requests and while one runs, so this check drives one
engine session call by call (``RequestImplementation.add`` / ``step`` /
``reset_prefix_cache``, capability ``reset``) next to the reference engine
(``reference.requests.RequestEngine``) doing the same calls:

1. request ``a`` runs to the end, nothing is held: the reset succeeds and
   publishes exactly one Cleared (device tier, the pool's dp_rank);
2. ``a`` again: the reset forgot every cached block, so the prompt hits
   nothing (the model's cached tokens) and its prompt blocks are Stored
   again (the router dropped them at the Cleared);
3. request ``b`` admitted and stepped once, so it holds blocks: the reset
   fails and publishes nothing;
4. ``b`` runs to the end: the reset succeeds again with one Cleared.

Every difference is a ``ConformanceFailure`` under CLEAR-ALL whose report
lists the calls so far with both sides' answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.conformance.requests.scripted import ScriptedRequestCheck
from kvspec.conformance.requests.scripted import brief as _brief
from kvspec.conformance.transport.engine import step_budget
from kvspec.reference.requests import RequestSpec
from kvspec.spec.errors import AdapterError
from kvspec.spec.hashing import block_hashes
from kvspec.spec.rules import RuleId
from kvspec.spec.wire import KvEvent, Stored

R = RuleId


@dataclass
class ResetCheck(ScriptedRequestCheck):
    """One session's reset script against the reference engine (module doc); ``record`` is told
    each time a reset was compared."""

    # ------------------------------------------------------------ the script
    def run(self) -> None:
        bs = self.setup.manager.block_size
        a = RequestSpec(prompt=[1 + k for k in range(2 * bs + 1)], max_tokens=2)
        b = RequestSpec(prompt=[101 + k for k in range(2 * bs + 1)], max_tokens=bs + 2)
        self.run_alone("a", a)
        self.reset("with nothing held")
        cached, stored = self.run_alone("a2", a)
        self.after_reset(a, cached, stored)
        self.hold("b", b)
        self.reset("while request b holds blocks")
        self.finish("b", b)
        self.reset("after b finished")

    # ----------------------------------------------------------------- steps
    def run_alone(self, rid: str, spec: RequestSpec) -> tuple[tuple[int | None, int | None], list[KvEvent]]:
        """``spec`` from add to finish on both sides: (impl, model) cached
        tokens and the implementation's events."""
        self.impl.add(rid, spec)
        self.model.add(rid, spec)
        self.log.append(f"add {rid}: prompt of {len(spec.prompt)} tokens, max_tokens {spec.max_tokens}")
        return self.finish(rid, spec)

    def finish(self, rid: str, spec: RequestSpec) -> tuple[tuple[int | None, int | None], list[KvEvent]]:
        impl_cached = model_cached = None
        events: list[KvEvent] = []
        for _ in range(step_budget([spec])):
            evs, done, idle = self.impl.step()
            events += evs
            impl_cached = next((d.get("cached_tokens") for d in done if d.get("id") == rid), impl_cached)
            if idle:
                break
        else:
            raise AdapterError(f"reset check: request {rid} did not finish within {step_budget([spec])} steps")
        while not self.model.idle:
            call = self.model.step()
            model_cached = next((f.result.cached_tokens for f in call.finished if f.request_id == rid), model_cached)
        self.log.append(f"steps until {rid} finished: {_brief(events)} (cached tokens {impl_cached})")
        return (impl_cached, model_cached), events

    def hold(self, rid: str, spec: RequestSpec) -> None:
        """Admit ``rid`` and step once on both sides: it holds blocks."""
        self.impl.add(rid, spec)
        self.model.add(rid, spec)
        evs, done, _ = self.impl.step()
        self.model.step()
        self.log.append(f"add {rid} and one step: {_brief(evs)}")
        if any(d.get("id") == rid for d in done):
            raise AdapterError(
                f"reset check: the engine finished request {rid} ({len(spec.prompt)} prompt tokens, "
                f"max_tokens {spec.max_tokens}) in one step, so no reset can come while it holds blocks"
            )

    def reset(self, when: str) -> None:
        ok, events = self.impl.reset_prefix_cache()
        want_ok, call = self.model.reset_prefix_cache()
        want = call.events
        self.log.append(f"reset {when}: {ok} | {_brief(events)}")
        self.record(str(R.CLEAR_ALL))
        if ok != want_ok:
            self.fail(f"reset {when}: it must {'succeed' if want_ok else 'fail'}", want_ok, ok)
        shape = [(e.kind, e.storage_tier, e.dp_rank) for e in events]
        want_shape = [(e.kind, e.storage_tier, e.dp_rank) for e in want]
        if shape != want_shape:
            what = "one Cleared (AllBlocksCleared) and nothing else" if want_ok else "nothing"
            self.fail(f"reset {when}: it must publish {what}", _brief(want), _brief(events))

    def after_reset(self, spec: RequestSpec, cached: tuple[int | None, int | None], stored: list[KvEvent]) -> None:
        impl_cached, model_cached = cached
        if impl_cached is not None and impl_cached != model_cached:
            self.fail(
                "the same prompt after a successful reset: the reset must forget every cached block",
                f"{model_cached} cached tokens",
                f"{impl_cached} cached tokens",
            )
        again = {
            b.block_hash
            for e in stored
            if e.storage_tier == "device" and isinstance(e.data, Stored)
            for b in e.data.stored.blocks
        }
        prompt = [seq for seq, _ in block_hashes(spec.prompt, self.setup.manager.block_size)]
        missing = [h for h in prompt if h not in again]
        if missing:
            self.fail(
                "the prompt's blocks cached again after a reset must be Stored again (the router dropped "
                "them at the Cleared)",
                f"Stored naming {prompt}",
                f"no Stored of {missing}",
            )

    # --------------------------------------------------------------- failure
    def pool(self) -> str:
        return f"{super().pool()}, dp_rank {self.setup.manager.dp_rank}"

    def fail(self, what: str, expected: object, actual: object) -> None:
        self.fail_under(R.CLEAR_ALL, what, expected, actual)


__all__ = ["ResetCheck"]
