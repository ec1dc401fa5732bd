"""The transaction manager: ending a transaction (a commit is a queued step, an abort
runs on the caller's thread), the decision, and the markers and Complete* that follow a
commit."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING

from txlog import completions
from txlog.crashpoints import crashpoint
from txlog.errors import (
    AtomicCreateUnsupportedError,
    CorruptObjectError,
    InvalidTxnStateError,
    ProducerFencedError,
    StorageError,
    TxlogError,
)
from txlog.metrics import record_end_txn
from txlog.partition_state import PartitionState
from txlog.producer.appends import _given_or_now
from txlog.producer.core import State
from txlog.producer.futures import _resolve
from txlog.producer.inline_commit import InlineCommit
from txlog.producer.sender import Uploaded, _Upload, _Written
from txlog.records import TopicPartition, now_ms
from txlog.txn_state import (
    COMMITTED,
    PREPARE_COMMIT,
    PendingAppend,
    PendingPart,
    TxnEnd,
    ended_as,
)

if TYPE_CHECKING:
    from txlog.producer.accumulator import _PendingBatch
    from txlog.txn_state import TxnRecord

_log = logging.getLogger(__name__)


def _definite(exc: BaseException) -> bool:
    """Store errors that say the write did not happen: a backend without atomic create,
    or a corrupt object met before the write."""
    return isinstance(exc, (AtomicCreateUnsupportedError, CorruptObjectError))


def _outcome_unknown(exc: BaseException) -> StorageError:
    """The error of a commit whose PrepareCommit write failed without a definite answer
    (a store error, not _definite(); its read-back did not find it landed): it may have
    landed, or still land."""
    return StorageError(
        f"the commit's PrepareCommit write failed ({exc}) and may have landed or still "
        "land: whether its records commit is unknown until abort_transaction() settles "
        "it (it fails if the commit landed) or a new producer's init_transactions() "
        "finishes it; read the partitions before sending those records again")


class _Completion:
    """A decided commit whose markers and CompleteCommit are still to be written: the
    producer's side of its end (the markers and Complete* are the coordinator's)."""

    __slots__ = ("batches", "durable", "end", "inline", "markers", "prep")

    def __init__(self, end: TxnEnd,
                 batches: list[tuple[TopicPartition, _PendingBatch, str]],
                 inline: dict[str, bytes] | None = None) -> None:
        assert end.prep is not None and not end.completed
        self.end = end
        self.prep: TxnRecord = end.prep  # the PrepareCommit that decided it
        # The batches (partition, batch, object key) its COMMIT markers append
        # (prep.pending): their futures resolve once the markers are written.
        self.batches = batches
        # The bytes of those of them its markers carry copies of (inline.batch.bytes).
        self.inline = inline or {}
        # Resolves once the markers are written (or failed to be: _settle retries them);
        # readers of this process wait for it (txlog.completions).
        self.markers: Future[None] = Future()
        # Its pending objects are known to be written (a decision that carries copies
        # of them may have been made before they were: see InlineCommit).
        self.durable = False


def _find_objects(st: PartitionState, keys: list[str]) -> dict[str, int]:
    """The base offsets of the batch objects ``keys`` in ``st`` (the newest batches
    first: a commit's markers appended them a moment ago)."""
    want = set(keys)
    found: dict[str, int] = {}
    b = st.batches
    for i in range(len(b) - 1, -1, -1):
        if b.data[i] in want and b.data[i] not in found:
            found[b.data[i]] = b.base_offset[i]
            if len(found) == len(want):
                break
    return found



class TransactionManager(InlineCommit):

    @staticmethod
    def _next_id(end: TxnEnd) -> tuple[int, int]:
        """The (producer id, epoch) a completed end hands the next transaction."""
        assert end.next_id is not None
        return end.next_id

    def _raise_if_failed(self, decided: Future[None]) -> None:
        """Wait for a commit's decision; if it failed, wait for the queued steps, take the
        state the failure leaves (abortable or fatal) and raise it."""
        wait([decided])
        exc = decided.exception()
        if exc is not None:
            self._await_pipeline()  # raises it, unless another thread took it first
            raise exc

    def _queue_commit(self) -> tuple[Future[None], Future[None]]:
        """Queue the open transaction's last batches and its commit on the committer;
        returns the future of the decision, and the caller's future, which resolves
        once the markers are written too (or failed to be: the commit holds, and they are
        written later), so that what its callbacks do sees the commit."""
        self._reap_pipeline()
        self._check_can_end()
        with self._lock:
            self._check_can_end()  # again: a send may have failed the transaction meanwhile
            self._check_sends_open("commit_transaction()")  # not ended by another thread
            self._sends_closed = "its transaction is being committed"
            self._seal_pending(list(self._pending))  # raises: nothing is committed
            batches = self._join_queued(list(self._pending.items()))
            self._pending.clear()
        # Queue first: this transaction's objects upload while the last commit is still
        # being decided (the committer runs the steps in order, so only the uploads,
        # which need no epoch, overlap).
        decided: Future[None] = Future()
        done: Future[None] = Future()
        done.set_running_or_notify_cancel()  # a commit cannot be called off once queued
        try:
            self._queue(self._commit_queued, batches, [decided, done])
        except BaseException as exc:
            # Not queued, and its batches are failed: it must not be committed without them.
            with self._qlock:
                if self.state == State.IN_TRANSACTION:
                    self.state = State.ABORTABLE_ERROR
                    self._error = exc
            raise
        self._last_commit = decided
        with self._qlock:  # not over a failure another thread has just taken
            if self.state == State.IN_TRANSACTION:
                self.state = State.READY
        return decided, done

    def _check_can_end(self) -> None:
        if self.state == State.ABORTABLE_ERROR:
            raise InvalidTxnStateError(
                f"cannot commit: the transaction hit an error ({self._error}); "
                "call abort_transaction()")
        self._check_state(State.IN_TRANSACTION, "commit_transaction()")

    def _abort_now(self) -> None:
        """EndTxn(abort) on the caller's thread (a commit is a step of the committer)."""
        assert self.transactional_id is not None
        self.state = State.ABORTING
        try:
            self._decide(commit=False)
            with self._qlock:  # what failed is aborted: later steps run again
                self._pipeline_error, self._pipeline_error_raised = None, False
        except ProducerFencedError as exc:
            self._fatal(exc)
            raise
        except TxlogError as exc:
            self._txn_error(exc)
            raise
        except Exception as exc:
            # Not a txlog error (a raw OSError from a filesystem): the abort may be
            # retried (a landed PrepareAbort is rolled forward), not left in ABORTING.
            self.state = State.ABORTABLE_ERROR
            self._error = exc
            raise
        self._registered.clear()
        self._held.clear()
        self._unbegun.clear()
        self._seq.clear()
        self.state = State.READY

    def _decide(self, commit: bool, pending: tuple[PendingAppend, ...] = (),
                batches: list[tuple[TopicPartition, _PendingBatch, str]] | None = None,
                inline: dict[str, bytes] | None = None) -> None:
        """Write Prepare* (an abort also its markers and Complete*; a commit's are left
        to _complete_decided).  A commit's ``pending`` batch objects (``batches``) are
        named in PrepareCommit and appended by its markers, which carry copies of those
        in ``inline``."""
        assert self.transactional_id is not None
        t0 = time.perf_counter()
        coord = self.log.coordinator
        self._settle()
        end = coord.prepare_end(self.transactional_id, self.producer_id, self.epoch, commit,
                                pending, claim=not commit and self._claim_on_abort)
        if not commit:
            self._claim_on_abort = False
        if end.next_id is not None:
            self.producer_id, self.epoch = end.next_id
            if batches:  # it ended as a commit already: whoever ended it appended them
                self._resolve_batches(batches)
        elif not commit:
            # An abort is the error path: finish it before returning, so nothing of the
            # failed transaction is left to settle.
            assert end.prep is not None
            self.producer_id, self.epoch = self._next_id(coord.complete(end.prep))
        else:
            c = _Completion(end, batches or [], inline)
            completions.track(self.log.store.identity, end.producer_id, end.epoch,
                              c.markers)
            self._completing = c
            crashpoint("after_decision")
        record_end_txn(self.log, commit, (time.perf_counter() - t0) * 1000)

    def _commit_queued(self, batches: list[tuple[TopicPartition, _PendingBatch]],
                       uploaded: Uploaded | None, outcome: list[Future[None]]) -> None:
        decided, done = outcome
        group, self._deferred = self._deferred, []
        inline_step = None
        if not self.commit_batches:
            self._write_batches(batches, uploaded)
            self._settle()  # the last commit's errors are its own, not this PrepareCommit's
            try:
                self._decide(commit=True)
            except (StorageError, OSError) as exc:
                if _definite(exc):
                    raise
                raise _outcome_unknown(exc) from exc
        else:
            # No DATA entry before the decision: PrepareCommit names the objects written
            # since the last entry, and the markers append them (one entry per partition).
            inline_step = self._inline_step() if batches else None
            if inline_step is not None:
                assert uploaded is not None
                self._commit_inline(inline_step[0], batches, inline_step[1], uploaded, group)
        if self.commit_batches and inline_step is None:
            try:
                group += self._write_batches(batches, uploaded, defer=True)
            except BaseException as exc:
                self._drop_group(group, exc, discard=True)  # never named anywhere
                raise
            group = self._append_unheld(group)
            pending, named = self._pending_appends(group)
            inline = {w.key: w.inline for _, written in group for w in written
                      if w.inline is not None}
            try:
                self._settle()  # (as above)
            except BaseException as exc:
                self._drop_group(group, exc, discard=True)  # never named anywhere
                raise
            begin, self._unbegun = self._unbegun, []
            try:
                self._begin_beside(begin, lambda: self._decide(
                    commit=True, pending=pending, batches=named, inline=inline))
            except BaseException as exc:
                if not isinstance(exc, (StorageError, OSError)) or _definite(exc):
                    self._drop_group(group, exc, discard=False)
                    raise
                if not self._decided_after_all(named):
                    # Not discarded: a PrepareCommit of unknown outcome may name them,
                    # and whoever rolls it forward appends them.  The futures must not
                    # read as "not written": resending those records could duplicate them.
                    unknown = _outcome_unknown(exc)
                    self._drop_group(group, unknown, discard=False)
                    raise unknown from exc
        self._registered.clear()
        self._held.clear()
        self._unbegun.clear()
        self._seq.clear()
        _resolve(decided)  # a blocking commit_transaction() returns; the markers follow
        try:
            self._complete_decided()
        finally:
            # The caller's future (and its callbacks, on this thread) once the markers
            # are written: a read there, or on a thread it waits for, sees the commit.
            _resolve(done)

    def _commit_inline(self, step: _Upload,
                       batches: list[tuple[TopicPartition, _PendingBatch]],
                       written: list[_Written], uploaded: Uploaded,
                       group: list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                         list[_Written]]]) -> None:
        """The commit's decision beside its uploads (InlineCommit), with its errors
        handled as the usual path's: a decision that failed without landing fails the
        batches; one of unknown outcome is read back."""
        try:
            group = self._append_unheld(group)
        except BaseException as exc:
            step.decided.set()
            self._drop_group([(batches, written)], exc, discard=False)  # (still uploading)
            raise
        group.append((batches, written))
        pending, named = self._pending_appends(group)
        copies = {w.key: w.inline for w in written if w.inline is not None and w.rows > 0}
        try:
            self._settle()  # the last commit's errors are its own, not this PrepareCommit's
        except BaseException as exc:
            step.decided.set()
            self._drop_group(group, exc, discard=False)
            raise
        self._unbegun.clear()
        try:
            durable = self._decide_inline(step, batches, written, uploaded, pending, named,
                                          copies)
        except BaseException as exc:
            if not isinstance(exc, (StorageError, OSError)) or _definite(exc):
                self._drop_group(group, exc, discard=False)
                raise
            if not self._decided_after_all(named):
                self._claim_on_abort = True
                unknown = _outcome_unknown(exc)  # (not discarded, as in _commit_queued)
                self._drop_group(group, unknown, discard=False)
                raise unknown from exc
            return  # (its markers write the objects from the record's copies)
        if self._completing is not None:
            self._completing.durable = durable

    def _decide_folded(self, tps: list[TopicPartition], pending: tuple[PendingAppend, ...],
                       named: list[tuple[TopicPartition, _PendingBatch, str]],
                       copies: dict[str, bytes]) -> None:
        """Write PrepareCommit registering ``tps`` and carrying ``copies`` (see
        Coordinator.prepare_end); the markers are left to _complete_decided."""
        assert self.transactional_id is not None
        t0 = time.perf_counter()
        end = self.log.coordinator.prepare_end(
            self.transactional_id, self.producer_id, self.epoch, True, pending,
            register=tps, inline=copies)
        if end.next_id is not None:  # ended as a commit already: whoever ended it
            self.producer_id, self.epoch = end.next_id  # appended them
            self._resolve_batches(named)
        else:
            c = _Completion(end, named, copies)
            completions.track(self.log.store.identity, end.producer_id, end.epoch,
                              c.markers, [(tp.topic, tp.partition) for tp in tps])
            self._completing = c
            crashpoint("after_decision")
        record_end_txn(self.log, True, (time.perf_counter() - t0) * 1000)

    def _decided_after_all(self, named: list[tuple[TopicPartition, _PendingBatch, str]],
                           ) -> bool:
        """After PrepareCommit failed with a store error: read the record once more.
        True if the commit landed after all (then it goes on as decided: failing the
        futures of batches that end up committed would invite a resend, a duplicate)."""
        assert self.transactional_id is not None
        pid, epoch = self._producer_id, self._epoch
        try:
            rec = self.log.coordinator.record(self.transactional_id)
        except Exception:
            return False  # still unknown: the error stands
        if rec is None or self._completing is not None:
            return False
        if rec.state == PREPARE_COMMIT and (rec.producer_id, rec.epoch) == (pid, epoch):
            c = _Completion(TxnEnd.decided(rec), named)
            # (a decision that registered its partitions left no entry there for this
            # process's readers to meet: they wait by partition, as after _decide_folded)
            completions.track(self.log.store.identity, pid, epoch, c.markers,
                              rec.partitions if rec.inline else ())
            self._completing = c
            return True
        if ended_as(rec, pid, epoch) == COMMITTED:  # rolled forward by someone already
            self._producer_id, self._epoch = rec.producer_id, rec.epoch
            self._resolve_batches(named)
            return True
        return False

    def _pending_appends(self, group: list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                                 list[_Written]]],
                         ) -> tuple[tuple[PendingAppend, ...],
                                    list[tuple[TopicPartition, _PendingBatch, str]]]:
        """The written objects of ``group`` as PrepareCommit's pending appends (one per
        partition, in order, each from the partition's next sequence number), and the
        batches they carry."""
        now = now_ms()
        by_tp: dict[TopicPartition, list[PendingPart]] = {}
        named: list[tuple[TopicPartition, _PendingBatch, str]] = []
        for batches, written in group:
            for (tp, batch), w in zip(batches, written, strict=True):
                if w.rows <= 0:  # (nothing to append: resolved at once)
                    batch.resolve(0)
                    batch.set_written()
                    continue
                by_tp.setdefault(tp, []).append(
                    w.part(*_given_or_now(w.ts_min, w.ts_max, w.untimed, now)))
                named.append((tp, batch, w.key))
                batch.outcome.drive = self._drive_markers
        pending = tuple(PendingAppend(tp.topic, tp.partition,
                                      self._seq.get(tp, 0) if self.idempotent else -1,
                                      tuple(parts)) for tp, parts in by_tp.items())
        return pending, named

    def _drive_markers(self, timeout: float | None) -> None:
        """For SendFuture.get() of a batch the last commit's markers append: wait for
        the committer to write them; if that failed, write them here (retrying, up to
        ``timeout``), so the batch's offsets come without another producer call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            c = self._completing
            if c is None or not c.batches:
                return  # resolved, or being resolved right now
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not c.markers.done():
                wait([c.markers], timeout=left)
                if not c.markers.done():
                    return  # out of time
                continue
            if c.markers.exception() is None:
                return  # the committer resolves the batches next
            try:
                self._finish_completion(c)  # (or another thread finishes it)
                return
            except (CorruptObjectError, AtomicCreateUnsupportedError) as exc:
                # Retrying cannot help: the commit holds, and the futures say why their
                # offsets are unknown (the producer's next operation raises it too).
                _log.warning("markers of a decided commit cannot be written: %s", exc)
                self._resolve_appended(c, exc)
                return
            except (StorageError, OSError) as exc:
                _log.debug("markers of a decided commit not written yet: %s", exc)
                if left is not None and left <= delay:
                    return
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except Exception:
                # Fenced, or the record moved on: a newer instance rolled the commit
                # forward (then the log has the batches) or nothing will.  The producer's
                # next operation reports the error; the futures get what the log says.
                self._resolve_appended(c)
                return

    def _resolve_appended(self, c: _Completion, why: BaseException | None = None) -> None:
        """Give the futures of the batches a commit's markers appended their offsets."""
        batches, c.batches = c.batches, []
        self._resolve_batches(batches, why)

    def _resolve_batches(self, batches: list[tuple[TopicPartition, _PendingBatch, str]],
                         unwritten: BaseException | None = None) -> None:
        """Give each batch's futures the offset of its object in the log (its marker is
        written), or an error if the object is not there (``unwritten``: why the
        markers could not be written)."""
        if not batches:
            return
        by_tp: dict[TopicPartition, list[tuple[_PendingBatch, str]]] = {}
        for tp, batch, key in batches:
            by_tp.setdefault(tp, []).append((batch, key))
        for tp, items in by_tp.items():
            plog = self.log.partition_log(tp)
            why: BaseException | None = None
            try:
                found = _find_objects(plog.current(), [k for _, k in items])
                if len(found) < len(items):  # another client's roll-forward wrote them
                    found = _find_objects(plog.refresh(), [k for _, k in items])
            except Exception as exc:  # the commit holds: only the offsets are unknown
                found, why = {}, exc
            for batch, key in items:
                if key in found:
                    batch.resolve(found[key])
                elif unwritten is not None:
                    batch.fail(TxlogError(
                        f"the batch is committed, but the marker that appends it to "
                        f"{tp.topic}-{tp.partition} cannot be written ({unwritten}); "
                        "repair the store: the producer's next operation, a reader "
                        "or `txlog maintain` then writes it"))
                else:
                    batch.fail(TxlogError(
                        f"the batch committed, but its offset in {tp.topic}-"
                        f"{tp.partition} is unknown "
                        f"({why or 'not in the log: compacted since?'}); "
                        "read the partition to find its records"))
                batch.set_written()

    def _complete_decided(self) -> None:
        """On the committer thread, right after a commit's decision: write its markers,
        then CompleteCommit, unless more steps are queued behind: then the next
        transaction's first AddPartitions writes CompleteCommit with it (one state-log
        write; see Coordinator.complete_into_next).  Failures are left to _settle, which
        writes whatever is missing (the commit is decided either way)."""
        c = self._completing
        if c is None:
            return
        coord = self.log.coordinator
        try:
            with completions.running():
                coord.write_markers(c.prep, inline=c.inline, durable=c.durable)
        except BaseException as exc:
            _resolve(c.markers, exc)  # readers waiting for them go on
            if not isinstance(exc, Exception):
                raise
            _log.debug("markers of a decided commit not written yet: %s", exc)
            return
        c.inline = {}
        _resolve(c.markers)
        self._resolve_appended(c)
        with self._qlock:
            if self._queued_steps > 1:  # this step counts itself
                return
        with self._settle_lock:
            if self._completing is not c:
                return  # another thread's _settle finished it
            try:
                self._producer_id, self._epoch = self._next_id(coord.finish(c.prep))
            except Exception as exc:
                _log.debug("CompleteCommit not written yet: %s", exc)
                return
            self._completing = None

    def _settle(self) -> None:
        """Finish the last commit's markers and Complete* where _complete_decided left
        them (a store error, or Complete* left to a next transaction that did not write
        it), and take the (id, epoch) for the next transaction.  The outcome was decided,
        so this only retries writing it down."""
        self._await_pipeline(quiet=True)  # a failed step is raised by the operation
        if self._completing is not None:
            self._finish_completion(None)

    def _finish_completion(self, c: _Completion | None) -> None:
        """Write what is missing of completion ``c`` (None: the one left, if any) with
        end_txn, take the (id, epoch) for the next transaction, and resolve what waits
        for it.  A no-op if another thread finished it meanwhile."""
        assert self.transactional_id is not None
        # One thread at a time: the committer may be folding or finishing the same
        # completion (after another thread queued more), and only one may hand out the
        # next epoch.
        with self._settle_lock:
            c = self._completing if c is None else c
            if c is None or self._completing is not c:
                return
            self._producer_id, self._epoch = self._next_id(self.log.coordinator.end_txn(
                self.transactional_id, c.end.producer_id, c.end.epoch, commit=True))
            self._completing = None
        _resolve(c.markers)  # end_txn wrote them (if the committer has not said so yet)
        self._resolve_appended(c)

    def _complete_into_next(self, tps: list[TopicPartition]) -> bool:
        """Register ``tps`` in the state-log write that completes the last commit, whose
        markers are written (see Coordinator.complete_into_next).  False: settle and add
        partitions the usual way."""
        with self._settle_lock:
            c = self._completing
            if c is None or not c.markers.done() or c.markers.exception() is not None:
                return False
            got = self.log.coordinator.complete_into_next(c.prep, tps)
            if got is None:
                return False  # someone else completed it: _settle takes what they wrote
            self._producer_id, self._epoch = self._next_id(got)
            self._completing = None
            return True
