"""A deliberately broken request-level child (protocol version 2, or 6 when offered), for tests/test_protocol_v2.py.

``python broken_engine.py MODE``: accepts a request-level ``hello`` and
answers ``add_request`` like a working engine (stdlib only, so it starts
fast); its first ``step`` misbehaves the way MODE names. The outcomes it
sends when it behaves are valid version-2 messages but not a real engine:
these children test the transport and the request-level driver, not a pool.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from broken_io import OUT, read, send, sleep_forever

MODE = sys.argv[1]
COUNTERS = {"active_blocks": 0, "active_refs": 0, "inactive_blocks": 0, "free_blocks": 4}


def outcome(rid: int, **kw: object) -> dict:
    body = {"finished": [], "running": 0, "waiting": 0, "counters": COUNTERS, "events": []}
    body.update(kw)
    return {"id": rid, "outcome": body}


def main() -> None:
    hello = read()
    if MODE == "v1_only":  # a version-1 child: it cannot run a request-level session
        msg = f"speaks versions [1], offered {hello['versions']}"
        send({"type": "refused", "error": {"code": "unsupported_version", "message": msg}})
        sys.exit(1)
    version = 6 if 6 in hello["versions"] else 2  # 6 when offered (the manifest declares protocol = 6)
    version = 1 if MODE == "picks_v1" else version  # picks_v1 answers a request-level hello with version 1
    caps = {"block_level": False, "request_level": True, "tiers": ["device", "host_pinned"]}
    send(
        {
            "type": "ready",
            "name": f"broken-engine:{MODE}",
            "protocol": version,
            **({"family": hello["family"]} if version == 6 else {}),
            "profile": hello["config"]["profile"],
            "capabilities": caps,
        }
    )
    if MODE == "hang":
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        sys.stderr.write(f"grandchild {proc.pid}\n")
        sys.stderr.flush()
    added: list[str] = []
    steps = 0
    while True:
        req = read()
        if req.get("type") == "bye":
            sys.exit(0)
        rid, op = req["id"], req["op"]
        if op["op"] == "add_request":
            added.append(op["request_id"])
            send(outcome(rid, waiting=len(added)))
            continue
        steps += 1
        if MODE == "crash":
            sys.stderr.write("fatal: block table corrupted in step 1\n")
            sys.stderr.flush()
            os._exit(3)
        if MODE == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if MODE == "hang":
            sleep_forever()
        if MODE == "garbage":
            OUT.write(b"scheduler: step 1 admitted 1 request {not json\n")
            OUT.flush()
            continue
        if MODE == "wrong_id":
            send(outcome(rid + 1))
            continue
        if MODE == "schema":
            send(outcome(rid, running=-1))
            continue
        if MODE == "step_outcome":  # a block-level StepOutcome where an EngineOutcome is due
            send({"id": rid, "outcome": {"result": {"status": "ok"}, "counters": COUNTERS, "events": []}})
            continue
        if MODE == "oversized":
            OUT.write(b'{"id": %d, "outcome": {"finished": [], "padding": "' % rid)
            for _ in range(10_000):  # 640 MB if anyone read it all
                OUT.write(b"x" * 65536)
            sleep_forever()
        if MODE == "protocol_error":
            send({"id": rid, "error": {"code": "unsupported_op", "message": "step is not implemented"}})
            continue
        if MODE == "unknown_finish":
            fin = {"request_id": "someone-else", "finish_reason": "length", "cached_tokens": 0, "output_tokens": 1}
            send(outcome(rid, finished=[fin]))
            continue
        if MODE == "stall":  # runs forever, never finishes anything
            send(outcome(rid, running=len(added)))
            continue
        if MODE == "idle":  # forgets the request: nothing running, nothing finished
            send(outcome(rid))
            continue
        if MODE == "finish_twice":
            fin = {"request_id": added[0], "finish_reason": "length", "cached_tokens": 0, "output_tokens": 1}
            send(outcome(rid, finished=[fin, fin]))
            continue
        sys.stderr.write(f"unknown mode {MODE}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
