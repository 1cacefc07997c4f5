"""spec/SPEC.md and the data catalogues (spec/rules.py, spec/profiles.py) in step.

The prose is the spec a reader trusts, the catalogues are what the tools key
on; these tests fail as soon as one names a rule or a profile the other does
not, or the prose forgets a profile's documented break of a rule.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvspec.spec.profiles import PROFILES
from kvspec.spec.rules import RULES, RuleId

SPEC = Path(__file__).resolve().parent.parent / "spec" / "SPEC.md"
TEXT = SPEC.read_text()
LINES = TEXT.splitlines()

HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
#: an id as SPEC.md writes it in backticks: upper-case words, joined by hyphens
BACKTICK_ID = re.compile(r"`([A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*)`")


def _headings() -> list[tuple[int, int, str]]:
    """(line index, level, text) of every Markdown heading outside code fences."""
    out: list[tuple[int, int, str]] = []
    fenced = False
    for i, line in enumerate(LINES):
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = HEADING.match(line)
        if m and not fenced:
            out.append((i, len(m.group(1)), m.group(2)))
    return out


HEADINGS = _headings()


def _section(start_line: int, level: int) -> str:
    """The text under a heading, up to the next heading of the same or a higher level."""
    end = len(LINES)
    for i, lvl, _ in HEADINGS:
        if i > start_line and lvl <= level:
            end = i
            break
    return "\n".join(LINES[start_line + 1 : end])


def _rule_headings() -> dict[str, list[tuple[int, int]]]:
    found: dict[str, list[tuple[int, int]]] = {}
    for i, lvl, text in HEADINGS:
        for rid in BACKTICK_ID.findall(text):
            found.setdefault(rid, []).append((i, lvl))
    return found


RULE_HEADINGS = _rule_headings()


def _rule_section(rule: RuleId) -> str:
    [(i, lvl)] = RULE_HEADINGS[str(rule)]
    return _section(i, lvl)


def _named_section(title: str) -> str:
    matches = [(i, lvl) for i, lvl, text in HEADINGS if text.strip() == title]
    assert len(matches) == 1, f"SPEC.md needs exactly one heading {title!r}"
    return _section(*matches[0])


@pytest.mark.parametrize("rule", list(RuleId), ids=str)
def test_every_rule_has_exactly_one_heading(rule: RuleId) -> None:
    assert len(RULE_HEADINGS.get(str(rule), [])) == 1, f"SPEC.md needs one heading with `{rule}`"


def test_every_id_in_a_heading_is_a_rule() -> None:
    unknown = sorted(set(RULE_HEADINGS) - {str(r) for r in RuleId})
    assert unknown == [], f"SPEC.md headings define ids that are not RuleIds: {unknown}"


@pytest.mark.parametrize("rule", list(RuleId), ids=str)
def test_every_rule_section_says_something(rule: RuleId) -> None:
    body = _rule_section(rule).strip()
    assert len(body.split()) >= 8, f"the section of {rule} is empty or a stub"


def test_rule_headings_sit_under_their_concern() -> None:
    """Each rule's heading is inside the section of its concern (grouped by concern)."""
    concern_section = {
        "lifecycle": {"Lifecycle operations", "Eviction policies"},
        "protocol": {"Event protocol"},
        "vllm pool": {"vLLM-style pool"},
        "offload": {"Offload tier (G2)"},
        "hashing": {"Hashing"},
        "invariant": {"Proven invariants"},
        "paged": {"Paged allocator"},
        "session": {"Session slot leases"},
        "radix": {"Radix prefix cache"},
        "shared tiers": {"Lower tiers (G3 disk, G4 object store), shared by the workers of a process"},
    }
    tops = [(i, text.strip()) for i, lvl, text in HEADINGS if lvl == 2]
    for rule, meta in RULES.items():
        [(line, _)] = RULE_HEADINGS[str(rule)]
        parent = [t for i, t in tops if i < line][-1]
        assert parent in concern_section[str(meta.concern)], f"{rule} is under {parent!r}"


def test_offload_and_invariants_are_one_section_each() -> None:
    tops = [text.strip() for _, lvl, text in HEADINGS if lvl == 2]
    assert tops.count("Offload tier (G2)") == 1
    assert tops.count("Proven invariants") == 1


