"""The rust_mocker adapter (adapters/rust_mocker): decoding the event plane,
start-up and shutdown that leave no process, thread or socket behind, and
clear errors for a missing wheel, an engine that does not start, a child
that talks garbage or hangs, and a request the pool cannot hold.

Tests that need the ai-dynamo-runtime wheel are skipped, saying so, when it
is not installed (``pip install 'kvspec[dynamo]'``)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvspec.adapters.rust_mocker import adapter as rm
from kvspec.conformance.requests.api import ImplementationUnavailableError
from kvspec.conformance.requests.workloads import setup_of
from kvspec.conformance.run.manifest import load_manifest
from kvspec.conformance.transport.process import group_members
from kvspec.reference.requests import RequestSpec
from kvspec.spec.errors import AdapterError, ConfigError, WireError
from kvspec.spec.hashing import block_hashes

ADAPTER_DIR = Path(rm.__file__).parent
MANIFEST = load_manifest(ADAPTER_DIR)
needs_wheel = pytest.mark.skipif(
    rm.wheel_version() is None, reason="the ai-dynamo-runtime wheel is not installed (pip install 'kvspec[dynamo]')"
)

# Two events as the 1.6.1 event plane publishes them (from a probe of the wheel).
DEVICE_STORED = {
    "worker_id": 16611442837984828375,
    "storage_tier": "device",
    "residency_domain": "worker",
    "dp_rank": 0,
    "event": {
        "event_id": 1,
        "dp_rank": 0,
        "data": {
            "stored": {
                "parent_hash": None,
                "start_position": None,
                "blocks": [
                    {"block_hash": 6320977984009303047, "tokens_hash": 6320977984009303047, "mm_extra_info": None},
                    {"block_hash": 3184517425968952090, "tokens_hash": 16988655349664461655, "mm_extra_info": None},
                ],
            }
        },
    },
}
HOST_REMOVED = {
    "worker_id": 16611442837984828375,
    "storage_tier": "host_pinned",
    "residency_domain": "worker",
    "event": {"event_id": 7, "dp_rank": 0, "data": {"removed": {"block_hashes": [3184517425968952090]}}},
}


# ----------------------------------------------------------------- decoding


def test_decode_event_reads_the_event_plane_form() -> None:
    worker, ev = rm.decode_event(DEVICE_STORED)
    assert worker == 16611442837984828375
    assert ev.event_id == 1 and ev.storage_tier == "device" and ev.kind == "stored"
    assert ev.hashes() == [6320977984009303047, 3184517425968952090]
    assert ev.data.stored.blocks[1].tokens_hash == 16988655349664461655  # type: ignore[union-attr]
    _, ev = rm.decode_event(HOST_REMOVED)
    assert ev.storage_tier == "host_pinned" and ev.kind == "removed" and ev.hashes() == [3184517425968952090]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"worker_id": 1}, "an 'event' object"),
        ({**DEVICE_STORED, "dp_rank": 3}, "disagrees"),
        ({**DEVICE_STORED, "storage_tier": "gpu"}, "unknown storage_tier"),
        ({**HOST_REMOVED, "event": {"event_id": 1, "data": {"removed": {"block_hashes": [-1]}}}}, "block_hashes"),
    ],
)
def test_decode_event_refuses_what_it_cannot_read(raw: dict[str, object], message: str) -> None:
    with pytest.raises(WireError, match=message):
        rm.decode_event(raw)


def test_multimodal_info_is_refused_not_dropped() -> None:
    raw: dict[str, Any] = {**DEVICE_STORED, "event": {**DEVICE_STORED["event"]}}  # type: ignore[dict-item]
    raw["event"]["data"] = {
        "stored": {
            "parent_hash": None,
            "blocks": [{"block_hash": 1, "tokens_hash": 1, "mm_extra_info": {"mm_objects": []}}],
        }
    }
    with pytest.raises(WireError, match="multimodal"):
        rm.decode_event(raw)


# ------------------------------------------------------------ availability


def test_a_missing_wheel_is_unavailable_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rm, "wheel_version", lambda: None)
    with pytest.raises(ImplementationUnavailableError, match=r"pip install 'kvspec\[dynamo\]'"):
        rm.open_rust_mocker(setup_of(8, 4), MANIFEST, ADAPTER_DIR)


def _fake_child(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    monkeypatch.setattr(rm, "wheel_version", lambda: "1.6.1")
    monkeypatch.setattr(rm, "child_argv", lambda: [sys.executable, "-c", code])


def test_a_child_that_writes_garbage_is_an_adapter_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_child(
        monkeypatch,
        "import sys; sys.stdin.readline(); print('hello, not json', flush=True); import time; time.sleep(30)",
    )
    t0 = time.monotonic()
    with pytest.raises(AdapterError, match="not a JSON line"):
        rm.open_rust_mocker(setup_of(8, 4), MANIFEST, ADAPTER_DIR)
    assert time.monotonic() - t0 < 10


def test_a_child_that_never_answers_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_child(monkeypatch, "import time, sys; sys.stderr.write('stuck\\n'); sys.stderr.flush(); time.sleep(60)")
    manifest = MANIFEST.model_copy(update={"start": MANIFEST.start.model_copy(update={"startup_timeout_s": 1.0})})
    t0 = time.monotonic()
    with pytest.raises(AdapterError, match="did not answer start") as e:
        rm.open_rust_mocker(setup_of(8, 4), manifest, ADAPTER_DIR)
    assert time.monotonic() - t0 < 15
    assert "stuck" in str(e.value)  # the child's stderr tail is in the report


def test_a_child_that_dies_is_an_adapter_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_child(monkeypatch, "import sys; sys.stderr.write('boom\\n'); sys.exit(7)")
    with pytest.raises(AdapterError, match="exited") as e:
        rm.open_rust_mocker(setup_of(8, 4), MANIFEST, ADAPTER_DIR)
    assert "boom" in str(e.value) and "exit status 7" in str(e.value)


# ------------------------------------------------------------- real engine


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _socket_fds(pid: int | str = "self") -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


def _listeners(pid: int | str) -> list[tuple[str, int]]:
    """(local address, port) of every TCP socket listening in ``pid``'s network namespace."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A":
                addr, port = f[1].split(":")
                out.append((addr, int(port, 16)))
    return out


