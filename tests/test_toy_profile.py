"""A toy profile, declared from outside kvspec: the minimum of a new profile.

A two-slot cache with Store and Remove, all of it here and in
``tests/data/toy/`` (its spec document with the rule ids, one golden): its
wire types, its model as a transition table (``reference.transitions``: per
operation, rule -> guard -> effect), its registry entry (``registry.register``
through ``registry.registered``), an in-process implementation and a broken
one. The generic lockstep and golden runner of kvspec
(``conformance.generic.lockstep``) check them; nothing in kvspec/ names the
toy. ``test_the_toy_needed_at_most_eight_files`` holds CONTRIBUTING.md's "Add
a profile" checklist to what the toy needed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from kvspec.conformance.generic.lockstep import (
    GenericLockstep,
    GoldenError,
    RuleBroken,
    goldens,
    load_golden,
    make_tagged_model,
    run_golden,
)
from kvspec.reference.transitions import Transition, TransitionModel, always
from kvspec.spec import registry, rules
from kvspec.spec.model import ProfileModel, TaggedModel

DATA = Path(__file__).parent / "data" / "toy"
ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------ wire types


class ToyWire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToyConfig(ToyWire):
    slots: int = Field(default=2, ge=1, le=8)


class Store(ToyWire):
    op: Literal["store"] = "store"
    key: int


class Remove(ToyWire):
    op: Literal["remove"] = "remove"
    key: int


ToyOp = Annotated[Store | Remove, Field(discriminator="op")]


class ToyOutcome(ToyWire):
    """The answer to one operation: the rule that refused it (None: done) and the keys held, ascending."""

    error: str | None = None
    keys: list[int]


# ------------------------------------------------------------------ the model


class ToyModel(TransitionModel[ToyOutcome]):
    """The toy's reference model: its rules, per operation, in the order they are tried."""

    def __init__(self, config: ToyConfig) -> None:
        self.config = config
        self.keys: set[int] = set()

    def _out(self, error: str | None = None) -> ToyOutcome:
        return ToyOutcome(error=error, keys=sorted(self.keys))

    def _held(self, op: Store | Remove) -> bool:
        return op.key in self.keys

    def _full(self, op: Store) -> bool:
        return len(self.keys) >= self.config.slots

    def _take(self, op: Store) -> ToyOutcome:
        self.keys.add(op.key)
        return self._out()

    def _free(self, op: Remove) -> ToyOutcome:
        self.keys.discard(op.key)
        return self._out()

    TRANSITIONS = (
        Transition("TOY-STORE-HELD", Store, _held, lambda m, op: m._out()),
        Transition("TOY-FULL", Store, _full, lambda m, op: m._out("TOY-FULL")),
        Transition("TOY-STORE", Store, always, _take),
        Transition("TOY-REMOVE", Remove, _held, _free),
        Transition("TOY-REMOVE-UNKNOWN", Remove, always, lambda m, op: m._out("TOY-REMOVE-UNKNOWN")),
    )


TOY = registry.ProfileEntry(
    "toy",
    "generic",
    ToyModel,
    scenarios=("goldens",),
    encodings=(),
    title="toy: a two-slot cache with Store and Remove (tests/test_toy_profile.py)",
    scenario_root=DATA,
    rules_doc=DATA / "SPEC.md",
    config_type=ToyConfig,
    op_type=ToyOp,
    outcome_type=ToyOutcome,
)

# ---------------------------------------------------------- implementations


class ToyCache:
    """The implementation under test: a list of slots (in-process adapter)."""

    def __init__(self, config: ToyConfig) -> None:
        self.slots: list[int | None] = [None] * config.slots

    def _answer(self, error: str | None = None) -> ToyOutcome:
        return ToyOutcome(error=error, keys=sorted(k for k in self.slots if k is not None))

    def step(self, op: Store | Remove) -> ToyOutcome:
        if isinstance(op, Store):
            if op.key in self.slots:
                return self._answer()
            if None not in self.slots:
                return self._full(op)
            self.slots[self.slots.index(None)] = op.key
            return self._answer()
        if op.key not in self.slots:
            return self._answer("TOY-REMOVE-UNKNOWN")
        self.slots[self.slots.index(op.key)] = None
        return self._answer()

    def _full(self, op: Store) -> ToyOutcome:
        return self._answer("TOY-FULL")


