"""Recorded stream formats: detection and readers.

Each reader feeds the router view directly from the decoded fields (no event
objects on the way), and raises ``StreamError`` naming the line or frame when
the input cannot be read. Formats:

- ``router``: Dynamo RouterEvent JSON lines (``codecs.RouterEventMsg``), as
  the event plane carries them and ``RadixTree.dump_tree_as_events()``
  prints them;
- ``kvspec``: kvspec event JSON lines (``spec/schema/kv_event.json``; a
  Dynamo ``KvCacheEvent`` line is one too);
- ``zmq``: a ZMQ capture (``capture.py``): multipart messages with their
  sequence numbers, each payload a vLLM ``KVEventBatch``;
- ``eventplane``: a ZMQ capture of Dynamo's event plane (``eventplane.py``):
  four frames per message, RouterEvents in a msgpack envelope;
- ``vllm``: raw vLLM ``KVEventBatch`` msgpack payloads, concatenated.

Limits: a line (or a msgpack batch) longer than ``max_record_bytes`` is an
error, as is nesting deeper than the decoders allow; a file that ends inside
a record says so.
"""

from __future__ import annotations

import binascii
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgpack
import msgspec
import xxhash

from kvspec.reference.router_view import At, RouterView, _Tier
from kvspec.spec.codecs import (
    KVSPEC_DECODER,
    ROUTER_DECODER,
    TIERS,
    U64_MAX,
    EventDataMsg,
    KvspecEventMsg,
    RemoveDataMsg,
    RouterEventMsg,
    StoreDataMsg,
    event_data,
    strip_unknown,
)
from kvspec.spec.errors import WireError
from kvspec.spec.hashing import SEED
from kvspec.streams import fastview
from kvspec.streams.capture import CAPTURE_DECODER, frames_of
from kvspec.streams.hashcheck import HashCheck
from kvspec.streams.producer_names import VLLM_FORMAT
from kvspec.streams.zmqfeed import FeedStats, ZmqFeed

FORMATS = ("auto", "router", "kvspec", "zmq", "eventplane", VLLM_FORMAT)
#: the longest line or batch read (a real event is a few kilobytes; a longer
#: record would take memory out of proportion to the blocks it stores)
MAX_RECORD_BYTES = 16 << 20
CHUNK = 1 << 20

_pack = struct.Struct("<QQ").pack
_xxh = xxhash.xxh3_64_intdigest


class ByteSource(Protocol):
    """What the readers read from: a binary file, or ``inputs.Input``."""

    def read(self, n: int = -1, /) -> bytes: ...


class StreamError(Exception):
    """The input cannot be read; ``at`` names where (line or batch)."""

    def __init__(self, message: str, at: str | None = None) -> None:
        super().__init__(f"{at}: {message}" if at else message)
        self.at = at
        self.reason = message


@dataclass(slots=True)
class ReadStats:
    records: int = 0  # lines or batches read
    events: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    bytes: int = 0


# ---------------------------------------------------------------- detection


def detect(source: Path | bytes) -> str:
    """The format of an input, from its first record (``source``: a file,
    or the input's first bytes)."""
    if isinstance(source, bytes):
        head = source
    else:
        with source.open("rb") as f:
            head = f.read(1 << 16)
    body = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    if not body:
        raise StreamError("the input is empty: no events to check")
    first = body[:1]
    if first == b"{":
        line = body.split(b"\n", 1)[0]
        try:
            obj = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError, ValueError):  # ValueError: invalid UTF-8 in a string
            return _guess_json(line)
        if isinstance(obj, dict):
            if "parts_b64" in obj:
                return "eventplane" if _event_plane_capture(obj["parts_b64"]) else "zmq"
            if "event" in obj and "worker_id" in obj:
                return "router"
            if "event_id" in obj and "data" in obj:
                return "kvspec"
        raise StreamError(
            "line 1 is a JSON object of no known format (a Dynamo RouterEvent has 'worker_id' and 'event', "
            "a kvspec or Dynamo KvCacheEvent 'event_id' and 'data', a ZMQ capture line 'parts_b64')"
        )
    b = first[0]
    if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD) or 0x80 <= b <= 0x8F or b in (0xDE, 0xDF):
        return VLLM_FORMAT
    raise StreamError(
        f"cannot tell the format: the input starts with byte 0x{b:02x}, neither a JSON object nor a msgpack "
        "array or map (name it with --format)"
    )