def _profile_table_columns() -> list[str]:
    body = _named_section("Profiles")
    header = next(line for line in body.splitlines() if line.startswith("|"))
    return [c.strip().strip("`") for c in header.strip("|").split("|")]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_has_a_column_in_the_profile_table(name: str) -> None:
    assert name in _profile_table_columns()


def test_profile_table_has_no_unknown_profile() -> None:
    cols = [c for c in _profile_table_columns() if c]
    assert sorted(cols) == sorted(PROFILES)


def test_profile_table_rows_cover_the_differences() -> None:
    body = _named_section("Profiles").lower()
    for row in [
        "use result",
        "all-or-nothing",
        "stored grouping and anchoring",
        "removed timing",
        "eviction policies",
        "destroy",
        "deref of an unknown",
        "partial deref",
        "router view mode",
    ]:
        assert f"| {row}" in body, f"the profile table has no row {row!r}"


KNOWN_BREAKS = [
    pytest.param(name, rule, id=f"{name}-{rule}") for name, p in PROFILES.items() for rule in p.known_breaks
]


@pytest.mark.parametrize(("name", "rule"), KNOWN_BREAKS)
def test_known_break_is_documented_in_the_rule(name: str, rule: RuleId) -> None:
    """The rule's own section names the profile, after saying it has a known break."""
    body = _rule_section(rule)
    at = body.lower().find("known break")
    assert at >= 0, f"the section of {rule} does not mention its known breaks"
    assert re.search(rf"`{re.escape(name)}`", body[at:]), f"the section of {rule} does not name {name} as breaking it"


def _listed_breaks() -> dict[str, set[str]]:
    """The 'Known breaks per profile' list: top-level bullets `- `profile`:`,
    each with the rule ids written under it."""
    body = _named_section("Known breaks per profile")
    out: dict[str, set[str]] = {}
    current: str | None = None
    for line in body.splitlines():
        m = re.match(r"^- `([a-z_]+)`:", line)
        if m:
            current = m.group(1)
            out[current] = set()
        elif line and not line.startswith(" "):
            current = None  # the list ended
        if current is not None:
            out[current].update(BACKTICK_ID.findall(line))
    return out


def test_known_breaks_list_matches_the_profile_table() -> None:
    listed = _listed_breaks()
    expected = {name: {str(r) for r in p.known_breaks} for name, p in PROFILES.items() if p.known_breaks}
    assert listed == expected


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_not_applicable_rules_are_not_claimed_for_the_profile(name: str) -> None:
    """A rule a profile does not have must not list that profile as holding it:
    its Profiles line never starts with the profile name."""
    p = PROFILES[name]
    for rule in p.not_applicable:
        body = _rule_section(rule)
        line = next((ln for ln in body.splitlines() if ln.startswith("*Profiles:*")), "")
        first = re.match(r"\*Profiles:\*\s*`([a-z_]+)` only", line)
        if first is not None:
            assert first.group(1) != name, f"{rule} says it is {name}-only, but {name} does not have it"


def test_vllm_replacement_rules_are_stated() -> None:
    vllm = _named_section("vLLM-style pool")
    assert "`STORE-COPY` replaces `STORE-NO-DUP`" in vllm
    assert "`REMOVE-COPY` replaces\n`REMOVE-EXACT`" in vllm or "`REMOVE-COPY` replaces `REMOVE-EXACT`" in vllm
    assert "issue #2" in vllm


def test_scenario_format_section_names_every_expect_key() -> None:
    from kvspec.spec.scenario import Expect, Scenario

    body = _named_section("Scenario files")
    for key in list(Scenario.model_fields) + list(Expect.model_fields):
        assert f"`{key}`" in body, f"Scenario files section does not document {key!r}"


def test_scenarios_cited_in_spec_exist() -> None:
    from kvspec.spec.scenario import SCENARIO_DIR

    cited = set(re.findall(r"`((?:kvbm|legacy|atomic|offload)/[a-z0-9_]+)`", TEXT))
    assert cited, "SPEC.md cites no scenario"
    missing = sorted(c for c in cited if not (SCENARIO_DIR / f"{c}.json").is_file())
    assert missing == []
