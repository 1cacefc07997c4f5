"""A deliberately broken JSON-lines adapter, for the transport's robustness tests.

``python broken_server.py MODE``: speaks just enough of spec/PROTOCOL.md
(stdlib only, so it starts fast) to reach the misbehaviour MODE names, then
misbehaves. Each folder beside this file is a manifest that runs one MODE
with small timeouts. The outcomes it sends when it behaves are valid
protocol messages but not a real manager (every result is 0): these
adapters test the transport, not the model. It answers version 6 (naming the
hello's family) when offered it, else version 1; the manifests here do not
declare ``protocol = 6``, so they run version 1 unless a test says otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from broken_io import OUT, read, send, sleep_forever

MODE = sys.argv[1]
OK_OUTCOME = {
    "result": {"value": 0, "status": "ok"},
    "counters": {"active_blocks": 0, "active_refs": 0, "inactive_blocks": 0, "free_blocks": 4},
    "events": [],
}


def spawn_grandchild() -> None:
    """A process of our own (same process group): cleanup must reach it too."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    sys.stderr.write(f"grandchild {proc.pid}\n")
    sys.stderr.flush()


def main() -> None:
    if MODE == "exit_at_start":
        sys.stderr.write("Traceback (most recent call last):\nImportError: no module named 'fastkv'\n")
        sys.exit(1)
    hello = read()
    if MODE == "slow_handshake":
        time.sleep(30)
    if MODE == "garbage_handshake":
        OUT.write(b"Loading model weights... done\n")
        OUT.flush()
        sleep_forever()
    if MODE == "refuse":
        send({"type": "refused", "error": {"code": "unsupported_config", "message": "capacity above 1024"}})
        sys.exit(1)
    if MODE == "bad_version":
        send({"type": "ready", "name": "broken", "protocol": 99, "profile": "kvbm", "capabilities": {}})
        sleep_forever()
    if MODE == "wrong_profile":
        send({"type": "ready", "name": "broken", "protocol": 1, "profile": "legacy", "capabilities": {}})
        sleep_forever()
    if MODE == "fewer_capabilities":
        caps = {"promote": False, "policies": []}
        send({"type": "ready", "name": "broken", "protocol": 1, "profile": "kvbm", "capabilities": caps})
        sleep_forever()
    if MODE == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # version 6 when offered (a manifest declaring protocol = 6), naming the hello's family; else 1
    v6 = 6 in hello["versions"]
    send(
        {
            "type": "ready",
            "name": f"broken:{MODE}",
            "protocol": 6 if v6 else 1,
            **({"family": hello["family"]} if v6 else {}),
            "profile": hello["config"]["profile"],
            "capabilities": {},
            # claims reuse, so that the pool tests can show a failed child is not reused
            "multi_session": MODE == "garbage",
        }
    )
    if MODE in ("hang", "ignore_term"):
        spawn_grandchild()
    n = 0
    while True:
        req = read()
        if req.get("type") == "bye":
            if MODE == "ignore_term":
                sleep_forever()  # ignores bye, EOF and SIGTERM: only SIGKILL ends it
            sys.exit(0)
        n += 1
        rid = req["id"]
        if MODE == "crash_mid_session" and n == 3:
            sys.stderr.write("fatal: slot table corrupted at request 3\n")
            sys.stderr.flush()
            os._exit(3)
        if MODE == "segfault" and n == 2:
            os.kill(os.getpid(), signal.SIGSEGV)
        if MODE in ("hang", "ignore_term") and n == 2:
            sleep_forever()
        if MODE == "hang_first_op":
            sleep_forever()
        if MODE == "garbage" and n == 2:
            OUT.write(b"DEBUG: evicting block 42 {not json\n")
            OUT.flush()
            continue
        if MODE == "wrong_id" and n == 2:
            rid += 1
        if MODE == "schema" and n == 2:
            send(
                {
                    "id": rid,
                    "outcome": dict(
                        OK_OUTCOME,
                        counters={"active_blocks": -1, "active_refs": 0, "inactive_blocks": 0, "free_blocks": 4},
                    ),
                }
            )
            continue
        if MODE == "result_and_error" and n == 2:
            send({"id": rid, "outcome": dict(OK_OUTCOME, error={"rule": "USE-VALIDATE", "message": "x"})})
            continue
        if MODE == "oversized" and n == 2:
            chunk = b"x" * 65536
            OUT.write(b'{"id": %d, "outcome": {"padding": "' % rid)
            for _ in range(10_000):  # 640 MB if anyone read it all
                OUT.write(chunk)
            sleep_forever()
        if MODE == "stderr_flood" and n == 2:
            line = b"warning: something is not quite right in the allocator\n"
            for _ in range(20_000):  # ~1.1 MB, far over the parent's stderr tail
                sys.stderr.buffer.write(line)
            sys.stderr.buffer.write(b"FINAL WORDS: out of slots\n")
            sys.stderr.flush()
            os._exit(2)
        if MODE == "protocol_error" and n == 2:
            send({"id": rid, "error": {"code": "unsupported_op", "message": "promote is not implemented"}})
            continue
        if MODE == "close_stdout" and n == 2:
            OUT.close()
            os.close(1)
            sleep_forever()
        if MODE == "two_lines" and n == 1:
            send({"id": rid, "outcome": OK_OUTCOME})
        send({"id": rid, "outcome": OK_OUTCOME})


if __name__ == "__main__":
    main()
