"""The vLLM-style ZMQ feed: multipart messages into the router view.

vLLM's ``ZmqEventPublisher`` (vllm-project/vllm vllm/distributed/kv_events.py)
sends each ``KVEventBatch`` as three frames, ``(topic, sequence, payload)``,
the sequence an 8-byte big-endian counter from 0; SGLang and the ai-dynamo
mocker's ``zmq_kv_events_port`` feed (ai-dynamo/dynamo
lib/mocker/src/services/zmq_events.rs) do the same. Its replay socket answers
with ``(empty, sequence, payload)`` frames (the mocker adds an empty topic
frame before the sequence) and ends with sequence -1. So in every message
the last two frames are the sequence and the payload.

``ZmqFeed.feed(frames, at)`` checks the sequence (a gap is lost batches, a
number seen before is a duplicate, one that fills an earlier gap arrived out
of order: EVENT-ID, since these events carry no ids of their own and the
sequence is what a router resynchronises on), decodes the payload and
applies its events to the router view in order. The same object serves
``kvspec check-log`` on a capture and ``kvspec watch`` on a live socket.

Resynchronising as a router must (spec/SPEC.md, EVENT-ID): a gap is one
finding, after which the worker's state is unknown (``RouterView.reset_worker``
with ``partial``) rather than wrong; a first sequence other than 0 (joined
late) leaves it unknown the same way; the sequence back at 0 is a publisher
restart (a notice; its state starts empty); a batch under a sequence number
already applied, with the same payload bytes, is a redelivery (counted and
skipped: transports deliver at least once), and with other bytes an
EVENT-ID finding.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import xxhash

from kvspec.reference.router_view import At, RouterView
from kvspec.spec.codecs import (
    MEDIUM_TO_TIER,
    REMOVED_TYPES,
    STORED_TYPES,
    U64_MAX,
    VllmBatchDecoder,
    VllmRemoved,
    VllmStored,
    check_u64,
    vllm_hash_int,
    vllm_tier,
)
from kvspec.spec.errors import WireError
from kvspec.spec.rules import RuleId
from kvspec.streams import fastview
from kvspec.streams.hashcheck import HashCheck, StoredMeta, _VllmScheme
from kvspec.streams.producer_names import VLLM_PRODUCER

I64_MAX = 2**63 - 1

_xxh = xxhash.xxh3_64_intdigest

#: gaps remembered (to tell a late batch from a duplicate)
MISSING_LIMIT = 65536
#: batches remembered by sequence number (to tell a redelivery from a different batch): a ring of this
#: many slots (a power of 2) holding the payload itself while all held take at most RING_BYTES, else its xxh3
RING = 4096
RING_BYTES = 32 << 20
END_SEQ = -1


@dataclass(slots=True)
class FeedStats:
    messages: int = 0
    batches: int = 0
    events: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    lost: int = 0
    duplicates: int = 0
    late: int = 0
    replayed: int = 0
    #: gaps (each one finding, however many batches it lost)
    gaps: int = 0
    restarts: int = 0
    #: batches received again with the same payload, skipped
    redelivered: int = 0
    topics: set[bytes] = field(default_factory=set)


class ZmqFeed:
    def __init__(
        self,
        view: RouterView,
        *,
        worker_id: int = 0,
        mid_stream: bool = False,
        first_seq: int = 0,
        native: bool = True,
        producer: str = "auto",
    ) -> None:
        """``mid_stream``: the first message may carry any sequence number.
        A live watcher that sees a gap asks the publisher's replay socket
        first and feeds what it returns with ``replayed=True``: those batches
        fill the gap, and repeats of batches already received are dropped
        without a finding.

        ``native``: clean events go through the C fast path
        (``fastview.vllm_event``) when it is built and the view and hash
        check are configured the way it assumes (copies counting, vLLM's
        sha256 scheme learned or given, no timing or expected parents);
        every other event, and every event that might break a rule, takes
        the Python path below, which stays the reference
        (tests/test_check_log_vllm_fused.py compares the two).

        ``producer``: ``vllm`` or ``sglang`` when named, which fixes how the
        hashes are written (unsigned, signed int64); ``auto`` learns it from
        the first hash only one of them allows (``signed``)."""
        self.view = view
        self.producer = producer
        #: whether the hashes are SGLang's signed int64 (None: not known yet)
        self.signed: bool | None = None
        self.native = native
        self._ctx: tuple[Any, ...] | None = None
        self._c_event: Callable[..., int] | None = None
        self.worker_id = worker_id
        self.mid_stream = mid_stream
        self.first_seq = first_seq
        self.decoder = VllmBatchDecoder()
        self.stats = FeedStats()
        self.next_seq: int | None = None
        self.missing: OrderedDict[int, None] = OrderedDict()
        #: batches applied from the replay socket that may still arrive live
        #: (a live copy of one of them is expected, not a duplicate)
        self.via_replay: OrderedDict[int, None] = OrderedDict()
        #: the last RING batches applied: slot seq % RING holds (seq, payload or its xxh3)
        self._ring: list[tuple[int, bytes | int] | None] = [None] * RING
        self._ring_bytes = 0
        #: events per dp rank (of this feed's worker): these feeds carry no event ids to count them by
        self._per_dp: dict[int, int] = {}
        self._dp = 0  # the dp rank counted in _dp_events
        self._dp_events = 0
        #: called with (worker, dp rank, batch) for each batch applied (watch's metrics)
        self.on_batch: Callable[[int, int, Any], None] | None = None
        if mid_stream:  # until a first sequence of 0 shows the stream from its start
            view.start_unknown.add(worker_id)

    # ------------------------------------------------------------ framing
    @staticmethod
    def split(frames: list[bytes]) -> tuple[bytes | None, int, bytes]:
        """(topic, sequence, payload) of one message; raises WireError."""
        if len(frames) < 2:
            raise WireError(f"a ZMQ event message has at least 2 frames (sequence, payload), got {len(frames)}")
        seq_b, payload = frames[-2], frames[-1]
        if len(seq_b) != 8:
            raise WireError(f"the sequence frame is {len(seq_b)} bytes, not 8")
        seq = int.from_bytes(seq_b, "big", signed=True)
        topic = frames[-3] if len(frames) >= 3 else None
        return topic, seq, payload

    def feed(self, frames: list[bytes], at: At = None, *, replayed: bool = False) -> int:
        """Check and apply one message; returns its sequence number."""
        nxt = self.next_seq
        if not replayed and nxt is not None and len(frames) == 3:
            # the common case, inlined: the sequence due (what _check_sequence
            # does with it, nothing else to check)
            seq_b = frames[1]
            if len(seq_b) == 8 and int.from_bytes(seq_b, "big", signed=True) == nxt:
                st = self.stats
                st.messages += 1
                if len(st.topics) < 16:
                    st.topics.add(frames[0])
                st.last_seq = nxt
                self.next_seq = nxt + 1
                payload = frames[2]
                ring = self._ring  # _remember, inlined for the common case
                i = nxt & (RING - 1)
                old = ring[i]
                n = len(payload)
                held = self._ring_bytes + n
                if old is not None and type(old[1]) is bytes:
                    held -= len(old[1])
                if held <= RING_BYTES:
                    ring[i] = (nxt, payload)
                    self._ring_bytes = held
                else:
                    self._remember(nxt, payload)
                self.apply_payload(payload, at)
                return nxt
        topic, seq, payload = self.split(frames)
        st = self.stats
        st.messages += 1
        if topic is not None and len(st.topics) < 16:
            st.topics.add(topic)
        if seq < 0:
            raise WireError(f"sequence {seq} on a data message (-1 only ends a replay)")
        if not self._sequence(seq, at, replayed, payload):
            return seq
        self._remember(seq, payload)
        self.apply_payload(payload, at)
        return seq

    @property
    def per_dp(self) -> dict[int, int]:
        """Events applied per dp rank."""
        out = dict(self._per_dp)
        if self._dp_events:
            out[self._dp] = out.get(self._dp, 0) + self._dp_events
        return out

    def _count_dp(self, dp: int, n: int) -> None:
        per = self._per_dp
        per[self._dp] = per.get(self._dp, 0) + self._dp_events
        self._dp, self._dp_events = dp, n

    def _remember(self, seq: int, payload: bytes) -> None:
        """Keep the batch applied under ``seq`` (no hashing on the way: a
        reference, unless the ring's payloads would pass RING_BYTES)."""
        ring = self._ring
        i = seq & (RING - 1)
        old = ring[i]
        if old is not None and type(old[1]) is bytes:
            self._ring_bytes -= len(old[1])
        n = len(payload)
        if self._ring_bytes + n <= RING_BYTES:
            ring[i] = (seq, payload)
            self._ring_bytes += n
        else:
            ring[i] = (seq, _xxh(payload))

    def _same_batch(self, seq: int, payload: bytes) -> bool | None:
        """Whether ``payload`` is the batch applied under ``seq`` (None: not remembered)."""
        kept = self._ring[seq & (RING - 1)]
        if kept is None or kept[0] != seq:
            return None
        return kept[1] == payload if type(kept[1]) is bytes else kept[1] == _xxh(payload)

    def _sequence(self, seq: int, at: At, replayed: bool, payload: bytes = b"") -> bool:
        """Check ``seq``; True when the batch is to be applied."""
        ok = self._check_sequence(seq, at, replayed, payload)
        if ok and replayed:
            self.via_replay[seq] = None
            if len(self.via_replay) > MISSING_LIMIT:
                self.via_replay.popitem(last=False)
        return ok

    def _check_sequence(self, seq: int, at: At, replayed: bool, payload: bytes = b"") -> bool:
        st = self.stats
        if st.first_seq is None:
            st.first_seq = seq
        st.last_seq = seq
        nxt = self.next_seq
        if nxt is None:
            if seq == self.first_seq:
                self.view.start_unknown.discard(self.worker_id)  # seen from its start: known empty
            else:
                self.view.reset_worker(self.worker_id, partial=True)  # joined late: unknown before
            if seq != self.first_seq and not self.mid_stream:
                self.view.report(
                    RuleId.EVENT_ID,
                    f"the feed starts at sequence {seq}, not {self.first_seq}: batches before it are missing "
                    "(use --mid-stream for a capture started mid-stream)",
                    self.worker_id,
                    0,
                    "device",
                    at,
                    sequence=seq,
                )
            self.next_seq = seq + 1
            st.replayed += replayed
            return True
        if seq == nxt:
            self.next_seq = seq + 1
            if replayed:
                st.replayed += 1
            return True
        if seq > nxt:
            lost = seq - nxt
            st.lost += lost
            st.gaps += 1
            self.view.gaps[self.worker_id] += 1
            self.view.reset_worker(self.worker_id, partial=True)  # what the lost batches did is unknown
            for s in range(nxt, min(seq, nxt + MISSING_LIMIT)):
                self.missing[s] = None
            while len(self.missing) > MISSING_LIMIT:
                self.missing.popitem(last=False)
            self.view.report(
                RuleId.EVENT_ID,
                f"sequence {seq} where {nxt} was due: {lost} batch(es) lost",
                self.worker_id,
                0,
                "device",
                at,
                first_missing=nxt,
                lost=lost,
            )
            self.next_seq = seq + 1
            return True
        if seq in self.missing:
            del self.missing[seq]
            if replayed:
                st.replayed += 1
                return True
            st.late += 1
            self.view.report(
                RuleId.EVENT_ID,
                f"sequence {seq} arrived after {nxt - 1}: out of order (its events are applied late)",
                self.worker_id,
                0,
                "device",
                at,
                sequence=seq,
            )
            return True
        if replayed:
            return False  # a replay repeats what already arrived: not the publisher's fault
        if seq in self.via_replay:
            del self.via_replay[seq]  # the live copy of a batch the replay socket supplied first
            return False
        same = self._same_batch(seq, payload)
        if same:
            st.redelivered += 1
            self.view.notice(
                "redelivered", f"sequence {seq} delivered again (skipped)", self.worker_id, 0, "device", at
            )
            return False
        if seq == self.first_seq:
            st.restarts += 1
            self.view.reset_worker(self.worker_id, partial=False)
            self.missing.clear()
            self._ring = [None] * RING
            self._ring_bytes = 0
            self.next_seq = seq + 1
            self.view.notice(
                "restart",
                f"sequence {seq} after {nxt - 1}: the publisher restarted (its state starts empty)",
                self.worker_id,
                0,
                "device",
                at,
            )
            return True
        st.duplicates += 1
        what = "with a different payload" if same is not None else "(too long ago to compare)"
        self.view.report(
            RuleId.EVENT_ID,
            f"sequence {seq} was already received {what}: duplicate batch (not applied)",
            self.worker_id,
            0,
            "device",
            at,
            sequence=seq,
        )
        return False

    def fill(self, seq: int) -> bool:
        """A replayed batch with this sequence is wanted (a gap not yet filled)."""
        return seq in self.missing

    # ------------------------------------------------------------- events
    def apply_payload(self, payload: bytes, at: At = None) -> None:
        """Decode one ``KVEventBatch`` and apply its events."""
        batch = self.decoder.decode(payload)
        st = self.stats
        st.batches += 1
        dp = batch.data_parallel_rank or 0
        if dp > 2**32 - 1:
            raise WireError(f"data_parallel_rank {dp} does not fit in 32 bits")
        view = self.view
        w = self.worker_id
        events = batch.events
        if dp == self._dp:  # the common case: one dp rank per feed
            self._dp_events += len(events)
        else:
            self._count_dp(dp, len(events))
        if self.on_batch is not None:
            self.on_batch(w, dp, batch)
        base = at if isinstance(at, int) else (at[0] if isinstance(at, tuple) and at else 0)
        ctx = self._ctx if self._ctx is not None else self._native_ctx()
        c_event = self._c_event
        for i, ev in enumerate(events):
            if ctx is not None and c_event is not None:
                code = c_event(ctx, ev, w, dp)
                if code == 1:
                    st.stored += 1
                    st.events += 1
                    continue
                if code == 2:
                    st.removed += 1
                    st.events += 1
                    continue
                if code == 3:  # applied; the hash check's state and the orphan reports are ours
                    self._removed_tail(cast(VllmRemoved, ev), w, dp, (base, i))
                    st.removed += 1
                    st.events += 1
                    continue
            where = (base, i)
            if isinstance(ev, STORED_TYPES):
                self._stored(ev, w, dp, where)
                st.stored += 1
            elif isinstance(ev, REMOVED_TYPES):
                self._removed(ev, w, dp, where)
                st.removed += 1
            else:
                view.on_cleared(w, dp, "device", None, at=where)
                st.cleared += 1
            st.events += 1

    def _native_ctx(self) -> tuple[Any, ...] | None:
        """The C fast path's context, once the configuration allows it (the
        hash scheme may be learned a few events into the stream)."""
        if not self.native:
            return None
        view = self.view
        check = view.check
        if (
            view.mode != "copies"
            or view.expect_dp_rank is not None
            or view.expected_parents
            or view._timing is not None
            or view.sequential_orphans
            or type(check) is not HashCheck
            or check.is_eagle
            or not isinstance(check.scheme, _VllmScheme)
            or check.scheme.algo != "sha256"
        ):
            return None
        mod = fastview.module()
        if mod is None:
            self.native = False
            return None
        self._c_event = mod.vllm_event
        self._ctx = (
            view,
            view.sources,
            check.full,
            check.pending,
            view.anchored_tiers,
            MEDIUM_TO_TIER,
            check.scheme.none,
            check,
            view.strict,
            STORED_TYPES,
            REMOVED_TYPES,
        )
        return self._ctx

    def _removed_tail(self, ev: VllmRemoved, w: int, dp: int, at: At) -> None:
        """The end of a Removed the C path applied (code 3), as ``on_removed``
        orders it: the hash check forgets the blocks gone, orphans are
        reported, the index moves on."""
        view = self.view
        tname = vllm_tier(ev.medium, ev.group_idx)
        tier = view.sources[(w, dp)].tiers[tname]
        hs = cast(list[int], ev.block_hashes)
        gone = [h for h in hs if h not in tier.live]
        if gone:
            if view.check is not None:
                view.check.gone((w, dp, tname), gone)
            if view.strict:
                ref = ("removed", None, tname, None, hs, None, at)
                for h in gone:
                    n_orphans = tier.kids.get(h, 0)
                    if n_orphans:
                        view._orphaned(h, n_orphans, (w, dp), tname, tier, ref)
        view.index += 1

    def _hashes(self, raw: list[int] | list[int | bytes], what: str) -> tuple[list[int], list[bytes | None] | None]:
        """The u64 a router keys each hash by, and the full digests when the
        feed carries bytes. Negative ints are SGLang's signed int64 hashes,
        mapped to the unsigned value of the same 8 bytes; ints above
        2**63-1 are unsigned (vLLM): one stream holds one kind or the other."""
        if all(type(h) is int for h in raw):
            hashes = cast(list[int], raw)
            lo, hi = min(hashes), max(hashes)
            if lo < 0:
                self._saw("signed", lo, what)
                hashes = [h & U64_MAX for h in hashes]
            if hi > I64_MAX:
                self._saw("unsigned", hi, what)
            check_u64(hashes, what)
            return hashes, None
        out: list[int] = []
        for h in raw:
            if isinstance(h, bytes):
                out.append(vllm_hash_int(h))
            else:
                out.extend(self._hashes([h], what)[0])
        check_u64(out, what)
        return out, [h if isinstance(h, bytes) else None for h in raw]

    def _saw(self, kind: str, value: int, what: str) -> None:
        """A hash only one producer's representation allows (see ``_hashes``)."""
        if self.signed is None:
            want = "signed" if self.producer == "sglang" else "unsigned" if self.producer == VLLM_PRODUCER else kind
            if kind != want:
                who = "SGLang publishes signed int64 hashes" if want == "signed" else "vLLM publishes unsigned ones"
                raise WireError(f"{what}: {value} cannot come from --producer {self.producer} ({who})")
            self.signed = kind == "signed"
            if self.signed:
                check = self.view.check
                if isinstance(check, HashCheck):
                    check.prefer("sglang")
            return
        if self.signed != (kind == "signed"):
            now = "negative" if kind == "signed" else "above 2**63-1"
            before = (
                "negative (signed int64, as SGLang publishes)"
                if self.signed
                else "above 2**63-1 (unsigned, as vLLM publishes)"
            )
            raise WireError(f"{what}: {value} is {now}, but earlier hashes were {before}: not one producer's hashes")

    def _stored(self, ev: VllmStored, w: int, dp: int, at: At) -> None:
        if not ev.block_hashes:
            raise WireError(f"event {at}: BlockStored names no blocks")
        hashes, fulls = self._hashes(ev.block_hashes, "BlockStored.block_hashes")
        p = ev.parent_block_hash
        full_parent = p if isinstance(p, bytes) else None
        parent = None if p is None else self._hashes([p], "BlockStored.parent_block_hash")[0][0]
        meta = StoredMeta(
            flat_tokens=ev.token_ids,
            block_size=ev.block_size,
            lora_name=ev.lora_name,
            extra_keys=ev.extra_keys,
            full_hashes=fulls,
            full_parent=full_parent,
            cache_salt=getattr(ev, "cache_salt", None),
        )
        self.view.on_stored(w, dp, vllm_tier(ev.medium, ev.group_idx), None, parent, hashes, None, None, meta, at)

    def _removed(self, ev: VllmRemoved, w: int, dp: int, at: At) -> None:
        raw = ev.block_hashes
        if not raw:
            raise WireError(f"event {at}: BlockRemoved names no blocks")
        hashes, _ = self._hashes(raw, "BlockRemoved.block_hashes")
        self.view.on_removed(w, dp, vllm_tier(ev.medium, ev.group_idx), None, hashes, at)
