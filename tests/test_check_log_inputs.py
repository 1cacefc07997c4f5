"""``kvspec check-log`` inputs operators use: standard input, gzip, several
files in one view, a growing file (``--follow``), and text encodings (a UTF-8
byte-order mark is accepted; UTF-16, invalid UTF-8 inside a string are clean
errors, never "internal error")."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvspec.cli import main

DATA = Path(__file__).parent / "data"
DYNAMO = DATA / "dynamo-1.6.1-mocker-device.router.jsonl"
HOST = DATA / "dynamo-1.6.1-mocker-host.router.jsonl"
VLLM = DATA / "vllm-0.32-cpu-engine.zmq.jsonl"
CMD = [sys.executable, "-m", "kvspec.cli", "check-log"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["check-log", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def with_defect(lines: list[bytes]) -> list[bytes]:
    """The Dynamo recording with line 5's event id skipped ahead (EVENT-ID)."""
    out = list(lines)
    obj = json.loads(out[4])
    obj["event"]["event_id"] += 7
    out[4] = json.dumps(obj).encode()
    return out


def dynamo_bytes() -> list[bytes]:
    return DYNAMO.read_bytes().splitlines()


# ------------------------------------------------------------------ stdin, gzip


def test_standard_input_is_read_as_a_file_is() -> None:
    data = DYNAMO.read_bytes()
    r = subprocess.run([*CMD, "-"], input=data, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert b"checked 487 events" in r.stdout
    bad = b"\n".join(with_defect(dynamo_bytes())) + b"\n"
    r = subprocess.run([*CMD, "-"], input=bad, capture_output=True, timeout=60)
    assert r.returncode == 1 and b"<stdin>:5: EVENT-ID" in r.stdout, r.stdout + r.stderr


def test_gzip_is_recognised_by_its_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gz = tmp_path / "trace.log"  # no .gz name: the magic bytes decide
    gz.write_bytes(gzip.compress(b"\n".join(with_defect(dynamo_bytes())) + b"\n"))
    code, out, _ = run(capsys, str(gz))
    assert code == 1 and "checked 487 events" in out and f"{gz}:5: EVENT-ID" in out
    cap = tmp_path / "cap.gz"
    cap.write_bytes(gzip.compress(VLLM.read_bytes()))
    code, out, _ = run(capsys, str(cap))
    assert code == 0 and "checked 80 events" in out and "ZMQ capture" in out


def test_damaged_gzip_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = gzip.compress(DYNAMO.read_bytes())
    cut = tmp_path / "cut.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    code, _, err = run(capsys, str(cut))
    assert code == 2 and "gzip stream ends early" in err and "internal error" not in err
    bad = bytearray(whole)
    bad[len(bad) // 2] ^= 0xFF
    broken = tmp_path / "broken.gz"
    broken.write_bytes(bytes(bad))
    code, _, err = run(capsys, str(broken))
    assert code == 2 and "internal error" not in err and "Traceback" not in err


# ------------------------------------------------------------------ several inputs


def test_several_inputs_share_one_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(DYNAMO), str(HOST))
    assert "checked 492 events" in out and "from 2 worker(s)" in out
    # the host recording's known orphaning, and nothing from sharing the view
    assert code == 1 and "REMOVE-NO-ORPHAN         1" in out
    # a stream cut in two pieces reads as the whole one
    lines = dynamo_bytes()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(b"\n".join(lines[:200]) + b"\n")
    b.write_bytes(b"\n".join(lines[200:]) + b"\n")
    code, out, _ = run(capsys, str(a), str(b))
    assert code == 0 and "checked 487 events" in out
    # each piece alone is not clean: the second starts mid-stream
    assert run(capsys, str(b))[0] == 1


def test_feeds_without_worker_ids_are_one_worker_per_input(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(VLLM), str(VLLM), "--json", "-")
    assert code == 0 and "checked 160 events" in err  # the summary goes to stderr when the JSON takes stdout
    doc = json.loads(out)
    assert doc["counts"]["sources"] == 2 and doc["input"]["path"] == [str(VLLM), str(VLLM)]


def test_several_inputs_of_different_producers_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, str(DYNAMO), str(VLLM))
    assert code == 2 and "different producers" in err


