"""Small z3 term builders over Python lists of terms (symbolic arrays).

The encoding keeps per-slot and per-hash state as Python lists of z3 terms
rather than z3 arrays: every index is then a finite case split, the formulas
stay quantifier-free, and z3 decides them quickly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import z3

Term: TypeAlias = z3.ExprRef


def literal_index(i: Term | int) -> int | None:
    """``i`` as a Python int when it is a literal (concrete states), else None."""
    if isinstance(i, int):
        return i
    if z3.is_int_value(i):
        return i.as_long()
    return None


def literal_bool(c: z3.BoolRef | bool) -> bool | None:
    if isinstance(c, bool):
        return c
    if z3.is_true(c):
        return True
    if z3.is_false(c):
        return False
    return None


def sel(xs: Sequence[Term], i: z3.ArithRef | int) -> Term:
    """``xs[i]`` for a symbolic index (out-of-range indices read the last entry)."""
    k = literal_index(i)
    if k is not None:
        return xs[k] if 0 <= k < len(xs) else xs[-1]
    out = xs[-1]
    for k in range(len(xs) - 2, -1, -1):
        out = z3.If(i == k, xs[k], out)
    return out


def upd(xs: Sequence[Term], i: z3.ArithRef | int, v: Term, when: z3.BoolRef | bool = True) -> list[Term]:
    """``xs`` with entry ``i`` set to ``v`` (when ``when`` holds)."""
    if isinstance(v, bool):
        v = z3.BoolVal(v)
    elif isinstance(v, int):
        v = z3.IntVal(v)
    w = literal_bool(when)
    if w is False:
        return list(xs)
    k = literal_index(i)
    if k is not None:
        out = list(xs)
        if 0 <= k < len(xs):
            out[k] = v if w is True else z3.If(when, v, xs[k])
        return out
    if w is True:
        return [z3.If(i == k, v, x) for k, x in enumerate(xs)]
    return [z3.If(z3.And(when, i == k), v, x) for k, x in enumerate(xs)]


def count(conds: Sequence[z3.BoolRef]) -> z3.ArithRef:
    """How many of ``conds`` hold."""
    if not conds:
        return z3.IntVal(0)
    return z3.Sum([z3.If(c, 1, 0) for c in conds])


def first_where(conds: Sequence[z3.BoolRef], default: int = -1) -> z3.ArithRef:
    """The lowest index whose condition holds (``default`` when none does)."""
    out: z3.ArithRef = z3.IntVal(default)
    for k in range(len(conds) - 1, -1, -1):
        out = z3.If(conds[k], z3.IntVal(k), out)
    return out


def argmin_where(conds: Sequence[z3.BoolRef], keys: Sequence[z3.ArithRef], default: int = -1) -> z3.ArithRef:
    """The index with the smallest key among those whose condition holds
    (the lowest such index on a tie; ``default`` when none holds)."""
    best: z3.ArithRef = z3.IntVal(default)
    best_key: z3.ArithRef = z3.IntVal(0)
    found: z3.BoolRef = z3.BoolVal(False)
    for k, (c, key) in enumerate(zip(conds, keys, strict=True)):
        take = z3.And(c, z3.Or(z3.Not(found), key < best_key))
        best = z3.If(take, z3.IntVal(k), best)
        best_key = z3.If(take, key, best_key)
        found = z3.Or(found, c)
    return best


def is_min(i: z3.ArithRef, conds: Sequence[z3.BoolRef], keys: Sequence[z3.ArithRef]) -> z3.BoolRef:
    """``i`` is one of the indices whose condition holds with the smallest key."""
    ci = sel(conds, i)
    ki = sel(keys, i)
    return z3.And(0 <= i, i < len(conds), ci, *[z3.Implies(c, ki <= k) for c, k in zip(conds, keys, strict=True)])
