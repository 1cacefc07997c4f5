"""The child process that runs one Dynamo mocker (run as ``python -m``).

Why a child: a ``DistributedRuntime`` leaves one loopback listener and its
tokio threads behind in the process that created it, even after shutdown
(ai-dynamo-runtime 1.6.1), so each mocker gets a process of its own and the
parent ends it by killing the process group. The parent may also start it in
a fresh network namespace with only loopback up (``unshare -rn``), because
the runtime's ZMQ publishers bind 0.0.0.0 whatever ``DYN_EVENT_PLANE_HOST``
says.

It speaks JSON lines on stdin/stdout (the parent, ``adapter.py``, validates
every reply); stdout carries nothing else (the runtime logs to stderr).

    {"op": "start", "engine": {...}, "namespace": NS, "block_size": B,
     "num_gpu_blocks": N, "token_ids": BOOL} -> {"ok": "started", ...}
    {"op": "run", "mode": "sequential" | "concurrent", "requests": [...],
     "quiesce_ms": Q, "request_timeout_s": T, "max_settle_s": S}
        sequential -> one {"ok": "request", ...} per request, then {"ok": "done"}
        concurrent -> {"ok": "concurrent", "outcomes": [...], "events": [...]}
    EOF on stdin, or {"op": "exit"}          -> the process exits at once

Errors are reported as ``{"error": MESSAGE, "stage": STAGE}``; after a start
error the process exits with status 3.

Knowing when a request's events are all in: the engine publishes a request's
last event around the time the response completes (before it, usually, by
about a millisecond; after it, rarely, by a few), and there is no end marker,
so a request is over when its response has completed *and* no event arrived
for ``quiesce_ms``; ``max_settle_s`` bounds that wait. The quiet is confirmed
by the subscriber thread itself (a poll of its socket that began
``quiesce_ms`` after the last event found nothing), not by the clock alone:
on a loaded machine the thread can be off the CPU for longer than the window,
and the clock would then call quiet a socket nobody read. Since that is
still a time bound, events that arrive after it are looked for (just before
the next request is sent, and for one more window after the run) and
reported as ``late`` in the reply, never silently given to another request:
the parent then reruns the workload with a longer window or reports a
transport problem (``adapter.py``). Lost envelopes are detected through the
envelope sequence numbers (contiguous from 0).

Token ids: the event plane's Stored blocks carry hashes only. With
``"token_ids": true`` the engine also runs its raw publisher
(``zmq_kv_events_port``, vLLM's event format, ``emit_kv_token_ids`` on),
which names each stored block's tokens; every reply then carries that
stream as ``raw_events`` and the parent joins the two by block hashes.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import struct
import sys
import threading
import time
from typing import Any

_OUT = sys.stdout


#: a wake-up of the stall watch later than this (it asks for 0.1 s) means the
#: process was not running: that gap does not count towards a stall
STARVED_S = 0.5

#: the outcome of a request the engine kept without progress
_STALLED: dict[str, Any] = {"cached_tokens": None, "finish": "stalled", "output_tokens": 0}


def reply(obj: dict[str, Any]) -> None:
    _OUT.write(json.dumps(obj, separators=(",", ":")) + "\n")
    _OUT.flush()


class EventCollector:
    """A ZMQ SUB on the kv-events channel, drained by one thread.

    ``raw``: the endpoint is the engine's raw publisher (``zmq_kv_events_port``),
    which speaks vLLM's KV event format (frames: topic, 8-byte sequence, one
    msgpack batch ``[ts, events, dp_rank]``) and, with ``emit_kv_token_ids``,
    carries each stored block's token ids, which the event plane does not."""

    def __init__(self, endpoint: str, raw: bool = False) -> None:
        import zmq

        self._zmq = zmq
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.monitor = self.sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.sub.connect(endpoint)
        self.raw = raw
        self.lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.next_sequence = 0
        self.envelopes = 0
        self.last_event_at = 0.0
        #: when the latest poll that found the socket empty began
        self.checked_empty_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events-sub", daemon=True)

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait for the SUB's handshake with the publisher (then the
        subscription reaches it within a moment on loopback)."""
        return bool(self.monitor.poll(int(timeout_s * 1000)))

    def start(self) -> None:
        self._thread.start()

    def _decode(self, frames: list[bytes]) -> list[dict[str, Any]]:
        import msgpack

        if self.raw:
            return self._decode_raw(frames)
        last = frames[-1]
        if len(last) < 5:
            raise ValueError(f"envelope of {len(last)} bytes is shorter than its 5-byte header")
        (length,) = struct.unpack(">I", last[1:5])
        env = msgpack.unpackb(last[5 : 5 + length], raw=False, strict_map_key=False)
        seq = env.get("sequence")
        if seq != self.next_sequence:
            self.problems.append(f"envelope sequence {seq} where {self.next_sequence} was due (events lost)")
        self.next_sequence = (seq if isinstance(seq, int) else self.next_sequence) + 1
        payload = env.get("payload")
        if isinstance(payload, bytes | bytearray):
            payload = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        if not isinstance(payload, list):
            raise ValueError(f"envelope payload is {type(payload).__name__}, not a list of events")
        return payload

    def _decode_raw(self, frames: list[bytes]) -> list[dict[str, Any]]:
        import msgpack

        if len(frames) != 3 or len(frames[1]) != 8:
            raise ValueError(f"raw KV event message of {len(frames)} frames, expected topic, sequence, payload")
        seq = int.from_bytes(frames[1], "big")
        if seq != self.next_sequence:
            self.problems.append(f"raw event sequence {seq} where {self.next_sequence} was due (events lost)")
        self.next_sequence = seq + 1
        batch = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
        if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
            raise ValueError("raw KV event payload is not a [ts, events, ...] batch")
        return [e for e in batch[1] if isinstance(e, dict)]

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            if not self.sub.poll(10):
                with self.lock:
                    self.checked_empty_at = began
                continue
            frames = self.sub.recv_multipart()
            now = time.monotonic()
            try:
                evs = self._decode(frames)
            except Exception as e:  # report, never die: the parent must hear about it
                with self.lock:
                    self.problems.append(f"undecodable envelope: {type(e).__name__}: {e}")
                continue
            with self.lock:
                self.envelopes += 1
                self.events.extend(evs)
                self.last_event_at = now

    def take(self) -> tuple[list[dict[str, Any]], list[str]]:
        with self.lock:
            evs, self.events = self.events, []
            probs, self.problems = self.problems, []
        return evs, probs

    def take_events(self) -> list[dict[str, Any]]:
        """The events received since the last take (problems stay)."""
        with self.lock:
            evs, self.events = self.events, []
        return evs

    async def settle(self, quiet_s: float, max_s: float) -> bool:
        """Wait until this thread found the socket empty at least ``quiet_s``
        after the last event (and after the call); False if it never did
        within ``max_s``."""
        start = time.monotonic()
        while True:
            with self.lock:
                since = max(self.last_event_at, start)
                checked = self.checked_empty_at
            if checked - since >= quiet_s:
                return True
            now = time.monotonic()
            if now - start > max_s:
                return False
            await asyncio.sleep(max(0.002, since + quiet_s - now))


class Mocker:
    def __init__(self) -> None:
        self.rt: Any = None
        self.client: Any = None
        self.serve: Any = None
        self.collector: EventCollector | None = None
        #: the raw publisher's events (token ids), when the start asked for them
        self.raw: EventCollector | None = None
        #: when the last output token arrived (stall detection in concurrent runs)
        self.progress_at = 0.0

    async def start(self, msg: dict[str, Any]) -> dict[str, Any]:
        t0 = time.monotonic()
        from dynamo._core import _normalize_mocker_config
        from dynamo.llm import EngineType, EntrypointArgs, ModelRuntimeConfig, make_engine, run_input
        from dynamo.runtime import DistributedRuntime

        ns = msg["namespace"]
        self.rt = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp", event_plane="zmq")
        dyn: dict[str, Any] = {"enable_local_indexer": True}
        raw_port = _free_port() if msg.get("token_ids") else None
        if raw_port is not None:
            dyn["zmq_kv_events_port"] = raw_port
        cfg = _normalize_mocker_config({"engine": msg["engine"], "dynamo": dyn})
        rc = ModelRuntimeConfig()
        rc.total_kv_blocks = int(msg["num_gpu_blocks"])
        rc.enable_local_indexer = True
        rc.kv_event_publishing_enabled = True
        endpoint = f"dyn://{ns}.mocker.generate"
        args = EntrypointArgs(
            EngineType.Mocker,
            model_path=None,
            model_name="kvspec-mock",
            endpoint_id=endpoint,
            mocker_engine_args=cfg,
            kv_cache_block_size=int(msg["block_size"]),
            runtime_config=rc,
        )
        engine = await make_engine(self.rt, args)
        self.serve = asyncio.ensure_future(run_input(self.rt, endpoint, engine))  # a Future, not a coroutine
        self.client = await self.rt.endpoint(f"{ns}.mocker.generate").client()
        await asyncio.wait_for(self.client.wait_for_instances(), msg.get("timeout_s", 20))
        pattern = os.path.join(os.environ["DYN_FILE_KV"], "v1", "event_channels", "*kv%2Devents*")
        deadline = time.monotonic() + msg.get("timeout_s", 20)
        while not (files := glob.glob(pattern)):
            if self.serve.done():
                self.serve.result()  # raises the engine's error
            if time.monotonic() > deadline:
                raise TimeoutError("the kv-events channel was never registered")
            await asyncio.sleep(0.005)
        with open(files[0]) as f:
            endpoint_addr = json.load(f)["transport"]["config"]["endpoint"]
        self.collector = EventCollector(endpoint_addr)
        self.collector.start()
        if not self.collector.wait_connected(5.0):
            raise TimeoutError(f"could not connect to the event publisher at {endpoint_addr}")
        if raw_port is not None:
            self.raw = EventCollector(f"tcp://127.0.0.1:{raw_port}", raw=True)
            self.raw.start()
            if not self.raw.wait_connected(5.0):
                raise TimeoutError(f"could not connect to the raw event publisher on port {raw_port}")
        await asyncio.sleep(0.05)  # the subscription reaches the publisher (PUB/SUB slow joiner)
        return {
            "ok": "started",
            "startup_s": round(time.monotonic() - t0, 4),
            "publisher": endpoint_addr,
            "pid": os.getpid(),
        }

    async def generate(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        body = {
            "token_ids": req["prompt"],
            "stop_conditions": {"max_tokens": req["max_tokens"], "ignore_eos": True},
            "sampling_options": {},
            "output_options": {},
            "eos_token_ids": [],
        }

        async def consume() -> dict[str, Any]:
            cached, finish, n_out = None, None, 0
            async for item in await self.client.generate(body):
                data = item.data()
                if not isinstance(data, dict):
                    continue
                n_out += len(data.get("token_ids") or [])
                self.progress_at = time.monotonic()
                usage = data.get("completion_usage") or {}
                details = usage.get("prompt_tokens_details") or {}
                if details.get("cached_tokens") is not None:
                    cached = details["cached_tokens"]
                if data.get("finish_reason") is not None:
                    finish = data["finish_reason"]
            return {
                "cached_tokens": cached,
                "finish": finish if isinstance(finish, str) else json.dumps(finish),
                "output_tokens": n_out,
            }

        try:
            return await asyncio.wait_for(consume(), timeout_s)
        except TimeoutError:
            raise
        except Exception as e:  # the engine refused or failed the request: that is its outcome
            return {"cached_tokens": None, "finish": f"error: {type(e).__name__}: {e}"[:2000], "output_tokens": 0}

    async def _gather(self, requests: list[dict[str, Any]], timeout: float, stall_s: float) -> list[dict[str, Any]]:
        """Run ``requests`` at once; those without progress (no token, no
        event) for ``stall_s`` are cancelled and reported stalled. Raises
        TimeoutError when one exceeds ``timeout`` while others progress."""
        assert self.collector is not None
        self.progress_at = time.monotonic()
        tasks = [asyncio.ensure_future(self.generate(req, timeout)) for req in requests]
        tick = time.monotonic()
        while True:
            _, pending = await asyncio.wait(tasks, timeout=0.1)
            if not pending:
                break
            now = time.monotonic()
            if now - tick > STARVED_S:
                # this process was off the CPU (a loaded machine), the engine's
                # threads likely with it: that time is not the engine's stall
                self.progress_at = max(self.progress_at, self.collector.last_event_at) + (now - tick)
            tick = now
            if now - max(self.progress_at, self.collector.last_event_at) > stall_s:
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
        outs: list[dict[str, Any]] = []
        for t in tasks:
            if t.cancelled():
                outs.append(dict(_STALLED))
                continue
            exc = t.exception()
            if exc is not None:
                raise exc
            outs.append(t.result())
        return outs

    async def run(self, msg: dict[str, Any]) -> None:
        assert self.collector is not None
        quiet = msg.get("quiesce_ms", 30) / 1000
        max_settle = msg.get("max_settle_s", 5.0)
        timeout = msg.get("request_timeout_s", 20.0)
        self.collector.take()  # nothing may be pending; anything left is reported below
        if self.raw is not None:
            self.raw.take()
        # A run can stall (the engine keeps a request it never finishes): once
        # no token and no event arrived for stall_s, the requests still open
        # are reported with finish "stalled" (the checker sees a request that
        # fits the pool and did not generate max_tokens). In a sequential run
        # the requests after a stall are not sent (the engine still holds the
        # stalled one) and are reported stalled as well.
        stall_s = float(msg.get("stall_s", 5.0))
        if msg["mode"] == "sequential":
            stalled = False
            for i, req in enumerate(msg["requests"]):
                t0 = time.monotonic()
                if stalled:
                    reply({"ok": "request", "index": i, **_STALLED, "events": [], "problems": [], "elapsed_ms": 0.0})
                    continue
                late = self._late(f"request {i - 1}'s events were taken") if i else []
                try:
                    (out,) = await self._gather([req], timeout, stall_s)
                except TimeoutError:
                    reply(
                        {
                            "error": f"request {i} did not complete within {timeout} s (engine stalled)",
                            "stage": "request",
                        }
                    )
                    return
                stalled = out["finish"] == "stalled"
                events, raw, problems = await self._collect(quiet, max_settle, f"request {i} completed")
                reply(
                    {
                        "ok": "request",
                        "index": i,
                        **out,
                        "events": events,
                        **raw,
                        "problems": problems,
                        "late": late,
                        "elapsed_ms": round((time.monotonic() - t0) * 1000, 3),
                    }
                )
            late = await self._trailing(quiet, max_settle, "the last request's events were taken")
            reply({"ok": "done", "late": late})
            return
        try:
            outs = await self._gather(msg["requests"], timeout, stall_s)
        except TimeoutError:
            reply({"error": f"a concurrent request did not complete within {timeout} s", "stage": "request"})
            return
        events, raw, problems = await self._collect(quiet, max_settle, "the requests completed")
        late = await self._trailing(quiet, max_settle, "the run's events were taken")
        reply({"ok": "concurrent", "outcomes": list(outs), "events": events, **raw, "problems": problems, "late": late})

    def _late(self, after: str) -> list[str]:
        """Events received since the last take (they came after a quiet
        window closed): dropped, and described for the reply."""
        notes: list[str] = []
        for name, c in (("event plane", self.collector), ("raw publisher", self.raw)):
            if c is None:
                continue
            evs = c.take_events()
            if evs:
                notes.append(f"{len(evs)} {name} events arrived after {after}")
        return notes

    async def _trailing(self, quiet: float, max_settle: float, after: str) -> list[str]:
        """One more quiet window after the run: anything in it was late."""
        assert self.collector is not None
        await self.collector.settle(quiet, max_settle)
        if self.raw is not None:
            await self.raw.settle(quiet, max_settle)
        return self._late(after)

    async def _collect(
        self, quiet: float, max_settle: float, after: str
    ) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
        """The events (and the raw publisher's, as ``{"raw_events": [...]}``
        when it is on) once both streams are quiet."""
        assert self.collector is not None
        settled = await self.collector.settle(quiet, max_settle)
        if self.raw is not None:
            settled = await self.raw.settle(quiet, max_settle) and settled
        events, problems = self.collector.take()
        raw: dict[str, Any] = {}
        if self.raw is not None:
            raw_events, raw_problems = self.raw.take()
            raw["raw_events"] = raw_events
            problems += raw_problems
        if not settled:
            problems.append(f"events kept arriving for {max_settle} s after {after}")
        return events, raw, problems


async def main() -> None:
    loop = asyncio.get_running_loop()
    mocker = Mocker()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.buffer.readline)
        if not line:
            break
        try:
            msg = json.loads(line)
        except ValueError as e:
            reply({"error": f"not a JSON line: {e}", "stage": "protocol"})
            continue
        op = msg.get("op")
        if op == "exit":
            break
        if op == "start":
            try:
                reply(await mocker.start(msg))
            except BaseException as e:
                reply({"error": f"{type(e).__name__}: {e}", "stage": "start"})
                _exit(3)
        elif op == "run":
            if mocker.client is None:
                reply({"error": "run before start", "stage": "protocol"})
                continue
            try:
                await mocker.run(msg)
            except Exception as e:
                reply({"error": f"{type(e).__name__}: {e}", "stage": "request"})
        else:
            reply({"error": f"unknown op {op!r}", "stage": "protocol"})
    _exit(0)


def _free_port() -> int:
    """A loopback TCP port nothing listens on now (the raw publisher binds it;
    in the adapter's own network namespace every port is free anyway)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _exit(status: int) -> None:
    """Leave at once: the runtime's graceful shutdown is slow (and can hang on
    a stalled request); the parent kills the process group anyway."""
    with contextlib.suppress(Exception):
        _OUT.flush()
    os._exit(status)


if __name__ == "__main__":
    # stdout is the protocol channel: anything else printing there would corrupt it
    sys.stdout = sys.stderr
    asyncio.run(main())