def _event_plane_capture(parts: object) -> bool:
    """Whether a capture line holds one of Dynamo's event plane messages."""
    from kvspec.streams.eventplane_frames import looks_like_event_plane

    if not isinstance(parts, list) or len(parts) != 4 or not all(isinstance(p, str) for p in parts):
        return False
    try:
        frames = [binascii.a2b_base64(p, strict_mode=True) for p in parts]
    except (binascii.Error, ValueError):
        return False
    return looks_like_event_plane(frames)


def _guess_json(line: bytes) -> str:
    """The format of a first line too long or broken to decode: by its keys."""
    if b'"parts_b64"' in line or b'"msg_idx"' in line:
        return "zmq"
    if b'"worker_id"' in line or b'"event"' in line or b'"storage_tier"' in line[:40]:
        return "router"
    return "kvspec"


# ------------------------------------------------------------------ lines


def iter_chunks(f: ByteSource, limit: int) -> Iterator[tuple[int, list[bytes], int]]:
    """Lists of lines (without newline), the number of the first, and the
    number of a line the file ends inside (it lacks its newline; 0: none).
    A line longer than ``limit`` raises StreamError without being read whole."""
    lineno = 1
    pending: list[bytes] = []  # pieces of a line that spans chunks
    pending_len = 0
    while True:
        chunk = f.read(CHUNK)
        if not chunk:
            break
        nl = chunk.find(b"\n")
        if nl < 0:
            pending.append(chunk)
            pending_len += len(chunk)
            if pending_len > limit:
                raise StreamError(f"longer than {limit} bytes (--max-record-bytes)", f"line {lineno}")
            continue
        if pending:
            pending.append(chunk)
            chunk = b"".join(pending)
            pending, pending_len = [], 0
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if len(chunk) > limit:  # otherwise no line in it can be longer
            for i, line in enumerate(lines):
                if len(line) > limit:
                    raise StreamError(f"longer than {limit} bytes (--max-record-bytes)", f"line {lineno + i}")
        yield lineno, lines, 0
        lineno += len(lines)
        if rest:
            pending.append(rest)
            pending_len = len(rest)
            if pending_len > limit:
                raise StreamError(f"longer than {limit} bytes (--max-record-bytes)", f"line {lineno}")
    if pending:
        yield lineno, [b"".join(pending)], lineno


class TextChunks:
    """The file as buffers of whole lines, for a reader that walks them in
    place without a bytes object per line: iterating gives (buffer, start,
    end, last) where the lines are ``buffer[start:end]``, each ended by a
    newline except an unterminated last line of the file (``last``; ``end``
    is then the buffer's length). A line that spans two reads comes as a
    buffer of its own, so a read chunk is never copied whole. The reader advances ``lineno`` (the number of the
    next line) by the lines it read before it takes the next buffer; nothing
    here counts them, which would cost a pass over every byte. The same
    lines and errors as ``iter_chunks``: a line longer than ``limit`` raises
    StreamError naming its number, before any line of its buffer is handed
    out."""

    def __init__(self, f: ByteSource, limit: int) -> None:
        self.f = f
        self.limit = limit
        self.lineno = 1

    def _too_long(self, at: int) -> StreamError:
        return StreamError(f"longer than {self.limit} bytes (--max-record-bytes)", f"line {at}")

    def __iter__(self) -> Iterator[tuple[bytes, int, int, bool]]:
        limit = self.limit
        pending: list[bytes] = []  # pieces of a line that spans chunks
        pending_len = 0
        while True:
            chunk = self.f.read(CHUNK)
            if not chunk:
                break
            nl = chunk.rfind(b"\n")
            if nl < 0:
                pending.append(chunk)
                pending_len += len(chunk)
                if pending_len > limit:
                    raise self._too_long(self.lineno)
                continue
            start = 0
            if pending:  # the line that spans chunks on its own, not the whole chunk copied
                start = chunk.index(b"\n") + 1
                pending.append(chunk[:start])
                head = b"".join(pending)
                pending, pending_len = [], 0
                if len(head) - 1 > limit:
                    raise self._too_long(self.lineno)
                yield head, 0, len(head), False
            end = nl + 1
            if end - start > limit:  # otherwise no line in it can be longer
                at, i = start, 0
                while at < end:
                    stop = chunk.index(b"\n", at, end)
                    if stop - at > limit:
                        raise self._too_long(self.lineno + i)
                    at, i = stop + 1, i + 1
            if start < end:
                yield chunk, start, end, False
            if end < len(chunk):
                rest = chunk[end:]
                pending.append(rest)
                pending_len = len(rest)
                if pending_len > limit:
                    raise self._too_long(self.lineno)
        if pending:
            last = b"".join(pending)
            yield last, 0, len(last), True


