"""How often each optional action kind is enabled per lockstep example (swarm testing).

The lockstep machine (conformance/block/machine.py) enables a random subset of its
optional action kinds per example, so that some examples never finish a
request, others never tick backwards, and each kind of bug meets the traffic
that shows it. A kind that is almost never enabled is almost never tested.

This draws the swarm set of the kvbm machine of adapters/reference (every
rule group mixed in: the offload tier's kinds too) for EXAMPLES Hypothesis
examples (generate phase, derandomized), twice:

- ``bitmask``: one integer in [0, 2^n) read as a bit mask, one bit per kind
  (the draw this project used before): Hypothesis favours small integers, so
  the kinds on the high bits, the late-listed ones, are rarely on;
- ``per kind``: one boolean per kind (``machine.swarm_sets``, the draw now
  used).

It prints the fraction of examples that enabled each kind under both; the
last line is the lowest fraction under the draw now used (ideal: 50%).
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kvspec.conformance.block import machine as mm
from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir

EXAMPLES = 2000


def bitmask(kinds: tuple[str, ...]) -> st.SearchStrategy[frozenset[str]]:
    """The former draw: one integer as a bit mask."""
    return st.integers(0, 2 ** len(kinds) - 1).map(lambda m: frozenset(k for i, k in enumerate(kinds) if m >> i & 1))


def enablement(strategy: st.SearchStrategy[frozenset[str]], kinds: tuple[str, ...]) -> dict[str, float]:
    seen: Counter[str] = Counter()
    n = 0

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(strategy)
    def draw(s: frozenset[str]) -> None:
        nonlocal n
        n += 1
        seen.update(s)

    draw()
    return {k: seen[k] / n for k in kinds}


def main() -> None:
    d = resolve_adapter_dir("adapters/reference")
    cls = mm.machine_class(mm.MachineSetup(load_manifest(d), d, "kvbm"))
    kinds = tuple(cls.optional_kinds())
    before = enablement(bitmask(kinds), kinds)
    after = enablement(mm.swarm_sets(kinds), kinds)
    print(f"{len(kinds)} optional kinds of the kvbm machine, {EXAMPLES} examples each")
    print(f"{'kind':<14} {'bitmask':>8} {'per kind':>9}")
    for k in kinds:
        print(f"{k:<14} {before[k]:>8.1%} {after[k]:>9.1%}")
    print(f"lowest: bitmask {min(before.values()):.1%}, per kind {min(after.values()):.1%}")
    print(f"swarm_enablement: {100 * min(after.values()):.1f} %")


if __name__ == "__main__":
    main()
