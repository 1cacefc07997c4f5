"""Compare a block model with the same model at an earlier git revision, step by step.

Why: moving a model from one way of naming its rules to another (issue 28: from ``trace.did`` to
the transition tables of ``kvspec.reference.transitions``) must change nothing a checker reads.
This walk drives the model at ``--old REV`` (its source read with ``git show``, the modules it
names loaded from that revision too) and the current one with the same operations and compares,
after every step: the outcome (result and events as JSON, or the rejection's rule and message),
the labels (the rules fired in order, each event's label, the result's rule, the silent rules),
the whole state (``fingerprint``), the counters and the earliest deadline.

Operations: random (seeded) and Hypothesis-drawn (``st.randoms``, shrunk on a difference), over a
token tree of 12 blocks with real hashes: Use (whole paths and suffixes with a parent, a partial
tail, each kind of metadata, and a few malformed), Deref (held blocks, and unknown ones), Promote,
Tick (to the earliest deadline, later, earlier), SwapIn (aimed at G2/G3/G4 residents), Destroy and
Reset. Configurations per profile: ``kvbm``, ``atomic`` (every policy), ``kvbm-g2`` (kvbm with a G2
tier, every offload option, fifo and shared links), ``kvbm-offload`` (G3 and G4 too) and ``legacy``
(with Destroy, and in a third of the runs the follow mode ``source_validation``), ``vllm`` (every
``PoolVariant`` departure, a host tier in most runs and the request driver's write-through after a
Use, its events and ``event_labels`` compared too) and ``kvbm-process`` (two or three kvbm workers
of one ``Process`` sharing G3/G4, each step on a random worker, every worker's events and state).

    python scripts/block_differential.py --old 3d6aefb --steps 20000

prints one line per profile, ``PROFILE: N steps equal`` and the rules fired, and exits 1 at the
first difference (the configuration, the operation and both sides).
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import types
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.reference.g1 import G1Model
from kvspec.reference.legacy import LegacyModel
from kvspec.reference.process import Process
from kvspec.reference.vllm_pool import HostBlock, PoolVariant, VllmPoolModel
from kvspec.spec.config import ManagerConfig, OffloadConfig
from kvspec.spec.errors import InvalidOperation
from kvspec.spec.hashing import local_block_hash, sequence_hash
from kvspec.spec.wire import (
    Deref,
    Destroy,
    FullBlock,
    Operation,
    PartialBlock,
    Plh,
    Promote,
    Reset,
    SwapIn,
    SwapInBlock,
    Tick,
    Use,
    event_to_json,
)

ROOT = Path(__file__).resolve().parent.parent
#: profile -> (the module of its model, the class)
MODELS = {p: ("kvspec/reference/g1.py", "G1Model") for p in ("kvbm", "atomic", "kvbm-g2", "kvbm-offload")}
MODELS["legacy"] = ("kvspec/reference/legacy.py", "LegacyModel")
MODELS["vllm"] = ("kvspec/reference/vllm_pool.py", "VllmPoolModel")
MODELS["kvbm-process"] = ("kvspec/reference/process.py", "Process")
#: the modules an old model may import that changed since (loaded from the old revision as well)
OLD_DEPENDENCIES = ("kvspec/reference/labels.py", "kvspec/reference/lower_tiers.py")
CURRENT: dict[str, Callable[[ManagerConfig], Any]] = {p: G1Model for p in MODELS}
CURRENT["legacy"] = LegacyModel
CURRENT["vllm"] = VllmPoolModel
CURRENT["kvbm-process"] = Process

BS = 2
#: node -> (parent node, its tokens)
TREE: dict[int, tuple[int | None, list[int]]] = {
    0: (None, [1, 2]),
    1: (0, [3, 4]),
    2: (1, [5, 6]),
    3: (1, [7, 8]),
    4: (0, [9, 9]),
    5: (4, [2, 2]),
    6: (None, [8, 8]),
    7: (6, [4, 4]),
    8: (7, [6, 6]),
    9: (2, [1, 1]),
    10: (9, [3, 3]),
    11: (5, [5, 5]),
}


def path(n: int) -> list[int]:
    out = []
    cur: int | None = n
    while cur is not None:
        out.append(cur)
        cur = TREE[cur][0]
    return out[::-1]


SEQ: dict[int, int] = {}
LOCAL: dict[int, int] = {}
for _n in sorted(TREE, key=lambda n: len(path(n))):
    _p, _toks = TREE[_n]
    LOCAL[_n] = local_block_hash(_toks)
    SEQ[_n] = sequence_hash(None if _p is None else SEQ[_p], LOCAL[_n])


def plh(n: int) -> Plh:
    p = TREE[n][0]
    return Plh(hash=SEQ[n], parent=None if p is None else SEQ[p], position=len(path(n)) - 1)


# ------------------------------------------------------------------ the old model
def _source(rev: str, rel: str) -> str:
    return subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout


@contextmanager
def _swapped(modules: dict[str, types.ModuleType]) -> Any:
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


def old_model(rev: str, rel: str, cls: str) -> Callable[[ManagerConfig], Any]:
    """The class ``cls`` of ``rel`` at ``rev``; while it loads, the dependencies that changed since
    are the revision's own (a new module under a private name, never the current one)."""
    loaded: dict[str, types.ModuleType] = {}
    deps = (*OLD_DEPENDENCIES, "kvspec/reference/g1.py") if rel.endswith("process.py") else OLD_DEPENDENCIES
    for dep in (*deps, rel):
        name = dep.removesuffix(".py").replace("/", ".")
        mod = types.ModuleType(name)
        mod.__file__ = f"{rev}:{dep}"
        with _swapped(loaded):
            exec(compile(_source(rev, dep), mod.__file__, "exec"), mod.__dict__)
        loaded[name] = mod
    model: Callable[[ManagerConfig], Any] = getattr(loaded[rel.removesuffix(".py").replace("/", ".")], cls)
    return model