def _json_error(e: Exception, lineno: int, last: bool, line: bytes | None = None) -> StreamError:
    if isinstance(e, RecursionError):
        return StreamError("nested too deeply", f"line {lineno}")
    if isinstance(e, UnicodeDecodeError):
        at = e.start
        if line is not None:  # the decoder's offset is inside the string; the line's is more use
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as whole:
                at = whole.start
        return StreamError(f"not valid UTF-8 ({e.reason} at byte {at + 1} of the line)", f"line {lineno}")
    msg = str(e)
    if isinstance(e, msgspec.ValidationError):
        msg = f"invalid record: {msg}"
    elif isinstance(e, msgspec.DecodeError):
        msg = f"not valid JSON ({msg})"
        if last:
            msg += "; the file ends inside this line (truncated?)"
    return StreamError(msg, f"line {lineno}")


# ---------------------------------------------------------------- readers


def apply_router_event(view: RouterView, m: RouterEventMsg, at: At) -> str:
    """Apply one Dynamo RouterEvent through the view's methods (the
    reference path of every RouterEvent input: lines, the event plane);
    returns its kind. Raises WireError for what the wire model allows but a
    RouterEvent cannot mean (no blocks, a hash above 64 bits, both variants)."""
    ev = m.event
    w = m.worker_id
    eid = ev.event_id
    if w > U64_MAX or eid > U64_MAX:
        raise WireError("worker_id or event_id does not fit in 64 bits")
    data = ev.data
    if type(data) is EventDataMsg:
        s = data.stored
        if s is not None and data.removed is None:
            blocks = s.blocks
            if not blocks:
                raise WireError("a stored event names no blocks")
            hs = [b.block_hash for b in blocks]
            ths = [b.tokens_hash for b in blocks]
            p = s.parent_hash
            if max(hs) > U64_MAX or max(ths) > U64_MAX or (p is not None and p > U64_MAX):
                raise WireError("a hash does not fit in 64 bits")
            view.on_stored(w, ev.dp_rank, m.storage_tier, eid, p, hs, ths, None, None, at)
            return "stored"
        r = event_data(data)
        assert isinstance(r, RemoveDataMsg)
        hs = r.block_hashes
        if not hs:
            raise WireError("a removed event names no blocks")
        if max(hs) > U64_MAX:
            raise WireError("a hash does not fit in 64 bits")
        view.on_removed(w, ev.dp_rank, m.storage_tier, eid, hs, at)
        return "removed"
    view.on_cleared(w, ev.dp_rank, m.storage_tier, eid, at)
    return "cleared"


