"""Which rules apply to an adapter: what a complete run must exercise.

A rule applies to an adapter when the suite has a test that asks for it
under one of the profiles the manifest runs and with the capabilities it
declares. A run that never exercises a rule that applies is **incomplete**:
not a pass (``results_suite``, ``plugin``). A rule that does not apply is
``not_applicable``, with the reason this module gives, in every report.

Where each family of rules is asked for:

- the G1 lifecycle and event rules: the block-level lockstep and the
  goldens, under each of ``kvbm``, ``atomic``, ``legacy`` the adapter runs
  (``block_level``, and a policy of the profile), less what the profile does
  not have (``profiles.Profile.not_applicable``) and what needs a capability:
  partial blocks, promote, typed errors (the invalid traffic), Destroy
  (``destroy``, legacy only);
- the offload rules: that lockstep under ``kvbm`` with ``offload`` (swap-in
  needs ``swap_in``);
- the vLLM pool rules and the request layer's: the request-level exploration
  (``request_level``, request profile ``vllm``); CLEAR-ALL and DEREF-OWNER
  need ``reset`` (the reset test and the shared-free test drive the engine
  step by step); the host-tier rules need
  the ``host_pinned`` tier;
- paged, session, radix: their own checkers, when the adapter runs the
  profile (radix tree operations need ``start.radix`` or a protocol-4 child;
  a request-only radix adapter is asked the radix request layer's rules);
- hashing: wherever blocks are stored (block or request level);
- invariants: the ones a lockstep step exercises on the implementation
  (``coverage.STEP_INVARIANTS``) apply where that lockstep runs; the others
  are properties of the reference model, proven by ``kvspec prove``
  (INVARIANTS.md), and checked on an implementation only through the rules
  they protect: they do not apply to a conformance run.
"""

from __future__ import annotations

from kvspec.conformance.block.coverage import STEP_INVARIANTS
from kvspec.conformance.requests.check import LAYER_RULES
from kvspec.spec import registry
from kvspec.spec.manifest import Manifest
from kvspec.spec.profiles import PROFILES
from kvspec.spec.registry import KVBM_NAME, LEGACY_NAME, PAGED, RADIX, RADIX_FAMILY, SESSION, VLLM_NAME
from kvspec.spec.rules import RULES, Concern, RuleId

R = RuleId
#: the block profiles the G1 lockstep runs (those with a lockstep machine: kvbm, atomic, legacy)
G1_PROFILES = registry.names("block", stateful=True)

#: rules the G1 lockstep can ask only with a capability: (capabilities, why)
_G1_NEEDS: dict[RuleId, tuple[tuple[str, ...], str]] = {
    R.USE_PARTIAL: (("partial_blocks",), "partial blocks"),
    R.DEREF_PARTIAL: (("partial_blocks",), "partial blocks"),
    R.INV_PARTIAL_UUID: (("partial_blocks",), "partial blocks"),
    R.PROMOTE_NEW: (("partial_blocks", "promote"), "promote of partial blocks"),
    R.PROMOTE_EXISTING: (("partial_blocks", "promote"), "promote of partial blocks"),
    R.PROMOTE_UNKNOWN: (("partial_blocks", "promote", "typed_errors"), "promote and typed errors"),
    R.DEREF_UNKNOWN: (("typed_errors",), "typed errors"),
    R.USE_VALIDATE: (("typed_errors",), "typed errors"),
    R.DESTROY_ACTIVE: (("destroy",), "destroy"),
}

#: the radix rules a request-only adapter is asked (the radix request layer)
_RADIX_REQUEST_RULES = frozenset(
    {
        R.RADIX_PREFIX_HIT,
        R.RADIX_MATCH,
        R.RADIX_INSERT,
        R.RADIX_SPLIT_SILENT,
        R.RADIX_EVICT_LRU,
        R.RADIX_REMOVE,
        R.RADIX_LOCKED_KEPT,
        R.RADIX_CAPACITY,
    }
)
#: protocol and hashing rules the radix checkers ask
_RADIX_SHARED = frozenset(
    {R.EVENT_ID, R.STORE_NO_DUP, R.PARENT_ANCHOR, R.REMOVE_EXACT, R.REMOVE_NO_ORPHAN, R.HASH_LOCAL, R.HASH_SEQUENCE}
)
_HOST_RULES = frozenset({R.G2_EVICT, R.G2_STORE_ON_COMPLETE})

MODEL_ONLY = (
    "a property of the reference model, proven by kvspec prove (INVARIANTS.md); an implementation is checked "
    "through the rules it protects, not on its own"
)


