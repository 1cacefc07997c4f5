"""The radix model as a transition table against the model it replaces, side by side.

Seeded random operation sequences (valid and rejected ones: held and unknown
lock names, inserts and requests that do not fit) run through the old model
(methods labelled ``@applies``) and the new one (``reference.radix_table``),
the plain model and the scheduler-flow model (``radix_flow``) under random
``Flow`` options; every step must give the same outcome (value, events, error
rule and message, snapshot) and leave the same whole tree (access times,
hashes, locks, clock, event ids), the error's rule must be the deciding rule
of the transition taken, and over the runs the set of rules fired must be the
same: the old model's are the labels of the labelled methods a step called
(and its error's rule), the new one's the rules of the transitions taken.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvspec.reference import radix as old_radix
from kvspec.reference import radix_flow as old_flow
from kvspec.reference import radix_flow_table as new_flow
from kvspec.reference import radix_table as new_radix
from kvspec.reference.labels import applied_rules
from kvspec.spec.radix_wire import (
    RadixConfig,
    RadixEvict,
    RadixInsert,
    RadixLock,
    RadixMatch,
    RadixOp,
    RadixRequest,
    RadixReset,
    RadixUnlock,
)

LOCKS = ("a", "b", "c")


def tokens(rng: random.Random, lo: int, hi: int) -> list[int]:
    return [rng.randint(1, 3) for _ in range(rng.randint(lo, hi))]


def random_op(rng: random.Random) -> RadixOp:
    kind = rng.randrange(12)
    if kind < 2:
        return RadixMatch(tokens=tokens(rng, 0, 9))
    if kind < 4:
        return RadixInsert(tokens=tokens(rng, 0, 9))
    if kind == 4:
        return RadixLock(name=rng.choice(LOCKS), tokens=tokens(rng, 0, 9))
    if kind == 5:
        return RadixUnlock(name=rng.choice(LOCKS))
    if kind == 6:
        return RadixEvict(tokens=rng.randint(0, 8))
    if kind == 7 and rng.random() < 0.3:
        return RadixReset()
    return RadixRequest(prompt=tokens(rng, 1, 9), output=tokens(rng, 1, 5))


def tree(m: Any) -> tuple[Any, ...]:
    """The whole state, access times and hashes included (the snapshot leaves them out)."""

    def node(n: Any) -> tuple[Any, ...]:
        kids = tuple(node(c) for _, c in sorted(n.children.items()))
        return (tuple(n.tokens), tuple(n.pages), n.lock_ref, n.last_access, kids)

    locks = {k: (m.path_len(v), v.last_access) for k, v in m.locks.items()}
    return node(m.root), m.clock, m.next_event_id, m.free, locks


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

    for name, fn in list(vars(old_radix.RadixModel).items()):
        if callable(fn) and applied_rules(fn):
            monkeypatch.setattr(old_radix.RadixModel, name, wrap(fn))
    yield record


def test_the_table_answers_like_the_labelled_model(fired: list[str]) -> None:
    rng = random.Random(28)
    steps = 0
    flowed = 0
    errors: set[str] = set()
    old_rules: set[str] = set()
    new_rules: set[str] = set()
    for _ in range(3000):
        config = RadixConfig(page_size=rng.randint(1, 3), capacity=rng.randint(1, 24))
        if rng.random() < 0.5:
            flow = old_flow.Flow(**{f: rng.random() < 0.5 for f in old_flow.Flow.__dataclass_fields__})
            old: Any = old_flow.FlowModel(config, flow)
            new: Any = new_flow.FlowModel(config, new_flow.Flow(**vars(flow)))
        else:
            old, new = old_radix.RadixModel(config), new_radix.RadixModel(config)
        for _ in range(rng.randint(1, 30)):
            op = random_op(rng)
            fired.clear()
            want = old.step(op)
            got = new.step(op)
            assert got == want, (config, op)
            assert tree(new) == tree(old), (config, op)
            if want.error is not None:
                assert new.last_rules[0] == want.error.rule, (op, new.last_rules, want.error)
                fired.append(want.error.rule)
                errors.add(want.error.message.split(" ")[0])
            old_rules.update(fired)
            new_rules.update(new.last_rules)
            steps += 1
            flowed += isinstance(old, old_flow.FlowModel)
    print(f"radix differential: {steps} steps equal ({flowed} of them of the flow model); rejections: {errors}")
    assert steps > 40_000
    assert new_rules == old_rules, sorted(new_rules ^ old_rules)