class RouterReader:
    """Dynamo RouterEvent JSON lines.

    Each line is decoded straight into compact structs and applied to the
    router view. For the common case (set counting, the event id expected,
    a known tier, every block new and its chain of hashes right) the view's
    ``on_stored``/``on_removed`` and the Dynamo hash chain run inlined here
    (``fused``, about twice as fast); any event that might break a rule, or a
    view configured otherwise, goes through the view's own methods, which
    remain the reference: the fused path changes no state before it knows the
    event is clean, so both give the same findings (tests/test_check_log_fused.py
    runs them side by side on valid and corrupted streams).

    With the C extension (``fastview``) a third path comes first: its
    ``lines()`` reads the JSON text of each line itself, without a decoded
    object, and applies the clean Stored and Removed it understands (``raw``;
    ``KVSPEC_FASTVIEW_RAW=0`` turns it off). It stops at the first line of
    any other shape or that might break a rule, which then goes the ways
    above; the tests run every path on valid, corrupted and oddly written
    lines. With it, the view's tiers hold their blocks in the extension's C
    tables (``RouterView.use_tables``), which it reads and changes without
    Python objects; the other paths see them as mappings."""

    def __init__(
        self,
        warn: Callable[[str], None],
        limit: int = MAX_RECORD_BYTES,
        *,
        fused: bool = True,
        native: bool = True,
        raw: bool | None = None,
    ) -> None:
        self.warn = warn
        self.limit = limit
        self.fused = fused
        self.native = native
        # KVSPEC_FASTVIEW_RAW=0: C per decoded line only (the benchmark compares both)
        self.raw = os.environ.get("KVSPEC_FASTVIEW_RAW", "1") != "0" if raw is None else raw
        self.unknown: set[str] = set()
        self.stats = ReadStats()

    def _lenient(self, line: bytes) -> RouterEventMsg:
        """Decode a line that has fields the strict decoder does not know."""
        fresh: set[str] = set()
        obj = strip_unknown(msgspec.json.decode(line), fresh)
        new = fresh - self.unknown
        if new:
            self.unknown |= new
            self.warn(
                f"router events carry field(s) this version does not know: {', '.join(sorted(new))} "
                "(ignored; a newer Dynamo may have added them)"
            )
        return msgspec.convert(obj, RouterEventMsg)

    def _fusable(self, view: RouterView) -> bool:
        """Whether the view is configured the way the fused path assumes."""
        check = view.check
        return (
            self.fused
            and view.mode == "set"
            and view.expect_dp_rank is None
            and not view.expected_parents
            and view._timing is None
            and not view.shared_tiers  # TIER-DEDUP is applied by the view's methods only
            and not view.sequential_orphans
            and (check is None or type(check) is HashCheck)
        )

    def _apply(self, m: RouterEventMsg, lineno: int, view: RouterView) -> str:
        """Apply one decoded line through the view's methods (the reference
        path); returns its kind."""
        try:
            return apply_router_event(view, m, lineno)
        except WireError as e:
            raise StreamError(str(e), f"line {lineno}") from None

    def _tail(self, m: RouterEventMsg, view: RouterView, lineno: int, strict: bool, hcheck: HashCheck | None) -> None:
        """The end of a Removed the C path applied (code 3): the hash check's
        state and the orphan reports, then the ids, as ``on_removed`` orders them."""
        ev = m.event
        key = (m.worker_id, ev.dp_rank)
        src = view.sources[key]
        tname = m.storage_tier
        data = ev.data
        assert type(data) is EventDataMsg and data.removed is not None
        hs = data.removed.block_hashes
        _removed_tail(view, src.tiers[tname], key, tname, ev.event_id, hs, hs, lineno, strict, hcheck)
        src.next_id = ev.event_id + 1
        view.index += 1

    def _lines(
        self, f: ByteSource, c_text: Callable[..., tuple[int, int, int, int]] | None, rctx: tuple, acc: list[int]
    ) -> Iterator[tuple[int, bytes, int]]:
        """(line number, line, number of the line the file ends inside or 0)
        of each line the Python paths read: every line, or with the C reader
        (``c_text``) only the lines it stops at; it adds the Stored and
        Removed it applied to ``acc``. A stopped line is handed out before the
        C reader goes on after it, so the two apply lines in file order."""
        if c_text is None:
            for first, lines, unterminated in iter_chunks(f, self.limit):
                for i, line in enumerate(lines):
                    yield first + i, line, unterminated
            return
        chunks = TextChunks(f, self.limit)
        for buf, pos, end, last in chunks:
            lineno = chunks.lineno
            while pos < end:
                pos, n, ns, nr = c_text(rctx, buf, pos, end)
                acc[0] += ns
                acc[1] += nr
                lineno += n
                if pos >= end:
                    break
                nl = buf.find(b"\n", pos, end)
                stop = end if nl < 0 else nl
                yield lineno, buf[pos:stop], lineno if last else 0
                lineno += 1
                pos = stop + 1
            chunks.lineno = lineno

    def run(self, f: ByteSource, view: RouterView) -> None:
        dec = ROUTER_DECODER.decode
        lenient = False
        records = n_stored = n_removed = n_cleared = 0
        # the fused path's view of the view (see the class docstring)
        fused = self._fusable(view)
        sources = view.sources
        anchored = view.anchored_tiers
        strict = view.strict
        check = view.check
        hcheck = check if type(check) is HashCheck else None
        chain = hcheck is not None and hcheck.chain_checks
        xxh, pack, seed = _xxh, _pack, SEED
        u64 = U64_MAX
        native = fastview.module() if fused and self.native else None
        c_stored = native.stored if native is not None else None
        c_removed = native.removed if native is not None else None
        c_line = native.line if native is not None else None
        if native is not None:
            native.take_chain_blocks()  # zero, whatever an interrupted run left
        ctx = (sources, anchored, chain, hcheck, view, xxh, seed, EventDataMsg, strict)
        # the C reader of whole lines (fastview text()): it applies the clean
        # lines it understands and stops at the first other one, which takes
        # the path below; then it goes on after that line
        c_text = native.text if native is not None and self.raw else None
        if c_text is not None and native is not None and view.tables is None:
            # every tier's blocks in C tables, which the C reader reads and
            # changes directly; the paths below see them as mappings
            view.use_tables((native.LiveTable, native.KidsTable))
        rctx = (sources, anchored, chain, hcheck, view, seed, strict)
        acc = [0, 0]  # Stored and Removed the C reader applied
        try:
            for lineno, line, unterminated in self._lines(f, c_text, rctx, acc):
                if not line or line.isspace():
                    continue
                try:
                    m = self._lenient(line) if lenient else dec(line)
                except msgspec.ValidationError as e:
                    if "unknown field" not in str(e):
                        raise _json_error(e, lineno, False, line) from None
                    try:
                        m = self._lenient(line)
                    except (msgspec.DecodeError, RecursionError, ValueError) as e2:
                        raise _json_error(e2, lineno, False, line) from None
                    lenient = True
                except (msgspec.DecodeError, RecursionError, ValueError) as e:
                    raise _json_error(e, lineno, lineno == unterminated, line) from None
                records += 1
                if c_line is not None:
                    code = c_line(ctx, m)
                    if code == 1:
                        n_stored += 1
                        continue
                    if code == 2:
                        n_removed += 1
                        continue
                    if code == 3:  # applied; the reports and the id bookkeeping are ours
                        self._tail(m, view, lineno, strict, hcheck)
                        n_removed += 1
                        continue
                ev = m.event
                w = m.worker_id
                eid = ev.event_id
                if w > u64 or eid > u64:
                    raise StreamError("worker_id or event_id does not fit in 64 bits", f"line {lineno}")
                if fused:
                    data = ev.data
                    if type(data) is EventDataMsg:
                        key = (w, ev.dp_rank)
                        src = sources.get(key)
                        s = data.stored
                        if src is not None and src.next_id == eid:
                            tname = m.storage_tier
                            tier = src.tiers.get(tname)
                            if tier is not None and s is not None and data.removed is None:
                                if (
                                    c_stored(
                                        tier.live,
                                        tier.kids,
                                        s.parent_hash,
                                        s.blocks,
                                        eid,
                                        view.index,
                                        anchored is None or tname in anchored,
                                        chain,
                                        xxh,
                                        seed,
                                    )
                                    if c_stored is not None
                                    else _fused_stored(
                                        tier, s, eid, view.index, tname, anchored, chain, xxh, pack, seed, u64
                                    )
                                ):
                                    src.next_id = eid + 1
                                    view.index += 1
                                    if hcheck is not None and chain:
                                        n = len(s.blocks)
                                        hcheck.checked_blocks += n
                                        hcheck.chain_blocks += n
                                    n_stored += 1
                                    continue
                            elif tier is not None and s is None and data.removed is not None:
                                hs = data.removed.block_hashes
                                done = 0
                                if c_removed is not None:
                                    done = c_removed(tier.live, tier.kids, tier.removed.cur, hs, (eid, view.index))
                                    if done:
                                        _removed_tail(
                                            view,
                                            tier,
                                            key,
                                            tname,
                                            eid,
                                            hs,
                                            hs,
                                            lineno,
                                            strict and done == 2,
                                            hcheck,
                                        )
                                if done or (
                                    hs and _fused_removed(view, tier, key, tname, eid, hs, lineno, strict, hcheck)
                                ):
                                    src.next_id = eid + 1
                                    view.index += 1
                                    n_removed += 1
                                    continue
                kind = self._apply(m, lineno, view)
                if kind == "stored":
                    n_stored += 1
                elif kind == "removed":
                    n_removed += 1
                else:
                    n_cleared += 1
        finally:
            n_stored += acc[0]
            n_removed += acc[1]
            records += acc[0] + acc[1]
            st = self.stats
            st.records, st.stored, st.removed, st.cleared = records, n_stored, n_removed, n_cleared
            st.events = n_stored + n_removed + n_cleared
            if native is not None:
                n = native.take_chain_blocks()
                if hcheck is not None:
                    hcheck.checked_blocks += n
                    hcheck.chain_blocks += n


