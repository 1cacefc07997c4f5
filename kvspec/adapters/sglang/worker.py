"""The SGLang worker: a child process that imports SGLang's RadixCache and drives it.

    python -m kvspec.adapters.sglang.worker           # serve JSON lines on stdin/stdout
    python -m kvspec.adapters.sglang.worker --warm    # import, build the native hash, exit

Importing SGLang takes seconds and binds placeholder modules (``loader.py``),
so it never happens in the test process: one worker serves the sessions of a
test run one after another, each a fresh ``RadixCache`` with KV events on.
The first cache of a machine compiles SGLang's native page hash (a C++
extension, cached under ``~/.cache/torch_extensions``); ``--warm`` does it
ahead (``make engines``).

Messages, one reply each:

- ``{"op": "open", "page_size", "capacity", "dynamo_format"}`` -> ``{"opened": [events], "absent": [...]}``
- ``{"op": "step", "step": RADIX_OP}`` -> ``{"value" | "refused": [rule, message], "events", "state"}``
- ``{"op": "reads"}`` -> ``{"unexpected": [...]}`` (placeholder reads beyond import time)
- ``{"op": "close"}``

Events are SGLang's own event objects as JSON (``type``, ``block_hashes``,
``parent_block_hash``, ``token_ids``, ``block_size``, ``medium``); the adapter
translates them. Errors are ``{"error": ..., "trace": ...}``.
"""

from __future__ import annotations

import json
import sys
import traceback
from array import array
from typing import Any

from kvspec.adapters.sglang.loader import LogicalClock, load_radix_cache, unexpected_reads
from kvspec.spec.radix_wire import (
    RADIX_OP_ADAPTER,
    RadixEvict,
    RadixInsert,
    RadixLock,
    RadixMatch,
    RadixOp,
    RadixRequest,
    RadixReset,
    RadixUnlock,
)


class SlotAllocator:
    """The token-to-KV allocator the cache frees into: ``capacity`` slot ids.

    SGLang's own allocators need a KV pool on a device; the cache itself only
    calls ``free_segment`` (when it evicts) and reads ``device``. Double frees
    and foreign slots are errors here, so a cache that frees a slot twice is
    caught."""

    device = "cpu"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free_ids: list[int] = []
        self.free_set: set[int] = set()
        self.reset()

    def available_size(self) -> int:
        return len(self.free_ids)

    def alloc(self, n: int) -> list[int]:
        if n > len(self.free_ids):
            raise RuntimeError(f"alloc of {n} slots with {len(self.free_ids)} free")
        out = [self.free_ids.pop() for _ in range(n)]
        self.free_set.difference_update(out)
        return out

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        del start_pos
        for i in [int(x) for x in indices.tolist()]:
            if i in self.free_set or not 0 <= i < self.capacity:
                raise RuntimeError(f"slot {i} freed twice or never allocated")
            self.free_ids.append(i)
            self.free_set.add(i)

    def reset(self) -> None:
        """Every slot free again (the scheduler's flush_cache resets its allocator with the tree)."""
        self.free_ids = list(range(self.capacity - 1, -1, -1))
        self.free_set = set(self.free_ids)


def _event_json(ev: Any) -> dict[str, Any]:
    kind = type(ev).__name__
    out: dict[str, Any] = {"type": kind}
    for f in ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "cache_salt", "lora_name"):
        if hasattr(ev, f):
            v = getattr(ev, f)
            out[f] = list(v) if isinstance(v, list) else v
    if hasattr(ev, "medium"):
        m = ev.medium
        out["medium"] = getattr(m, "value", m)
    return out


