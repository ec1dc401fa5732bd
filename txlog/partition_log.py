"""One partition's log on the object store: load (checkpoint + tail), append, read.

An append is one put-if-absent claiming the next slot.  A writer predicts the slot from
its cached state and succeeds with one request; on contention it reads the new tail
(one list plus the new entries) and retries, re-validating against what it learned.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlog import (
    arrow_memory,
    checksums,
    completions,
    fetch_windows,
    inline_copies,
    layout,
)
from txlog.batch_codec import encode_parquet_buffer
from txlog.batch_rows import BatchRows, held_bytes
from txlog.checkpoint import decode_checkpoint, encode_checkpoint
from txlog.declared_size import (
    DEFAULT_FETCH_MAX_BYTES,
)
from txlog.errors import (
    CorruptObjectError,
    ObjectNotFoundError,
    ProducerFencedError,
)
from txlog.fanout import fan_out
from txlog.model import (
    BEGIN,
    COMMIT,
    CONTROL_KINDS,
    DATA,
    INLINE_MAX_BYTES,
    PARTS,
    Entry,
    decode_entry,
    named_objects,
)
from txlog.partition_state import PartitionState, ReadSpan
from txlog.records import now_ms
from txlog.storage.base import ObjectStore
from txlog.unique import unique

log = logging.getLogger(__name__)

DEFAULT_CHECKPOINT_INTERVAL = 1000
#: A cold open that replays at least this many entries leaves a checkpoint behind, so
#: the next cold open (a Spark commit worker, a new consumer) does not replay them again:
#: with checkpoints only every DEFAULT_CHECKPOINT_INTERVAL appends, every fresh process
#: paid for the whole tail, and each Spark commit cost more requests than the last.
TAIL_CHECKPOINT = 16
KEEP_CHECKPOINTS = 2


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    slot: int
    duplicate: bool = False


#: One batch object of a DATA entry of several: key, count, nbytes, ts_min, ts_max, untimed;
#: a batch inside a shared object adds its first row and the object's rows (model.PARTS).
Part = tuple[Any, ...]


def _stamp(ts_min: int | None, ts_max: int | None, untimed: bool,
           append_ms: int) -> tuple[int, int]:
    """A batch's timestamp range as its entry records it: records without a timestamp
    of their own (None: none has one; ``untimed``: some) take the append time."""
    lo = append_ms if ts_min is None else ts_min
    hi = append_ms if ts_max is None else ts_max
    if untimed:  # time lookups and retention see the records' append time
        lo, hi = min(lo, append_ms), max(hi, append_ms)
    return lo, hi


@dataclass(slots=True)
class AppendSpec:
    kind: str
    count: int
    producer_id: int = -1
    epoch: int = 0
    base_sequence: int = -1
    transactional: bool = False
    txn_id: str | None = None
    data: str | None = None
    nbytes: int = 0
    ts_min: int | None = 0
    ts_max: int | None = 0
    #: Some records have no timestamp of their own: their time is the append time, which
    #: the entry's range then takes in (ts_min/ts_max None: no record has one).
    untimed: bool = False
    log_start_offset: int | None = None
    extra: dict[str, Any] | None = None
    #: A DATA append of several batch objects in one entry (see model.PARTS): each
    #: (key, count, nbytes, ts_min, ts_max, untimed), as the single-object fields are,
    #: plus (row, object_rows) for a batch inside a shared object (kept a part even
    #: alone); ``data``, ``count``, ``nbytes`` and the timestamps are taken from them.
    parts: list[Part] | None = None
    #: The bytes of objects this entry appends, to carry in it (model.INLINE_VERSION): those
    #: that fit INLINE_MAX_BYTES in all are copied into the entry.
    inline: dict[str, bytes] | None = None


def _inline_copies(spec: AppendSpec) -> dict[str, str] | None:
    """The entry's inline copies (key -> base64) of the objects ``spec`` appends, in
    their order while they fit INLINE_MAX_BYTES; only objects whose key names a checksum,
    which a reader checks the copy against."""
    if not spec.inline or spec.kind not in (DATA, COMMIT):
        return None
    # (never a shared object: every partition's entry would carry all of it)
    sizes = {p[0]: p[2] for p in spec.parts if len(p) == 6} if spec.parts is not None \
        else {spec.data: spec.nbytes} if spec.data else {}
    out: dict[str, str] = {}
    total = 0
    for key, size in sizes.items():
        data = spec.inline.get(key)
        if data is None or len(data) != size or checksums.expected(key) is None \
                or total + size > INLINE_MAX_BYTES:
            continue
        out[key] = base64.b64encode(data).decode("ascii")
        total += size
    return out or None


#: Slots a refresh reads by name before it lists the tail (see PartitionLog._probe_tail):
#: a commit adds a BEGIN entry and a COMMIT marker to a partition, and one more
#: shows that nothing follows them.
PROBE_SLOTS = 3


def _parallel(store: ObjectStore) -> bool:
    return not store.local_requests


class PartitionLog:
    def __init__(self, store: ObjectStore, topic: str, partition: int, *,
                 checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
                 fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES) -> None:
        self.store = store
        self.fetch_max_bytes = fetch_max_bytes
        self.topic = topic
        self.partition = partition
        self.checkpoint_interval = max(1, checkpoint_interval)
        self.state: PartitionState | None = None
        # One Log may be shared by threads (producers, a consumer, maintenance): the cached
        # state is only read and advanced under this lock.
        self._lock = threading.RLock()
        self._log_prefix = layout.log_prefix(topic, partition)
        self._tail_checkpoints = True  # off after one fails (read-only access)
        # Decoded bytes per stored byte of the objects last read within a budget.
        self._expansion: float | None = None

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    # -- loading -----------------------------------------------------------------------

    def load(self) -> PartitionState:
        """Latest readable checkpoint plus the entries after it (never the whole history)."""
        with self._lock:
            st = self._load_checkpoint()
            try:
                replayed = self._read_tail(st)
            except CorruptObjectError:
                # A damaged entry: keep the valid prefix before it, so committed data below
                # it stays readable (plan_read).  Not after a transient error: writers
                # trust the cached state, which must then be complete.
                self.state = st
                raise
            self.state = st
            if replayed >= TAIL_CHECKPOINT and self._tail_checkpoints:
                self._tail_checkpoints = self._checkpoint_quietly(st, quiet=True)
            return st

    def refresh(self) -> PartitionState:
        # A commit of this process whose markers are still being written (in the
        # background) is open here (by a DATA or BEGIN entry, or by its decision alone):
        # wait for it, so the next read in the process that committed sees the commit.
        # Outside the lock: the marker writer needs it.
        st = self._refresh()
        ident = self.store.identity
        held = bool(st.open_txns) and completions.wait_for(ident, list(st.open_txns))
        if completions.wait_for_partition(ident, self.topic, self.partition) or held:
            st = self._refresh()
        return st

    def _refresh(self) -> PartitionState:
        with self._lock:
            if self.state is None:
                return self.load()
            if self._probe_tail(self.state) == PROBE_SLOTS:
                self._read_tail(self.state)  # a backlog: list the rest
            return self.state

    def _probe_tail(self, st: PartitionState) -> int:
        """Read the next PROBE_SLOTS slots' entries by name, side by side on a remote
        store, instead of listing the tail: a reader that keeps up finds the one or two
        new entries a commit adds (or none) with one round of GETs, where a LIST costs
        a round trip of its own before they can be read, and more than a GET.  Slots
        are claimed in order, so only the run up to the first missing one counts.
        Returns how many entries were applied."""
        keys = [layout.entry_key(self.topic, self.partition, st.next_slot + i)
                for i in range(PROBE_SLOTS)]

        def probe(key: str) -> bytes | None:
            try:
                return self.store.get(key)
            except ObjectNotFoundError:
                return None

        if _parallel(self.store):
            raws = fan_out(probe, keys)
        else:
            raws = []
            for k in keys:
                raws.append(probe(k))
                if raws[-1] is None:
                    break
        applied = 0
        for k, raw in zip(keys, raws, strict=False):
            if raw is None:
                break
            e = decode_entry(raw, k)
            self._check_owned(named_objects(e), f"log entry {k}")
            st.apply(e)
            applied += 1
            if e.inline:  # a reader that keeps up reads these records next
                inline_copies.keep(self.store.identity, e.inline)
        return applied

    def current(self) -> PartitionState:
        with self._lock:
            return self.state if self.state is not None else self.load()

    def _load_checkpoint(self) -> PartitionState:
        keys = self.store.list(layout.checkpoint_prefix(self.topic, self.partition))
        for key in reversed(keys):
            try:
                st = decode_checkpoint(self.store.get(key), key)
                self._check_owned_column(st.batches.arrow(), f"checkpoint {key}")
                self._check_owned({k for _, k in st.pending_deletes}, f"checkpoint {key}")
                return st
            except ObjectNotFoundError:
                continue  # deleted by a newer checkpoint's cleanup
            except CorruptObjectError as exc:
                log.warning("ignoring unreadable checkpoint: %s", exc)
        return PartitionState()

    def _read_tail(self, st: PartitionState) -> int:
        start_after = (layout.entry_key(self.topic, self.partition, st.next_slot - 1)
                       if st.next_slot > 0 else None)
        keys = self.store.list(self._log_prefix, start_after=start_after)
        if not keys:
            return 0
        # Only the contiguous run from next_slot: a claimed slot is never skipped.
        run: list[str] = []
        expect = st.next_slot
        for k in keys:
            try:
                slot = layout.slot_of(k)
            except ValueError:
                continue
            if slot != expect:
                break
            run.append(k)
            expect += 1
        if _parallel(self.store) and len(run) > 1:
            raws = fan_out(self.store.get, run)
        else:
            raws = [self.store.get(k) for k in run]
        for k, raw in zip(run, raws, strict=True):
            e = decode_entry(raw, k)
            self._check_owned(named_objects(e), f"log entry {k}")
            st.apply(e)
        return len(run)

    def _check_owned(self, keys: Iterable[str], what: str) -> None:
        for key in keys:
            if key and not layout.owns(self.topic, self.partition, key):
                raise CorruptObjectError(
                    f"{what} names object {key!r}, outside {self.name}'s own data "
                    f"({layout.data_prefix(self.topic, self.partition)}); an entry may only "
                    "name its own partition's objects. It is corrupt, or was written by "
                    "someone who should not write to this root: remove it")

    def _check_owned_column(self, batches: pa.Table, what: str) -> None:
        """:meth:`_check_owned` for a batch index's keys, with array operations (a
        checkpoint names up to millions of objects); keys that may not pass get the exact
        check.  Also: a batch names a shared object's rows (``object_rows``) exactly when
        its key is a shared object's, or a reader would take the whole object as its own."""
        keys = batches.column("data")
        in_shared = batches.column("object_rows").to_numpy() != 0
        data = layout.data_prefix(self.topic, self.partition)
        if pc.all(pc.starts_with(keys, data)).as_py():
            named_shared = np.zeros(len(keys), bool)
        else:
            shared = "^" + re.escape(layout.shared_prefix(self.topic)) + r"[^/]+\.parquet$"
            is_shared = pc.match_substring_regex(keys, shared)
            named_shared = is_shared.to_numpy(zero_copy_only=False)
            ok = pc.or_(pc.or_(pc.equal(keys, ""), pc.or_(
                pc.starts_with(keys, data),
                pc.starts_with(keys, layout.staging_prefix_of(self.topic)))), is_shared)
            self._check_owned(keys.filter(pc.invert(ok)).to_pylist(), what)
        if (named_shared != in_shared).any():
            raise CorruptObjectError(
                f"{what} has batches whose objects and object_rows disagree (a shared "
                "object's batch without the object's rows, or rows for an object of its "
                "own); txlog falls back to an older checkpoint or the log itself")
        for chunk in keys.chunks:
            if _suspicious_bytes(chunk):
                odd = pc.or_(pc.match_substring(chunk, ".."), pc.or_(
                    pc.match_substring(chunk, "\\"), pc.match_substring(chunk, "\x00")))
                self._check_owned(chunk.filter(odd).to_pylist(), what)

    # -- appending -----------------------------------------------------------------------

    def write_data(self, table: pa.Table) -> tuple[str, int]:
        """Write a batch object under a unique name (plain put; not yet part of the log)."""
        key, size, _ = self.write_object(table)
        return key, size

    def write_object(self, table: pa.Table, *, copy_up_to: int = 0,
                     ) -> tuple[str, int, bytes | None]:
        """write_data(), also returning a copy of the object's bytes when it is at most
        ``copy_up_to`` bytes (a log entry may carry it); larger objects are let go at once."""
        key, data = self.encode_object(table)
        try:
            self.store.put_new(key, data)
            size = len(data)
            return key, size, (bytes(data) if size <= copy_up_to else None)
        finally:
            del data
            arrow_memory.release()

    def encode_object(self, table: pa.Table) -> tuple[str, bytes | memoryview]:
        """A new batch object's key (naming its checksum) and bytes, not yet written."""
        buf = encode_parquet_buffer(table)
        data: bytes | memoryview = (memoryview(buf) if self.store.writes_buffers
                                    else buf.to_pybytes())
        del buf
        return layout.data_key(self.topic, self.partition,
                               unique() + checksums.tag(data)), data

    def append(self, spec: AppendSpec) -> AppendResult:
        """Claim the next slot for ``spec``; returns the batch's base offset.

        Data batches are validated against the producer state of the log as it is just
        before the claimed slot (sequence gaps, duplicates, fenced epochs); a lost race
        re-reads the tail and re-validates, so a check never goes stale.
        """
        with self._lock:
            return self._append(spec)

    def _append(self, spec: AppendSpec) -> AppendResult:
        marker_parts = spec.kind == COMMIT and spec.parts is not None
        if spec.parts is not None:
            # A part of no records would start where the next one does; readers refuse it.
            kept = [p for p in spec.parts if p[1] > 0]
            if marker_parts:
                # A COMMIT carrying its transaction's last batches
                # (model.MARKER_PARTS_VERSION): with none left, a plain marker.
                spec.parts, marker_parts = kept or None, bool(kept)
            else:
                spec.parts = kept or spec.parts[:1]
                # (a batch of a shared object is always a part: its rows are named there)
                if (len(spec.parts) == 1 and len(spec.parts[0]) == 6) \
                        or spec.parts[0][1] <= 0:
                    spec.data, spec.count, spec.nbytes, spec.ts_min, spec.ts_max, \
                        spec.untimed = spec.parts[0][:6]
                    spec.parts = None
        if spec.parts is not None:  # the entry's totals are the parts' (never out of step)
            spec.data = spec.parts[0][0]
            # (a marker's own offset comes last)
            spec.count = sum(p[1] for p in spec.parts) + (1 if marker_parts else 0)
            spec.nbytes = sum(p[2] for p in spec.parts)
        inline = _inline_copies(spec)
        st = self.current()
        while True:
            if spec.kind == DATA:
                dup = st.check_sequence(spec.producer_id, spec.epoch, spec.base_sequence,
                                        spec.count, spec.transactional)
                if dup is not None:
                    return AppendResult(dup, -1, duplicate=True)
            elif spec.kind == BEGIN:
                if (spec.producer_id, spec.epoch) in st.open_txns:
                    return AppendResult(st.high_watermark, -1, duplicate=True)  # a retry
                if st.fence_epoch.get(spec.producer_id, -1) >= spec.epoch:
                    raise ProducerFencedError(
                        f"producer {spec.producer_id} epoch {spec.epoch} was fenced: its "
                        "transaction already ended in this partition; a newer producer "
                        "owns the transactional.id")
            elif spec.kind in CONTROL_KINDS and (spec.producer_id, spec.epoch) not in \
                    st.open_txns and st.fence_epoch.get(spec.producer_id, -1) >= spec.epoch:
                # Markers are idempotent: another client's marker for this transaction
                # already decided it here (roll-forwards race).
                return AppendResult(st.high_watermark, -1, duplicate=True)
            append_ms = now_ms()
            extra = spec.extra
            if spec.parts is None:
                ts_min, ts_max = _stamp(spec.ts_min, spec.ts_max, spec.untimed, append_ms)
            else:
                stamps = [_stamp(p[3], p[4], p[5], append_ms) for p in spec.parts]
                ts_min = min(lo for lo, _ in stamps)
                ts_max = max(hi for _, hi in stamps)
                extra = {PARTS: [[p[0], p[1], p[2], lo, hi, *p[6:]] for p, (lo, hi)
                                 in zip(spec.parts, stamps, strict=True)]}
            entry = Entry(
                slot=st.next_slot, kind=spec.kind, base_offset=st.high_watermark,
                count=spec.count, producer_id=spec.producer_id, epoch=spec.epoch,
                base_sequence=spec.base_sequence, transactional=spec.transactional,
                txn_id=spec.txn_id, data=spec.data, nbytes=spec.nbytes, ts_min=ts_min,
                ts_max=ts_max, append_ms=append_ms, log_start_offset=spec.log_start_offset,
                extra=extra, inline=inline,
            )
            key = layout.entry_key(self.topic, self.partition, entry.slot)
            if self.store.put_if_absent(key, entry.encode()):
                st.apply(entry)
                if st.next_slot % self.checkpoint_interval == 0:
                    self._checkpoint_quietly(st)
                return AppendResult(entry.base_offset, entry.slot)
            self._read_tail(st)

    # -- checkpoints ---------------------------------------------------------------------

    def write_checkpoint(self, st: PartitionState | None = None) -> str:
        st = st or self.refresh()
        key = layout.checkpoint_key(self.topic, self.partition, st.next_slot)
        self.store.put(key, encode_checkpoint(st))
        old = self.store.list(layout.checkpoint_prefix(self.topic, self.partition))
        for k in old[:-KEEP_CHECKPOINTS]:
            if k < key:
                self.store.delete(k)
        return key

    def _checkpoint_quietly(self, st: PartitionState, *, quiet: bool = False) -> bool:
        # A failed checkpoint costs only a longer tail for the next reader.
        try:
            self.write_checkpoint(st)
        except Exception as exc:
            (log.debug if quiet else log.warning)(
                "checkpoint of %s failed (will retry at the next interval): %s",
                self.name, exc)
            return False
        return True

    # -- reading -------------------------------------------------------------------------

    def read_spans(self, spans: Sequence[ReadSpan], columns: Sequence[str] | None = None,
                   *, max_decoded: int | None = None,
                   kept: dict[str, BatchRows] | None = None) -> list[pa.Table]:
        """The rows of each span, trimmed to its offsets, in order.  Each object is read
        once even when several spans (runs of a compacted segment) point into it, and
        only the row groups that hold the spans' batches are decoded (an object may hold
        other batches: other partitions' in a shared object, other runs in a segment).

        ``max_decoded``: decode objects in order only until their decoded tables hold
        that many bytes (at least one object), and return the tables of the spans read
        so far, a prefix of ``spans``: a budget on stored sizes alone lets objects that
        compress well decode to many times it.

        ``kept``: shared objects (read for ``columns``) fetched by an earlier read, taken
        from it instead of fetched; the shared objects this read fetches are left there,
        so that reads of the other partitions in them fetch none again."""
        kept = {} if kept is None else kept
        of: dict[str, list[ReadSpan]] = {}
        for s in spans:
            of.setdefault(s.data, []).append(s)
        keys = list(of)
        cols = list(columns) if columns else None

        def opened(k: str, raw: bytes | None) -> BatchRows:
            rows = kept.get(k)
            if rows is None or rows.columns != cols:
                if raw is None:
                    raw = self._get_verified(k)
                rows = BatchRows(raw, k, cols, piece_bytes=1 << 30,
                                 fetch_max_bytes=self.fetch_max_bytes, whole=False)
                if layout.is_shared(k):
                    kept[k] = rows
            return rows

        def decode(k: str, raw: bytes | None) -> list[pa.Table]:
            return _read_batches(opened(k, raw), of[k])

        def fetched(k: str) -> bytes:
            rows = kept.get(k)
            return rows.raw if rows is not None and rows.columns == cols else \
                self._get_verified(k)

        tables: dict[str, list[pa.Table]]
        if max_decoded is None:
            if _parallel(self.store) and len(keys) > 1:
                tables = dict(zip(keys, fan_out(lambda k: decode(k, None), keys),
                                  strict=True))
            else:
                tables = {k: decode(k, None) for k in keys}
        else:
            # A window at a time, sized by the budget left (fetch_windows): objects past
            # the budget are neither fetched nor held.
            get_many = ((lambda ks: fan_out(fetched, list(ks)))
                        if _parallel(self.store) else None)
            tables, self._expansion = fetch_windows.read_within(
                keys, fetch_windows.stored_sizes(self.state, spans, keys),
                max_decoded=max_decoded, expansion=self._expansion, get=fetched,
                get_many=get_many, decode=decode,
                decoded_size=held_bytes) if keys else ({}, self._expansion)
        out = []
        taken = dict.fromkeys(keys, 0)
        for s in spans:
            if s.data not in tables:
                break
            out.append(tables[s.data][taken[s.data]])
            taken[s.data] += 1
        return out

    def read_span(self, span: ReadSpan, columns: Sequence[str] | None = None) -> pa.Table:
        return self.read_spans([span], columns)[0]

    def _get_verified(self, key: str) -> bytes:
        raw = inline_copies.take(self.store.identity, key)  # the entry carried a copy
        return raw if raw is not None else checksums.verify(key, self.store.get(key))


def _read_batches(rows: BatchRows, spans: Sequence[ReadSpan]) -> list[pa.Table]:
    """The rows of each of ``spans`` (all of one object), read in one pass over it."""
    for s in spans:
        if rows.num_rows < s.row + s.count:
            raise CorruptObjectError(
                f"batch object {s.data} holds {rows.num_rows} rows but its log entry "
                f"needs rows {s.row}..{s.row + s.count - 1}")
    return rows.read([(s.file_row, s.take) for s in spans])


def _suspicious_bytes(keys: pa.Array) -> bool:
    """Whether any of the keys may hold "..", a backslash or a NUL (a scan of their bytes:
    a match across two keys is a false alarm, which the exact check then clears)."""
    if len(keys) == 0 or not pa.types.is_string(keys.type):
        return len(keys) > 0
    _, offset_buf, value_buf = keys.buffers()
    if value_buf is None:  # every key empty
        return False
    offsets = np.frombuffer(offset_buf, np.int32, len(keys) + 1, keys.offset * 4)
    raw = np.frombuffer(value_buf, np.uint8)[offsets[0]:offsets[-1]]
    dots = raw == ord(".")
    return bool((raw == ord("\\")).any() or (raw == 0).any() or (dots[1:] & dots[:-1]).any())