def _fused_stored(
    tier: _Tier,
    s: StoreDataMsg,
    eid: int,
    index: int,
    tname: str,
    anchored: frozenset[str] | None,
    chain: bool,
    xxh: Callable[..., int],
    pack: Callable[..., bytes],
    seed: int,
    u64: int,
) -> bool:
    """``RouterView.on_stored`` of a clean Stored, inlined: True when applied;
    False (the view untouched) when the event needs the reference path
    (a parent not stored, a hash out of range or off its chain, a block
    already stored or named twice, no blocks)."""
    live = tier.live
    parent = s.parent_hash
    if parent is not None and (parent > u64 or (parent not in live and (anchored is None or tname in anchored))):
        return False
    blocks = s.blocks
    if not blocks:
        return False
    kids = tier.kids
    prev = parent
    done: list[int] = []
    for b in blocks:
        h = b.block_hash
        th = b.tokens_hash
        if chain:
            if prev is None:
                if th != h or h > u64:
                    break
            else:
                try:
                    if xxh(pack(prev, th), seed) != h:
                        break
                except (OverflowError, struct.error):  # tokens_hash above u64
                    break
        elif h > u64 or th > u64:
            break
        if h in live:
            break
        live[h] = (1, prev, eid, index)
        if prev is not None:
            kids[prev] = kids.get(prev, 0) + 1
        done.append(h)
        prev = h
    else:
        return True
    # roll back: the reference path will apply (and report) the whole event
    prev = parent
    for h in done:
        del live[h]
        if prev is not None:
            k = kids[prev]
            if k == 1:
                del kids[prev]
            else:
                kids[prev] = k - 1
        prev = h
    return False


