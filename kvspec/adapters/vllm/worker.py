"""The vLLM worker: a child process that imports vLLM and runs engines.

    python -m kvspec.adapters.vllm.worker

Importing vLLM takes seconds (torch and most of vLLM come with it), so one
worker serves the sessions of a test run one after another: ``open`` builds
a fresh ``VllmEngine`` (a new KVCacheManager and BlockPool; vLLM keeps no
other state between them but its NONE_HASH, which depends only on the hash
algorithm), ``close`` drops it. JSON lines on stdin/stdout, one reply per
message (a sequential run replies once per request, then ``done``):

- ``{"op": "open", "capacity", "block_size", "dp_rank", "hash_algo", "publish", "replay"}``
  (``publish``: also send every batch through vLLM's ``ZmqEventPublisher``, which connects there;
  ``replay``: its replay socket, bound there)
- ``{"op": "run", "mode": "sequential"|"concurrent", "requests": [{"prompt", "max_tokens"}]}``
- ``{"op": "add", "id", "prompt", "max_tokens"}``, ``{"op": "step"}``: the engine step by step
- ``{"op": "reset"}``: ``reset_prefix_cache``
- ``{"op": "close"}``

Event batches travel as the base64 of vLLM's own msgpack ``KVEventBatch``
payloads. Anything that goes wrong is ``{"error": ...}``; stdout carries
nothing else (vLLM's logging goes to stderr).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import traceback
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _batches(payloads: list[bytes]) -> list[str]:
    return [base64.b64encode(p).decode() for p in payloads]


def _outcome(t: Any) -> dict[str, Any]:
    return {
        "index": t.index,
        "id": t.request_id,
        "cached_tokens": t.cached_tokens,
        "output_tokens": t.req.num_output_tokens,
        "finish": "stalled" if t.stalled else "length",
        "preemptions": t.preemptions,
        "tokens": list(t.req.all_token_ids),
    }


class Worker:
    def __init__(self, out: Any) -> None:
        self.out = out
        self.engine: Any = None

    def reply(self, msg: dict[str, Any]) -> None:
        self.out.write(json.dumps(msg) + "\n")
        self.out.flush()

    def handle(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "open":
            from kvspec.adapters.vllm.engine import VllmEngine, vllm_version

            self._close()
            self.engine = VllmEngine(
                int(msg["capacity"]),
                int(msg["block_size"]),
                dp_rank=int(msg.get("dp_rank", 0)),
                hash_algo=str(msg.get("hash_algo", "sha256")),
                publish_endpoint=msg.get("publish"),
                replay_endpoint=msg.get("replay"),
            )
            self.reply({"ok": "open", "version": vllm_version()})
        elif op == "close":
            self._close()
            self.reply({"ok": "closed"})
        elif self.engine is None:
            self.reply({"error": f"{op!r} before open"})
        elif op == "run":
            self._run(str(msg["mode"]), msg["requests"])
        elif op == "add":
            self.engine.add(str(msg["id"]), list(msg["prompt"]), int(msg["max_tokens"]))
            self.reply({"ok": "added"})
        elif op == "step":
            step = self.engine.step()
            self.reply(
                {
                    "ok": "step",
                    "batches": _batches(step.payloads),
                    "finished": [_outcome(t) for t in step.finished],
                    "idle": self.engine.idle,
                }
            )
        elif op == "reset":
            ok, payloads = self.engine.reset_prefix_cache()
            self.reply({"ok": "reset", "value": ok, "batches": _batches(payloads)})
        else:
            self.reply({"error": f"unknown op {op!r}"})

    def _run(self, mode: str, requests: list[dict[str, Any]]) -> None:
        eng = self.engine
        if mode == "sequential":
            for i, r in enumerate(requests):
                eng.add(f"r{eng.count}", list(r["prompt"]), int(r["max_tokens"]))
                payloads: list[bytes] = []
                finished: list[Any] = []
                while not eng.idle:
                    step = eng.step()
                    payloads += step.payloads
                    finished += step.finished
                self.reply({"ok": "request", **_outcome(finished[0]), "index": i, "batches": _batches(payloads)})
            self.reply({"ok": "done"})
            return
        first = eng.count
        for r in requests:
            eng.add(f"r{eng.count}", list(r["prompt"]), int(r["max_tokens"]))
        payloads = []
        outcomes: dict[int, dict[str, Any]] = {}
        while not eng.idle:
            step = eng.step()
            payloads += step.payloads
            outcomes.update((t.index - first, _outcome(t)) for t in step.finished)
        self.reply(
            {"ok": "concurrent", "outcomes": [outcomes[k] for k in sorted(outcomes)], "batches": _batches(payloads)}
        )

    def _close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def main() -> int:
    # vLLM may print to stdout while importing: keep the protocol channel clean
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    worker = Worker(out)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            worker.handle(json.loads(line))
        except Exception as e:
            worker.reply({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]})
    worker._close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
