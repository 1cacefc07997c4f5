"""Checking one step of a paged or session manager: against the model, and against a golden.

``check_paged`` / ``check_session`` compare what the implementation answered
with what the reference model answered for the same operation and raise
``ConformanceFailure`` naming the rule of the first difference. They check
the implementation's snapshot on its own first (reference counts equal the
holders it reports, the pools add up), so that a broken allocator is named by
the invariant it breaks, not only by a difference.

Block ids are the implementation's choice: ``match_blocks`` pairs each block
id of the implementation with the model's, position by position over every
block table and prefix entry, and the pairing must be one to one (the same
sharing), per pool, at every step.

``check_expect`` checks a golden step's ``expect`` against an outcome.
"""

from __future__ import annotations

from collections import Counter

from kvspec.conformance.verdicts.failures import ConformanceFailure
from kvspec.spec.deviations import Site
from kvspec.spec.manager_scenario import ManagerExpect
from kvspec.spec.manager_wire import ManagerOp, PagedOp, PagedOutcome, PagedSnapshot, SessionOutcome
from kvspec.spec.rules import RuleId

R = RuleId

#: the rule an op's own effect is checked under
PAGED_OP_RULE: dict[str, RuleId] = {
    "allocate": R.PAGED_EXTEND,
    "extend": R.PAGED_EXTEND,
    "fork": R.PAGED_SHARE,
    "write": R.PAGED_COW,
    "swap_out": R.PAGED_SWAP,
    "swap_in": R.PAGED_SWAP,
    "free": R.PAGED_FREE,
    "store_prefix": R.PAGED_PREFIX_EVICT,
    "match_prefix": R.PAGED_PREFIX_EVICT,
    "evict_prefixes": R.PAGED_PREFIX_EVICT,
}


def same_data(got: list[int | None], want: list[int | None]) -> bool:
    """Equal wherever ``want`` has a value (null: nothing written there, any value will do)."""
    return len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want, strict=True))


def _fail(rule: RuleId | str, message: str, conditions: frozenset[str] = frozenset()) -> ConformanceFailure:
    return ConformanceFailure(RuleId(rule), message, site=Site(RuleId(rule), conditions=conditions))


def _named(op: ManagerOp) -> set[str]:
    return {v for k in ("seq", "src", "dst") if isinstance(v := getattr(op, k, None), str)}


# ----------------------------------------------------------------- paged


def holders(s: PagedSnapshot) -> tuple[Counter[int], Counter[int]]:
    """How many table entries and prefix entries hold each block, per pool (device, host)."""
    dev: Counter[int] = Counter()
    host: Counter[int] = Counter()
    for v in s.sequences.values():
        (dev if v.tier == "device" else host).update(v.blocks)
    for p in s.prefixes:
        dev.update(p.blocks)
    return dev, host


def self_check(s: PagedSnapshot, device_blocks: int, host_blocks: int) -> None:
    """The invariants an allocator's own snapshot must satisfy, whatever the model says."""
    dev, host = holders(s)
    for pool, refs, held, size, free in (
        ("device", s.device_refs, dev, device_blocks, s.free_device),
        ("host", s.host_refs, host, host_blocks, s.free_host),
    ):
        counted = {int(b): n for b, n in refs.items()}
        if counted != dict(held):
            diff = sorted(b for b in set(counted) | set(held) if counted.get(b, 0) != held.get(b, 0))
            b = diff[0]
            raise _fail(
                R.PAGED_REFCOUNT,
                f"{pool} block {b} has reference count {counted.get(b, 0)} but {held.get(b, 0)} holders "
                f"(blocks whose count is off: {diff[:8]})",
            )
        if free + len(counted) != size:
            raise _fail(
                R.PAGED_CONSERVE,
                f"{pool} pool: {free} free + {len(counted)} in use != {size} blocks",
            )


def match_blocks(impl: PagedSnapshot, model: PagedSnapshot, rule: RuleId = R.PAGED_SHARE) -> None:
    """Impl block ids pair one to one with the model's over every table and prefix entry.

    One implementation block standing for two of the model's is a block in use
    given to a second holder (``PAGED-NO-REUSE``); two implementation blocks
    standing for one of the model's is sharing the operation failed to set up
    (or a copy it should not have made): the operation's own ``rule``."""
    pairs: dict[tuple[str, int], int] = {}
    back: dict[tuple[str, int], int] = {}

    def pair(tier: str, a: int, b: int, where: str) -> None:
        if pairs.setdefault((tier, a), b) != b:
            raise _fail(
                R.PAGED_COW if rule == R.PAGED_COW else R.PAGED_NO_REUSE,
                f"{where}: the implementation's {tier} block {a} is held where the model has two different blocks",
            )
        if back.setdefault((tier, b), a) != a:
            raise _fail(
                rule,
                f"{where}: the implementation's {tier} blocks {back[(tier, b)]} and {a} stand for one shared "
                "block of the model",
            )

    for name, v in impl.sequences.items():
        m = model.sequences[name]
        for i, (a, b) in enumerate(zip(v.blocks, m.blocks, strict=True)):
            pair(v.tier, a, b, f"sequence {name!r} block {i}")
    for p, q in zip(impl.prefixes, model.prefixes, strict=True):
        for i, (a, b) in enumerate(zip(p.blocks, q.blocks, strict=True)):
            pair("device", a, b, f"prefix {p.key!r} block {i}")