def _g1_profiles(m: Manifest) -> list[str]:
    """The G1 profiles the block-level lockstep runs for ``m``."""
    caps = m.capabilities
    if not caps.block_level:
        return []
    run = m.supported_profiles()
    return [p for p in G1_PROFILES if p in run and any(pol in caps.policies for pol in PROFILES[p].policies)]


def _g1_reason(rule: RuleId, m: Manifest) -> str | None:
    """Why the G1 lockstep and goldens never ask ``rule`` of ``m`` (None: they do)."""
    profiles = _g1_profiles(m)
    if not profiles:
        return "no block-level G1 profile (kvbm, atomic, legacy) run" + (
            "" if m.capabilities.block_level else ": missing capability block_level"
        )
    caps = m.capabilities
    concern = RULES[rule].concern
    if concern == Concern.OFFLOAD:
        if KVBM_NAME not in profiles or not caps.offload:
            return "missing capability offload (under kvbm)"
        if rule in (R.SWAPIN_RESERVE, R.SWAPIN_SKIP_PRESENT, R.SWAPIN_ANCHOR) and not caps.swap_in:
            return "missing capability swap_in"
        return None
    if rule in STEP_INVARIANTS or rule == R.INV_ROUTER_MATCH:
        only = STEP_INVARIANTS.get(rule)
        if only is not None and not set(only) & set(profiles):
            return f"profile {', '.join(only)} not run at block level"
        if rule == R.INV_QUARANTINE and not caps.offload:
            return "missing capability offload (under kvbm)"
    elif concern == Concern.INVARIANT:
        return MODEL_ONLY
    under = [p for p in profiles if PROFILES[p].applies(rule)]
    if rule == R.DESTROY_ACTIVE:
        under = [p for p in under if p == LEGACY_NAME]
    if not under:
        return f"not a rule of the profiles run at block level ({', '.join(profiles)})"
    need = _G1_NEEDS.get(rule)
    if need is not None and not all(caps.has(c) for c in need[0]):
        return "missing capability " + ", ".join(c for c in need[0] if not caps.has(c))
    return None


def _request_reason(rule: RuleId, m: Manifest) -> str | None:
    """Why the vllm request layer never asks ``rule`` of ``m`` (None: it does)."""
    caps = m.capabilities
    if not caps.request_level:
        return "missing capability request_level"
    if m.request_profile() != VLLM_NAME:
        return f"requests run under profile {m.request_profile()}"
    if rule in (R.CLEAR_ALL, R.DEREF_OWNER):  # the step-by-step checks: reset, the free of shared blocks
        return None if caps.reset else "missing capability reset"
    if rule not in LAYER_RULES:
        return "not a rule of the request layer"
    if rule in _HOST_RULES and "host_pinned" not in caps.tiers:
        return "missing capability tier:host_pinned"
    return None


def _radix_reason(rule: RuleId, m: Manifest) -> str | None:
    if RADIX not in m.supported_profiles():
        return "missing capability profile:radix"
    tree_ops = bool(m.start.factory_for(RADIX_FAMILY, m.kind)) or m.kind == "subprocess"
    if tree_ops:
        return None if (RULES[rule].concern == Concern.RADIX or rule in _RADIX_SHARED) else "not a radix rule"
    if rule in _RADIX_REQUEST_RULES or rule in _RADIX_SHARED:
        return None if m.capabilities.request_level else "missing capability request_level"
    return "needs the radix tree operations (start.radix or a protocol-4 child); requests cannot ask it"


def not_applicable_reason(rule: RuleId | str, m: Manifest) -> str | None:
    """Why ``rule`` does not apply to the adapter of manifest ``m`` (None: it
    applies, and a complete run exercises it)."""
    rid = RuleId(rule)
    concern = RULES[rid].concern
    if concern == Concern.PAGED:
        return None if PAGED in m.supported_profiles() else "missing capability profile:paged"
    if concern == Concern.SESSION:
        return None if SESSION in m.supported_profiles() else "missing capability profile:session"
    if concern == Concern.RADIX:
        return _radix_reason(rid, m)
    if concern == Concern.INVARIANT and rid not in STEP_INVARIANTS and rid != R.INV_ROUTER_MATCH:
        return MODEL_ONLY
    reasons = [_g1_reason(rid, m), _request_reason(rid, m)]
    if rid in _RADIX_SHARED:
        reasons.append(_radix_reason(rid, m))
    if any(r is None for r in reasons):
        return None
    return "; ".join(dict.fromkeys(r for r in reasons if r))


def applicable_rules(m: Manifest) -> list[str]:
    """Every rule a complete run of ``m``'s adapter exercises, in catalogue order."""
    return [str(r) for r in RULES if not_applicable_reason(r, m) is None]


__all__ = ["MODEL_ONLY", "applicable_rules", "not_applicable_reason"]
