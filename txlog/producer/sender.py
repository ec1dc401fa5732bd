"""The sender: queued steps run in order on the committer thread, their batch objects
upload on writer threads (bounded uploads and steps in flight), and their entries are
appended, several steps' at once when they are ready together."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa

from txlog import fanout
from txlog.errors import InvalidTxnStateError, TxlogError
from txlog.partition_log import Part
from txlog.producer.appends import Appender
from txlog.producer.core import State
from txlog.producer.futures import _resolve
from txlog.records import TopicPartition
from txlog.shared_objects import write_shared

if TYPE_CHECKING:
    from txlog.producer.accumulator import _PendingBatch

_log = logging.getLogger(__name__)


#: Batch objects uploading at once (Kafka's producer keeps up to
#: five requests in flight per connection).
MAX_UPLOADS = 2


#: Steps whose objects are being written or whose entries wait for the committer, at
#: most (Kafka's max.in.flight.requests.per.connection); later steps wait to upload, and
#: meanwhile take their partitions' later batches (see Producer._join_queued).
MAX_IN_FLIGHT = 3


#: Uploads at once of the steps a queued commit waits for.  Its caller is blocked (or
#: the commit is the oldest work), so they no longer compete with send() for the GIL,
#: whose hand-over kept the two writers behind while records were being sent
#: (measured in docs/benchmarks.md).
DRAIN_UPLOADS = 4


#: The most bytes (as Arrow holds them) of batches one shared object takes: a step's
#: larger batches of a topic go in several, which upload side by side, as objects of one
#: partition each did.
SHARED_OBJECT_BYTES = 16 << 20


#: Puts at once of one step's batch objects (one per partition) on a remote store:
#: a request there costs tens of milliseconds, almost all of it waiting.
STEP_OBJECT_UPLOADS = 16


class _Upload:
    """The batch objects of one queued step; batches may join it until it starts."""

    __slots__ = ("batches", "claimed", "commit", "decided", "dispatched", "encoded", "nbytes",
                 "started", "step", "uploaded")

    def __init__(self, batches: list[tuple[TopicPartition, _PendingBatch]]) -> None:
        self.batches = batches
        self.nbytes = sum(b.nbytes for _, b in batches)
        self.started = False
        self.dispatched = False  # handed to a writer thread (see Producer._dispatch)
        self.step = 0  # its number among the queued steps, once queued
        self.uploaded: Uploaded | None = None  # the objects' keys, once written
        self.commit = False  # the step commits the transaction (after its batches)
        # Its batches' entries were appended by an earlier step (Producer._claim_ready):
        # it has nothing left to write.
        self.claimed = False
        # A commit's step whose objects may travel in its PrepareCommit: their _Written
        # (with bytes) once encoded, before they are put, or None if they may not
        # (see InlineCommit); set when the decision was attempted.
        self.encoded: Future[list[_Written] | None] | None = None
        self.decided = threading.Event()


class _Written(NamedTuple):
    """A batch object written, with what its log entry needs (worked out by the writer
    thread: the committer appends entries one after another, and every pyarrow call
    there costs it a wait for the GIL, which the sending thread holds)."""

    key: str
    nbytes: int
    rows: int
    ts_min: int | None
    ts_max: int | None
    untimed: bool
    #: The object's bytes, kept for its log entry to carry (inline.batch.bytes), or None.
    inline: bytes | None = None
    #: In a shared object (batch.objects.shared): the batch's first row, the object's
    #: rows; 0 when the object is the batch's own.
    row: int = 0
    object_rows: int = 0

    def part(self, ts_min: int | None, ts_max: int | None) -> Part:
        """The batch as an append's part (partition_log.Part), with these timestamps."""
        shared = (self.row, self.object_rows) if self.object_rows else ()
        return (self.key, self.rows, self.nbytes, ts_min, ts_max, self.untimed, *shared)