class EvictingToyCache(ToyCache):
    """A bug: a store into a full cache evicts the first slot instead of refusing."""

    def _full(self, op: Store) -> ToyOutcome:
        self.slots[0] = op.key
        return self._answer()


@pytest.fixture
def toy() -> Iterator[registry.ProfileEntry]:
    with registry.registered(TOY) as entry:
        yield entry


# ------------------------------------------------------------------ the tests

ALL_TOY_RULES = {"TOY-STORE", "TOY-STORE-HELD", "TOY-FULL", "TOY-REMOVE", "TOY-REMOVE-UNKNOWN"}


@pytest.mark.usefixtures("toy")
def test_the_toy_is_registered_with_its_rules_while_declared() -> None:
    assert registry.names("generic") == ("toy",)
    assert set(rules.OUTSIDE_RULES) == ALL_TOY_RULES == set(ToyModel.rules())
    assert rules.known("TOY-FULL") and rules.OUTSIDE_RULES["TOY-FULL"].spec == DATA / "SPEC.md"
    assert "toy" not in registry.all_scenario_dirs(), "an outside profile's goldens are not under spec/scenarios"
    assert isinstance(make_tagged_model(TOY, ToyConfig()), ProfileModel)


def test_the_toy_is_gone_after_the_block() -> None:
    with registry.registered(TOY):
        pass
    assert "toy" not in registry.PROFILES and not rules.known("TOY-FULL")
    assert registry.names() == registry.BUNDLED


@pytest.mark.usefixtures("toy")
def test_the_golden_passes_and_exercises_every_toy_rule() -> None:
    files = goldens(TOY)
    assert [f.name for f in files] == ["fill_free_refill.json"]
    ls = run_golden(TOY, files[0], ToyCache)
    assert set(ls.exercised) == ALL_TOY_RULES == set(load_golden(TOY, files[0]).rules)
    assert ls.exercised["TOY-STORE"] == 3


@pytest.mark.usefixtures("toy")
def test_a_broken_implementation_is_caught_by_the_golden_under_the_toy_rule() -> None:
    with pytest.raises(RuleBroken) as e:
        run_golden(TOY, goldens(TOY)[0], EvictingToyCache)
    assert e.value.rule == "TOY-FULL"
    assert "toy/fill_free_refill step 3" in e.value.report


@pytest.mark.usefixtures("toy")
def test_a_golden_whose_expect_is_wrong_fails_even_when_model_and_implementation_agree(tmp_path: Path) -> None:
    text = (DATA / "goldens" / "fill_free_refill.json").read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(text.replace('"expect": {"keys": [2, 3]}', '"expect": {"keys": [3]}'))
    with pytest.raises(RuleBroken, match=r"step 7") as e:
        run_golden(TOY, bad, ToyCache)
    assert e.value.rule == "TOY-STORE"


@pytest.mark.usefixtures("toy")
def test_a_malformed_golden_is_refused_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"rules": [], "config": {"slots": 2}, "steps": [{"op": {"op": "push", "key": 1}, "expect": {}}]}')
    with pytest.raises(GoldenError, match=r"bad\.json: not a golden of profile 'toy'"):
        load_golden(TOY, bad)
    bad.write_text('{"rules": ["TOY-NOPE"], "config": {"slots": 2}, "steps": []}')
    with pytest.raises(GoldenError, match="unknown rules TOY-NOPE"):
        load_golden(TOY, bad)


OPS = st.lists(st.builds(Store, key=st.integers(0, 3)) | st.builds(Remove, key=st.integers(0, 3)), max_size=12)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(ops=OPS)
def test_the_lockstep_accepts_the_implementation(ops: list[Store | Remove]) -> None:
    with registry.registered(TOY):
        ls = GenericLockstep(ToyCache(ToyConfig()), make_tagged_model(TOY, ToyConfig()))
        for op in ops:
            ls.step(op)
        assert sum(ls.exercised.values()) == len(ops)


