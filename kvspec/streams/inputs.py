"""Where ``kvspec check-log`` reads from: files, standard input, gzip, a growing file.

``open_input(name)`` gives an ``Input``: a byte stream with ``read(n)``
(what every reader of ``formats.py`` calls) and its first bytes
(``head``, for format detection) without consuming them, so that standard
input, which cannot be rewound, is read once:

- ``-`` is standard input; any other name a file;
- gzip is recognised by its magic bytes (1f 8b), whatever the name, and
  decompressed as it is read; a damaged or cut gzip stream is an input
  error (``StreamError``) naming it, never a traceback;
- a UTF-8 byte-order mark at the start is skipped (editors on some systems
  write one); a UTF-16 or UTF-32 mark is an error that says so, since the
  readers take UTF-8 JSON or msgpack;
- ``follow=True`` (``--follow``): at the end of the file, wait for more
  (``tail -f``) until ``stop()`` is called (SIGINT, SIGTERM) or nothing was
  appended for ``idle_timeout`` seconds. Only whole lines are handed out
  for line formats (``lines=True``): a line the writer has not finished is
  held until its newline arrives, and one still unfinished when the
  follow stops is left unread and reported (``pending``). A file that
  shrinks while followed (truncated, rotated) is an error.
"""

from __future__ import annotations

import gzip
import os
import sys
import time
import zlib
from typing import IO

from kvspec.streams.formats import ByteSource, StreamError

HEAD = 1 << 16
GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
#: byte-order marks of encodings the readers do not take (longest first)
OTHER_BOMS = (
    (b"\x00\x00\xfe\xff", "UTF-32 (big-endian)"),
    (b"\xff\xfe\x00\x00", "UTF-32 (little-endian)"),
    (b"\xfe\xff", "UTF-16 (big-endian)"),
    (b"\xff\xfe", "UTF-16 (little-endian)"),
)
POLL_S = 0.1


class Input:
    """One input stream (see the module docstring)."""

    def __init__(self, name: str, raw: IO[bytes], *, closes: bool) -> None:
        self.name = name
        self._raw = raw
        self._closes = closes
        self.gzip = False
        self.follow = False
        self.idle_timeout: float | None = None
        self.lines = True
        self.pending = 0  # bytes of an unfinished last line left unread when a follow stopped
        self._stopped = False
        self._src: ByteSource = raw
        self._buf = b""
        self._pos = 0  # bytes taken from the source so far (for a followed file: its offset)
        head = self._fill(HEAD)
        if head[:2] == GZIP_MAGIC:
            self.gzip = True
            self._src = gzip.GzipFile(fileobj=_Replay(head, raw), mode="rb")  # type: ignore[call-overload]
            self._buf = b""
            self._pos = 0  # from here: decompressed bytes (a gzip stream is never followed)
            head = self._fill(HEAD)
        if head.startswith(UTF8_BOM):
            self._buf = self._buf[len(UTF8_BOM) :]
        else:
            for bom, enc in OTHER_BOMS:
                if head.startswith(bom):
                    raise StreamError(f"the input is {enc} text (byte-order mark {bom.hex(' ')}): give it as UTF-8")

    @property
    def head(self) -> bytes:
        """The first bytes of the input (after gzip and a BOM), not consumed."""
        return self._buf

    def _read_src(self, n: int) -> bytes:
        try:
            data = self._src.read(n)
        except (gzip.BadGzipFile, zlib.error) as e:
            raise StreamError(f"not valid gzip ({e})") from None
        except EOFError:
            raise StreamError("the gzip stream ends early (truncated?)") from None
        self._pos += len(data)
        return data

    def _fill(self, n: int) -> bytes:
        while len(self._buf) < n:
            data = self._read_src(n - len(self._buf))
            if not data:
                break
            self._buf += data
        return self._buf

    def stop(self) -> None:
        """End a follow at the next read (signal handlers call this)."""
        self._stopped = True

    def read(self, n: int = -1, /) -> bytes:
        if self._buf and (not self.follow or not self.lines):
            out, self._buf = self._buf, b""
            return out
        if not self.follow:
            return self._read_src(n)
        return self._follow(n)

    def _follow(self, n: int) -> bytes:
        """The next data of a growing file: whole lines for line formats."""
        quiet_since = time.monotonic()
        while True:
            data = self._read_src(n)
            if data:
                quiet_since = time.monotonic()
                if not self.lines:
                    return data
                self._buf += data
                nl = self._buf.rfind(b"\n")
                if nl >= 0:
                    out, self._buf = self._buf[: nl + 1], self._buf[nl + 1 :]
                    return out
                continue
            if self.lines and self._buf:
                nl = self._buf.rfind(b"\n")
                if nl >= 0:
                    out, self._buf = self._buf[: nl + 1], self._buf[nl + 1 :]
                    return out
            if self._stopped or (self.idle_timeout is not None and time.monotonic() - quiet_since >= self.idle_timeout):
                self.pending = len(self._buf)
                self._buf = b""
                return b""
            self._check_not_shrunk()
            time.sleep(POLL_S)

    def _check_not_shrunk(self) -> None:
        try:
            size = os.fstat(self._raw.fileno()).st_size
        except (OSError, ValueError):
            return
        if size < self._pos:
            raise StreamError(
                f"the file shrank to {size} bytes while followed (read up to byte {self._pos}): truncated or rotated"
            )

    def close(self) -> None:
        if self._closes:
            self._raw.close()


class _Replay:
    """A raw stream with bytes already read put back in front (for gzip)."""

    def __init__(self, head: bytes, raw: IO[bytes]) -> None:
        self._head = head
        self._raw = raw

    def read(self, n: int = -1, /) -> bytes:
        if self._head:
            if n < 0 or n >= len(self._head):
                out, self._head = self._head, b""
                return out + (self._raw.read(-1 if n < 0 else n - len(out)) if n != len(out) else b"")
            out, self._head = self._head[:n], self._head[n:]
            return out
        return self._raw.read(n)


def open_input(name: str) -> Input:
    """The input ``name`` (``-``: standard input); raises OSError for a file
    that cannot be opened and StreamError for an encoding that cannot be read."""
    if name == "-":
        return Input("<stdin>", sys.stdin.buffer, closes=False)
    f = open(name, "rb")  # noqa: SIM115 - Input.close() closes it
    try:
        return Input(name, f, closes=True)
    except BaseException:
        f.close()
        raise
