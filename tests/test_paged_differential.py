"""The paged model as a transition table against the model it replaces, side by side.

Seeded random operation sequences (valid and rejected ones, both switch
settings of ``write_in_place``) run through the old model (methods labelled
``@applies``) and the new one (``reference.paged_table``); every step must
give the same outcome (value, error rule and message, the whole state), the
error's rule must be the deciding rule of the transition taken, and over the
runs the set of rules fired must be the same: the old model's are the labels
of the labelled methods a step called (and its error's rule), the new one's
the rules of the transitions taken.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvspec.reference import paged as old_paged
from kvspec.reference import paged_table as new_paged
from kvspec.reference.labels import applied_rules
from kvspec.spec.manager_wire import (
    PagedAllocate,
    PagedConfig,
    PagedEvictPrefixes,
    PagedExtend,
    PagedFork,
    PagedFree,
    PagedMatchPrefix,
    PagedOp,
    PagedStorePrefix,
    PagedSwapIn,
    PagedSwapOut,
    PagedWrite,
)

NAMES = ("a", "b", "c", "d")
KEYS = ("p", "q", "r")


def random_config(rng: random.Random) -> PagedConfig:
    high = rng.choice((0.0, 0.3, 0.5, 1.0))
    return PagedConfig(
        device_blocks=rng.randint(1, 8),
        host_blocks=rng.randint(0, 5),
        block_size=rng.randint(1, 4),
        max_prefixes=rng.randint(0, 3),
        high_below=high,
        critical_below=rng.choice([c for c in (0.0, 0.1, 0.3, 0.5) if c <= high]),
    )


def random_op(rng: random.Random) -> PagedOp:
    name, other = rng.choice(NAMES), rng.choice(NAMES)
    kind = rng.randrange(11)
    if kind == 0:
        return PagedAllocate(seq=name, tokens=rng.randint(0, 12))
    if kind == 1:
        return PagedExtend(seq=name, tokens=rng.randint(0, 9))
    if kind == 2:
        return PagedFork(src=name, dst=other, blocks=rng.choice((None, 0, 1, 2, 5)))
    if kind in (3, 4):
        return PagedWrite(seq=name, position=rng.randint(0, 12), value=rng.randint(0, 9))
    if kind == 5:
        return PagedSwapOut(seq=name)
    if kind == 6:
        return PagedSwapIn(seq=name)
    if kind == 7:
        return PagedFree(seq=name)
    if kind == 8:
        return PagedStorePrefix(key=rng.choice(KEYS), seq=name, blocks=rng.randint(1, 4))
    if kind == 9:
        return PagedMatchPrefix(key=rng.choice(KEYS), dst=other)
    return PagedEvictPrefixes(count=rng.randint(0, 3))


@pytest.fixture
def fired(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The labels of the old model's labelled methods, recorded as they are called."""
    record: list[str] = []

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            record.extend(str(r) for r in applied_rules(fn))
            return fn(*args, **kwargs)

        return call

    for cls in (old_paged.Pool, old_paged.PagedModel):
        for name, fn in list(vars(cls).items()):
            if callable(fn) and applied_rules(fn):
                monkeypatch.setattr(cls, name, wrap(fn))
    yield record


def test_the_table_answers_like_the_labelled_model(fired: list[str]) -> None:
    rng = random.Random(28)
    steps = 0
    old_rules: set[str] = set()
    new_rules: set[str] = set()
    for _ in range(3000):
        config = random_config(rng)
        old, new = old_paged.PagedModel(config), new_paged.PagedModel(config)
        old.write_in_place = new.write_in_place = rng.random() < 0.2
        for _ in range(rng.randint(1, 30)):
            op = random_op(rng)
            fired.clear()
            want = old.step(op)
            got = new.step(op)
            assert got == want, (config, op)
            if want.error is not None:
                assert new.last_rules[0] == want.error.rule, (op, new.last_rules, want.error)
                fired.append(want.error.rule)
            old_rules.update(fired)
            new_rules.update(new.last_rules)
            steps += 1
    print(f"paged differential: {steps} steps equal")
    assert steps > 40_000
    assert new_rules == old_rules, sorted(new_rules ^ old_rules)
