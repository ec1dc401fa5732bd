"""The record accumulator: per-partition batches, linger, joining a queued batch, and the
memory bound (``buffer.memory``) that makes send() wait."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import wait
from dataclasses import dataclass, field

import pyarrow as pa

from txlog.partitioner import partition_for_key
from txlog.producer.core import State
from txlog.producer.futures import _Outcome
from txlog.producer.sender import MAX_UPLOADS, Sender
from txlog.records import CheckedRow, TopicPartition, checked_kafka_batch

_log = logging.getLogger(__name__)


def mono_ms() -> int:
    """Milliseconds on the monotonic clock: linger is a duration, which a wall clock that
    jumps (NTP, a resumed VM) would stretch or cut short."""
    return time.monotonic_ns() // 1_000_000


#: Steps (batch writes, pipelined commits) queued before send() waits for the oldest.
MAX_QUEUED_STEPS = 16


#: A queued batch that has not started uploading takes later batches of its partition
#: up to this many ``batch.size``s: behind a backlog, one object and one entry carry
#: several batches, as a Kafka produce request carries every batch ready for its broker
#: (measured in docs/benchmarks.md).
JOIN_BATCHES = 4


@dataclass
class _PendingBatch:
    rows: list[CheckedRow] = field(default_factory=list)
    tables: list[pa.Table] = field(default_factory=list)
    nbytes: int = 0
    first_ms: int = 0  # on the monotonic clock (mono_ms)
    table_rows: int = 0  # rows in ``tables`` (counted once per send, not summed)
    # What its futures wait for (its ``written`` event: see _Outcome).
    outcome: _Outcome = field(default_factory=_Outcome)
    # Later batches of the partition that joined this one while it waited to upload
    # (their records follow this batch's; their outcomes point to this one's).
    joined: list[_PendingBatch] = field(default_factory=list)

    # The (min, max) of the timestamps in ``tables`` (None: no record there has one),
    # and whether some record there has none: the log entry's fields.
    ts_min: int | None = None
    ts_max: int | None = None
    untimed: bool = False

    @property
    def written(self) -> threading.Event | None:
        """Set once the batch is resolved (kept in its outcome only, where get() looks)."""
        return self.outcome.written

    def set_event(self) -> None:
        """Give a transaction's batch its ``written`` event (when queued for writing)."""
        if self.outcome.written is None:
            self.outcome.written = threading.Event()

    def resolve(self, base: int) -> None:
        self.outcome.base = base

    def fail(self, exc: BaseException) -> None:
        self.outcome.error = exc

    def count(self) -> int:
        return len(self.rows) + self.table_rows + sum(j.count() for j in self.joined)

    def add_table(self, table: pa.Table, ts: tuple[int | None, int | None, bool]) -> None:
        """Add records already in the topic's schema, with their ts_range()."""
        self.tables.append(table)
        self.table_rows += table.num_rows
        lo, hi, untimed = ts
        if not table.num_rows:
            return
        if lo is not None and hi is not None:
            self.ts_min = lo if self.ts_min is None else min(self.ts_min, lo)
            self.ts_max = hi if self.ts_max is None else max(self.ts_max, hi)
        self.untimed |= untimed

    def seal(self) -> None:
        """Turn the records sent one at a time into a table, on the thread that closes
        the batch (a sender, the linger thread, a commit): building it on a writer
        thread made the writer wait for the GIL, which the sender holds, at every
        pyarrow call, and the uploads fell behind."""
        if self.rows:
            table, lo, hi = checked_kafka_batch(self.rows)
            self.add_table(table, (lo, hi, False))
            self.rows = []

    def ts_range(self) -> tuple[int | None, int | None, bool]:
        """What records.ts_range() gives for the batch's table, joined batches and all
        (every part sealed)."""
        lo = hi = None
        untimed = False
        for part in (self, *self.joined):
            if part.ts_min is not None and part.ts_max is not None:
                lo = part.ts_min if lo is None else min(lo, part.ts_min)
                hi = part.ts_max if hi is None else max(hi, part.ts_max)
            untimed |= part.untimed
        if lo is None or hi is None:
            return None, None, True
        return lo, hi, untimed

    def set_written(self) -> None:
        """Wake every get() waiting on this batch, also on a joined batch's own event (a
        plain producer's batch has one from the start, and a get() may wait on it)."""
        for b in (self, *self.joined):
            if b.written is not None:
                b.written.set()

    def join(self, later: _PendingBatch) -> None:
        """Take ``later``'s records after this batch's (the caller holds the lock that
        keeps this batch's upload from starting)."""
        # (shift before parent: a get() that sees the parent sees the shift too)
        later.outcome.shift = self.count()
        later.outcome.parent = self.outcome
        self.joined.append(later)
        self.nbytes += later.nbytes