# --------------------------------------------------------------- configurations
def random_config(rng: random.Random, profile: str) -> ManagerConfig:
    off = None
    if profile in ("kvbm-g2", "kvbm-offload", "kvbm-process"):
        kw: dict[str, Any] = {
            "num_g2_blocks": rng.randint(1, 5),
            "block_size_bytes": rng.choice([None, 0, 1_000_000, 3_000_000]),
            "link": "shared" if profile != "kvbm-g2" else rng.choice(["shared", "fifo"]),
            "batch_size": rng.randint(1, 3),
            "g2_eviction": rng.choice(["lineage", "lru"]),
            "g2_allocation": rng.choice(["at_start", "at_completion"]),
            "dedup": rng.choice(["filter", "resend"]),
            "tick_result": rng.choice(["none", "released_slots", "transfers"]),
        }
        if profile != "kvbm-g2":
            kw["num_g3_blocks"] = rng.choice([None, 1, 2, 4])
            kw["g4"] = rng.random() < 0.5 or kw["num_g3_blocks"] is None
            kw["lower_tier_events"] = rng.choice(["none", "owner"])
        off = OffloadConfig(**kw)
    if profile in ("legacy", "vllm"):
        return ManagerConfig(profile=profile, capacity=rng.randint(2, 8), block_size=BS, eviction="lru")
    return ManagerConfig(
        profile="atomic" if profile == "atomic" else "kvbm",
        capacity=rng.randint(2, 8),
        block_size=BS,
        eviction=rng.choice(["lineage", "lru", "multi_lru", "unordered"]),
        offload=off,
        dp_rank=rng.choice([0, 1]),
    )


# ------------------------------------------------------------------- operations
def _use(rng: random.Random, legacy: bool) -> Use:
    nodes = path(rng.choice(list(TREE)))
    parent: FullBlock | PartialBlock | None = None
    if len(nodes) > 1 and rng.random() < (0.02 if legacy else 0.3):
        cut = rng.randint(1, len(nodes) - 1)
        parent = FullBlock(full=SEQ[nodes[cut - 1]])
        nodes = nodes[cut:]
    if rng.random() < 0.1:
        nodes = nodes + nodes[:1]  # a block twice
    if rng.random() < 0.05:
        rng.shuffle(nodes)
    blocks: list[FullBlock | PartialBlock] = [FullBlock(full=SEQ[n]) for n in nodes]
    if rng.random() < 0.4:
        blocks.append(PartialBlock(partial=f"u{rng.randint(0, 4)}"))
    meta = rng.choice(["tokens", "hashes"] if legacy and rng.random() < 0.95 else ["tokens", "hashes", "none"])
    toks = [list(TREE[n][1]) for n in nodes] if meta == "tokens" else None
    if toks and rng.random() < 0.03:
        toks[0] = toks[0][:1]  # a short block
    plhs = [plh(n) for n in nodes]
    if plhs and rng.random() < 0.03:
        plhs = plhs[1:]  # a lineage hash missing
    if rng.random() < 0.02:
        parent = PartialBlock(partial="u0")  # a partial block as parent
    local = [LOCAL[n] for n in nodes] if meta != "none" else []
    return Use(blocks=blocks, local_hashes=local, plhs=plhs, token_ids=toks, parent=parent)


