"""Which ``kvspec prove`` option applies to which profile, and the usage error when one does not.

An option a profile does not read would change nothing and say nothing
(``--profile session --slots 50`` used to print the same table, exit 0).
So every option but ``--profile`` is listed here with the profiles (and the
level: bounded or ``--unbounded``) that read it; ``misapplied`` names the
first one given that the chosen profile does not read, and the CLI exits 2
with that message.
"""

from __future__ import annotations

import argparse

from kvspec.spec import registry

#: every profile with an encoding (spec/registry.py, each entry's ``encodings``)
PROFILES = registry.encodings()
#: the profiles with an ``--unbounded`` level of their own (the others are bounded only or unbounded only)
UNBOUNDED = (registry.KVBM_OFFLOAD, registry.RADIX)
#: the profiles whose refuted rows ``--counterexamples`` writes as replay files (``smt/counterexamples.py``);
#: the others write a text file per refuted row (the trace from the initial state, or why there is none)
COUNTEREXAMPLE_PROFILES = (registry.KVBM_NAME, registry.LEGACY_NAME, registry.ATOMIC_NAME)
#: the options only the offload encoding's bounded level reads, and those it reads at every level
_OFFLOAD_BOUNDED = ((registry.KVBM_OFFLOAD, "bounded"),)
_OFFLOAD_ANY = ((registry.KVBM_OFFLOAD, "*"),)

#: option -> (argparse dest, the (profile, level) pairs that read it; level "bounded", "unbounded" or "*")
APPLIES: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "--slots": ("slots", _OFFLOAD_BOUNDED),
    "--hashes": ("hashes", _OFFLOAD_BOUNDED),
    "--no-symmetry": ("no_symmetry", _OFFLOAD_BOUNDED),
    "--contracts": ("contracts", _OFFLOAD_BOUNDED),
    "--no-operations": ("no_operations", _OFFLOAD_BOUNDED),
    "--op-slots": ("op_slots", _OFFLOAD_BOUNDED),
    "--op-hashes": ("op_hashes", _OFFLOAD_BOUNDED),
    "--batch": ("batch", _OFFLOAD_BOUNDED),
    "--invariant": ("invariant", _OFFLOAD_ANY),
    "--no-lemmas": ("no_lemmas", _OFFLOAD_ANY),
    "--no-sanity": ("no_sanity", _OFFLOAD_ANY),
    "--unbounded": ("unbounded", tuple((p, "*") for p in UNBOUNDED)),
    "--timeout": ("timeout", tuple((p, "*") for p in PROFILES)),
    "--mutant": ("mutant", tuple((p, "*") for p in PROFILES)),
    "--counterexamples": (
        "counterexamples",
        tuple((p, "bounded" if p in UNBOUNDED else "*") for p in PROFILES),
    ),
}


def given(args: argparse.Namespace, dest: str) -> bool:
    """Was the option given (its value differs from "not given": None or False)?"""
    v = getattr(args, dest, None)
    return v is not None and v is not False


def where(option: str) -> str:
    """The profiles (and level) an option applies to, in words."""
    pairs = APPLIES[option][1]
    if len(pairs) == len(PROFILES) and all(lv == "*" for _p, lv in pairs):
        return "every profile"
    names = []
    for p, level in pairs:
        names.append(
            p if level == "*" else f"{p} ({level} only)" if level == "unbounded" else f"{p} (without --unbounded)"
        )
    return "--profile " + ", ".join(names)


def misapplied(args: argparse.Namespace, profile: str) -> str | None:
    """The usage error for the first option given that ``profile`` (at the
    level chosen) does not read, or None."""
    level = "unbounded" if getattr(args, "unbounded", False) else "bounded"
    for option, (dest, pairs) in APPLIES.items():
        if not given(args, dest):
            continue
        if not any(p == profile and lv in ("*", level) for p, lv in pairs):
            at = f"--profile {profile}" + (" --unbounded" if level == "unbounded" and option != "--unbounded" else "")
            return f"{option} does not apply to {at}; it applies to {where(option)}"
    return None


def profile_specific(args: argparse.Namespace) -> list[str]:
    """The options given that some profiles do not read (they choose kvbm-offload when no --profile is given)."""
    return [o for o, (dest, pairs) in APPLIES.items() if given(args, dest) and len(pairs) < len(PROFILES)]