class Accumulator(Sender):
    def _partition_of(self, topic: str, n: int, partition: int | None,
                      key: bytes | None) -> TopicPartition:
        """The record's TopicPartition, one shared object per partition."""
        p = self._choose_partition(topic, n, partition, key)
        tps = self._tps.get(topic)
        if tps is None or len(tps) != n:  # a topic deleted and made again may differ
            tps = self._tps[topic] = [TopicPartition(topic, i) for i in range(n)]
        return tps[p]

    def _choose_partition(self, topic: str, n: int, partition: int | None,
                          key: bytes | None) -> int:
        if partition is not None:
            if not 0 <= partition < n:
                from txlog.errors import UnknownTopicError

                raise UnknownTopicError(
                    f"topic {topic!r} has partitions 0..{n - 1}, not {partition}")
            return partition
        if key:
            return partition_for_key(key, n)
        return self._rr.next(n)

    def _new_batch(self) -> _PendingBatch:
        """A partition's next batch (the caller holds ``_lock``); wakes the linger thread,
        started with the first batch of a non-transactional producer."""
        if self.transactional_id is not None:
            return _PendingBatch(first_ms=mono_ms())
        if self._wake is None:
            self._wake = threading.Condition(self._lock)
            self._lingerer = threading.Thread(target=self._linger, daemon=True,
                                              name="txlog-linger")
            self._lingerer.start()
        self._wake.notify()
        return _PendingBatch(first_ms=mono_ms(), outcome=_Outcome(threading.Event()))

    def _linger(self) -> None:
        """Write each batch once linger.ms has passed since its first record."""
        wake = self._wake
        assert wake is not None
        with wake:
            while self.state != State.CLOSED:
                if not self._pending:
                    wake.wait()
                    continue
                now = mono_ms()
                due = [tp for tp, b in self._pending.items()
                       if now - b.first_ms >= self.linger_ms]
                if due and not self._writes_idle():
                    # No callback wakes this thread when a write ends (the committer
                    # never takes the producer's lock): look again shortly.
                    wake.wait(0.002)
                    continue
                if not due:
                    first = min(b.first_ms for b in self._pending.values())
                    wake.wait(max(1, first + self.linger_ms - now) / 1000)
                    continue
                try:
                    self._flush_partitions(due)
                except Exception as exc:
                    # The batches' futures carry it; send_batch() has none, so the next
                    # flush() (or close()) raises it, as it would have written the batch.
                    _log.debug("linger flush failed: %s", exc)
                    self._linger_error = exc

    def _maybe_flush(self, tp: TopicPartition, batch: _PendingBatch) -> None:
        if self._pending_bytes + self._queued_bytes > self.buffer_memory:
            # buffer.memory bounds the batches still filling too, or many partitions'
            # open batches alone could hold partitions x batch.size; once it is used up
            # every batch goes, as Kafka's accumulator treats all batches as ready when
            # its pool is exhausted, and _backpressure waits for room.
            self._flush_partitions(list(self._pending))
        elif batch.nbytes >= self.batch_size:
            # Batches past linger go with it, as Kafka's sender drains every ready batch:
            # while full ones keep the writes busy, a quiet partition's would wait on.
            now = mono_ms()
            self._flush_partitions([tp] + [t for t, b in self._pending.items()
                                           if t != tp and now - b.first_ms >= self.linger_ms])
        elif self._queued_steps < MAX_UPLOADS and mono_ms() - batch.first_ms >= self.linger_ms:
            # (_writes_idle() inlined, and the clock read only then: once per record)
            self._flush_partitions([tp])

    def _writes_idle(self) -> bool:
        """Whether a batch past linger may go on its own now: while two or more writes
        (or commits) are queued it keeps growing instead, as Kafka's batches wait for a
        free in-flight slot (many small batches would each cost the committer a request,
        and it would fall behind).  Full batches always go, and take such batches along."""
        return self._queued_steps < MAX_UPLOADS

    def _flush_partitions(self, tps: list[TopicPartition]) -> None:
        self._reap_pipeline()  # raises a failure before anything is taken
        tps = [tp for tp in tps if tp in self._pending]
        if not tps:
            return
        failed: Exception | None = None
        try:
            self._seal_pending(tps)
        except Exception as exc:  # that batch failed; the others are written
            failed = exc
        batches = self._join_queued([(tp, self._pending.pop(tp)) for tp in tps
                                     if tp in self._pending])
        self._pending_bytes = sum(b.nbytes for b in self._pending.values())
        # Written in the background, as Kafka's sender thread does: the caller goes on
        # queueing records while the objects upload and the committer appends their
        # entries in order.  A transaction's writes wait for nothing but its commit.
        if batches:
            self._queue(self._write_batches, batches)
        if failed is not None and self.transactional_id is None:
            # The failed batch's futures carry it, and the next flush() raises it (a
            # transaction's state does): the caller's own record may be queued, so
            # send() must not raise.
            with self._qlock:
                self._linger_error = self._linger_error or failed
        self._backpressure()

    def _seal_pending(self, tps: list[TopicPartition]) -> None:
        """Seal these partitions' pending batches (the caller holds ``_lock``).  send()
        checked every record, so this should not fail; if a batch cannot be sealed all
        the same, it fails (its futures get the error, and it leaves ``_pending``) and so
        does an open transaction, instead of being lost unnoticed; then this raises."""
        failed: BaseException | None = None
        for tp in tps:
            batch = self._pending[tp]
            try:
                batch.seal()
            except Exception as exc:
                del self._pending[tp]
                self._pending_bytes -= batch.nbytes
                self._fail_batches([batch], exc)
                failed = failed or exc
        if failed is None:
            return
        if self.transactional_id is not None:
            with self._qlock:
                if self.state == State.IN_TRANSACTION:
                    self.state = State.ABORTABLE_ERROR
                    self._error = failed
        raise failed

    def _backpressure(self) -> None:
        """Wait for the oldest queued steps while too much is queued: queued batches hold
        memory (as Kafka's buffer.memory bounds), and each step costs the committer at
        least one request.  The oldest only, so the uploads never run dry."""
        limit = self.buffer_memory
        while self._queued_bytes > limit or self._queued_steps > MAX_QUEUED_STEPS:
            with self._qlock:
                while self._steps and self._steps[0].done():
                    self._steps.popleft()
                oldest = self._steps[0] if self._steps else None
            if oldest is None:
                return
            wait([oldest])

    def _join_queued(self, batches: list[tuple[TopicPartition, _PendingBatch]],
                     ) -> list[tuple[TopicPartition, _PendingBatch]]:
        """Let each batch join its partition's last queued batch if that one has not
        started uploading (at most JOIN_BATCHES batch sizes together); returns the rest.
        A commit's last batch, a linger flush or a full batch behind a backlog then
        costs no object and no log entry of its own, as a Kafka batch takes records
        until it is sent."""
        rest = []
        with self._qlock:
            # Not into a step that an earlier failure dooms: a batch sent after the
            # failure was known goes on (a plain producer's), in a step of its own.
            doomed = self._pipeline_error is not None
            for tp, b in batches:
                tail = self._tails.get(tp)
                if tail is not None and not tail[0].started and not doomed \
                        and tail[0].step > self._skip_through \
                        and tail[1].nbytes + b.nbytes <= JOIN_BATCHES * self.batch_size:
                    tail[1].join(b)
                    tail[0].nbytes += b.nbytes
                    self._queued_bytes += b.nbytes
                else:
                    rest.append((tp, b))
        return rest