def check_paged(
    op: PagedOp, got: PagedOutcome, want: PagedOutcome, before: PagedSnapshot | None, sizes: tuple[int, int]
) -> None:
    """``got`` (implementation) against ``want`` (model) for ``op``; ``before``: the model's prior state."""
    rule = PAGED_OP_RULE[op.op]
    self_check(got.state, *sizes)
    if (got.error is None) != (want.error is None):
        if want.error is not None:
            raise _fail(want.error.rule, f"{op.op}: the model rejects it ({want.error.message}); it was applied")
        assert got.error is not None
        raise _fail(rule, f"{op.op}: rejected under {got.error.rule} ({got.error.message}); the model applies it")
    if got.error is not None and want.error is not None and got.error.rule != want.error.rule:
        raise _fail(want.error.rule, f"{op.op}: rejected under {got.error.rule}, the spec says {want.error.rule}")
    g, w = got.state, want.state
    if sorted(g.sequences) != sorted(w.sequences):
        raise _fail(rule, f"{op.op}: live sequences {sorted(g.sequences)}, expected {sorted(w.sequences)}")
    touched = _named(op)
    for name, m in w.sequences.items():
        v = g.sequences[name]
        if (v.tier, v.tokens, len(v.blocks)) != (m.tier, m.tokens, len(m.blocks)):
            r = rule if name in touched else R.PAGED_NO_REUSE
            raise _fail(
                r,
                f"{op.op}: sequence {name!r} is {v.tier}/{v.tokens} tokens/{len(v.blocks)} blocks, "
                f"expected {m.tier}/{m.tokens}/{len(m.blocks)}",
            )
        if not same_data(v.data, m.data):
            first = next(i for i, (x, y) in enumerate(zip(v.data, m.data, strict=True)) if y is not None and x != y)
            r = rule if name in touched else (R.PAGED_COW if op.op == "write" else R.PAGED_NO_REUSE)
            raise _fail(
                r,
                f"{op.op}: sequence {name!r} reads {v.data[first]} at token {first}, expected {m.data[first]}"
                + ("" if name in touched else " (another sequence's write or reuse reached it)"),
            )
    if [p.key for p in g.prefixes] != [p.key for p in w.prefixes]:
        raise _fail(
            R.PAGED_PREFIX_EVICT,
            f"{op.op}: prefix entries {[p.key for p in g.prefixes]}, expected {[p.key for p in w.prefixes]}",
        )
    match_blocks(g, w, rule)
    if (g.free_device, g.free_host) != (w.free_device, w.free_host):
        raise _fail(
            R.PAGED_FREE if op.op == "free" else rule,
            f"{op.op}: {g.free_device} device / {g.free_host} host blocks free, "
            f"expected {w.free_device} / {w.free_host}",
        )
    if got.value != want.value:
        raise _fail(rule, f"{op.op}: returned {got.value}, expected {want.value}")
    if g.pressure != w.pressure:
        raise _fail(
            R.PAGED_PRESSURE, f"{op.op}: pressure {g.pressure} with {g.free_device} blocks free, expected {w.pressure}"
        )


# ----------------------------------------------------------------- session


def check_session(
    op: ManagerOp, got: SessionOutcome, want: SessionOutcome, conditions: frozenset[str] = frozenset()
) -> None:
    """``conditions``: named facts about this step (``spec.deviations.CONDITIONS``) a failure carries."""
    kind = getattr(op, "op", "?")
    if (got.error is None) != (want.error is None) or (got.error and want.error and got.error.rule != want.error.rule):
        rule = want.error.rule if want.error else (got.error.rule if got.error else R.SESSION_VALIDATE)
        raise _fail(rule, f"{kind}: error {got.error}, expected {want.error}")
    if got.refused != want.refused:
        rule = want.refused or got.refused or R.SESSION_LEASE
        raise _fail(rule, f"{kind}: refused={got.refused}, expected refused={want.refused}")
    if got.admission != want.admission:
        ga, wa = got.admission, want.admission
        arule: RuleId = R.SESSION_LRU
        if ga is not None and wa is not None:
            if ga.generation != wa.generation:
                arule = R.SESSION_FENCE
            elif (ga.candidate, ga.requires_clear, ga.tokens) != (wa.candidate, wa.requires_clear, wa.tokens):
                arule = R.SESSION_CANDIDATE
        raise _fail(arule, f"{kind}: admission {ga}, expected {wa}")
    if got.applied != want.applied:
        rule = R.SESSION_FENCE if want.applied is False else R.SESSION_RELEASE
        raise _fail(
            rule, f"{kind}: applied={got.applied}, expected {want.applied} (a stale handle must not act)", conditions
        )
    if got.drained != want.drained:
        raise _fail(R.SESSION_FENCE, f"{kind}: drained {got.drained}, expected {want.drained}")
    g, w = got.state, want.state
    for i, (a, b) in enumerate(zip(g.slots, w.slots, strict=False)):
        if a != b:
            if kind in ("reset", "evict_all"):
                rule = R.SESSION_RELEASE
            elif a.generation != b.generation:
                rule = R.SESSION_FENCE
            else:
                rule = R.SESSION_LEASE
            raise _fail(rule, f"{kind}: slot {i} is {a}, expected {b}")
    if len(g.slots) != len(w.slots):
        raise _fail(R.SESSION_VALIDATE, f"{kind}: {len(g.slots)} slots reported, expected {len(w.slots)}")
    if g.idle_lru != w.idle_lru:
        raise _fail(R.SESSION_LRU, f"{kind}: idle sessions {g.idle_lru}, expected {w.idle_lru}")
    if g.in_flight != w.in_flight:
        raise _fail(R.SESSION_LEASE, f"{kind}: sessions in flight {g.in_flight}, expected {w.in_flight}")
    if g.pending != w.pending:
        raise _fail(R.SESSION_FENCE, f"{kind}: pending snapshots {g.pending}, expected {w.pending}")


