"""The transaction coordinator, run in-process by any client.

Each operation reads the transactional.id's record from the state log, decides the next
record with the pure state machine (:mod:`txlog.txn_state`), and persists it with a
compare-and-set on the state log before acting on it.  EndTxn is Prepare*, then markers
to every registered partition, then Complete* with the epoch bumped; a commit's Complete*
may instead be the next transaction's first Ongoing record (:meth:`complete_into_next`).
Anyone who meets a transaction in Prepare* rolls it forward; one past its timeout is
fenced and aborted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from txlog.crashpoints import crashpoint
from txlog.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionTimeoutError,
)
from txlog.fanout import fan_out
from txlog.model import ABORT, COMMIT
from txlog.partition_log import AppendSpec
from txlog.producer_ids import ProducerIdAllocator
from txlog.records import TopicPartition, now_ms
from txlog.state_log import StateLog, StateLogPartition
from txlog.store_clock import StoreClock
from txlog.txn_state import (
    COMPLETE,
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    DEAD,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    PREPARING,
    PendingAppend,
    TxnRecord,
    bump_epoch,
    check_timeout,
    needs_new_producer_id,
)

if TYPE_CHECKING:
    from txlog.root import Root

log = logging.getLogger(__name__)


def max_transaction_timeout_ms(txlog: Root) -> int:
    """transaction.max.timeout.ms for the root (the one place it is read): the value
    stored in the root, which every client of it shares (txlog.root_settings)."""
    return int(txlog.root_settings()["transaction.max.timeout.ms"])


class Coordinator:
    def __init__(self, txlog: Root) -> None:
        self.log = txlog
        self.state_log = StateLog(txlog.store, txlog.config["transaction.state.log.num.partitions"])
        self.pids = ProducerIdAllocator(txlog.store)
        self.clock = StoreClock(txlog.store)
        # Open transactions this client has seen, by (txn_id, producer id, epoch): when it
        # first saw each, on its monotonic clock (used where the store gives no times).
        self._watched: dict[tuple[str, int, int], float] = {}
        self._watch_lock = threading.Lock()

    # -- timeouts ----------------------------------------------------------------------

    def expired(self, rec: TxnRecord, *, owner: bool = False) -> bool:
        """Whether the open transaction ``rec`` ran past its timeout, judged so that no
        client's wall clock matters: on the store's clock, from the stamp of the state-log
        object that began it; where the store gives no times, only once this client has
        itself watched it open for the whole timeout on its monotonic clock.  A timeout
        above transaction.max.timeout.ms (stored before the limit) counts as the limit.

        ``owner``: the caller began ``rec`` itself, so its own wall clock is a fair first
        filter (it saves the store requests on every call while the transaction is young).
        """
        if rec.state != ONGOING:
            return False
        timeout = min(rec.timeout_ms, max_transaction_timeout_ms(self.log))
        if owner and now_ms() - rec.txn_start_ms <= timeout:
            return False
        age: float | None = None
        if rec.start_slot >= 0:
            part = self.state_log.partition_for(rec.txn_id)
            age = self.clock.age_ms(part.entry_key(rec.start_slot))
        if age is None:
            age = self._watched_ms(rec)
        return age > timeout

    def _watched_ms(self, rec: TxnRecord) -> float:
        key = (rec.txn_id, rec.producer_id, rec.epoch)
        now = time.monotonic()
        with self._watch_lock:
            if len(self._watched) > 10_000:
                self._watched.clear()
            first = self._watched.setdefault(key, now)
        return (now - first) * 1000

    def record(self, txn_id: str) -> TxnRecord | None:
        part = self.state_log.partition_for(txn_id)
        part.refresh()
        return part.get(txn_id)

    # -- InitProducerId ----------------------------------------------------------------

    def init_producer_id(self, txn_id: str, timeout_ms: int) -> tuple[int, int]:
        """Fence any earlier instance and return this instance's (producer id, epoch)."""
        check_timeout(timeout_ms, max_transaction_timeout_ms(self.log))
        part = self.state_log.partition_for(txn_id)
        if not part.loaded:  # (a new id needs one: its claim overlaps the reads below)
            self.pids.claim_ahead()
        while True:
            part.refresh()
            cur = part.get(txn_id)
            now = now_ms()
            if cur is None or cur.state == DEAD:
                new = TxnRecord(txn_id, self.pids.allocate(), 0, EMPTY, timeout_ms,
                                last_update_ms=now)
            elif cur.state in PREPARING:
                self._complete(cur)
                continue
            elif cur.state == ONGOING:
                # A previous instance's transaction is open: fence it and abort it.
                prep = cur.transition(PREPARE_ABORT, abort_reason="fenced", last_update_ms=now)
                if part.compare_and_set(txn_id, cur, prep):
                    self._complete(prep)
                continue
            else:  # Empty, Complete*, Dead
                pid, epoch = bump_epoch(cur, self._fresh_pid_if(needs_new_producer_id(cur)))
                new = TxnRecord(txn_id, pid, epoch, EMPTY, timeout_ms, (), 0, now,
                                cur.producer_id, cur.epoch, cur.abort_reason)
            if part.compare_and_set(txn_id, cur, new):
                return new.producer_id, new.epoch

    def _fresh_pid_if(self, needed: bool) -> int | None:
        return self.pids.allocate() if needed else None

    # -- AddPartitionsToTxn / AddOffsetsToTxn ------------------------------------------

    def add_partitions(self, txn_id: str, producer_id: int, epoch: int,
                       tps: Iterable[TopicPartition]) -> None:
        """Register partitions with the transaction before the first write to them."""
        wanted = tuple(sorted({(tp.topic, tp.partition) for tp in tps}))
        part = self.state_log.partition_for(txn_id)
        fresh = False
        while True:
            cur, fresh = self._current(part, txn_id, producer_id, epoch, fresh)
            self._check_owner(txn_id, cur, producer_id, epoch)
            assert cur is not None
            now = now_ms()
            if cur.state in PREPARING:
                self._complete(cur)
                if cur.state == PREPARE_ABORT and cur.abort_reason == "timeout":
                    raise self._timeout_error(txn_id)
                raise InvalidTxnStateError(
                    f"transaction of {txn_id!r} is completing; begin a new one first")
            if cur.state == ONGOING:
                if self.expired(cur, owner=True):
                    self.abort_if_expired(txn_id)
                    raise self._timeout_error(txn_id)
                merged = tuple(sorted(set(cur.partitions) | set(wanted)))
                if merged == cur.partitions:
                    if not fresh:  # decide "nothing to write" on a fresh read only
                        fresh = True
                        continue
                    return
                new = cur.transition(ONGOING, partitions=merged, last_update_ms=now)
            elif cur.state in COMPLETE:
                new = cur.transition(ONGOING, partitions=wanted, txn_start_ms=now,
                                     last_update_ms=now, abort_reason="")
            else:
                raise InvalidTxnStateError(
                    f"transactional.id {txn_id!r} is {cur.state}; call init_transactions()")
            if part.compare_and_set(txn_id, cur, new):
                crashpoint("after_add_partitions")
                return
            fresh = True

    @staticmethod
    def _current(part: StateLogPartition, txn_id: str, producer_id: int, epoch: int,
                 fresh: bool) -> tuple[TxnRecord | None, bool]:
        """The transaction's record, and whether it was just read from the store.

        The owner's own cached record is trusted for a decision that ends in a
        compare-and-set: the put-if-absent of the next slot fails if anyone wrote since,
        and then the loop re-reads.  That saves a list per AddPartitions and EndTxn.
        Anything else (another owner, a state the owner did not leave it in) is re-read.
        """
        if not fresh and part.loaded:
            cur = part.get(txn_id)
            if cur is not None and (cur.producer_id, cur.epoch) == (producer_id, epoch) \
                    and (cur.state == ONGOING or cur.state in COMPLETE):
                return cur, False
        part.refresh()
        return part.get(txn_id), True

    # -- EndTxn ------------------------------------------------------------------------

    def end_txn(self, txn_id: str, producer_id: int, epoch: int, commit: bool,
                ) -> tuple[int, int]:
        """Commit or abort; returns the producer's (id, epoch) for its next transaction."""
        step = self.prepare_end(txn_id, producer_id, epoch, commit)
        return step if isinstance(step, tuple) else self.complete(step)

    def prepare_end(self, txn_id: str, producer_id: int, epoch: int, commit: bool,
                    pending: tuple[PendingAppend, ...] = ()) -> tuple[int, int] | TxnRecord:
        """EndTxn up to its decision.  Returns the persisted Prepare* record, which
        :meth:`complete` then rolls forward (the outcome is decided once it is durable,
        as Kafka answers EndTxn before its markers are written), or the producer's next
        (id, epoch) when there is nothing left to complete.

        ``pending`` (a commit only) names written batch objects that no entry appended
        yet: the PrepareCommit record carries them, and its COMMIT markers append them
        (one entry per partition), so the decision waits for no DATA entry.  Their
        partitions must be registered already."""
        assert commit or not pending
        part = self.state_log.partition_for(txn_id)
        fresh = False
        while True:
            cur, fresh = self._current(part, txn_id, producer_id, epoch, fresh)
            now = now_ms()
            ended = ended_as(cur, producer_id, epoch)
            if cur is not None and ended is not None:
                # The transaction already ended: our own retry, or a timeout abort.
                if (ended == "commit") == commit:
                    return cur.producer_id, cur.epoch
                if cur.abort_reason == "timeout":
                    raise self._timeout_error(txn_id)
                raise ProducerFencedError(
                    f"transaction of {txn_id!r} was aborted by another client (fenced)")
            self._check_owner(txn_id, cur, producer_id, epoch)
            assert cur is not None
            if not {(a.topic, a.partition) for a in pending} <= set(cur.partitions):
                if not fresh:
                    fresh = True
                    continue
                raise InvalidTxnStateError(  # (a producer bug: registration comes first)
                    f"transaction of {txn_id!r} would append to unregistered partitions")
            if cur.state == EMPTY or (cur.state in COMPLETE and not cur.partitions):
                if not fresh:
                    fresh = True
                    continue
                return producer_id, epoch  # nothing was written: nothing to end
            if cur.state in PREPARING:
                if (cur.state == PREPARE_COMMIT) != commit:
                    if cur.abort_reason == "timeout":
                        self._complete(cur)
                        raise self._timeout_error(txn_id)
                    raise InvalidTxnStateError(
                        f"transaction of {txn_id!r} is already {cur.state}")
                return cur
            if cur.state != ONGOING:
                raise InvalidTxnStateError(f"transaction of {txn_id!r} is {cur.state}")
            if commit and self.expired(cur, owner=True):
                self.abort_if_expired(txn_id)
                raise self._timeout_error(txn_id)
            prep = cur.transition(PREPARE_COMMIT if commit else PREPARE_ABORT,
                                  last_update_ms=now, pending=pending,
                                  abort_reason="" if commit else "client")
            if part.compare_and_set(txn_id, cur, prep):
                return prep
            fresh = True

    def complete(self, prep: TxnRecord) -> tuple[int, int]:
        """Roll a persisted Prepare* forward; returns the (id, epoch) for the next
        transaction of its transactional.id."""
        return self._complete(prep)

    def _complete(self, prep: TxnRecord) -> tuple[int, int]:
        """Write markers to every registered partition, then persist Complete*."""
        self.write_markers(prep)
        return self.finish(prep)

    def write_markers(self, prep: TxnRecord) -> None:
        """Write a Prepare* record's markers to every partition it registered."""
        commit = prep.state == PREPARE_COMMIT
        crashpoint("after_prepare")

        pending = {(a.topic, a.partition): a for a in prep.pending}

        def mark(tp: TopicPartition) -> None:
            self.write_marker(tp, prep.producer_id, prep.epoch, commit,
                              pending.get((tp.topic, tp.partition)), prep.txn_id)
            crashpoint("after_marker")

        tps = [TopicPartition(topic, p) for topic, p in prep.partitions]
        # A commit's BEGIN entries are written beside its PrepareCommit, so a partition
        # may not show the transaction yet: its marker goes first.  Marked after the
        # others, a crash in between would leave it where no reader meets the
        # transaction, unmarked, while every partition that holds a reader is done.
        remote = len(tps) > 1 and not self.log.store.local_requests
        unheld: list[TopicPartition] = []
        if commit:  # (loading a partition is a request: side by side on a remote store)
            flags = fan_out(lambda tp: self._unheld(tp, prep), tps) if remote else \
                [self._unheld(tp, prep) for tp in tps]
            unheld = [tp for tp, f in zip(tps, flags, strict=True) if f]
        for wave in (unheld, [tp for tp in tps if tp not in unheld]):
            if len(wave) > 1 and not self.log.store.local_requests:
                # Markers are independent of each other: on a remote store write them in
                # parallel (a 64-partition commit on S3 waited for 64 sequential round
                # trips).
                fan_out(mark, wave)
            else:
                for tp in wave:
                    mark(tp)

    def _unheld(self, tp: TopicPartition, prep: TxnRecord) -> bool:
        """Whether ``tp`` (as cached) shows neither an entry of ``prep``'s transaction
        nor its marker: a reader there would read past the transaction."""
        st = self.log.partition_log(tp).current()
        key = (prep.producer_id, prep.epoch)
        return key not in st.open_txns and st.fence_epoch.get(key[0], -1) < key[1]

    def finish(self, prep: TxnRecord) -> tuple[int, int]:
        """Persist Complete* for a Prepare* record whose markers are written; returns the
        (id, epoch) for the next transaction of its transactional.id."""
        commit = prep.state == PREPARE_COMMIT
        crashpoint("before_complete")
        part = self.state_log.partition_for(prep.txn_id)
        pid, epoch = bump_epoch(prep, self._fresh_pid_if(needs_new_producer_id(prep)))
        done = prep.transition(COMPLETE_COMMIT if commit else COMPLETE_ABORT,
                               producer_id=pid, epoch=epoch, partitions=(),
                               prev_producer_id=prep.producer_id, prev_epoch=prep.epoch,
                               prev_outcome="commit" if commit else "abort",
                               last_update_ms=now_ms())
        if part.compare_and_set(prep.txn_id, prep, done):
            return pid, epoch
        cur = part.get(prep.txn_id)
        if cur is not None and ended_as(cur, prep.producer_id, prep.epoch) is not None:
            return cur.producer_id, cur.epoch  # someone else completed it (same decision)
        # A newer instance took over since (its init_producer_id rolled this transaction
        # forward): never hand out its epoch, or two live instances would share it.  The
        # epoch we return is already fenced.
        return pid, epoch

    def complete_into_next(self, prep: TxnRecord, tps: Iterable[TopicPartition],
                           ) -> tuple[int, int] | None:
        """Complete a PrepareCommit whose markers are all written, and register ``tps``
        for the same transactional.id's next transaction, in one state-log write
        (CompleteCommit and AddPartitionsToTxn together: a pipelined producer's next
        transaction needs both, one after the other).  Returns the (id, epoch) of the new
        transaction, or None if the record changed since ``prep`` (another client rolled
        the commit forward, or a newer instance took over): then complete and add
        partitions the usual way, which sees what happened."""
        assert prep.state == PREPARE_COMMIT
        crashpoint("before_complete")
        part = self.state_log.partition_for(prep.txn_id)
        pid, epoch = bump_epoch(prep, self._fresh_pid_if(needs_new_producer_id(prep)))
        now = now_ms()
        nxt = prep.transition(
            ONGOING, producer_id=pid, epoch=epoch,
            partitions=tuple(sorted({(tp.topic, tp.partition) for tp in tps})),
            prev_producer_id=prep.producer_id, prev_epoch=prep.epoch, prev_outcome="commit",
            txn_start_ms=now, last_update_ms=now, abort_reason="")
        if not part.compare_and_set(prep.txn_id, prep, nxt):
            return None
        crashpoint("after_add_partitions")
        return pid, epoch

    def write_marker(self, tp: TopicPartition, producer_id: int, epoch: int,
                     commit: bool, pending: PendingAppend | None = None,
                     txn_id: str | None = None) -> None:
        """Append a COMMIT/ABORT marker for (producer_id, epoch) unless one already acts;
        a COMMIT appends the transaction's ``pending`` batch objects in the same entry."""
        plog = self.log.partition_log(tp)
        # The cached state suffices: a decided transaction stays decided, and append()
        # re-reads the tail and re-checks for another marker if its slot was taken.
        # (A marker that carries batches is found the same way: it raised the fence
        # epoch, so a second roll-forward never appends them twice.)
        st = plog.current()
        if (producer_id, epoch) not in st.open_txns and \
                st.fence_epoch.get(producer_id, -1) >= epoch:
            return
        parts = list(pending.parts) if commit and pending is not None else None
        plog.append(AppendSpec(
            kind=COMMIT if commit else ABORT, count=1, producer_id=producer_id, epoch=epoch,
            transactional=True, parts=parts,
            base_sequence=pending.base_sequence if pending is not None and parts else -1,
            txn_id=txn_id if parts else None))

    # -- liveness without a daemon -------------------------------------------------------

    def abort_if_expired(self, txn_id: str) -> bool:
        """Roll a Prepare* forward, or fence-and-abort an Ongoing transaction past its
        timeout.  Returns True if something was completed."""
        part = self.state_log.partition_for(txn_id)
        while True:
            part.refresh()
            cur = part.get(txn_id)
            if cur is None:
                return False
            if cur.state in PREPARING:
                self._complete(cur)
                return True
            if cur.state == ONGOING and self.expired(cur):
                prep = cur.transition(PREPARE_ABORT, abort_reason="timeout",
                                      last_update_ms=now_ms())
                if part.compare_and_set(txn_id, cur, prep):
                    self._complete(prep)
                    return True
                continue
            return False

    def resolve_open(self, tp: TopicPartition, producer_id: int, epoch: int,
                     txn_id: str | None) -> bool:
        """Settle an open transaction (producer_id, epoch) found at a partition's LSO.

        The caller must have read the partition before calling, so that any marker written
        before the state log moved on is already known.  Returns True if it acted.
        """
        rec = self.record(txn_id) if txn_id else None
        if rec is not None and (rec.producer_id, rec.epoch) == (producer_id, epoch):
            if rec.state in PREPARING:
                self._complete(rec)
                return True
            if rec.state == ONGOING:
                if self.expired(rec):
                    return self.abort_if_expired(rec.txn_id)
                return False  # open and in time: it holds the LSO, as in Kafka
        # The transaction (producer_id, epoch) is over, yet this partition has no marker
        # for it: its batch here was never part of it (a zombie's write).  Abort it here.
        self.write_marker(tp, producer_id, epoch, commit=False)
        return True

    def sweep(self) -> list[str]:
        """Maintenance: roll forward every Prepare*, abort every expired transaction."""
        acted = []
        for rec in self.state_log.all_records():
            if (rec.state in PREPARING or self.expired(rec)) \
                    and self.abort_if_expired(rec.txn_id):
                acted.append(rec.txn_id)
        return acted

    def expire_transactional_ids(self, now: int | None = None) -> list[str]:
        """Maintenance: forget every transactional.id idle (Empty or Complete*) for longer
        than transactional.id.expiration.ms, as Kafka's coordinator does: a Dead record
        removes it from the state log, and its next init_transactions() gets a new
        producer id.  Idle time is by this client's clock against the last update's:
        the limit is days (7 by default), far beyond any clock skew that matters."""
        limit = int(self.log.config["transactional.id.expiration.ms"])
        now = now_ms() if now is None else now
        gone = []
        for rec in self.state_log.all_records():
            if rec.state not in COMPLETE or now - rec.last_update_ms <= limit:
                continue
            part = self.state_log.partition_for(rec.txn_id)

            def decide(cur: TxnRecord | None) -> TxnRecord | None:
                if cur is None or cur.state not in COMPLETE \
                        or now - cur.last_update_ms <= limit:
                    return None  # (a producer used it meanwhile)
                return cur.transition(DEAD, last_update_ms=now, partitions=())

            new = part.update(rec.txn_id, decide)
            if new is not None and new.state == DEAD:
                gone.append(rec.txn_id)
        return gone

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _check_owner(txn_id: str, cur: TxnRecord | None, producer_id: int, epoch: int) -> None:
        if cur is None:
            raise InvalidTxnStateError(
                f"transactional.id {txn_id!r} is not initialised (or it expired after "
                "transactional.id.expiration.ms idle); create a producer and call "
                "init_transactions()")
        if (cur.producer_id, cur.epoch) != (producer_id, epoch):
            if (cur.prev_producer_id, cur.prev_epoch) == (producer_id, epoch) and \
                    cur.state == COMPLETE_ABORT and cur.abort_reason == "timeout":
                raise TransactionTimeoutError(
                    f"the transaction of {txn_id!r} ran past transaction.timeout.ms "
                    f"({cur.timeout_ms} ms) and was aborted; call abort_transaction() "
                    "and start again")
            raise ProducerFencedError(
                f"producer for transactional.id {txn_id!r} (id {producer_id}, epoch {epoch}) "
                f"was fenced by a newer instance (id {cur.producer_id}, epoch {cur.epoch}); "
                "close this producer")

    @staticmethod
    def _timeout_error(txn_id: str) -> TransactionTimeoutError:
        return TransactionTimeoutError(
            f"the transaction of {txn_id!r} ran past transaction.timeout.ms and was aborted; "
            "call abort_transaction() and start again")


def ended_as(cur: TxnRecord | None, producer_id: int, epoch: int) -> str | None:
    """How the transaction (producer_id, epoch) ended, if ``cur`` is the record that ended
    it: a Complete* record, or the next transaction's Ongoing record, which carries the
    outcome in prev_outcome (a fold writes it; an Ongoing after Complete* keeps it)."""
    if cur is None or (cur.prev_producer_id, cur.prev_epoch) != (producer_id, epoch):
        return None
    if cur.state == COMPLETE_COMMIT:
        return "commit"
    if cur.state == COMPLETE_ABORT:
        return "abort"
    if cur.state == ONGOING and cur.prev_outcome in ("commit", "abort"):
        return cur.prev_outcome
    return None
