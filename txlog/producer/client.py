"""The producer: Kafka's client API over txlog partition logs.

Non-transactional producers are idempotent by default (a producer id and per-partition
sequence numbers, so a retried append is recognised).  With ``transactional_id`` the
producer runs Kafka's transaction protocol through the in-process coordinator:
partitions are registered before the first write to them, and every transaction end
bumps the epoch.

Records are batched per partition (``batch.size`` bytes or ``linger.ms`` since the first
record, checked on each send) and every batch is written on flush, commit or close.  A
batch is written in the background, as Kafka's sender thread does: its object uploads
(two at a time) and a committer thread appends the entries in order, while the caller
goes on sending; ``flush()`` and commits wait for what was queued, and too much queued
makes ``send()`` wait for the oldest write.  A batch past linger goes on its own once
fewer than two writes are queued (it grows meanwhile); a full one always goes, and takes
the batches past linger along.  A batch joins its partition's last queued batch whose
upload has not started (up to four batch sizes together): behind a backlog, one object
and one entry carry several batches.  A non-transactional producer also runs a
linger thread that queues a batch once ``linger.ms`` has passed with no further send: a
quiet producer's records do not wait for ``flush()``.  (A transactional producer's
records become visible only at commit, which writes them anyway.)  Without a
transaction a failed write fails its batch's futures, those of the writes queued before
the failure was known (nothing lands behind a lost batch), and the next ``flush()``; in
a transaction it fails the transaction, as below.

``commit_transaction()`` returns once PrepareCommit is durable (the outcome is decided
then: anyone who meets it rolls it forward), as Kafka answers EndTxn before its markers
are written.  The committer thread writes the markers and CompleteCommit while the caller
goes on; the next write of a transaction, the next end and ``close()`` come after them,
because the next transaction needs the epoch that CompleteCommit hands out.  When the
next transaction's first write is already queued by then, CompleteCommit is written
together with its AddPartitions, in one state-log write.  ``abort_transaction()``
finishes its markers before it returns.

``commit_transaction_async()`` does not wait even for PrepareCommit: the transaction's
last batches and its PrepareCommit are written by a committer thread while the caller
begins the next transaction (as Flink's two-phase-commit sinks keep producing while the
last checkpoint's transaction commits).  The commit is a step in the same queue as the
batch writes, so the next transaction's entries follow the last one's commit and carry
the epoch it hands out.  In a transaction, if a queued step fails, the later ones are
skipped and the next operation of the caller raises its error: the open transaction (and
the failed one, if it was never decided) must be aborted, or, after a fatal error, the
producer closed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, NamedTuple

import pyarrow as pa

from txlog import fanout
from txlog.errors import InvalidTxnStateError, TxlogError
from txlog.names import CONSUMER_OFFSETS_TOPIC, INTERNAL_TOPICS, validate_id
from txlog.offsets import encode_offset_commits, offsets_partition
from txlog.producer.core import _CLOSING, State
from txlog.producer.futures import RecordMetadata, SendFuture
from txlog.producer.transactions import TransactionManager
from txlog.records import TopicPartition, checked_row, conform, largest_record, ts_range

_log = logging.getLogger(__name__)


class StagedObject(NamedTuple):
    """An already-written batch object to append (see Producer.send_staged_many)."""

    tp: TopicPartition
    key: str
    rows: int
    nbytes: int
    ts_min: int | None = 0
    ts_max: int | None = 0
    untimed: bool = False


def _run_bounded(fn: Callable[[], None], timeout: float) -> bool:
    """Run ``fn`` on a helper thread for up to ``timeout`` seconds; True if it finished
    (its error is raised here), False if it is still running (it goes on by itself)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            failure.append(exc)

    t = threading.Thread(target=run, name="txlog-close", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return False
    if failure:
        raise failure[0]
    return True



class Producer(TransactionManager):




    def init_transactions(self) -> None:
        """Register this instance as the owner of its transactional.id, fencing older ones
        and completing or aborting whatever they left open."""
        self._require_txn()
        if self.state is not State.UNINITIALIZED:
            # As Kafka's client: an instance initialises once (a second call would fence
            # this very instance's open transaction); create a new producer instead.
            raise InvalidTxnStateError(
                f"init_transactions() was already called (state {self.state.value}); it "
                "runs once per producer")
        assert self.transactional_id is not None
        self.producer_id, self.epoch = self.log.coordinator.init_producer_id(
            self.transactional_id, self.timeout_ms)
        self._seq.clear()
        self.state = State.READY

    def begin_transaction(self) -> None:
        self._require_txn()
        self._reap_pipeline()  # a failed pipelined commit fails the next begin
        with self._lock, self._qlock:  # not over a failure another thread has just taken
            if self._sends_closed is _CLOSING:
                self._refuse_send("begin_transaction()")
            self._check_state(State.READY, "begin_transaction()")
            self.state = State.IN_TRANSACTION
            self._sends_closed = None
        if not self._pipelining():  # else the queued commit resets them when it ends
            self._registered.clear()
            self._held.clear()
            self._unbegun.clear()
            self._seq.clear()

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int],
                                    group_id: str) -> None:
        """Commit consumer offsets as part of the transaction (visible only if it commits)."""
        self._require_txn()
        self._check_state(State.IN_TRANSACTION, "send_offsets_to_transaction()")
        validate_id("group.id", group_id)
        self._topic_info(CONSUMER_OFFSETS_TOPIC)  # a failure here fails the transaction
        if not offsets:
            return  # nothing to commit (as in Kafka): no batch of no records
        tp = offsets_partition(self.log, group_id)
        table = encode_offset_commits(group_id, offsets)
        with self._lock:
            self._check_sends_open("send_offsets_to_transaction()")
            self._guard(lambda: self._append_now(tp, table))

    def add_partitions_to_transaction(self, tps: Any) -> None:
        """Register ``tps`` with the open transaction in one state-log write (optional:
        every write registers its own partition; this saves a write per partition when
        many are about to be written, e.g. by a Spark commit)."""
        self._require_txn()
        self._check_state(State.IN_TRANSACTION, "add_partitions_to_transaction()")
        tps = [TopicPartition(*tp) for tp in tps]
        for tp in tps:
            self.log.partition_log(tp)  # validates topic and partition
        with self._lock:
            self._check_sends_open("add_partitions_to_transaction()")
            self._guard(lambda: self._register(tps))

    def send_app_version(self, app_id: str, version: int) -> None:
        """Record, inside this transaction, that ``app_id`` committed ``version`` (Delta's
        txnAppId/txnVersion): visible through committed_app_version() once it commits."""
        from txlog.app_versions import app_version_offsets

        group, offsets = app_version_offsets(app_id, version)
        self.send_offsets_to_transaction(offsets, group)

    def commit_transaction(self) -> None:
        """Commit; returns once the outcome is decided (PrepareCommit is durable)."""
        self._require_txn()
        # The commit is queued behind the transaction's writes, as a pipelined one is:
        # its last batches then upload while the earlier ones are still being appended,
        # and PrepareCommit follows the last entry on the committer thread at once.
        decided, _ = self._queue_commit()
        self._raise_if_failed(decided)

    def commit_transaction_async(self) -> Future[None]:
        """Commit without waiting: the transaction's last batches and its PrepareCommit are
        written by the committer thread, and the caller may begin the next transaction at
        once.  The returned future resolves when the commit is decided (what
        :meth:`commit_transaction` waits for) and its markers are written, or raises why
        it failed; then the producer's next operation raises too, and
        :meth:`abort_transaction` aborts what is open.  (If the markers fail, the
        future still resolves: the commit holds, and the producer writes them later.)  So
        a read in its callbacks, or on a thread they wait for, sees the commit, and the
        future cannot be cancelled.

        Sends of the next transaction are queued behind this commit (up to
        ``buffer.memory`` or 16 flushes of them, then ``send()`` waits).  This call
        queues the commit (its batches start uploading), then waits until the previous
        commit is decided, so at most one undecided commit is left when it returns.  If
        the previous commit failed, this one is not written and its error is raised
        here.  Do not call the
        producer from a callback of the returned future: callbacks run on the committer
        thread, which must not wait for itself."""
        self._require_txn()
        prev = self._last_commit
        undecided = prev is not None and not prev.done()  # else reaped below or before
        _, fut = self._queue_commit()
        if prev is None or not undecided:
            return fut
        # If that commit failed, this one is skipped: raise its cause now.
        self._raise_if_failed(prev)
        return fut

    def abort_transaction(self) -> None:
        self._require_txn()
        self._await_pipeline(quiet=True)  # its failure leaves an abortable state
        if self.state not in (State.IN_TRANSACTION, State.ABORTABLE_ERROR):
            raise InvalidTxnStateError(f"abort_transaction() in state {self.state.value}")
        with self._lock:
            if self._sends_closed is not None and self.state is State.IN_TRANSACTION:
                self._refuse_send("abort_transaction()")  # a commit was queued
            self._sends_closed = "its transaction is being aborted"
            for batch in self._pending.values():
                batch.fail(InvalidTxnStateError("transaction aborted before the batch was sent"))
            self._pending.clear()
            self._pending_bytes = 0
        with self._qlock:
            self._tails.clear()
        self._abort_now()

    def send(self, topic: str, value: Any = None, key: Any = None, *,
             partition: int | None = None, headers: Any = None,
             timestamp_ms: int | None = None) -> SendFuture:
        """Queue one record; returns a future whose offset is known after flush()."""
        # Called once per record: the common case avoids every call and allocation it
        # can (a sum over an empty generator, a lock in Log.topic() and a new
        # TopicPartition per record were a third of the producer's GIL time).
        if self.state is not self._sending_state:
            self._check_can_send()
        if topic in INTERNAL_TOPICS:
            self._refuse_internal(topic)
        info = self._topic_info(topic)
        if not info.kafka_shaped:
            if not isinstance(value, Mapping):
                raise TypeError(
                    f"topic {topic!r} is typed: send a dict of its columns as value, or "
                    "use send_batch() with an Arrow table")
            return self._queue_table(topic, pa.Table.from_pylist([dict(value)]), partition,
                                     key)
        row = checked_row(key, value, headers, timestamp_ms)
        kb, vb = row[0], row[1]
        tp = self._partition_of(topic, info.partitions, partition, kb)
        size = (len(kb) if kb else 0) + (len(vb) if vb else 0)
        if row[2]:
            size += sum(len(h["key"].encode()) + len(h["value"] or b"") for h in row[2])
        if size > self._max_record:
            self._too_large(topic, size)
        with self._lock:
            # Overtaken since the check above? (_check_sends_open inline: once per record)
            if self._sends_closed is not None:
                self._refuse_send("send()")
            batch = self._pending.get(tp)
            if batch is None:
                batch = self._pending[tp] = self._new_batch()
            fut = SendFuture(tp, len(batch.rows) + batch.table_rows, batch.outcome)
            batch.rows.append(row)
            batch.nbytes += size + 16
            self._pending_bytes += size + 16
            self._maybe_flush(tp, batch)
        return fut

    def send_batch(self, topic: str, table: pa.Table, *, partition: int | None = None,
                   ) -> list[RecordMetadata] | None:
        """Queue an Arrow table of records (columns of the topic, or key/value/headers/
        timestamp for Kafka-shaped topics) for one partition."""
        self._check_can_send()
        if topic in INTERNAL_TOPICS:
            self._refuse_internal(topic)
        info = self._topic_info(topic)  # an unknown topic fails the open transaction
        if not isinstance(table, pa.Table):
            raise TypeError("send_batch() takes a pyarrow.Table")
        if not table.num_rows:
            # Checked all the same, then nothing to write: a batch of no records would
            # start where the next one does.
            conform(table, info.schema, topic, kafka_shaped=info.kafka_shaped)
            if partition is not None:
                self._choose_partition(topic, info.partitions, partition, None)
            return None
        self._queue_table(topic, table, partition, None)
        return None

    def _queue_table(self, topic: str, table: pa.Table, partition: int | None,
                     key: Any) -> SendFuture:
        """Queue ``table`` (checked here: a bad table fails this call, not its batch)."""
        info = self.log.topic(topic)
        table = conform(table, info.schema, topic, kafka_shaped=info.kafka_shaped)
        if table.nbytes > self._max_record:  # else no record in it can be too large
            largest = largest_record(table)
            if largest > self._max_record:
                self._too_large(topic, largest)
        ts = ts_range(table)
        kb = key.encode() if isinstance(key, str) else key
        tp = self._partition_of(topic, info.partitions, partition, kb)
        with self._lock:
            self._check_sends_open("send()")  # overtaken since the caller's check
            batch = self._pending.get(tp)
            if batch is None:
                batch = self._pending[tp] = self._new_batch()
            batch.seal()  # records sent one at a time before it come first
            fut = SendFuture(tp, batch.table_rows, batch.outcome)
            batch.add_table(table, ts)
            batch.nbytes += table.nbytes
            self._pending_bytes += table.nbytes
            self._maybe_flush(tp, batch)
        return fut

    def send_staged(self, tp: TopicPartition, data_key: str, num_rows: int, nbytes: int,
                    ts_min: int | None = 0, ts_max: int | None = 0, *,
                    untimed: bool = False) -> int:
        """Append an already-written batch object (e.g. a Spark task's staged Parquet file)
        to ``tp`` without copying it; returns its base offset.  The object must match the
        topic's schema; the caller checked it when it wrote the file.  An object of no
        records is left out (-1, as Kafka gives for an offset it does not know): a batch
        of none would start where the next one does."""
        if self.transactional_id is not None:
            self._check_state(State.IN_TRANSACTION, "send_staged()")
        tp = TopicPartition(*tp)
        if tp.topic in INTERNAL_TOPICS:
            self._refuse_internal(tp.topic)
        self._topic_info(tp.topic)  # a failure here fails the transaction
        self.log.partition_log(tp)  # validates topic and partition
        with self._lock:
            self._check_sends_open("send_staged()")
            if num_rows <= 0:
                return -1
            return int(self._guard(lambda: self._append_object(
                tp, data_key, num_rows, nbytes, ts_min, ts_max, untimed)))

    def send_staged_many(self, items: list[StagedObject]) -> list[int]:
        """send_staged() for several objects: each partition's appends in the given
        order, different partitions' at the same time in a transaction (their logs are
        independent; the commit comes after all of them, as always).  Returns the base
        offsets in the order of ``items`` (-1 for an object of no records, left out as
        send_staged() leaves it)."""
        if self.transactional_id is not None:
            self._check_state(State.IN_TRANSACTION, "send_staged_many()")
        groups: dict[TopicPartition, list[int]] = {}
        for i, it in enumerate(items):
            tp = TopicPartition(*it.tp)
            if tp.topic in INTERNAL_TOPICS:
                self._refuse_internal(tp.topic)
            self._topic_info(tp.topic)  # a failure here fails the transaction
            self.log.partition_log(tp)  # validates topic and partition
            if it.rows > 0:
                groups.setdefault(tp, []).append(i)
        bases = [-1] * len(items)
        stop = threading.Event()  # one partition failed: the others stop appending

        def append(i: int) -> None:
            it = items[i]
            bases[i] = self._append_object(TopicPartition(*it.tp), it.key, it.rows,
                                           it.nbytes, it.ts_min, it.ts_max, it.untimed)

        def one_partition(tp: TopicPartition) -> None:
            for i in groups[tp]:
                if stop.is_set():
                    return
                try:
                    append(i)
                except BaseException:
                    stop.set()
                    raise

        def append_all() -> None:
            # Registered first, in one state-log write, not by each thread on its own.
            self._register(list(groups))
            if self.transactional_id is None or len(groups) < 2:
                # In the given order: a plain producer's appends land as they go.
                for i in range(len(items)):
                    if items[i].rows > 0:
                        append(i)
                return
            # Every append has ended before the caller goes on.
            errors = [e for e in fanout.errors(one_partition, list(groups)) if e is not None]
            if errors:
                # The gravest decides the state (_guard): a fence or an unknown outcome
                # over an abortable store error; the rest are logged.
                worst = next((e for e in errors
                              if not (isinstance(e, TxlogError) and e.abortable)), errors[0])
                for e in errors:
                    if e is not worst:
                        _log.warning("staged append also failed on another partition: %r", e)
                raise worst

        with self._lock:
            self._check_sends_open("send_staged_many()")
            self._guard(append_all)
        return bases

    def partitions_for(self, topic: str) -> list[TopicPartition]:
        """The partitions of ``topic`` (raises UnknownTopicError if there is none)."""
        return self.log.partitions_for(topic)

    def metrics(self) -> dict[str, Any]:
        """This producer's state and queue, with the root's store and transaction metrics
        (``Log.metrics()``) under ``"log"``."""
        with self._qlock:
            queued_bytes, queued_steps = self._queued_bytes, self._queued_steps
        with self._lock:
            pending_bytes = sum(b.nbytes for b in self._pending.values())
        return {"transactional_id": self.transactional_id, "state": self.state.value,
                "producer_id": self._producer_id, "epoch": self._epoch,
                "queued_bytes": queued_bytes, "queued_writes": queued_steps,
                # What buffer.memory bounds: batches still filling and those queued.
                "buffered_bytes": pending_bytes + queued_bytes,
                "pending_partitions": len(self._pending), "log": self.log.metrics()}

    def flush(self) -> None:
        """Write every queued batch (and wait for the committer's queue).  Without a
        transaction, raises the error of a background write that failed since the last
        flush."""
        with self._lock:
            self._flush_partitions(list(self._pending))
        self._await_pipeline()
        with self._qlock:
            exc, self._linger_error = self._linger_error, None
        if exc is not None:
            raise exc

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued, finish the last commit and, as Kafka's client does on a
        graceful close, abort a transaction left open (else it would hold the LSO of
        every partition it wrote until its timeout).  ``timeout`` (seconds) bounds the
        wait: once it passes, or with 0, the producer closes at once, and an open
        transaction is left for readers or ``txlog maintain`` to abort after its
        timeout (Kafka's forced close)."""
        if self.state == State.CLOSED:
            return
        with self._lock:  # what is sent from here on would miss the flush below
            self._sends_closed = _CLOSING
        finished = True
        try:
            if timeout is None:
                self._close_work()
            else:
                finished = timeout > 0 and _run_bounded(self._close_work, timeout)
                if not finished:
                    _log.warning("close(timeout=%s): closing without waiting; anything "
                                 "still open is aborted after transaction.timeout.ms",
                                 timeout)
        finally:
            with self._lock:
                self._fail_batches(list(self._pending.values()),
                                   InvalidTxnStateError("the producer was closed first"))
                self._pending.clear()
                self._pending_bytes = 0
                self.state = State.CLOSED
                self._sends_closed = "the producer is closed"
                if self._wake is not None:
                    self._wake.notify_all()  # the linger thread ends
            if self._lingerer is not None and finished:
                self._lingerer.join()
            if self._committer is not None:
                self._committer.shutdown(wait=finished)  # (queued steps still resolve)
            if self._writer is not None:  # (its last steps may have started it just now)
                self._writer.shutdown(wait=finished)

    def _close_work(self) -> None:
        if self.transactional_id is None:
            self.flush()
            return
        self._close_settle()
        if self.state in (State.IN_TRANSACTION, State.ABORTABLE_ERROR):
            _log.info("close(): aborting the open transaction of %r", self.transactional_id)
            with self._lock:
                self._fail_batches(list(self._pending.values()), InvalidTxnStateError(
                    "the producer was closed before the batch was sent; its transaction "
                    "was aborted"))
                self._pending.clear()
                self._pending_bytes = 0
            with self._qlock:
                self._tails.clear()
            try:
                self._abort_now()
            except Exception as exc:
                _log.warning("close(): the open transaction of %r could not be aborted "
                             "(%s); readers and `txlog maintain` abort it after "
                             "transaction.timeout.ms", self.transactional_id, exc)

    def _close_settle(self) -> None:
        """Leave no commit in PrepareCommit behind, if the store lets us; if not, any
        reader or ``txlog maintain`` rolls it forward (the commit already holds)."""
        self._await_pipeline(quiet=True)  # a failed later step must not stop this
        try:
            self._settle()
        except Exception as exc:
            _log.warning("close(): the last commit's markers or CompleteCommit could not be "
                         "written (%s); readers and `txlog maintain` will finish them", exc)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