class _Object(NamedTuple):
    """Where a batch was written: its object, the object's bytes if kept, and its rows
    in a shared object (0, 0: the object is its own)."""

    key: str
    nbytes: int
    copy: bytes | None
    row: int = 0
    object_rows: int = 0

    def written(self, table: pa.Table, batch: _PendingBatch) -> _Written:
        return _Written(self.key, self.nbytes, table.num_rows, *batch.ts_range(),
                        inline=self.copy, row=self.row, object_rows=self.object_rows)


Uploaded = Future[list[_Written]]



class Sender(Appender):
    def _pipelining(self) -> bool:
        """True while queued steps (writes, pipelined commits) are outstanding."""
        return self._pipeline is not None and not self._pipeline.done()

    def _reap_pipeline(self) -> None:
        """Take the outcome of queued steps that are all done (raising a failure) without
        waiting for any."""
        if (self._pipeline is not None and self._pipeline.done()) or \
                self._pipeline_error is not None:
            self._await_pipeline()

    def _in_committer(self) -> bool:
        return threading.get_ident() == self._committer_ident

    def _queue(self, fn: Any, batches: list[tuple[TopicPartition, _PendingBatch]],
               outcome: list[Future[None]] | None = None) -> Any:
        """Run ``fn(batches, uploaded)`` (a commit: ``fn(batches, uploaded, outcome)``) on
        the committer thread after everything queued before; the batches' objects are
        written meanwhile.  The ``outcome`` futures get the step's failure if it fails or
        is skipped."""
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix=(
                f"txlog-commit-{self.transactional_id}" if self.transactional_id is not None
                else "txlog-send"))
        step = _Upload(batches)
        nbytes = step.nbytes
        for _, b in batches:
            b.set_event()  # a transaction's batch: get() may now wait for it
        with self._qlock:
            self._queued_bytes += nbytes
            self._queued_steps += 1
        uploaded: Uploaded | None = Future() if batches else None
        step.uploaded = uploaded
        if outcome is not None and uploaded is not None and self.commit_inline_bytes:
            step.encoded = Future()
        try:
            with self._qlock:  # callers on several threads: one order of steps, _pipeline
                self._step_ids += 1
                step.step = self._step_ids
                step.commit = outcome is not None
                fut = self._committer.submit(self._run_queued, fn, batches, step,
                                             uploaded, self._step_ids, outcome)
                self._order.append(step)  # (under _qlock: before the step can start)
                if outcome is not None:  # a commit: later batches never join this
                    self._tails.clear()  # transaction's (cleared with the step queued)
                    self._closed_through = step.step
                else:
                    for tp, b in batches:  # a later batch may join these
                        self._tails[tp] = (step, b)
                if uploaded is not None:  # uploads start in the committer's order
                    self._to_upload.append(step)
                if uploaded is not None or outcome is not None:
                    # (a commit lifts the in-flight bound of the steps before it)
                    self._dispatch()
                self._pipeline = fut
                while self._steps and self._steps[0].done():  # steps end in order
                    self._steps.popleft()
                self._steps.append(fut)
        except BaseException as exc:  # e.g. a send racing close(): the pools are shut
            with self._qlock:
                self._queued_bytes -= nbytes
                self._queued_steps -= 1
                if self.transactional_id is not None and self._pipeline_error is None:
                    # The transaction lost these batches: it must not commit.
                    self._pipeline_error, self._pipeline_error_raised = exc, True
            self._fail_batches([b for _, b in batches], exc)
            raise
        return fut

    def _run_queued(self, fn: Any, batches: list[tuple[TopicPartition, _PendingBatch]],
                    upload: _Upload, uploaded: Uploaded | None, step: int,
                    outcome: list[Future[None]] | None) -> Any:
        self._committer_ident = threading.get_ident()
        with self._qlock:
            if self._order and self._order[0] is upload:
                self._order.popleft()
            elif upload in self._order:  # (steps start in order: not expected)
                self._order.remove(upload)
        self._running = upload
        try:
            if self._pipeline_error is not None or step <= self._skip_through:
                # Skipped: an earlier step failed.  In a transaction, the open
                # transaction cannot commit.  Without one, the writes queued before the
                # failure was known fail too, so nothing lands behind a lost batch (as
                # Kafka fails the batches in flight behind one); later writes go on.
                exc = InvalidTxnStateError(
                    f"not written: an earlier queued write failed "
                    f"({self._pipeline_error or self._skip_cause})")
                upload.decided.set()  # (no decision follows: its uploads must not wait)
                with self._qlock:
                    upload.started = True  # nothing joins a failed step from here on
                    if uploaded is not None and not upload.dispatched:
                        self._to_upload.remove(upload)  # and nothing uploads for it
                        uploaded.set_exception(exc)
                if not upload.claimed:  # (else the step that claimed it settled them)
                    self._fail_batches([b for _, b in batches], exc)
                if outcome is not None and self._deferred:  # left to this commit
                    group, self._deferred = self._deferred, []
                    self._drop_group(group, exc, discard=True)
                for f in outcome or ():
                    _resolve(f, exc)
                if uploaded is not None and not upload.claimed:  # (claimed: attempted)
                    wait([uploaded])
                    if uploaded.exception() is None:
                        self._discard_keys([tp for tp, _ in batches],
                                           [w.key for w in uploaded.result()])
                raise exc
            try:
                if upload.claimed:  # its entries are appended: only a commit is left
                    batches, uploaded = [], None
                if outcome is not None:
                    return fn(batches, uploaded, outcome)
                return fn(batches, uploaded)
            except BaseException as exc:
                for f in outcome or ():
                    _resolve(f, exc)
                with self._qlock:
                    if self.transactional_id is not None:
                        if self._pipeline_error is None:
                            self._pipeline_error, self._pipeline_error_raised = exc, False
                    else:
                        # Without a transaction the batches' futures carry the error,
                        # and the next flush() raises it.
                        self._skip_through = self._step_ids
                        self._skip_cause = exc
                        if self._linger_error is None:
                            self._linger_error = exc
                raise
        finally:
            self._running = None
            with self._qlock:
                self._queued_bytes -= upload.nbytes
                self._queued_steps -= 1
                if upload.dispatched:
                    self._in_flight -= 1
                elif upload.uploaded is not None and upload in self._to_upload:
                    # (every path waits for its upload or takes it out of the queue;
                    # this only keeps the queue right if one ever does neither)
                    self._to_upload.remove(upload)
                    upload.uploaded.set_exception(InvalidTxnStateError("not written"))
                self._dispatch()  # the next upload may start

    def _await_pipeline(self, *, quiet: bool = False) -> None:
        """Wait for the steps queued so far (the committer is then idle, unless another
        thread queued more meanwhile, as flush() allows).  If a step failed, the open
        transaction cannot
        commit: the state becomes ABORTABLE_ERROR (or FATAL_ERROR, as the same error would
        make it in the caller's thread) and, unless ``quiet``, the error is raised."""
        if self._in_committer():
            return
        fut = self._pipeline
        if fut is not None:
            wait([fut])  # steps run in order: everything queued before it is done too
        with self._qlock:
            exc = self._pipeline_error
            if fut is not None and self._pipeline is fut:  # else another thread queued
                self._pipeline = None  # more meanwhile: keep tracking it
            if exc is None:
                return
            # The failure stays until the transaction is aborted (or the producer
            # re-initialised): later steps are skipped, and every thread that waits
            # here leaves the state it calls for, whichever took it first.  It is
            # raised once; later operations raise for the state.
            self._error = exc
            if self.state not in (State.FATAL_ERROR, State.CLOSED):
                if isinstance(exc, TxlogError) and exc.abortable:
                    self.state = State.ABORTABLE_ERROR
                else:  # fenced, or the outcome of a write is unknown
                    self.state = State.FATAL_ERROR
            raise_now = not quiet and not self._pipeline_error_raised
            if raise_now:
                self._pipeline_error_raised = True
        if raise_now:
            raise exc

    def _dispatch(self) -> None:
        """Start the oldest queued uploads (the caller holds ``_qlock``) while a writer
        is free (MAX_UPLOADS; DRAIN_UPLOADS for the steps a queued commit waits for) and
        fewer than MAX_IN_FLIGHT steps are being written or wait for their entries.
        Objects need no epoch and no registration, so they upload beside the commit in
        flight; but a step that waits here still takes its partition's later batches, so
        behind slow uploads or a slow committer one object and one entry carry several
        batches."""
        while self._to_upload and self._uploading < (
                DRAIN_UPLOADS if self._to_upload[0].step <= self._closed_through
                else MAX_UPLOADS) and (
                self._in_flight < MAX_IN_FLIGHT
                # A step a commit was queued behind takes no more batches: holding it
                # back would only make the commit wait.
                or self._to_upload[0].step <= self._closed_through):
            step = self._to_upload.popleft()
            step.started = True  # no batch joins from here on
            for tp, _ in step.batches:
                if (tail := self._tails.get(tp)) is not None and tail[0] is step:
                    del self._tails[tp]
            step.dispatched = True
            self._in_flight += 1
            self._uploading += 1
            assert step.uploaded is not None
            try:
                if self._writer is None:
                    self._writer = ThreadPoolExecutor(
                        MAX_UPLOADS if self.transactional_id is None else
                        max(MAX_UPLOADS, DRAIN_UPLOADS),
                                                      thread_name_prefix="txlog-write")
                self._writer.submit(self._write_step, step, step.uploaded)
            except BaseException as exc:  # the pool is shut (close() racing a send)
                self._uploading -= 1
                step.uploaded.set_exception(exc)
                if step.encoded is not None:
                    step.encoded.set_result(None)

    def _write_step(self, step: _Upload, uploaded: Uploaded) -> None:
        try:
            written = self._conform_and_write(step)
        except BaseException as exc:
            uploaded.set_exception(exc)
        else:
            uploaded.set_result(written)
        finally:
            if step.encoded is not None and not step.encoded.done():
                step.encoded.set_result(None)  # (failed before it was known)
            with self._qlock:
                self._uploading -= 1
                self._dispatch()

    def _conform_and_write(self, step: _Upload) -> list[_Written]:
        batches = step.batches
        tables = [self._joined_table(b) for _, b in batches]
        items = [(tp, t) for (tp, _), t in zip(batches, tables, strict=True)]
        if step.encoded is not None:
            return self._encode_then_write(step, items)
        return [o.written(t, b) for t, (_, b), o
                in zip(tables, batches, self._write_objects(items), strict=True)]

    def _write_batches(self, batches: list[tuple[TopicPartition, _PendingBatch]],
                       uploaded: Uploaded | None, *, defer: bool = False,
                       ) -> list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                       list[_Written]]]:
        """On the committer thread: wait for the batch objects ``uploaded`` is writing,
        registering their partitions meanwhile, then append their log entries (a commit
        with ``defer``: return them instead, for its PrepareCommit to name; a step that
        a commit's is claimed with leaves them to it too).  A failure is the step's:
        _await_pipeline gives the caller's thread the state it leaves."""
        if not batches:
            return []
        assert uploaded is not None  # _upload() writes every non-empty step's objects
        tps = [tp for tp, _ in batches]
        try:
            # Register while the objects are still being written (AddPartitions waits
            # for the last commit's markers; neither needs the other).
            try:
                self._register(tps)
                if defer:  # a commit's: its markers append them, and a reader that
                    # meets the transaction here first rolls a decided one forward.
                    # The BEGIN entries go beside PrepareCommit (_begin_beside); their
                    # partitions count as held from here on.
                    for tp in dict.fromkeys(tps):
                        if tp not in self._held:
                            self._held.add(tp)
                            self._unbegun.append(tp)
            except BaseException:
                wait([uploaded])
                if uploaded.exception() is None:
                    self._discard_keys(tps, [w.key for w in uploaded.result()])
                raise
            written = uploaded.result()
        except BaseException as exc:
            self._fail_batches([b for _, b in batches], exc)
            raise
        group = [(batches, written)]
        if defer:
            return group
        running = self._running
        if running is not None and not running.commit and self.append_parts:
            claimed, through_commit = self._claim_ready()
            group += claimed
            if through_commit and self.commit_batches:
                # The commit's PrepareCommit names them (appended here: those in
                # partitions the transaction holds nothing in yet).
                self._deferred += self._append_unheld(group)
                return []
        self._append_entries(group)
        return []

    def _claim_ready(self) -> tuple[list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                                list[_Written]]], bool]:
        """Take over the appends of the steps queued right behind the running one whose
        objects are written already, up to and including a commit's (not past it: the
        next transaction's batches follow its decision).  Behind a slow committer, one
        entry per partition then appends what several steps wrote, instead of one entry
        per object: on S3 each is a conditional put of 3-7 ms, and a transaction's
        commit waited for them one by one.  Once a commit is queued, the uploads before
        it are waited for first (_uploads_through_commit), so that one entry takes all.
        Also returns whether a commit's step was claimed."""
        out: list[tuple[list[tuple[TopicPartition, _PendingBatch]], list[_Written]]] = []
        wait(self._uploads_through_commit())
        with self._qlock:
            if self._pipeline_error is not None:
                return out, False
            for u in self._order:
                up = u.uploaded
                if u.commit and up is None and not u.claimed and \
                        u.step > self._skip_through:
                    # A commit with no batch of its own (its last records joined a write
                    # before it): claimed with nothing to append.
                    u.claimed = True
                    return out, True
                if u.claimed or up is None or not up.done() or up.exception() is not None \
                        or u.step <= self._skip_through:
                    break
                if self.transactional_id is not None and \
                        any(tp not in self._registered for tp, _ in u.batches):
                    break  # it registers a partition first, in its own turn
                u.claimed = True
                out.append((u.batches, up.result()))
                if u.commit:
                    return out, True
        return out, False

    def _uploads_through_commit(self) -> list[Uploaded]:
        """The uploads of the steps queued behind the running one, through a queued
        commit's, if all of them can be claimed once written (else none): the commit
        waits for every one of them anyway, and one entry after the last upload is
        sooner than an entry per step, one after another."""
        ups: list[Uploaded] = []
        with self._qlock:
            # The wait below needs every one of them started: start what the in-flight
            # bound held back (as _queue does when it queues a commit).
            self._dispatch()
            for u in self._order:
                if u.claimed or u.step <= self._skip_through or \
                        any(tp not in self._registered for tp, _ in u.batches):
                    return []
                if u.uploaded is not None:
                    ups.append(u.uploaded)
                if u.commit:
                    return ups
        return []

    def _append_unheld(self, group: list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                              list[_Written]]],
                       ) -> list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                       list[_Written]]]:
        """Append the batches of ``group`` in partitions where the transaction holds
        no entry yet (a COMMIT marker may only append where a reader meets the
        transaction first); returns the rest."""
        if all(tp in self._held for batches, _ in group for tp, _ in batches):
            return group
        now: list[tuple[list[tuple[TopicPartition, _PendingBatch]], list[_Written]]] = []
        later: list[tuple[list[tuple[TopicPartition, _PendingBatch]], list[_Written]]] = []
        for batches, written in group:
            for keep, out in ((False, now), (True, later)):
                pairs = [(b, w) for b, w in zip(batches, written, strict=True)
                         if (b[0] in self._held) == keep]
                if pairs:
                    out.append(([b for b, _ in pairs], [w for _, w in pairs]))
        try:
            self._append_entries(now)
        except BaseException as exc:
            self._drop_group(later, exc, discard=True)
            raise
        return later

    def _drop_group(self, group: list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                           list[_Written]]],
                    exc: BaseException, *, discard: bool) -> None:
        """Fail the batches of a group no commit appends; ``discard``: delete their
        objects too (only when nothing can name them)."""
        self._fail_batches([b for batches, _ in group for _, b in batches], exc)
        if discard:
            tps = [tp for batches, _ in group for tp, _ in batches]
            self._discard_keys(tps, [w.key for _, written in group for w in written])

    @staticmethod
    def _joined_table(batch: _PendingBatch) -> pa.Table:
        """A sealed batch, joined batches and all, as one table (every part is in the
        topic's schema already)."""
        tables = [t for part in (batch, *batch.joined) for t in part.tables]
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


    def _encode_then_write(self, step: _Upload, items: list[tuple[TopicPartition, pa.Table]],
                           ) -> list[_Written]:
        raise NotImplementedError  # (InlineCommit)

    def _object_units(self, items: list[tuple[TopicPartition, pa.Table]]) -> list[list[int]]:
        """Which of ``items`` go in one object: with batch.objects.shared, a topic's
        batches of two or more partitions in one shared object (one batch per partition
        and schema, so each batch's object and partition name it alone; past
        SHARED_OBJECT_BYTES, in several); the rest (and everything without it) an object
        each.  Indices ascend in each unit."""
        if not self.shared_objects or len(items) < 2:
            return [[i] for i in range(len(items))]
        by_topic: dict[str, tuple[pa.Schema, dict[int, int]]] = {}
        for i, (tp, t) in enumerate(items):
            if not t.num_rows:
                continue
            schema, first = by_topic.setdefault(tp.topic, (t.schema, {}))
            if tp.partition not in first and t.schema.equals(schema):
                first[tp.partition] = i
        units: list[list[int]] = []
        for _, first in by_topic.values():
            size = 0
            for _, i in sorted(first.items()):  # in partition order, as the object holds them
                nbytes = items[i][1].nbytes
                if not units or size + nbytes > SHARED_OBJECT_BYTES or \
                        items[units[-1][0]][0].topic != items[i][0].topic:
                    units.append([])
                    size = 0
                units[-1].append(i)
                size += nbytes
        shared = [sorted(u) for u in units if len(u) >= 2]
        grouped = {i for unit in shared for i in unit}
        return shared + [[i] for i in range(len(items)) if i not in grouped]

    def _write_objects(self, items: list[tuple[TopicPartition, pa.Table]],
                       ) -> list[_Object]:
        """Write the tables as batch objects (plain puts of unique names; a topic's
        batches of several partitions in one shared object, see _object_units), side by
        side on a remote store: one after another, a commit across P partitions waited
        for P round trips before its decision."""
        def put(unit: list[int]) -> list[tuple[int, _Object]]:
            tp, table = items[unit[0]]
            plog = self.log.partition_log(tp)
            if len(unit) == 1:
                # A copy of the bytes is kept only for objects a log entry carries inline.
                return [(unit[0], _Object(*plog.write_object(
                    table, copy_up_to=self.inline_bytes)))]
            slices = write_shared(plog.store, tp.topic,
                                  [(items[i][0].partition, items[i][1]) for i in unit])
            return [(i, _Object(s.key, s.nbytes, None, s.row, s.object_rows))
                    for i, s in zip(unit, slices, strict=True)]

        units = self._object_units(items)
        if len(units) < 2 or self.log.store.local_requests:
            got = [put(u) for u in units]
        else:
            lanes = min(len(units), STEP_OBJECT_UPLOADS)
            # Each lane writes every lanes-th object in turn: at most that many at once.
            got = [x for lane in fanout.fan_out(
                lambda i: [put(u) for u in units[i::lanes]], range(lanes)) for x in lane]
        out: dict[int, _Object] = {}
        for placed in got:
            out.update(placed)
        return [out[i] for i in range(len(items))]