# ----------------------------------------------------------------- goldens


def _block(s: PagedSnapshot, name: str, i: int) -> tuple[str, int]:
    v = s.sequences[name]
    return v.tier, v.blocks[i]


def check_expect(rules: list[RuleId], op: ManagerOp, out: PagedOutcome | SessionOutcome, e: ManagerExpect) -> None:
    """Every key ``e`` sets must hold in ``out``; a failure names the step's first rule unless a key has its own."""
    kind = getattr(op, "op", "?")
    r0 = rules[0]

    def need(ok: bool, rule: RuleId | str, msg: str) -> None:
        if not ok:
            raise _fail(rule, f"{kind}: {msg}")

    if e.error is not None or (out.error is not None):
        need(
            out.error is not None and e.error is not None and out.error.rule == e.error,
            e.error or (out.error.rule if out.error else r0),
            f"error {out.error}, expected {e.error}",
        )
    if isinstance(out, PagedOutcome):
        s = out.state
        if e.value is not None:
            need(out.value == e.value, r0, f"returned {out.value}, expected {e.value}")
        if e.sequences is not None:
            need(sorted(s.sequences) == sorted(e.sequences), r0, f"live {sorted(s.sequences)}, expected {e.sequences}")
        for name, data in (e.data or {}).items():
            need(name in s.sequences, r0, f"no sequence {name!r}")
            got_data = s.sequences[name].data
            need(same_data(got_data, data), r0, f"{name!r} reads {got_data}, expected {data}")
        refs_of = {"device": s.device_refs, "host": s.host_refs}
        for name, refs in (e.refs or {}).items():
            need(name in s.sequences, r0, f"no sequence {name!r}")
            v = s.sequences[name]
            got = [refs_of[v.tier].get(str(b), 0) for b in v.blocks]
            need(got == refs, R.PAGED_REFCOUNT, f"{name!r}'s blocks have reference counts {got}, expected {refs}")
        for name, tier in (e.tiers or {}).items():
            need(s.sequences[name].tier == tier, r0, f"{name!r} is in {s.sequences[name].tier}, expected {tier}")
        for a, i, b, j in e.shared or []:
            need(_block(s, a, i) == _block(s, b, j), r0, f"{a}[{i}] and {b}[{j}] must be one block")
        for a, i, b, j in e.private or []:
            need(_block(s, a, i) != _block(s, b, j), r0, f"{a}[{i}] and {b}[{j}] must be different blocks")
        if e.free_device is not None:
            need(s.free_device == e.free_device, r0, f"{s.free_device} device blocks free, expected {e.free_device}")
        if e.free_host is not None:
            need(s.free_host == e.free_host, r0, f"{s.free_host} host blocks free, expected {e.free_host}")
        if e.prefixes is not None:
            keys = [p.key for p in s.prefixes]
            need(keys == e.prefixes, R.PAGED_PREFIX_EVICT, f"prefix entries {keys}, expected {e.prefixes}")
        if e.pressure is not None:
            need(s.pressure == e.pressure, R.PAGED_PRESSURE, f"pressure {s.pressure}, expected {e.pressure}")
    else:
        st = out.state
        if e.admission is not None or e.refused is not None:
            need(out.admission == e.admission, r0, f"admission {out.admission}, expected {e.admission}")
            need(out.refused == e.refused, r0, f"refused {out.refused}, expected {e.refused}")
        if e.applied is not None:
            need(out.applied == e.applied, r0, f"applied {out.applied}, expected {e.applied}")
        if e.drained is not None:
            need(out.drained == e.drained, r0, f"drained {out.drained}, expected {e.drained}")
        if e.slots is not None:
            need(st.slots == e.slots, r0, f"slots {st.slots}, expected {e.slots}")
        if e.idle_lru is not None:
            need(st.idle_lru == e.idle_lru, r0, f"idle sessions {st.idle_lru}, expected {e.idle_lru}")
        if e.in_flight is not None:
            need(st.in_flight == e.in_flight, r0, f"in flight {st.in_flight}, expected {e.in_flight}")
