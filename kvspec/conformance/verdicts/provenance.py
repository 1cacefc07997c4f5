"""Where a verdict comes from: the versions and settings that decided its traffic.

The same port at the same effort got different coverage counts under
Hypothesis 6.155 and 6.170: the traffic a run generates depends on the
Hypothesis version (its generation and shrinking change between releases),
the effort's settings and seed, and the implementation the run drove. A
verdict that does not say which of these produced it cannot be compared with
another one honestly. So every results file (``results.py``), replay file
(``replay_file.py``, request-level workloads) and run header records a
``Provenance``, and what replays or compares verdicts (``kvspec replay``,
``kvspec gate``, ``kvspec report``) says when provenances differ instead of
mixing them silently.

``differences`` sorts what differs into what decides the generated traffic
(the Hypothesis version, the effort, its settings, the seed of a random
effort: counts from two such runs are not comparable) and what is only worth
saying (kvspec, Python, the adapter folder, the profile's options: the gate
already attributes a kvspec change rule by rule, and the capabilities it
compares are the manifest's).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

import hypothesis
from pydantic import BaseModel, ConfigDict

import kvspec


class _ProvenanceModel(BaseModel):
    # a newer kvspec may record more; an older reader keeps what it does not know
    model_config = ConfigDict(extra="allow")


class Versions(_ProvenanceModel):
    """The software that judged and generated: kvspec (with the digest of
    everything that judges, ``results.spec_version``), Hypothesis and Python."""

    kvspec: str
    spec_digest: str
    hypothesis: str
    python: str

    def label(self) -> str:
        return f"kvspec {self.kvspec}+{self.spec_digest[:12]}, Hypothesis {self.hypothesis}, Python {self.python}"


def versions_of(spec_digest: str) -> Versions:
    """This process's versions, with ``spec_digest`` (``results.spec_version``,
    whose ``current_versions`` is the one call that fills it)."""
    return Versions(
        kvspec=kvspec.__version__,
        spec_digest=spec_digest,
        hypothesis=hypothesis.__version__,
        python=platform.python_version(),
    )


class Provenance(_ProvenanceModel):
    """Everything a run's verdict depends on besides the implementation's code."""

    versions: Versions
    #: the effort (``--hypothesis-profile``) and the seed (None: not pinned)
    effort: str | None = None
    hypothesis_seed: str | None = None
    #: the effort's settings that decide the generated traffic
    #: (``max_examples``, ``stateful_step_count``, ``derandomize``)
    settings: dict[str, Any] = {}
    #: the adapter folder (absolute) and the selected variant
    adapter_path: str | None = None
    variant: str | None = None
    #: the profile the manifest claims and the semantics options it declares
    profile: str | None = None
    profile_options: dict[str, Any] = {}

    def label(self) -> str:
        """One line for a header or a report."""
        parts = [self.versions.label()]
        if self.effort is not None:
            seed = f", seed {self.hypothesis_seed}" if self.hypothesis_seed is not None else ""
            budget = ""
            if self.settings:
                budget = (
                    f" ({self.settings.get('max_examples')} examples, {self.settings.get('stateful_step_count')} steps"
                    + (", derandomised" if self.settings.get("derandomize") else "")
                    + ")"
                )
            parts.append(f"effort {self.effort}{budget}{seed}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class ProvenanceDifference:
    #: what differs ("Hypothesis", "effort", "seed", "Python", ...)
    what: str
    first: str
    second: str
    #: does it decide the generated traffic (counts not comparable)?
    decides_traffic: bool


def _seed_matters(p: Provenance) -> bool:
    # a derandomised effort takes its examples from the test itself and
    # ignores --hypothesis-seed (settings.py)
    return not p.settings.get("derandomize", False)


def differences(a: Provenance | None, b: Provenance | None, *, generated: bool = True) -> list[ProvenanceDifference]:
    """What differs between two provenances, the traffic-deciding ones first.

    ``generated``: the verdicts come from generated traffic (a suite run); a
    stream check generates nothing, so only its versions are worth saying.
    A missing provenance (a file of an older kvspec) is itself a difference
    that decides the traffic of a generated run: nothing says it was the same.
    """
    if a is None or b is None:
        if a is None and b is None:
            return [ProvenanceDifference("provenance", "not recorded", "not recorded", generated)]
        return [
            ProvenanceDifference(
                "provenance",
                "not recorded" if a is None else "recorded",
                "not recorded" if b is None else "recorded",
                generated,
            )
        ]
    out: list[ProvenanceDifference] = []

    def add(what: str, x: Any, y: Any, decides: bool) -> None:
        if x != y:
            out.append(ProvenanceDifference(what, str(x), str(y), decides))

    va, vb = a.versions, b.versions
    add("Hypothesis", va.hypothesis, vb.hypothesis, generated)
    if generated:
        add("effort", a.effort, b.effort, True)
        for key in sorted(set(a.settings) | set(b.settings)):
            add(f"effort setting {key}", a.settings.get(key), b.settings.get(key), True)
        if _seed_matters(a) or _seed_matters(b):
            add("seed", a.hypothesis_seed, b.hypothesis_seed, True)
    add("kvspec", f"{va.kvspec}+{va.spec_digest[:12]}", f"{vb.kvspec}+{vb.spec_digest[:12]}", False)
    add("Python", va.python, vb.python, False)
    add("adapter folder", a.adapter_path, b.adapter_path, False)
    add("variant", a.variant, b.variant, False)
    add("profile options", a.profile_options, b.profile_options, False)
    return sorted(out, key=lambda d: not d.decides_traffic)


def describe(diffs: list[ProvenanceDifference]) -> str:
    """``Hypothesis 6.155.2 vs 6.170.17; seed 1 vs 2`` (for a message)."""
    return "; ".join(f"{d.what} {d.first} vs {d.second}" for d in diffs)
