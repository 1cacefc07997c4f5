"""The JSON-lines transport against deliberately broken adapters.

Each adapter under tests/broken_adapters/ runs ``broken_server.py MODE`` with
1 s timeouts. Every case must end in an ``AdapterError`` whose message names
what went wrong, within a bounded time, with no process of the adapter's
group left alive, and with the implementation refusing further calls.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvspec.conformance.run.manifest import load_manifest
from kvspec.conformance.transport.jsonl import AdapterProtocolError, JsonlImplementation
from kvspec.conformance.transport.process import group_members
from kvspec.spec.config import ManagerConfig
from kvspec.spec.errors import AdapterError
from kvspec.spec.wire import FullBlock, Plh, Use

pytestmark = pytest.mark.timeout(60)

BROKEN = Path(__file__).parent / "broken_adapters"
CONFIG = ManagerConfig(capacity=4)
#: upper bound for "within the timeout": the 1 s call timeout plus process
#: start-up, kill and reaping on a loaded 2-core CI machine
BOUND_S = 8.0


def use(i: int) -> Use:
    return Use(blocks=[FullBlock(full=i)], plhs=[Plh(hash=i)])


def assert_group_gone(pgid: int, timeout: float = 3.0) -> None:
    """No live process in the group (orphaned grandchildren are reaped by init asynchronously)."""
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert group_members(pgid) == [], f"processes left in group {pgid}: {group_members(pgid)}"


def open_broken(mode: str) -> JsonlImplementation:
    d = BROKEN / mode
    return JsonlImplementation(load_manifest(d), d, CONFIG)


def run_until_error(mode: str, max_steps: int = 5) -> tuple[JsonlImplementation, AdapterError, float]:
    impl = open_broken(mode)
    start = time.monotonic()
    try:
        for i in range(1, max_steps + 1):
            impl.step(use(i))
    except AdapterError as e:
        return impl, e, time.monotonic() - start
    finally:
        pass
    impl.close()
    raise AssertionError(f"{mode}: no AdapterError after {max_steps} steps")


def handshake_error(mode: str) -> tuple[AdapterError, float]:
    start = time.monotonic()
    with pytest.raises(AdapterError) as info:
        open_broken(mode)
    return info.value, time.monotonic() - start


# ------------------------------------------------------------------ during a session


@pytest.mark.parametrize(
    ("mode", "pattern"),
    [
        ("crash_mid_session", r"exited to request 3 \(use\) \(exit status 3\)"),
        ("segfault", r"exited to request 2 \(use\) \(killed by SIGSEGV\)"),
        ("hang", r"no reply to request 2 \(use\) within 1 s: the adapter hangs; its process group was killed"),
        ("garbage", r"reply to request 2 \(use\) is not valid JSON .*'DEBUG: evicting block 42 \{not json'"),
        ("wrong_id", r"reply to request 2 \(use\) carries id 3, expected 2"),
        (
            "schema",
            r"OutcomeReply to request 2 \(use\) does not match the protocol schema: "
            r"outcome\.counters\.active_blocks: Input should be greater than or equal to 0",
        ),
        (
            "result_and_error",
            r"does not match the protocol schema: outcome: Value error, "
            r"a step outcome carries exactly one of result and error",
        ),
        (
            "oversized",
            r"reply to request 2 \(use\) is larger than max_reply_bytes=65536 \(\d+ bytes read "
            r"without an end of line\), starting '\{\"id\": 2",
        ),
        ("stderr_flood", r"exited to request 2 \(use\) \(exit status 2\)"),
        ("protocol_error", r"protocol error to request 2 \(use\): unsupported_op: promote is not implemented"),
        ("close_stdout", r"closed its stdout to request 2 \(use\) but did not exit"),
        ("ignore_term", r"no reply to request 2 \(use\) within 1 s"),
        ("two_lines", r"(unsolicited output before request 2|carries id 1, expected 2)"),
    ],
)
def test_misbehaviour_is_a_clear_adapter_error(mode: str, pattern: str) -> None:
    impl, err, elapsed = run_until_error(mode)
    message = str(err)
    assert re.search(pattern, message), message
    assert f"adapter 'broken_{mode}'" in message
    assert elapsed < BOUND_S, f"{mode}: took {elapsed:.1f} s"
    assert impl.dead is not None
    assert_group_gone(impl.pgid)
    # dead: the next call fails at once, without touching a process
    with pytest.raises(AdapterError, match="not usable after an earlier failure"):
        impl.step(use(99))
    impl.close()
    impl.close()  # idempotent


def test_crash_reports_exit_status_and_stderr_tail() -> None:
    _, err, _ = run_until_error("crash_mid_session")
    assert err.exit_status == 3
    assert "fatal: slot table corrupted at request 3" in err.stderr_tail
    assert "--- stderr (tail) ---" in str(err)


def test_stderr_flood_keeps_a_bounded_tail_with_the_last_words() -> None:
    _, err, _ = run_until_error("stderr_flood")
    assert err.exit_status == 2
    assert err.stderr_tail.rstrip().endswith("FINAL WORDS: out of slots")
    assert "earlier bytes of stderr dropped" in err.stderr_tail
    assert len(err.stderr_tail) < 20_000


def test_hang_kills_grandchildren_too() -> None:
    impl, err, _ = run_until_error("hang")
    found = re.search(r"grandchild (\d+)", err.stderr_tail)
    assert found, err.stderr_tail
    grandchild = int(found.group(1))
    assert_group_gone(impl.pgid)
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]


def test_oversized_reply_is_not_read_to_the_end() -> None:
    """The child offers 640 MB; the parent stops after the limit plus one read chunk."""
    _, err, _ = run_until_error("oversized")
    size = int(re.search(r"\((\d+) bytes read", str(err)).group(1))  # type: ignore[union-attr]
    assert 65536 < size <= 65536 + 64 * 1024 + 64 * 1024


def test_protocol_error_reply_is_typed() -> None:
    _, err, _ = run_until_error("protocol_error")
    assert isinstance(err, AdapterProtocolError)
    assert err.code == "unsupported_op"


# ------------------------------------------------------------------ during the handshake


@pytest.mark.parametrize(
    ("mode", "pattern"),
    [
        ("exit_at_start", r"exited to hello \(the handshake\) \(exit status 1\)"),
        ("slow_handshake", r"no reply to hello \(the handshake\) within 1 s"),
        ("garbage_handshake", r"reply to hello is not valid JSON .*'Loading model weights\.\.\. done'"),
        ("refuse", r"refused the handshake \(unsupported_config\): capacity above 1024"),
        ("bad_version", r"chose protocol version 99, which the parent did not offer \(offered \[1, 2\]\)"),
        ("wrong_profile", r"runs profile 'legacy' but was configured with 'kvbm'"),
        (
            "fewer_capabilities",
            r"manifest\.toml declares capabilities the adapter's handshake does not: "
            r"promote, policy:lru$",
        ),
        ("not_found", r"cannot start \['.*no-such-adapter-binary'\]"),
    ],
)
def test_handshake_failure_is_a_clear_adapter_error(mode: str, pattern: str) -> None:
    before = _my_children()
    err, elapsed = handshake_error(mode)
    assert re.search(pattern, str(err)), str(err)
    assert f"adapter 'broken_{mode}'" in str(err)
    assert elapsed < BOUND_S
    time.sleep(0.05)
    assert _my_children() - before == set(), "a child of this test process survived a failed handshake"


def test_exit_at_start_shows_its_stderr() -> None:
    err, _ = handshake_error("exit_at_start")
    assert "ImportError: no module named 'fastkv'" in err.stderr_tail


def _my_children() -> set[int]:
    """Live direct children of this process (from /proc)."""
    me = os.getpid()
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                rest = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(rest[1]) == me and rest[0] != "Z":
                out.add(int(entry.name))
    return out


# ------------------------------------------------------------------ close and cleanup


def test_close_escalates_to_sigkill_for_a_child_that_ignores_bye_and_sigterm() -> None:
    impl = open_broken("ignore_term")
    impl.step(use(1))
    pgid = impl.pgid
    assert group_members(pgid), "the adapter and its grandchild should be running"
    impl.close()
    assert impl.exit_status == -signal.SIGKILL
    assert_group_gone(pgid)


def test_close_after_bye_is_a_clean_exit() -> None:
    impl = open_broken("two_lines")  # behaves until it gets a second request
    pgid = impl.pgid
    impl.close()
    assert impl.exit_status == 0
    assert_group_gone(pgid)
    with pytest.raises(AdapterError, match="is closed"):
        impl.step(use(1))


def test_garbage_collection_kills_an_unclosed_adapter() -> None:
    impl = open_broken("hang")
    pgid = impl.pgid
    del impl
    import gc

    gc.collect()
    assert_group_gone(pgid)


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import signal
    import sys
    from pathlib import Path
    from kvspec.conformance.run.manifest import load_manifest, resolve_adapter_dir
    from kvspec.conformance.transport.jsonl import JsonlImplementation, reuse_children
    from kvspec.spec.config import ManagerConfig
    from kvspec.spec.wire import FullBlock, Plh, Use

    # Ctrl-C raises KeyboardInterrupt even when the test runs in a background
    # job, which inherits SIGINT ignored (Python then installs no handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    pgids = []
    if sys.argv[2] == "pooled":
        # entered, never left: only the exit-time finalizers can end the idle child
        context = reuse_children()
        context.__enter__()
        ref = resolve_adapter_dir("adapters/reference_jsonl")
        idle = JsonlImplementation(load_manifest(ref), ref, ManagerConfig(capacity=4))
        idle.close()
        pgids.append(idle.pgid)
    d = Path(sys.argv[1])
    manifest = load_manifest(d).model_copy(update={"start": load_manifest(d).start.model_copy(
        update={"timeout_s": 120.0})})
    impl = JsonlImplementation(manifest, d, ManagerConfig(capacity=4))
    impl.step(Use(blocks=[FullBlock(full=1)], plhs=[Plh(hash=1)]))
    pgids.append(impl.pgid)
    print(*pgids, flush=True)
    impl.step(Use(blocks=[FullBlock(full=2)], plhs=[Plh(hash=2)]))  # hangs for 120 s
    """
)


@pytest.mark.parametrize(("mode", "pooled"), [("hang", False), ("ignore_term", False), ("hang", True)])
def test_ctrl_c_in_the_parent_leaves_no_process_behind(mode: str, pooled: bool, tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(CTRL_C_SCRIPT)
    parent = subprocess.Popen(
        [sys.executable, str(script), str(BROKEN / mode), "pooled" if pooled else "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    pgids: list[int] = []
    try:
        assert parent.stdout is not None
        pgids += [int(x) for x in parent.stdout.readline().split()]
        assert len(pgids) == (2 if pooled else 1), pgids
        assert len(group_members(pgids[-1])) == 2, "adapter and grandchild should be running"
        if pooled:
            assert len(group_members(pgids[0])) == 1, "the idle pooled child should be running"
        time.sleep(0.2)  # let the parent block in the hanging step
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=15)
    finally:
        if parent.poll() is None:  # the test failed early: clean up what the parent cannot
            parent.kill()
            parent.wait()
            for pgid in pgids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
    assert b"KeyboardInterrupt" in err, err.decode(errors="replace")
    for pgid in pgids:
        assert_group_gone(pgid)