def _fused_removed(
    view: RouterView,
    tier: _Tier,
    key: tuple[int, int],
    tname: str,
    eid: int,
    hs: list[int],
    lineno: int,
    strict: bool,
    hcheck: HashCheck | None,
) -> bool:
    """``RouterView.on_removed`` in set mode, inlined: False (the view
    untouched) when a block is not stored, for the reference path to report.
    A block named twice passes the first test; its second removal is
    reported as the reference reports it, from the same state."""
    live = tier.live
    for h in hs:
        if h not in live:
            return False
    kids = tier.kids
    removed = tier.removed
    recent = removed.cur
    index = view.index
    mark = (eid, index)
    pop = live.pop
    gone: list[int] = []
    for h in hs:
        rec = pop(h, None)
        if rec is None:
            view._not_stored(h, key, tname, tier, ("removed", eid, tname, None, hs, None, lineno), index, True)
            continue
        recent[h] = mark
        p = rec[1]
        if p is not None:
            k = kids.get(p)
            if k == 1:
                del kids[p]
            elif k:
                kids[p] = k - 1
        gone.append(h)
    _removed_tail(view, tier, key, tname, eid, hs, gone, lineno, strict, hcheck)
    return True


def _removed_tail(
    view: RouterView,
    tier: _Tier,
    key: tuple[int, int],
    tname: str,
    eid: int,
    hs: list[int],
    gone: list[int],
    lineno: int,
    orphans: bool,
    hcheck: HashCheck | None,
) -> None:
    """What ``on_removed`` does after the blocks left: rotate the recent
    removals, tell the hash check, report orphans (``orphans``: strict, and
    some block in ``gone`` may have stored children)."""
    removed = tier.removed
    if len(removed.cur) >= removed.cap:
        removed.rotate()
    if hcheck is not None and (hcheck.full or hcheck.pending):
        hcheck.gone((key[0], key[1], tname), gone)
    if orphans:
        kids = tier.kids
        for h in gone:
            n_orphans = kids.get(h, 0)
            if n_orphans:
                view._orphaned(h, n_orphans, key, tname, tier, ("removed", eid, tname, None, hs, None, lineno))


