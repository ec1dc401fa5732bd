"""The state of one partition, computed purely from its log entries.

No I/O here: :func:`PartitionState.apply` replays entries; the high watermark, the last
stable offset (LSO), the aborted ranges, producer (idempotence) state and the read plan
are all functions of the replayed entries.

Visibility rules (docs/design.md, "Reading"):

* a transaction is identified by (producer id, epoch): the epoch is bumped at every
  transaction end, so each (pid, epoch) names exactly one transaction;
* a COMMIT/ABORT marker for (pid, e) decides every open batch of (pid, e) before it and
  raises the partition's fence epoch for pid to e;
* a data batch whose epoch is at or below pid's fence epoch is FENCED: a zombie's late
  write, never visible, never holding the LSO;
* data from pid at a newer epoch fences any still-open older epoch of pid (a legitimate
  older transaction would have had its marker written here before the epoch moved on);
* LSO = first offset of the earliest open transaction, else the high watermark.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from txlog import model
from txlog.errors import (
    CorruptObjectError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    UnknownProducerIdError,
)
from txlog.model import ABORT, BEGIN, COMMIT, COMPACT, DATA, PARTS, PURGE, RETENTION, Entry

# Batch statuses.
PLAIN = 0  # non-transactional: visible once appended
COMMITTED = 1
ABORTED = 2
OPEN = 3
FENCED = 4
STATUS_NAMES = {PLAIN: "plain", COMMITTED: "committed", ABORTED: "aborted", OPEN: "open",
                FENCED: "fenced"}
VISIBLE = frozenset({PLAIN, COMMITTED})

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)

# How many recent batches per producer are remembered for duplicate detection (Kafka: 5).
RECENT_BATCHES = 5


@dataclass(slots=True)
class OpenTxn:
    producer_id: int
    epoch: int
    first_offset: int
    txn_id: str | None
    batches: list[int] = field(default_factory=list)  # base offsets of its batches here
    first_append_ms: int = 0


@dataclass(slots=True)
class ProducerState:
    epoch: int
    last_seq: int
    # (first_seq, last_seq, base_offset) of the most recent batches, oldest first.
    recent: list[tuple[int, int, int]] = field(default_factory=list)
    last_ms: int = 0


@dataclass(frozen=True, slots=True)
class ReadSpan:
    """Part of one batch object to read: offsets [start, stop) of the batch at base_offset."""

    data: str
    base_offset: int
    count: int
    start: int
    stop: int
    status: int
    producer_id: int
    append_ms: int
    row: int = 0  # the batch's first row in the object (non-zero inside compacted segments)

    @property
    def skip(self) -> int:
        return self.start - self.base_offset

    @property
    def file_row(self) -> int:
        """Row index in the object of the span's first record."""
        return self.row + self.start - self.base_offset

    @property
    def take(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset


#: The batch index's columns, in the order checkpoints store them.  ``row``: the batch's
#: first row in its object; ``object_rows``: a shared object's rows, else 0 (model.share).
BATCH_COLUMNS = ("base_offset", "count", "producer_id", "epoch", "status", "data", "nbytes",
                 "ts_min", "ts_max", "append_ms", "txn_id", "row", "object_rows")


class BatchColumns:
    """The data batches of a partition as parallel columns (cheap to checkpoint as Arrow).

    Loaded from a checkpoint, the batches stay one Arrow table (``frozen``) until a caller
    asks for a column as a list: a planner of millions of batches then reads them with
    array operations instead of building a Python object per value.  Appending (the tail
    after a checkpoint) and deciding open batches work without leaving Arrow; any other
    change turns the columns into lists first."""

    if TYPE_CHECKING:  # properties, defined below the class
        base_offset: list[int]
        count: list[int]
        producer_id: list[int]
        epoch: list[int]
        status: list[int]
        data: list[str]
        nbytes: list[int]
        ts_min: list[int]
        ts_max: list[int]
        append_ms: list[int]
        txn_id: list[str | None]
        row: list[int]
        object_rows: list[int]

    def __init__(self) -> None:
        self._frozen: pa.Table | None = None  # the first rows, as a checkpoint held them
        self._fixed: dict[int, int] = {}      # statuses of frozen rows decided since
        self._numpy: dict[str, np.ndarray] = {}  # frozen columns as arrays (cached)
        # The rows after the frozen ones (all of them once thawed), column by column.
        self._lists: dict[str, list[Any]] = {n: [] for n in BATCH_COLUMNS}

    @classmethod
    def from_arrow(cls, table: pa.Table) -> BatchColumns:
        """Batches held as ``table`` (a checkpoint's columns, already validated)."""
        b = cls()
        if table.num_rows:
            b._frozen = table.combine_chunks()
        return b

    def _thaw(self) -> None:
        t = self._frozen
        if t is None:
            return
        for name in BATCH_COLUMNS:
            self._lists[name][:0] = t.column(name).to_pylist()
        status = self._lists["status"]
        for i, s in self._fixed.items():
            status[i] = s
        self._frozen, self._fixed, self._numpy = None, {}, {}

    def __len__(self) -> int:
        n = len(self._lists["base_offset"])
        return n if self._frozen is None else n + self._frozen.num_rows

    def _frozen_array(self, name: str) -> np.ndarray:
        a = self._numpy.get(name)
        if a is None:
            assert self._frozen is not None
            a = self._numpy[name] = self._frozen.column(name).to_numpy()
        return a

    def arrow(self) -> pa.Table:
        """Every batch as one Arrow table of :data:`BATCH_COLUMNS` (nothing copied when
        the batches are a checkpoint's, unchanged)."""
        from txlog.checkpoint import BATCH_SCHEMA

        parts = []
        if self._frozen is not None:
            t = self._frozen
            if self._fixed:
                status = self._frozen_array("status").copy()
                for i, s in self._fixed.items():
                    status[i] = s
                t = t.set_column(BATCH_COLUMNS.index("status"), "status",
                                 pa.array(status, pa.int8()))
            parts.append(t)
        if self._lists["base_offset"] or not parts:
            parts.append(pa.table([self._lists[n] for n in BATCH_COLUMNS], schema=BATCH_SCHEMA))
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts).combine_chunks()

    def add(self, e: Entry, status: int) -> int:
        c = self._lists
        c["base_offset"].append(e.base_offset)
        c["count"].append(e.count)
        c["producer_id"].append(e.producer_id)
        c["epoch"].append(e.epoch)
        c["status"].append(status)
        c["data"].append(e.data or "")
        c["nbytes"].append(e.nbytes)
        c["ts_min"].append(e.ts_min)
        c["ts_max"].append(e.ts_max)
        c["append_ms"].append(e.append_ms)
        c["txn_id"].append(e.txn_id)
        c["row"].append(0)
        c["object_rows"].append(0)
        return len(self) - 1

    def add_part(self, e: Entry, status: int, base_offset: int, part: list[Any]) -> None:
        """One batch object of a DATA entry of several (see model.PARTS), or one batch
        inside a shared object (a part of 7: its first row and the object's rows)."""
        key, count, nbytes, ts_min, ts_max = part[:5]
        row, object_rows = (part[5], part[6]) if len(part) > 5 else (0, 0)
        c = self._lists
        c["base_offset"].append(base_offset)
        c["count"].append(count)
        c["producer_id"].append(e.producer_id)
        c["epoch"].append(e.epoch)
        c["status"].append(status)
        c["data"].append(key)
        c["nbytes"].append(nbytes)
        c["ts_min"].append(ts_min)
        c["ts_max"].append(ts_max)
        c["append_ms"].append(e.append_ms)
        c["txn_id"].append(e.txn_id)
        c["row"].append(row)
        c["object_rows"].append(object_rows)

    def shares(self) -> list[int]:
        """Each batch's stored bytes as byte accounting counts them (model.share)."""
        return [model.share(n, c, r) if r else n
                for n, c, r in zip(self.nbytes, self.count, self.object_rows, strict=True)]

    def decide(self, offset: int, key: tuple[int, int], status: int) -> None:
        """Give every OPEN batch of transaction ``key`` (producer id, epoch) at ``offset``
        its outcome.  Several batches may start at one offset: a batch of no records
        (older producers wrote them for an empty send_batch()) starts where the next one
        does."""
        n0 = 0
        if self._frozen is not None:
            bases = self._frozen_array("base_offset")
            n0 = len(bases)
            i = int(np.searchsorted(bases, offset, "left"))
            if i < n0 and bases[i] == offset:
                pids, epochs = self._frozen_array("producer_id"), self._frozen_array("epoch")
                statuses = self._frozen_array("status")
                while i < n0 and bases[i] == offset:
                    now = self._fixed.get(i, int(statuses[i]))
                    if (int(pids[i]), int(epochs[i])) == key and now == OPEN:
                        self._fixed[i] = status
                    i += 1
                if i < n0:
                    return
        c = self._lists
        bases_t, pids_t, epochs_t, status_t = (c["base_offset"], c["producer_id"], c["epoch"],
                                               c["status"])
        j = bisect.bisect_left(bases_t, offset)
        while j < len(bases_t) and bases_t[j] == offset:
            if (pids_t[j], epochs_t[j]) == key and status_t[j] == OPEN:
                status_t[j] = status
            j += 1

    def drop_before(self, n: int) -> None:
        self._thaw()
        for name in BATCH_COLUMNS:
            del self._lists[name][:n]

    def replace(self, i: int, j: int, rows: list[dict[str, Any]]) -> None:
        """Replace batches [i, j) with ``rows`` (dicts of column values)."""
        self._thaw()
        for name in BATCH_COLUMNS:
            self._lists[name][i:j] = [r[name] for r in rows]