def test_a_finding_names_its_input_among_several(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = with_defect(dynamo_bytes())
    bad.write_bytes(b"\n".join(lines) + b"\n")
    other = tmp_path / "other.jsonl"
    other.write_bytes(HOST.read_bytes())
    res = tmp_path / "r.json"
    code, out, _ = run(capsys, str(other), str(bad), "--json", str(res))
    assert code == 1 and f"{bad}:5: EVENT-ID" in out
    doc = json.loads(res.read_text())
    assert any(f["at"] == f"{bad} line 5" for f in doc["findings"])


# ------------------------------------------------------------------ follow


def _read_until(proc: subprocess.Popen[bytes], needle: bytes, deadline: float) -> bytes:
    assert proc.stdout is not None
    seen = b""
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            seen += chunk
            if needle in seen:
                return seen
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not printed in time; saw {seen[-500:]!r}")


def test_follow_checks_what_is_appended_until_idle(tmp_path: Path) -> None:
    lines = dynamo_bytes()
    log = tmp_path / "growing.jsonl"
    log.write_bytes(b"\n".join(lines[:100]) + b"\n")
    proc = subprocess.Popen([*CMD, str(log), "--follow", "--idle-timeout", "3"], stdout=subprocess.PIPE)
    try:
        _wait_read_to_end(proc, log, time.monotonic() + 30)
        with log.open("ab") as f:
            for i in range(100, len(lines), 50):
                piece = b"\n".join(lines[i : i + 50]) + b"\n"
                half = len(piece) // 2  # a line written in two parts: checked once it ends
                f.write(piece[:half])
                f.flush()
                time.sleep(0.2)
                f.write(piece[half:])
                f.flush()
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert b"checked 487 events" in out


def test_follow_reports_findings_as_they_come_and_stops_on_sigint(tmp_path: Path) -> None:
    lines = with_defect(dynamo_bytes())
    log = tmp_path / "growing.jsonl"
    log.write_bytes(b"\n".join(lines[:3]) + b"\n")
    proc = subprocess.Popen([*CMD, str(log), "-f"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_read_to_end(proc, log, time.monotonic() + 30)
        with log.open("ab") as f:
            f.write(b"\n".join(lines[3:10]) + b"\n" + lines[10][:20])  # an unfinished line at the end
        seen = _read_until(proc, b":5: EVENT-ID", time.monotonic() + 30)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert b"checked 10 events" in seen + out
    assert b"were not read: a line the writer had not ended" in err


def _wait_read_to_end(proc: subprocess.Popen[bytes], path: Path, deadline: float) -> None:
    """Until the process has the file open and has read it to its end (Linux /proc)."""
    size = path.stat().st_size
    while time.monotonic() < deadline:
        fds = Path(f"/proc/{proc.pid}/fd")
        for fd in fds.iterdir() if fds.exists() else []:
            try:
                if os.readlink(fd) != str(path):
                    continue
                pos = int(Path(f"/proc/{proc.pid}/fdinfo/{fd.name}").read_text().split()[1])
            except OSError:
                continue
            if pos >= size:
                return
        time.sleep(0.05)
    raise AssertionError("the follower never read the file to its end")


def test_follow_of_a_truncated_file_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "growing.jsonl"
    log.write_bytes(DYNAMO.read_bytes())
    proc = subprocess.Popen(
        [*CMD, str(log), "-f", "--idle-timeout", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        _wait_read_to_end(proc, log, time.monotonic() + 30)
        log.write_bytes(b"")
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2 and b"shrank" in err, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-", "-f"], "standard input is read until it closes"),
        ([str(DYNAMO), "--idle-timeout", "2"], "--idle-timeout needs --follow"),
        (["-", "-"], "read once only"),
    ],
)
def test_follow_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


def test_follow_refuses_gzip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gz = tmp_path / "t.gz"
    gz.write_bytes(gzip.compress(DYNAMO.read_bytes()))
    code, _, err = run(capsys, str(gz), "--follow")
    assert code == 2 and "not a gzip stream" in err


# ------------------------------------------------------------------ encodings


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for src in (DYNAMO, VLLM):
        log = tmp_path / src.name
        log.write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
        code, out, err = run(capsys, str(log))
        assert code == 0, out + err


def test_utf16_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "u16.jsonl"
    log.write_bytes(DYNAMO.read_text().encode("utf-16"))
    code, _, err = run(capsys, str(log))
    assert code == 2 and "UTF-16" in err


@pytest.mark.parametrize("line", [1, 3])
@pytest.mark.parametrize("raw", [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xe9t\xe9"])
def test_invalid_utf8_in_a_string_is_a_clean_error(
    line: int, raw: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = dynamo_bytes()[:5]
    lines[line - 1] = lines[line - 1].replace(b'"residency_domain": "worker"', b'"residency_domain": "w' + raw + b'"')
    lines[line - 1] = lines[line - 1].replace(b'"residency_domain":"worker"', b'"residency_domain":"w' + raw + b'"')
    assert raw in lines[line - 1]
    log = tmp_path / "bad.jsonl"
    log.write_bytes(b"\n".join(lines) + b"\n")
    code, _, err = run(capsys, str(log))
    assert code == 2, err
    assert f"{log}:{line}: not valid UTF-8" in err
    assert "internal error" not in err


def test_invalid_utf8_in_an_unread_key_of_a_capture_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = VLLM.read_bytes().splitlines()
    lines[2] = lines[2].replace(b'{"msg_idx"', b'{"x\xc3\x28": 1, "msg_idx"')
    log = tmp_path / "bad.zmq.jsonl"
    log.write_bytes(b"\n".join(lines) + b"\n")
    code, _, err = run(capsys, str(log))
    assert code == 2 and f"{log}:3: not valid UTF-8" in err


def test_help_names_the_inputs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["check-log", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for word in ("standard input", "gzip", "--follow", "--idle-timeout", "Several inputs", "zcat trace.gz"):
        assert word in text, word