def _swap_in(rng: random.Random, m: Any) -> SwapIn:
    lower: set[int] = set(m.g2)
    if m.tiers is not None:
        if m.tiers.g3 is not None:
            lower |= set(m.tiers.g3.blocks)
        lower |= {e.seq for e, _w in m.tiers.g4.values()}
    aimed = [n for n in TREE if any(SEQ[x] in lower for x in path(n))]
    nodes = path(rng.choice(aimed) if aimed and rng.random() < 0.85 else rng.choice(list(TREE)))
    starts = [i for i, x in enumerate(nodes) if SEQ[x] in lower]
    cut = rng.choice(starts) if starts and rng.random() < 0.8 else rng.randint(0, len(nodes) - 1)
    parent = SEQ[nodes[cut - 1]] if cut > 0 else None
    return SwapIn(blocks=[SwapInBlock(seq_hash=SEQ[n], plh=plh(n)) for n in nodes[cut:]], parent=parent)


def _partials(m: Any) -> list[str]:
    """The partial blocks ``m`` holds (G1: its own map; legacy: its active entries)."""
    if isinstance(m, LegacyModel) or not hasattr(m, "partial"):
        return [str(k[1]) for k in m.active if k[0] == "P"]
    return list(m.partial)


def _vllm_op(rng: random.Random, m: VllmPoolModel) -> Operation:
    """A vllm block table (leading full blocks, then partial ones), a Promote of a held block, a
    Deref of held blocks (by hash or uuid), a Reset; some of each malformed."""
    k = rng.random()
    if k < 0.45:
        use = _use(rng, legacy=False)
        fulls = [b for b in use.blocks if isinstance(b, FullBlock)]
        parts = [PartialBlock(partial=f"v{rng.randint(0, 9)}") for _ in range(rng.choice([0, 0, 1, 2]))]
        if rng.random() < 0.03:
            parts = parts + parts[:1]  # a partial block twice
        blocks: list[FullBlock | PartialBlock] = [*fulls, *parts]
        if parts and rng.random() < 0.03:
            blocks.append(fulls[0] if fulls else FullBlock(full=SEQ[0]))  # a full block after a partial one
        return use.model_copy(update={"blocks": blocks})
    if k < 0.6:
        uuid = rng.choice(list(m.held)) if m.held and rng.random() < 0.9 else f"v{rng.randint(0, 12)}"
        n = rng.choice(list(TREE))
        p = TREE[n][0]
        return Promote(
            uuid=uuid,
            seq_hash=SEQ[n],
            parent_hash=None if p is None else SEQ[p],
            local_hash=LOCAL[n],
            plh=plh(n),
            token_ids=list(TREE[n][1]) if rng.random() < 0.9 else [1],
        )
    if k < 0.94:
        pool: list[FullBlock | PartialBlock] = [FullBlock(full=s) for s in m.by_hash for _ in range(2)]
        pool += [PartialBlock(partial=u) for u in m.held]
        refs = rng.sample(pool, rng.randint(1, min(len(pool), 5))) if pool else []
        if rng.random() < 0.05 or not refs:
            refs.append(
                FullBlock(full=SEQ[rng.choice(list(TREE))]) if rng.random() < 0.7 else PartialBlock(partial="z")
            )
        return Deref(blocks=refs)
    if k < 0.98:
        return Reset()
    return rng.choice([Tick(now_ms=1.0), Destroy(blocks=[FullBlock(full=SEQ[0])])])