class KvspecReader:
    """kvspec event JSON lines (or Dynamo KvCacheEvent lines: worker 0)."""

    def __init__(self, warn: Callable[[str], None], limit: int = MAX_RECORD_BYTES, worker_id: int = 0) -> None:
        self.warn = warn
        self.limit = limit
        self.worker_id = worker_id
        self.stats = ReadStats()

    def run(self, f: ByteSource, view: RouterView) -> None:
        dec = KVSPEC_DECODER.decode
        st = self.stats
        w = self.worker_id
        for first, lines, unterminated in iter_chunks(f, self.limit):
            for off, line in enumerate(lines):
                lineno = first + off
                if not line or line.isspace():
                    continue
                st.bytes += len(line) + 1
                try:
                    m: KvspecEventMsg = dec(line)
                except (msgspec.DecodeError, RecursionError, ValueError) as e:
                    raise _json_error(e, lineno, lineno == unterminated, line) from None
                st.records += 1
                try:
                    self._apply(m, view, w, lineno)
                except WireError as e:
                    raise StreamError(str(e), f"line {lineno}") from None
                st.events += 1

    def _apply(self, m: KvspecEventMsg, view: RouterView, w: int, lineno: int) -> None:
        st = self.stats
        tier = m.storage_tier
        if tier not in TIERS:
            raise WireError(f"unknown storage_tier {tier!r}")
        if m.event_id > U64_MAX:
            raise WireError("event_id does not fit in 64 bits")
        d = event_data(m.data)
        if m.block_token_ids is not None and not isinstance(d, StoreDataMsg):
            raise WireError("block_token_ids is only allowed on a stored event")
        if isinstance(d, StoreDataMsg):
            if not d.blocks:
                raise WireError("a stored event names no blocks")
            hs = [b.block_hash for b in d.blocks]
            ths = [b.tokens_hash for b in d.blocks]
            p = d.parent_hash
            if max(hs) > U64_MAX or max(ths) > U64_MAX or (p is not None and p > U64_MAX):
                raise WireError("a hash does not fit in 64 bits")
            toks = m.block_token_ids
            if toks is not None and len(toks) != len(hs):
                raise WireError(f"block_token_ids has {len(toks)} entries for {len(hs)} blocks")
            view.on_stored(w, m.dp_rank, tier, m.event_id, p, hs, ths, toks, None, lineno)
            st.stored += 1
        elif isinstance(d, RemoveDataMsg):
            hs = d.block_hashes
            if not hs:
                raise WireError("a removed event names no blocks")
            if max(hs) > U64_MAX:
                raise WireError("a hash does not fit in 64 bits")
            view.on_removed(w, m.dp_rank, tier, m.event_id, hs, lineno)
            st.removed += 1
        else:
            view.on_cleared(w, m.dp_rank, tier, m.event_id, lineno)
            st.cleared += 1


class Feed(Protocol):
    """What turns a captured message into events: ``ZmqFeed`` (vLLM-style
    feeds) or ``eventplane.EventPlaneFeed`` (Dynamo's event plane)."""

    stats: FeedStats

    def feed(self, frames: list[bytes], at: At = None, *, replayed: bool = False) -> int: ...


