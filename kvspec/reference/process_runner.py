"""Run a several-worker golden (``spec.process_scenario``) on the reference ``Process``.

Returns the first difference from the file's expectations as text, or None.
The model is the only implementation that runs these goldens today: the
adapter protocol has no worker id yet (SPEC.md, "Lower tiers", what is not
covered).
"""

from __future__ import annotations

from kvspec.reference.process import Process
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.process_scenario import ProcessScenario


def run_process_scenario(s: ProcessScenario) -> str | None:
    p = Process(s.config, s.workers)
    for i, step in enumerate(s.steps):
        exp = step.expect
        where = f"step {i} (worker {step.worker}, {step.op.op})"
        try:
            out = p.apply(step.worker, step.op)
        except InvalidOperation as e:
            if exp.error is not None and e.rule == exp.error:
                continue
            return f"{where}: rejected [{e.rule}] {e}"
        if exp.error is not None:
            return f"{where}: must be rejected under {exp.error}"
        res = out.step.result
        if "result" in exp.model_fields_set and res.value != exp.result:
            return f"{where}: result {res.value!r}, expected {exp.result!r}"
        if exp.status is not None and res.status != exp.status:
            return f"{where}: status {res.status!r}, expected {exp.status!r}"
        if exp.events is not None:
            for i in range(s.workers):
                want = [e.model_dump() for e in exp.events.get(str(i), [])]
                got = [e.model_dump() for e in out.events_of(i)]
                if got != want:
                    return f"{where}: worker {i} events\n  expected {want}\n  actual   {got}"
        for key, blocks in (exp.g2 or {}).items():
            got_g2 = p.workers[int(key)].registered("host_pinned")
            if got_g2 != set(blocks):
                return f"{where}: worker {key} G2 {sorted(got_g2)}, expected {sorted(blocks)}"
        for tier, want_blocks in (("g3", exp.g3), ("g4", exp.g4)):
            if want_blocks is not None and p.contents(tier) != set(want_blocks):
                return f"{where}: {tier} {sorted(p.contents(tier))}, expected {sorted(want_blocks)}"
        me = p.workers[step.worker]
        if exp.inactive is not None and set(me.inactive()) != set(exp.inactive):
            return f"{where}: inactive {sorted(me.inactive())}, expected {sorted(exp.inactive)}"
        if "earliest_deadline_ms" in exp.model_fields_set and me.earliest_deadline() != exp.earliest_deadline_ms:
            return f"{where}: earliest deadline {me.earliest_deadline()}, expected {exp.earliest_deadline_ms}"
    return None