def test_the_lockstep_catches_the_broken_implementation_under_the_toy_rule() -> None:
    """Hypothesis finds a run where the evicting cache differs; the failure names TOY-FULL."""
    failures: list[str] = []

    @settings(max_examples=200, deadline=None, derandomize=True, database=None)
    @given(ops=OPS)
    def run(ops: list[Store | Remove]) -> None:
        ls = GenericLockstep(EvictingToyCache(ToyConfig()), make_tagged_model(TOY, ToyConfig()))
        try:
            for op in ops:
                ls.step(op)
        except RuleBroken as e:
            failures.append(e.rule)
            raise

    with registry.registered(TOY), pytest.raises(RuleBroken):
        run()
    assert failures and set(failures) == {"TOY-FULL"}


def test_registration_refuses_a_taken_name_or_rule_and_changes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'kvbm' is already registered"):
        registry.register(registry.ProfileEntry("kvbm", "generic", ToyModel, (), (), op_type=ToyOp))
    doc = tmp_path / "SPEC.md"
    doc.write_text("### `TOY-A` — fine\n\n### `USE-NEW` — taken by the catalogue\n")
    with pytest.raises(ValueError, match="already defined elsewhere: USE-NEW"):
        registry.register(registry.ProfileEntry("toy2", "generic", ToyModel, (), (), rules_doc=doc, op_type=ToyOp))
    assert "toy2" not in registry.PROFILES and not rules.known("TOY-A")
    with pytest.raises(ValueError, match="cannot be unregistered"):
        registry.unregister("radix")


def test_a_model_that_names_no_rule_is_refused() -> None:
    class Untagged:
        def __init__(self, config: ToyConfig) -> None:
            self.config = config

        def step(self, op: Store | Remove) -> ToyOutcome:
            return ToyOutcome(keys=[])

    entry = registry.ProfileEntry("toy3", "generic", Untagged, (), (), op_type=ToyOp)
    assert isinstance(Untagged(ToyConfig()), ProfileModel) and not isinstance(Untagged(ToyConfig()), TaggedModel)
    with pytest.raises(TypeError, match="has no last_rules"):
        make_tagged_model(entry, ToyConfig())


#: a file a checklist item has the contributor touch, as the checklist writes it
_PATH = re.compile(r"`((?:kvspec|docs)/[^`\s]+|mkdocs\.yml)`")


def _checklist() -> tuple[str, dict[str, set[str]], set[str]]:
    """CONTRIBUTING.md's "Add a profile" section: its text, the files of its
    per-family lockstep item (family -> paths) and the files of the other items."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("## Add a profile", 1)[1].split("\n## ", 1)[0]
    numbered = section[section.index("\n1. ") :].split("\n\n", 1)[0]
    items = re.split(r"^\d+\. ", numbered, flags=re.MULTILINE)[1:]
    by_family: dict[str, set[str]] = {}
    common: set[str] = set()
    for item in items:
        routes = re.findall(r"^   - `(\w+)`(.*?)(?=^   - |\Z)", item, flags=re.MULTILINE | re.DOTALL)
        if routes:
            by_family.update((fam, set(_PATH.findall(body))) for fam, body in routes)
        else:
            common |= set(_PATH.findall(item))
    return section, by_family, common


def test_the_toy_needed_at_most_eight_files() -> None:
    """What the toy needed (this module and tests/data/toy/) is what the checklist says a
    profile declared outside kvspec needs, and each route of the checklist touches at most 8 files."""
    toy_files = [Path(__file__), *sorted(p for p in DATA.rglob("*") if p.is_file())]
    assert len(toy_files) == 3, toy_files
    section, by_family, common = _checklist()
    assert "declared outside kvspec, at run time, in 3 files" in section
    assert {"block", "generic"} <= set(by_family), by_family
    assert "kvspec/spec/registry.py" in common and "mkdocs.yml" in common, common
    for family, own in by_family.items():
        assert len(common | own) <= 8, (family, sorted(common | own))
