"""What the terminal says about a conformance run, before and after it.

- ``header_lines``: the implementation under test (adapter, path, variant),
  the profiles, policies, semantics options and capabilities its manifest
  declares, the protocol it is spoken to with, the effort in use, and the
  versions that decide the generated traffic (kvspec and its spec digest,
  Hypothesis, Python: ``verdicts/provenance.py``); so a log says what was
  checked, and with what, without opening the manifest.
- ``rules_table``: how often each rule was exercised, with a legend, and
  every rule of the catalogue the run never exercised with the reason
  (capability missing, profile does not apply, never reached, not covered
  by any test of this run), from the same per-rule verdicts as the results
  file (``results_suite``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kvspec.conformance.run.settings import effort, is_deterministic
from kvspec.conformance.verdicts.results import RuleResult, current_versions
from kvspec.spec.manifest import Manifest
from kvspec.spec.protocol import BLOCK_VERSIONS, ENGINE_VERSION, FAMILY_VERSION, SessionFamily, legacy_versions
from kvspec.spec.registry import RADIX_FAMILY
from kvspec.spec.rules import RULES

_BOOL_CAPS = (
    "block_level",
    "request_level",
    "partial_blocks",
    "promote",
    "typed_errors",
    "strict_validation",
    "offload",
    "swap_in",
    "event_token_ids",
    "destroy",
    "reset",
)


def _offered(m: Manifest) -> str:
    """The JSON-lines versions the parent offers this adapter, by kind of session."""
    if m.kind != "subprocess":  # the C library's host process speaks 1 and 2
        return f"protocol versions {', '.join(map(str, BLOCK_VERSIONS))} offered (request level: {ENGINE_VERSION})"
    kinds: dict[SessionFamily, str] = {
        "block": "block",
        "request": "request",
        "manager": "allocator",
        RADIX_FAMILY: "radix",
    }
    each = "; ".join(f"{what} {', '.join(map(str, legacy_versions(fam)))}" for fam, what in kinds.items())
    if m.capabilities.workers > 1:
        each += f"; workers {', '.join(map(str, legacy_versions('block', 2)))}"
    if m.start.protocol is not None and m.start.protocol >= FAMILY_VERSION:
        return f"protocol versions offered: {each}; {FAMILY_VERSION} with each (start.protocol = {m.start.protocol})"
    return f"protocol versions offered: {each}"


def header_lines(
    manifest: Manifest,
    adapter_dir: Path,
    impl_arg: str | None,
    effort_name: str,
    *,
    seeded: bool,
    seed: object = None,
) -> list[str]:
    """The lines pytest prints in its header for this run."""
    m, caps = manifest, manifest.capabilities
    variant = f", variant {m.variant}" if m.variant else ""
    given = f" (--impl={impl_arg})" if impl_arg and impl_arg != str(adapter_dir) else ""
    others = [p for p in m.supported_profiles() if p != m.profile]
    on = [c for c in _BOOL_CAPS if getattr(caps, c, False)]
    off = [c for c in _BOOL_CAPS if not getattr(caps, c, False)]
    semantics = "; ".join(f"{k}={'|'.join(caps.supported(k))}" for k in sorted(caps.semantics)) or "defaults"
    protocol = "in-process (kind python: no wire protocol)" if m.kind == "python" else f"kind {m.kind}, {_offered(m)}"
    s = effort(effort_name, seeded=seeded)
    mode = "derandomised" if s.derandomize else ("seeded" if seeded else "random")
    if seeded and seed is not None:
        mode += f", --hypothesis-seed={seed}"
    return [
        f"kvspec adapter: {m.name}{variant} at {adapter_dir}{given}",
        f"kvspec profiles: {m.profile} (claimed)" + (f"; also {', '.join(others)}" if others else ""),
        f"kvspec policies: {', '.join(caps.policies)}; semantics options: {semantics}",
        f"kvspec capabilities: {', '.join(on) or '-'}; tiers {', '.join(caps.tiers)}"
        + (f"; not declared: {', '.join(off)}" if off else ""),
        f"kvspec protocol: {protocol}",
        f"kvspec versions: {current_versions().label()} (with the effort, they decide the generated traffic)",
        f"kvspec effort: {effort_name} ({s.max_examples} examples per test, {s.stateful_step_count} steps, {mode})"
        + ("" if is_deterministic(effort_name, seeded=seeded) else "; declared deviations are not judged")
        + (_SEED_IGNORED if seeded and s.derandomize else ""),
    ]


#: a derandomised effort fixes each test's examples from the test itself, so
#: Hypothesis ignores --hypothesis-seed there: two "seeds" are one run. Said
#: in the header so that nobody counts them as independent samples.
_SEED_IGNORED = (
    "; --hypothesis-seed has no effect on a derandomised effort "
    "(every seed gives the same examples; --hypothesis-profile=thorough or smoke varies them)"
)


LEGEND = (
    "legend: RULE COUNT = how many checked steps or scenario assertions of this run exercised the rule",
    "(exercised: the traffic asked for what the rule governs, whatever the implementation did);",
    "'never exercised' lists the catalogue's rules with no count, and why",
)


def rules_table(hits: Mapping[str, int], verdicts: Mapping[str, RuleResult] | None) -> list[str]:
    """The lines of the ``rules exercised`` section: a legend, the counts,
    then the rules never exercised with their reason (when ``verdicts``, the
    per-rule results of the run, are known)."""
    lines = [f"  {text}" for text in LEGEND]
    lines += [f"  {rule:<26} {n}" for rule, n in sorted(hits.items())]
    if verdicts is None:
        lines.append("  (a narrowed selection: the rules it never exercised are not listed)")
        return lines
    catalogue = {str(r) for r in RULES}
    missing = [r for r in sorted(catalogue) if not hits.get(r)]
    if not missing:
        return lines
    lines.append(f"  never exercised ({len(missing)} of {len(catalogue)} rules):")
    applies = [r for r in missing if (v := verdicts.get(r)) is None or v.status == "not_exercised"]
    for r in applies:
        lines.append(f"    {r:<26} APPLIES, never exercised: {never_reason(verdicts.get(r))}")
    for r in missing:
        if r not in applies:
            lines.append(f"    {r:<26} {never_reason(verdicts.get(r))}")
    return lines


def never_reason(v: RuleResult | None) -> str:
    """Why a rule has no count: its verdict's note in plain words."""
    if v is None:
        return "no test of this run covers it"
    if v.status == "not_applicable":
        return f"does not apply: {v.note}"
    if v.status == "deviation":
        return f"declared deviation ({v.note})"
    if v.status == "fail":
        return "failed before it was counted"
    note = v.note or "never reached"
    if "covered by" in note:
        return f"never reached ({note})"
    return note