@needs_wheel
def test_start_run_and_close_leave_no_process_thread_or_socket() -> None:
    threads0, sockets0 = _threads(), _socket_fds()
    py_threads0 = {t.ident for t in threading.enumerate()}
    impl = rm.open_rust_mocker(setup_of(8, 4), MANIFEST, ADAPTER_DIR)
    child = impl.child  # held: close() itself must end it (not the garbage collector's finalizer)
    assert child is not None
    pid, pgid = child.pid, child.pgid
    try:
        assert group_members(pgid), "the mocker runs in its own process group"
        listeners = _listeners(pid)
        assert listeners, "the engine listens (request plane, event plane)"
        if rm.netns_works() and os.environ.get("KVSPEC_RUST_MOCKER_NETNS", "auto") != "0":
            assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
            interfaces = [ln.split(":")[0].strip() for ln in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]]
            assert interfaces == ["lo"], "a loopback-only namespace"
        else:  # no namespace: everything must at least be advertised on loopback
            assert any(addr in ("0100007F", "00000000000000000000000001000000") for addr, _ in listeners)
        out = impl.run_sequential([RequestSpec(prompt=list(range(1, 9)), max_tokens=2)])
        assert out[0].finish == "length" and out[0].events
    finally:
        impl.close()
    assert group_members(pgid) == [], "no process of the mocker's group survives close()"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    deadline = time.monotonic() + 5
    while _threads() > threads0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _threads() == threads0, "no thread left in this process"
    assert {t.ident for t in threading.enumerate()} == py_threads0
    assert _socket_fds() == sockets0, "no socket left open in this process"
    assert not Path(impl._tmp).exists(), "the runtime's file store is removed"
    assert child.closed


@needs_wheel
def test_a_real_run_reports_cached_tokens_and_prompt_hashes() -> None:
    prompt = list(range(1, 9))
    h = [s for s, _ in block_hashes(prompt, 4)]
    with rm.open_rust_mocker(setup_of(8, 4), MANIFEST, ADAPTER_DIR) as impl:
        out = impl.run_sequential(
            [RequestSpec(prompt=prompt, max_tokens=1)] * 2 + [RequestSpec(prompt=[*prompt, 9], max_tokens=1)]
        )
    assert [o.cached_tokens for o in out] == [0, 4, 8]  # whole blocks, at most num_tokens - 1
    assert [e.hashes() for e in out[0].events] == [h]
    ids = [e.event_id for o in out for e in o.events]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # contiguous (the first id is a declared deviation)


@needs_wheel
def test_a_request_the_pool_cannot_hold_is_refused_and_the_engine_stays_usable() -> None:
    with rm.open_rust_mocker(setup_of(4, 4), MANIFEST, ADAPTER_DIR) as impl:
        with pytest.raises(ConfigError, match="exceeds the pool"):
            impl.run_sequential([RequestSpec(prompt=list(range(1, 11)), max_tokens=8)])  # 17 tokens > 16
        t0 = time.monotonic()
        out = impl.run_sequential([RequestSpec(prompt=list(range(1, 11)), max_tokens=7)])  # exactly 16
        assert out[0].finish == "length" and time.monotonic() - t0 < 10