class Session:
    """One RadixCache and what the harness keeps beside it (the allocator, the locks)."""

    def __init__(self, rc: Any, page_size: int, capacity: int, dynamo_format: bool) -> None:
        import torch

        self.rc = rc
        self.torch = torch
        self.page = page_size
        self.alloc = SlotAllocator(capacity)
        rc.time = LogicalClock()  # loader.py: deterministic access times, SGLang's order
        self.cache = rc.RadixCache.create_simulated(
            mock_allocator=self.alloc,
            page_size=page_size,
            enable_kv_cache_events=True,
            dynamo_kv_event_format=dynamo_format,
        )
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams

        self.EvictParams, self.InsertParams, self.MatchPrefixParams = EvictParams, InsertParams, MatchPrefixParams
        self.locks: dict[str, Any] = {}

    def key(self, tokens: list[int]) -> Any:
        return self.rc.RadixKey(array("q", tokens))

    def take(self) -> list[dict[str, Any]]:
        return [_event_json(e) for e in self.cache.kv_events.take()]

    def match(self, tokens: list[int]) -> tuple[int, Any]:
        m = self.cache.match_prefix(self.MatchPrefixParams(key=self.key(tokens)))
        return int(m.device_prefix_len), m.last_device_node

    def tensor(self, ids: list[int]) -> Any:
        return self.torch.tensor(ids, dtype=self.torch.int64)

    def step(self, op: RadixOp) -> dict[str, Any]:
        """Apply one op; the refusals are the harness's (lock names, pool slots)."""
        if isinstance(op, RadixMatch):
            return {"value": self.match(op.tokens)[0]}
        if isinstance(op, RadixInsert):
            n = len(op.tokens) // self.page * self.page
            if n > self.alloc.available_size():
                return {"refused": ["RADIX-CAPACITY", f"{n} slots needed, {self.alloc.available_size()} free"]}
            slots = self.tensor(self.alloc.alloc(n))
            r = self.cache.insert(self.InsertParams(key=self.key(op.tokens[:n]), value=slots))
            if r.prefix_len:
                self.alloc.free_segment(slots[: r.prefix_len])
            return {"value": int(r.prefix_len)}
        if isinstance(op, RadixLock):
            if op.name in self.locks:
                return {"refused": ["RADIX-VALIDATE", f"lock {op.name!r} is already held"]}
            n, node = self.match(op.tokens)
            self.cache.inc_lock_ref(node)
            self.locks[op.name] = node
            return {"value": n}
        if isinstance(op, RadixUnlock):
            node = self.locks.pop(op.name, None)
            if node is None:
                return {"refused": ["RADIX-VALIDATE", f"no lock {op.name!r} is held"]}
            self.cache.dec_lock_ref(node)
            return {"value": 0}
        if isinstance(op, RadixEvict):
            return {"value": int(self.cache.evict(self.EvictParams(num_tokens=op.tokens)).num_tokens_evicted)}
        if isinstance(op, RadixReset):
            self.cache.reset()
            self.alloc.reset()
            self.locks.clear()
            return {"value": 0}
        assert isinstance(op, RadixRequest)
        return self.request(op)

    def request(self, op: RadixRequest) -> dict[str, Any]:
        """The scheduler's path for one request (SPEC.md RADIX-PREFIX-HIT): match the
        prompt but its last token, lock, allocate (evicting what is missing), insert
        prompt + output but the last token, free duplicates and the partial page, unlock."""
        cached, node = self.match(op.prompt[:-1])
        self.cache.inc_lock_ref(node)
        seq = op.prompt + op.output[:-1]
        need = len(seq) - cached
        free = self.alloc.available_size()
        if need > free + int(self.cache.evictable_size()):
            self.cache.dec_lock_ref(node)
            return {"refused": ["RADIX-CAPACITY", f"{need} slots needed, {free} free"]}
        if need > free:
            self.cache.evict(self.EvictParams(num_tokens=need - free))
        prefix = self.cache.path_device_indices(node)
        values = self.torch.cat([prefix.to(self.torch.int64), self.tensor(self.alloc.alloc(need))])
        r = self.cache.insert(self.InsertParams(key=self.key(seq), value=values))
        aligned = len(seq) // self.page * self.page
        if r.prefix_len > cached:
            self.alloc.free_segment(values[cached : r.prefix_len])
        if aligned < len(seq):
            self.alloc.free_segment(values[aligned:])
        self.cache.dec_lock_ref(node)
        return {"value": cached}

    def state(self) -> dict[str, Any]:
        def view(node: Any) -> dict[str, Any]:
            kids = sorted(node.children.values(), key=lambda c: tuple(c.key.token_ids[: self.page]))
            return {
                "tokens": list(node.key.token_ids),
                "lock_ref": int(node.lock_ref),
                "children": [view(c) for c in kids],
            }

        def path_len(node: Any) -> int:
            n = 0
            while node is not self.cache.root_node and node is not None:
                n += len(node.key)
                node = node.parent
            return n

        root = self.cache.root_node
        kids = sorted(root.children.values(), key=lambda c: tuple(c.key.token_ids[: self.page]))
        return {
            "tree": [view(c) for c in kids],
            "evictable": int(self.cache.evictable_size()),
            "protected": int(self.cache.protected_size()),
            "free": self.alloc.available_size(),
            "locks": {name: path_len(n) for name, n in sorted(self.locks.items())},
        }


def serve(inp: Any, out: Any) -> None:
    rc, bound = load_radix_cache()
    session: Session | None = None

    def reply(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    for line in inp:
        try:
            msg = json.loads(line)
            op = msg.get("op")
            if op == "open":
                session = Session(rc, int(msg["page_size"]), int(msg["capacity"]), bool(msg.get("dynamo_format")))
                reply({"opened": session.take(), "absent": bound})
            elif op == "step":
                if session is None:
                    raise RuntimeError("step before open")
                radix_op = RADIX_OP_ADAPTER.validate_python(msg["step"])
                result = session.step(radix_op)
                result["events"] = session.take()
                result["state"] = session.state()
                reply(result)
            elif op == "reads":
                reply({"unexpected": unexpected_reads()})
            elif op == "close":
                session = None
                reply({"closed": True})
            else:
                raise RuntimeError(f"unknown message {op!r}")
        except Exception as e:
            reply({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]})


def warm() -> None:
    """Import SGLang and build its native page hash once (``make engines``)."""
    rc, _ = load_radix_cache()
    s = Session(rc, 1, 4, False)
    s.step(RadixInsert(tokens=[1, 2]))
    print("sglang radix cache ready (native hash built)")


def main() -> None:
    if "--warm" in sys.argv[1:]:
        warm()
        return
    real_out = sys.stdout
    sys.stdout = sys.stderr  # SGLang's prints never reach the protocol stream
    serve(sys.stdin, real_out)


if __name__ == "__main__":
    main()