class CaptureReader:
    """A ZMQ capture (``capture.py``) of either kind of feed."""

    def __init__(self, feed: Feed, limit: int = MAX_RECORD_BYTES) -> None:
        self.feed = feed
        self.limit = limit
        self.stats = ReadStats()

    def run(self, f: ByteSource, view: RouterView) -> None:
        dec = CAPTURE_DECODER.decode
        st = self.stats
        feed = self.feed
        feed_fn = feed.feed
        a2b = binascii.a2b_base64
        for first, lines, unterminated in iter_chunks(f, self.limit):
            for off, line in enumerate(lines):
                lineno = first + off
                if not line or line.isspace():
                    continue
                st.bytes += len(line) + 1
                try:
                    if not line.isascii():  # the decoder skips unknown keys unread: their UTF-8 too
                        line.decode("utf-8")
                    rec = dec(line)
                except (msgspec.DecodeError, RecursionError, ValueError) as e:
                    raise _json_error(e, lineno, lineno == unterminated, line) from None
                st.records += 1
                parts = rec.parts_b64
                frames = None
                if len(parts) == 3 and (rec.n_parts is None or rec.n_parts == 3):
                    try:  # frames_of, inlined for the usual three frames
                        frames = [
                            a2b(parts[0], strict_mode=True),
                            a2b(parts[1], strict_mode=True),
                            a2b(parts[2], strict_mode=True),
                        ]
                    except (binascii.Error, ValueError):
                        frames = None  # frames_of reports it
                try:
                    feed_fn(frames if frames is not None else frames_of(rec), lineno, replayed=rec.replayed)
                except WireError as e:
                    raise StreamError(str(e), f"line {lineno}") from None
        _copy_feed_stats(feed, st)


class PayloadReader:
    """Concatenated vLLM ``KVEventBatch`` msgpack payloads (no sequence
    numbers: the batches are applied in file order)."""

    def __init__(self, feed: ZmqFeed, limit: int = MAX_RECORD_BYTES) -> None:
        self.feed = feed
        self.limit = limit
        self.stats = ReadStats()

    def run(self, f: ByteSource, view: RouterView) -> None:
        st = self.stats
        unpacker = msgpack.Unpacker(max_buffer_size=max(self.limit, CHUNK))
        buf = bytearray()
        base = 0  # absolute offset of buf[0]
        start = 0  # absolute offset of the next batch
        n = 0
        while True:
            chunk = f.read(CHUNK)
            if chunk:
                try:
                    unpacker.feed(chunk)
                except msgpack.BufferFull:
                    raise StreamError(f"larger than {self.limit} bytes (--max-record-bytes)", f"batch {n}") from None
                buf += chunk
            while True:
                try:
                    unpacker.skip()
                except msgpack.OutOfData:
                    break
                except (ValueError, msgpack.StackError, msgpack.FormatError, msgpack.ExtraData) as e:
                    raise StreamError(f"not valid msgpack ({type(e).__name__}: {e})", f"batch {n}") from None
                end = unpacker.tell()
                payload = bytes(buf[start - base : end - base])
                st.records += 1
                st.bytes += len(payload)
                try:
                    self.feed.apply_payload(payload, n)
                except WireError as e:
                    raise StreamError(str(e), f"batch {n} (byte {start})") from None
                n += 1
                start = end
            if start > base:
                del buf[: start - base]
                base = start
            if not chunk:
                break
        if buf:
            raise StreamError(
                f"the file ends inside a batch: {len(buf)} byte(s) after the last complete batch (truncated?)",
                f"batch {n} (byte {start})",
            )
        _copy_feed_stats(self.feed, st)


def _copy_feed_stats(feed: Feed, st: ReadStats) -> None:
    fs = feed.stats
    st.events, st.stored, st.removed, st.cleared = fs.events, fs.stored, fs.removed, fs.cleared


Reader = RouterReader | KvspecReader | CaptureReader | PayloadReader


def describe(fmt: str) -> str:
    return {
        "router": "Dynamo RouterEvent JSON lines",
        "kvspec": "kvspec event JSON lines",
        "zmq": "ZMQ capture (vLLM-style feed)",
        "eventplane": "ZMQ capture of Dynamo's event plane",
        VLLM_FORMAT: "vLLM KVEventBatch msgpack payloads",
    }.get(fmt, fmt)
