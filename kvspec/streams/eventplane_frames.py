"""The framing of Dynamo's event plane messages, apart from their content.

``formats`` needs to recognise an event plane capture line before anything is
decoded, and ``eventplane`` applies what the frames carry through ``formats``;
the framing lives here so that neither imports the other (the frames are
described in ``eventplane``'s docstring).
"""

from __future__ import annotations

from kvspec.spec.errors import WireError

FRAME_VERSION = 1
FRAME_HEADER = 5

__all__ = ["FRAME_HEADER", "FRAME_VERSION", "looks_like_event_plane", "split"]


def looks_like_event_plane(frames: list[bytes]) -> bool:
    """Whether a message has the event plane's four frames (not vLLM's three)."""
    return (
        len(frames) == 4
        and len(frames[1]) == 8
        and len(frames[2]) == 8
        and len(frames[3]) >= FRAME_HEADER
        and frames[3][0] == FRAME_VERSION
    )


def split(frames: list[bytes]) -> tuple[bytes, int, int, bytes]:
    """(topic, publisher id, sequence, envelope bytes); raises WireError."""
    if len(frames) != 4:
        raise WireError(
            f"an event plane message has 4 frames (topic, publisher id, sequence, envelope), got {len(frames)}"
        )
    topic, pid_b, seq_b, frame = frames
    if len(pid_b) != 8 or len(seq_b) != 8:
        raise WireError(f"the publisher id and sequence frames are {len(pid_b)} and {len(seq_b)} bytes, not 8")
    if len(frame) < FRAME_HEADER:
        raise WireError(f"the envelope frame is {len(frame)} bytes, shorter than its {FRAME_HEADER}-byte header")
    if frame[0] != FRAME_VERSION:
        raise WireError(f"envelope frame version {frame[0]}, not {FRAME_VERSION}")
    n = int.from_bytes(frame[1:5], "big")
    if n != len(frame) - FRAME_HEADER:
        raise WireError(f"the envelope frame header says {n} bytes, {len(frame) - FRAME_HEADER} follow")
    return topic, int.from_bytes(pid_b, "big"), int.from_bytes(seq_b, "big"), frame[FRAME_HEADER:]