@needs_wheel
def test_an_engine_that_does_not_start_is_an_adapter_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(setup: object, backend: str = "vllm", token_ids: bool = False) -> dict[str, object]:
        return {"num_gpu_blocks": 8, "block_size": 4, "native_host_offload": {"num_host_blocks": 4}}

    monkeypatch.setattr(rm, "engine_config", broken)  # host tier without kv_cache_bytes_per_token
    t0 = time.monotonic()
    with pytest.raises(AdapterError, match="error during start") as e:
        rm.open_rust_mocker(setup_of(8, 4), MANIFEST, ADAPTER_DIR)
    assert "kv_cache_bytes_per_token" in str(e.value)
    assert time.monotonic() - t0 < 30


# ------------------------------------------------------------- late events

# A fake worker: starts, then answers a sequential run whose request 1 (or
# the end of the run) reports events that came after its quiet window closed,
# for the first LATE attempts (counted in a file), and logs each run's window.
_LATE_CHILD = """
import json, os, sys
state = sys.argv[1]
n = int(open(state).read()) if os.path.exists(state) else 0
open(state, "w").write(str(n + 1))
late_runs, where = int(sys.argv[2]), sys.argv[3]
def reply(o):
    print(json.dumps(o), flush=True)
for line in sys.stdin:
    msg = json.loads(line)
    if msg["op"] == "start":
        reply({"ok": "started", "startup_s": 0.0})
    elif msg["op"] == "run":
        open(state + ".windows", "a").write(f"{msg['quiesce_ms']}\\n")
        late = ["2 event plane events arrived after request 0's events were taken"] if n < late_runs else []
        for i, _ in enumerate(msg["requests"]):
            reply({"ok": "request", "index": i, "cached_tokens": 0, "finish": "length", "output_tokens": 1,
                   "events": [], "problems": [], "late": late if (i == 1 and where == "request") else []})
        reply({"ok": "done", "late": late if where == "done" else []})
"""


def _late_child(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, late_runs: int, where: str = "request") -> Path:
    state = tmp_path / "starts"
    monkeypatch.setattr(rm, "wheel_version", lambda: "1.6.1")
    argv = [sys.executable, "-c", _LATE_CHILD, str(state), str(late_runs), where]
    monkeypatch.setattr(rm, "child_argv", lambda: argv)
    return state


_TWO = [RequestSpec(prompt=[1, 2, 3, 4], max_tokens=1), RequestSpec(prompt=[5, 6, 7, 8], max_tokens=1)]


@pytest.mark.parametrize("where", ["request", "done"])
def test_late_events_rerun_the_workload_on_a_fresh_engine_with_a_longer_window(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str
) -> None:
    state = _late_child(monkeypatch, tmp_path, late_runs=1, where=where)
    impl = rm.open_rust_mocker(setup_of(8, 4), MANIFEST, ADAPTER_DIR)
    try:
        outs = impl.run_sequential(_TWO)
    finally:
        impl.close()
    assert [o.finish for o in outs] == ["length", "length"]
    assert state.read_text() == "2"  # a second engine ran the workload
    windows = [float(w) for w in (tmp_path / "starts.windows").read_text().split()]
    assert windows == [rm.QUIESCE_MS, rm.QUIESCE_MS * rm.LATE_FACTOR]
    assert len(impl.retried) == 1 and "arrived after" in impl.retried[0]


def test_events_late_every_time_are_a_transport_problem_not_a_finding(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    state = _late_child(monkeypatch, tmp_path, late_runs=99)
    impl = rm.open_rust_mocker(setup_of(8, 4), MANIFEST, ADAPTER_DIR)
    try:
        with pytest.raises(AdapterError, match="transport problem of the adapter") as e:
            impl.run_sequential(_TWO)
    finally:
        impl.close()
    assert "not a finding about the mocker" in str(e.value)
    assert state.read_text() == str(1 + rm.LATE_RETRIES)


def test_a_socket_nobody_read_is_not_quiet() -> None:
    """The quiet window is confirmed by the subscriber thread's own empty
    poll, not by the clock: with the thread not running (as when it is off
    the CPU on a loaded machine) the window never closes."""
    pytest.importorskip("zmq")
    pytest.importorskip("msgpack")
    import asyncio

    from kvspec.adapters.rust_mocker.worker import EventCollector

    c = EventCollector("tcp://127.0.0.1:9")
    try:
        assert asyncio.run(c.settle(0.01, 0.1)) is False
        c.start()
        assert asyncio.run(c.settle(0.01, 5.0)) is True
    finally:
        c._stop.set()
        c._thread.join(timeout=2)
        c.sub.close(0)
        c.monitor.close(0)
        c.ctx.term()