def random_op(rng: random.Random, m: Any) -> Operation:
    """One operation for model ``m`` (read, never changed)."""
    if isinstance(m, VllmPoolModel):
        return _vllm_op(rng, m)
    k = rng.random()
    legacy = m.config.profile == "legacy"
    if getattr(m, "offload", None) is not None and rng.random() < 0.15:
        return _swap_in(rng, m)
    if legacy and rng.random() < 0.08:  # Destroy: of held blocks, sometimes one twice or one not held
        held: list[FullBlock | PartialBlock] = [FullBlock(full=s) for s in m.owners()]
        held += [PartialBlock(partial=u) for u in _partials(m)]
        refs = rng.sample(held, rng.randint(1, len(held))) if held else []
        if rng.random() < 0.1 or not refs:
            refs.append(refs[0] if refs and rng.random() < 0.5 else FullBlock(full=SEQ[rng.choice(list(TREE))]))
        return Destroy(blocks=refs)
    if k < 0.42:
        return _use(rng, legacy)
    if k < 0.64:
        pool: list[FullBlock | PartialBlock] = [FullBlock(full=s) for s in m.owners()]
        pool += [PartialBlock(partial=u) for u in _partials(m)]
        refs = rng.sample(pool, rng.randint(1, len(pool))) if pool else []
        if rng.random() < 0.08 or not refs:
            refs.append(
                FullBlock(full=SEQ[rng.choice(list(TREE))]) if rng.random() < 0.7 else PartialBlock(partial="z")
            )
        return Deref(blocks=refs)
    if k < 0.74:
        held_partials = _partials(m)
        uuid = rng.choice(held_partials) if held_partials and rng.random() < 0.9 else f"u{rng.randint(0, 6)}"
        n = rng.choice(list(TREE))
        p = TREE[n][0]
        return Promote(
            uuid=uuid,
            seq_hash=SEQ[n],
            parent_hash=None if p is None else SEQ[p],
            local_hash=LOCAL[n],
            plh=plh(n),
            token_ids=list(TREE[n][1]) if rng.random() < 0.8 else None,
        )
    if k < 0.88:
        due, r = m.earliest_deadline(), rng.random()
        if due is not None and r < 0.5:
            return Tick(now_ms=due)
        if r < 0.6:
            return Tick(now_ms=max(0.0, getattr(m, "now", 0.0) - rng.choice([0.5, 1.0, 5.0])))
        now = getattr(m, "now", 0.0)
        return Tick(now_ms=now + rng.choice([0.0, 0.5, 1.0, 2.0, 3.0, 7.0, 20.0]))
    if k < 0.98:
        return _swap_in(rng, m) if not legacy else SwapIn(blocks=[SwapInBlock(seq_hash=SEQ[0], plh=plh(0))])
    return Reset() if rng.random() < 0.5 else Destroy(blocks=[FullBlock(full=SEQ[0])])


