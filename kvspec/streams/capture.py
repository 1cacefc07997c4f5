"""The ZMQ capture file: what ``kvspec watch --record`` writes and
``kvspec check-log`` reads.

One JSON object per received message, one per line, the frames exactly as
they arrived, base64-encoded:

    {"msg_idx": 0, "recv_time_s": 7.427311, "n_parts": 3,
     "parts_b64": ["a3Y=", "AAAAAAAAAAA=", "k8tB2s..."]}

``msg_idx`` counts messages from 0 in arrival order, ``recv_time_s`` is the
receive time in seconds (monotonic, from the start of the recording),
``n_parts`` the number of frames. A message fetched from the publisher's
replay socket carries ``"replayed": true``. This is the layout of the vLLM
0.32 recording the project keeps as a fixture, so captures made elsewhere the
same way are read as they are. JSON lines, not a binary format: a capture
can be inspected, cut and concatenated with text tools, and a truncated one
loses at most its last line (which ``check-log`` reports).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from typing import IO, Annotated

import msgspec

from kvspec.spec.errors import WireError

NonNeg = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class CaptureLine(msgspec.Struct, gc=False):
    parts_b64: list[str]
    msg_idx: NonNeg | None = None
    recv_time_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    n_parts: NonNeg | None = None
    replayed: bool = False


CAPTURE_DECODER = msgspec.json.Decoder(CaptureLine)
_a2b = binascii.a2b_base64


def frames_of(line: CaptureLine) -> list[bytes]:
    """The frames of one captured message; raises WireError."""
    if line.n_parts is not None and line.n_parts != len(line.parts_b64):
        raise WireError(f"n_parts is {line.n_parts} but {len(line.parts_b64)} frames are recorded")
    try:  # base64.b64decode(p, validate=True) without its Python wrapper
        return [_a2b(p, strict_mode=True) for p in line.parts_b64]
    except (binascii.Error, ValueError) as e:
        raise WireError(f"a frame is not valid base64 ({e})") from None


class CaptureWriter:
    """Appends received messages to a capture file, one line each."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.count = 0
        self.t0 = time.monotonic()

    def write(self, frames: list[bytes], *, replayed: bool = False) -> None:
        rec: dict[str, object] = {
            "msg_idx": self.count,
            "recv_time_s": round(time.monotonic() - self.t0, 6),
            "n_parts": len(frames),
            "parts_b64": [base64.b64encode(f).decode("ascii") for f in frames],
        }
        if replayed:
            rec["replayed"] = True
        self.out.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.count += 1

    def flush(self) -> None:
        self.out.flush()