def _column(name: str) -> property:
    def get(self: BatchColumns) -> list[Any]:
        if self._frozen is not None:
            self._thaw()
        return self._lists[name]

    def put(self: BatchColumns, value: list[Any]) -> None:
        self._thaw()
        self._lists[name] = value

    return property(get, put, doc=f"The batches' {name} values, as a list.")


for _name in BATCH_COLUMNS:
    setattr(BatchColumns, _name, _column(_name))


@dataclass
class PartitionState:
    next_slot: int = 0
    high_watermark: int = 0
    log_start_offset: int = 0
    batches: BatchColumns = field(default_factory=BatchColumns)
    open_txns: dict[tuple[int, int], OpenTxn] = field(default_factory=dict)
    fence_epoch: dict[int, int] = field(default_factory=dict)
    producers: dict[int, ProducerState] = field(default_factory=dict)
    aborted: list[AbortedTxn] = field(default_factory=list)
    last_append_ms: int = 0
    # Objects no longer referenced (after retention or compaction): (due_ms, key); deleted
    # once due, so readers holding older plans can finish first.
    pending_deletes: list[tuple[int, str]] = field(default_factory=list)

    # -- replay ------------------------------------------------------------------------

    def apply(self, e: Entry) -> None:
        """Apply the entry at slot ``next_slot``."""
        if e.slot != self.next_slot:
            raise CorruptObjectError(
                f"log entry for slot {e.slot} found where slot {self.next_slot} was expected"
            )
        if e.base_offset != self.high_watermark:
            raise CorruptObjectError(
                f"log entry at slot {e.slot} starts at offset {e.base_offset}, but the "
                f"previous entry ends at {self.high_watermark}: the offset chain is broken"
            )
        if e.kind == DATA:
            self._apply_data(e)
        elif e.kind in (COMMIT, ABORT):
            if e.extra is not None and e.extra.get(PARTS) is not None:
                # A COMMIT that carries its transaction's last batches: they are appended
                # (as a DATA entry of the same parts would be), then the marker, at the
                # entry's last offset, decides them with the rest.
                self._apply_data(e.marker_data())
                self._apply_marker(e, e.last_offset)
            else:
                self._apply_marker(e, e.base_offset)
        elif e.kind == BEGIN:
            self._apply_begin(e)
        elif e.kind == RETENTION:
            if e.log_start_offset is not None:
                self._apply_retention(e)
        elif e.kind == COMPACT:
            self._apply_compaction(e)
        elif e.kind == PURGE:
            until = int((e.extra or {}).get("purged_until_ms", 0))
            self.pending_deletes = [(d, k) for d, k in self.pending_deletes if d > until]
        self.high_watermark += e.count
        self.next_slot += 1
        self.last_append_ms = max(self.last_append_ms, e.append_ms)

    def _apply_retention(self, e: Entry) -> None:
        assert e.log_start_offset is not None
        new_start = min(e.log_start_offset, self.last_stable_offset)
        if new_start <= self.log_start_offset:
            return
        self.log_start_offset = new_start
        due = e.delete_due_ms
        self.pending_deletes.extend((due, k) for k in self.drop_batches_below(new_start))

    def _apply_compaction(self, e: Entry) -> None:
        """Replace the batches of [start, end) by runs of one segment object, if the range
        still holds exactly the objects the compactor planned from (else a no-op)."""
        x = e.extra or {}
        start, end = int(x["start"]), int(x["end"])
        b = self.batches
        i = bisect.bisect_left(b.base_offset, start)
        j = bisect.bisect_left(b.base_offset, end)
        if end > self.last_stable_offset or list(dict.fromkeys(b.data[i:j])) != x["replaces"]:
            return  # raced with retention or another compaction: keep what is there
        if any(st not in (PLAIN, COMMITTED, ABORTED, FENCED) for st in b.status[i:j]):
            return
        seg = str(x["segment"])
        rows = [{"base_offset": r[0], "count": r[1], "row": r[2], "append_ms": r[3],
                 "producer_id": r[4], "status": r[5], "epoch": r[6], "ts_min": r[7],
                 "ts_max": r[8], "data": seg, "nbytes": int(x["nbytes"]) if n == 0 else 0,
                 "txn_id": None, "object_rows": 0} for n, r in enumerate(x["runs"])]
        old = set(b.data[i:j])
        b.replace(i, j, rows)
        due = e.delete_due_ms
        self.pending_deletes.extend((due, k) for k in sorted(old) if k)

    def _apply_data(self, e: Entry) -> None:
        pid = e.producer_id
        if not e.transactional:
            status = PLAIN
        elif e.epoch <= self.fence_epoch.get(pid, -1):
            status = FENCED
        else:
            status = OPEN
            # A newer epoch from pid means any older open epoch of pid is over.
            for key in [k for k in self.open_txns if k[0] == pid and k[1] < e.epoch]:
                self._close(key, FENCED, e.base_offset)
        parts = e.extra.get(PARTS) if e.extra is not None else None
        offsets = [e.base_offset]
        if parts is None:
            self.batches.add(e, status)
        else:  # several objects in one entry: a batch each, as if appended one by one
            offsets = []
            base = e.base_offset
            for part in parts:
                self.batches.add_part(e, status, base, part)
                offsets.append(base)
                base += part[1]
        if status == OPEN:
            key = (pid, e.epoch)
            txn = self.open_txns.get(key)
            if txn is None:
                txn = OpenTxn(pid, e.epoch, e.base_offset, e.txn_id, first_append_ms=e.append_ms)
                self.open_txns[key] = txn
            txn.batches.extend(offsets)
        if e.base_sequence >= 0 and pid >= 0:
            self._record_sequence(e)

    def _apply_begin(self, e: Entry) -> None:
        """A transaction opens here before its first batch (model.BEGIN), as a first DATA
        entry would open it: a zombie's (fenced epoch) is ignored."""
        pid = e.producer_id
        if e.epoch <= self.fence_epoch.get(pid, -1):
            return
        for key in [k for k in self.open_txns if k[0] == pid and k[1] < e.epoch]:
            self._close(key, FENCED, e.base_offset)
        if (pid, e.epoch) not in self.open_txns:
            self.open_txns[(pid, e.epoch)] = OpenTxn(pid, e.epoch, e.base_offset, e.txn_id,
                                                     first_append_ms=e.append_ms)

    def _record_sequence(self, e: Entry) -> None:
        last_seq = e.base_sequence + e.count - 1
        p = self.producers.get(e.producer_id)
        if p is None or e.epoch != p.epoch:
            p = ProducerState(epoch=e.epoch, last_seq=last_seq)
            self.producers[e.producer_id] = p
        p.last_seq = max(p.last_seq, last_seq)
        p.recent.append((e.base_sequence, last_seq, e.base_offset))
        del p.recent[:-RECENT_BATCHES]
        p.last_ms = e.append_ms

    def _apply_marker(self, e: Entry, offset: int) -> None:
        """A COMMIT/ABORT marker of (producer id, epoch) at ``offset``."""
        pid = e.producer_id
        key = (pid, e.epoch)
        if key in self.open_txns:
            self._close(key, COMMITTED if e.kind == COMMIT else ABORTED, offset)
        for k in [k for k in self.open_txns if k[0] == pid and k[1] < e.epoch]:
            self._close(k, FENCED, offset)
        if e.epoch > self.fence_epoch.get(pid, -1):
            self.fence_epoch[pid] = e.epoch

    def _close(self, key: tuple[int, int], status: int, marker_offset: int) -> None:
        txn = self.open_txns.pop(key)
        for off in dict.fromkeys(txn.batches):
            # None left at the offset: dropped by retention.
            self.batches.decide(off, key, status)
        if status == ABORTED:
            self.aborted.append(AbortedTxn(txn.producer_id, txn.first_offset, marker_offset))

    # -- derived values ------------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        if not self.open_txns:
            return self.high_watermark
        return min(t.first_offset for t in self.open_txns.values())

    def end_offset(self, isolation: str) -> int:
        return self.last_stable_offset if isolation == READ_COMMITTED else self.high_watermark

    def earliest_open_txn(self) -> OpenTxn | None:
        if not self.open_txns:
            return None
        return min(self.open_txns.values(), key=lambda t: t.first_offset)

    def aborted_ranges(self, start: int, end: int) -> list[AbortedTxn]:
        """Kafka's aborted-transaction index entries that overlap [start, end)."""
        return [a for a in self.aborted if a.first_offset < end and a.last_offset >= start]

    # -- idempotence -----------------------------------------------------------------------

    def check_sequence(
        self, producer_id: int, epoch: int, base_sequence: int, count: int, transactional: bool
    ) -> int | None:
        """Validate a new batch before it is appended.

        Returns the original base offset when the batch is a retry of one already in the
        log (a duplicate), None when it may be appended; raises on fencing or a gap.
        """
        if transactional and epoch <= self.fence_epoch.get(producer_id, -1):
            raise ProducerFencedError(
                f"producer {producer_id} epoch {epoch} was fenced: its transaction already "
                "ended in this partition; a newer producer owns the transactional.id"
            )
        if base_sequence < 0:
            return None
        p = self.producers.get(producer_id)
        if p is not None and epoch < p.epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {epoch} is older than the epoch {p.epoch} "
                "already written to this partition: this producer was fenced"
            )
        if p is None and base_sequence != 0:
            raise UnknownProducerIdError(
                f"producer {producer_id} sent sequence {base_sequence}, but this partition "
                "keeps no state for it (expired after producer.id.expiration.ms, or never "
                "written): start again from sequence 0 with a new producer id")
        if p is None or epoch > p.epoch:
            if base_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} epoch {epoch} starts at sequence {base_sequence}, "
                    "expected 0: earlier batches are missing"
                )
            return None
        last = base_sequence + count - 1
        for first_seq, last_seq, base_offset in p.recent:
            if first_seq == base_sequence and last_seq == last:
                return base_offset
        if base_sequence != p.last_seq + 1:
            raise OutOfOrderSequenceError(
                f"producer {producer_id} sent sequence {base_sequence} but the partition "
                f"expects {p.last_seq + 1}: a batch in between is missing or was reordered"
            )
        return None

    # -- planning ----------------------------------------------------------------------------

    def batch_index_at(self, offset: int) -> int:
        """Index of the first batch whose end is above ``offset``."""
        b = self.batches
        i = bisect.bisect_right(b.base_offset, offset) - 1
        if i < 0:
            return 0
        if b.base_offset[i] + b.count[i] <= offset:
            return i + 1
        return i

    def plan_read(self, start: int, end: int | None, isolation: str = READ_COMMITTED,
                  ) -> tuple[list[ReadSpan], int]:
        """The batch objects (with edge trims) a read of [start, end) returns.

        Returns the spans and the offset the reader's position moves to once it has
        consumed them all: the read's upper bound (the LSO or high watermark, capped by
        ``end``), which skips trailing markers and aborted batches.
        """
        picked, lo, limit = self.read_indices(start, end, isolation)
        b = self.batches
        bases, counts = b.base_offset, b.count
        return [ReadSpan(b.data[i], bases[i], counts[i], max(bases[i], lo),
                         min(bases[i] + counts[i], limit), b.status[i], b.producer_id[i],
                         b.append_ms[i], b.row[i]) for i in picked], limit

    def read_indices(self, start: int, end: int | None, isolation: str = READ_COMMITTED,
                     ) -> tuple[list[int], int, int]:
        """What :meth:`plan_read` returns, as positions in ``batches``: ``(picked, lo,
        limit)``; batch ``i`` of ``picked`` is read over offsets ``[max(base, lo),
        min(base + count, limit))``, never empty.  For planners of many batches, which
        need not build a span per batch."""
        if isolation not in ISOLATION_LEVELS:
            raise ValueError(f"unknown isolation level {isolation!r}")
        limit = self.end_offset(isolation)
        if end is not None:
            limit = min(limit, end)
        start = max(start, self.log_start_offset)
        if start >= limit:
            return [], start, start
        b = self.batches
        bases, counts, statuses = b.base_offset, b.count, b.status
        first = self.batch_index_at(start)
        stop = bisect.bisect_left(bases, limit, first)  # batches from here start at limit
        if isolation == READ_COMMITTED:
            picked = [i for i in range(first, stop) if statuses[i] in VISIBLE and counts[i]]
        else:
            picked = [i for i in range(first, stop) if counts[i]]
        # Offsets are dense and batches do not overlap, so only the first and last batch
        # can be cut by [start, limit); any that the cut leaves empty is dropped.
        while picked and max(bases[picked[0]], start) >= min(bases[picked[0]]
                                                              + counts[picked[0]], limit):
            picked.pop(0)
        while picked and max(bases[picked[-1]], start) >= min(bases[picked[-1]]
                                                               + counts[picked[-1]], limit):
            picked.pop()
        return picked, start, limit

    def drop_batches_below(self, offset: int) -> list[str]:
        """Forget batches wholly below ``offset``; returns their objects no longer used."""
        b = self.batches
        n = 0
        while n < len(b) and b.base_offset[n] + b.count[n] <= offset:
            n += 1
        dropped = set(b.data[:n])
        if n:
            b.drop_before(n)
        still = set(b.data[: min(len(b), 64)])  # a segment's later runs sit right after
        return sorted(k for k in dropped if k and k not in still)

    def visible_batch_count(self) -> int:
        return sum(1 for s in self.batches.status if s in VISIBLE)

    def size_bytes(self) -> int:
        """The partition's stored bytes (a shared object's batches count their share)."""
        return sum(self.batches.shares())