class _OnWorker:
    """A ``Process`` seen as one model: each step on the worker ``current`` (chosen per step); its
    events are the worker's then the others' (published during it); its state every worker's."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self.current = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.proc.workers[self.current], name)

    def apply(self, op: Operation) -> Any:
        ps = self.proc.apply(self.current, op)
        others = [e for w in sorted(ps.others) for e in ps.others[w]]
        return types.SimpleNamespace(result=ps.step.result, events=[*ps.step.events, *others], labels=ps.step.labels)

    def fingerprint(self) -> Any:
        return tuple(w.fingerprint() for w in self.proc.workers)

    def counters(self) -> Any:
        return tuple(w.counters() for w in self.proc.workers)

    def earliest_deadline(self) -> Any:
        return tuple(w.earliest_deadline() for w in self.proc.workers)


# ------------------------------------------------------------------------- walk
class Differs(AssertionError):
    """The two models answered one operation differently."""


def _label(lab: Any) -> tuple[Any, ...]:
    """An event label as plain values (the old revision's classes are not the current ones)."""
    rules = (lab.published, lab.blocks, lab.parent, lab.tokens, lab.choice)
    return (*(None if r is None else str(r) for r in rules), sorted(lab.copies))


def _labels(labels: Any) -> tuple[Any, ...]:
    """A step's labels as plain values: rules fired in order, event labels, result rule, silent rules."""
    return (
        [str(r) for r in labels.rules],
        [_label(e) for e in labels.events],
        None if labels.result is None else str(labels.result),
        sorted((k, str(r)) for k, r in labels.silent.items()),
    )


def _outcome(m: Any, op: Operation) -> tuple[Any, Any]:
    try:
        step = m.apply(op)
    except InvalidOperation as e:
        return ("rejected", str(e.rule), str(e)), None
    return ("ok", step.result, [event_to_json(e) for e in step.events]), _labels(step.labels)


def run(old: Callable[[ManagerConfig], Any], profile: str, rng: random.Random, fired: Counter[str]) -> int:
    """One random configuration and 5-60 operations on both models; the steps compared."""
    cfg = random_config(rng, profile)
    if profile == "vllm":  # a host tier in most runs, and each departure the checker can follow
        variant = PoolVariant(
            first_event_id=rng.choice([0, 1]),
            store_copies=rng.random() < 0.7,
            remove_copies=rng.random() < 0.7,
            host_order=rng.choice(["leaf_first", "hash"]),
            full_prompt_hit=rng.random() < 0.2,
            host_writes_hits=rng.random() < 0.7,
        )
        host = rng.choice([None, 1, 2, 4, 6])
        a = old(cfg, host_blocks=host, variant=variant)  # type: ignore[call-arg]
        b = VllmPoolModel(cfg, host_blocks=host, variant=variant)
    elif profile == "kvbm-process":  # two or three workers sharing G3/G4
        n_workers = rng.randint(2, 3)
        a, b = _OnWorker(old(cfg, n_workers)), _OnWorker(Process(cfg, n_workers))  # type: ignore[call-arg]
    else:
        a, b = old(cfg), CURRENT[profile](cfg)
    if profile == "legacy" and rng.random() < 0.3:  # the follow mode legacy_source_validation
        a.source_validation = b.source_validation = True
    n = rng.randint(5, 60)
    for i in range(n):
        if isinstance(b, _OnWorker):
            a.current = b.current = rng.randrange(len(b.proc.workers))
        op = random_op(rng, b.proc.workers[b.current] if isinstance(b, _OnWorker) else b)
        (oa, la), (ob, lb) = _outcome(a, op), _outcome(b, op)
        where = f"{profile}, step {i}, {cfg!r}, {op!r}"
        for what, x, y in (
            ("outcome", oa, ob),
            ("labels", la, lb),
            ("state", a.fingerprint(), b.fingerprint()),
            ("counters", a.counters(), b.counters()),
            ("earliest deadline", a.earliest_deadline(), b.earliest_deadline()),
        ):
            if x != y:
                raise Differs(f"{what} differs at {where}:\n  old: {x}\n  new: {y}")
        fired[oa[0]] += 1
        for r in lb[0] if lb is not None else ():
            fired[r] += 1
        if isinstance(b, VllmPoolModel) and b.host is not None and isinstance(op, Use) and rng.random() < 0.6:
            # the request driver's write-through of the prompt's full blocks (outside ``apply``)
            fulls = [r.full for r in op.blocks if isinstance(r, FullBlock)]
            local = op.local_hashes or [0] * len(fulls)
            blocks = [HostBlock(seq, loc, i) for i, (seq, loc) in enumerate(zip(fulls, local, strict=False))]
            hits = rng.randint(0, len(blocks))
            ha = [event_to_json(e) for e in a.host_write_through(blocks, hits)]
            hb = [event_to_json(e) for e in b.host_write_through(blocks, hits)]
            if ha != hb or a.fingerprint() != b.fingerprint():
                raise Differs(f"host write-through differs at {where}:\n  old: {ha}\n  new: {hb}")
            fired["host write-through"] += 1
        if isinstance(b, VllmPoolModel):
            la_all = {k: _label(v) for k, v in a.event_labels.items()}
            lb_all = {k: _label(v) for k, v in b.event_labels.items()}
            if la_all != lb_all:
                raise Differs(f"event_labels differ at {where}:\n  old: {la_all}\n  new: {lb_all}")
    return n


def walk(old: Callable[[ManagerConfig], Any], profile: str, steps: int, seed: int) -> Counter[str]:
    rng = random.Random(seed)
    fired: Counter[str] = Counter()
    while fired["steps"] < steps:
        fired["steps"] += run(old, profile, rng, fired)
    return fired


def hypothesis_walk(old: Callable[[ManagerConfig], Any], profile: str, examples: int) -> Counter[str]:
    fired: Counter[str] = Counter()

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.randoms(use_true_random=False))
    def one(rng: random.Random) -> None:
        fired["steps"] += run(old, profile, rng, fired)

    one()
    return fired


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the git revision of the old model")
    ap.add_argument("--steps", type=int, default=20_000, help="random steps per profile")
    ap.add_argument("--examples", type=int, default=200, help="Hypothesis runs per profile (5-60 steps each)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profiles", default=",".join(MODELS))
    args = ap.parse_args(argv)
    for profile in args.profiles.split(","):
        rel, cls = MODELS[profile]
        old = old_model(args.old, rel, cls)
        try:
            fired = walk(old, profile, args.steps, args.seed)
            fired.update(hypothesis_walk(old, profile, args.examples))
        except Differs as e:
            print(f"{profile}: {e}")
            return 1
        steps = fired.pop("steps")
        print(f"{profile}: {steps} steps equal; {dict(sorted(fired.items()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
