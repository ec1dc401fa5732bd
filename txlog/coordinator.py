"""The transaction coordinator, run in-process by any client.

Each operation is one run of the state log's read-decide-write loop
(:meth:`txlog.state_log.StateLogPartition.run`) with a pure decision of
:mod:`txlog.txn_decide`: the next record is persisted with a compare-and-set before it
is acted on.  EndTxn is Prepare*, then markers to every registered partition, then
Complete* with the epoch bumped (:class:`txlog.txn_markers.TxnCompleter`, which this
class is); every end comes back as a :class:`txlog.txn_state.TxnEnd`.  Anyone who meets
a transaction in Prepare* rolls it forward; one past its timeout is fenced and aborted.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING

from txlog import txn_decide as decide
from txlog.crashpoints import crashpoint
from txlog.producer_ids import ProducerIdAllocator
from txlog.records import TopicPartition, now_ms
from txlog.state_log import StateLog
from txlog.store_clock import StoreClock
from txlog.txn_markers import TxnCompleter
from txlog.txn_state import (
    COMPLETE,
    DEAD,
    EMPTY,
    ONGOING,
    PREPARING,
    PendingAppend,
    TxnEnd,
    TxnRecord,
    check_timeout,
)

if TYPE_CHECKING:
    from txlog.root import Root

log = logging.getLogger(__name__)


def max_transaction_timeout_ms(txlog: Root) -> int:
    """transaction.max.timeout.ms for the root (the one place it is read): the value
    stored in the root, which every client of it shares (txlog.root_settings)."""
    return int(txlog.root_settings()["transaction.max.timeout.ms"])


class Coordinator(TxnCompleter):
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
        new = part.run(
            txn_id, partial(decide.init_producer_id, txn_id=txn_id, timeout_ms=timeout_ms),
            complete=self.complete, new_producer_id=self.pids.allocate)
        assert isinstance(new, TxnRecord)
        return new.producer_id, new.epoch

    # -- AddPartitionsToTxn / AddOffsetsToTxn ------------------------------------------

    def add_partitions(self, txn_id: str, producer_id: int, epoch: int,
                       tps: Iterable[TopicPartition]) -> None:
        """Register partitions with the transaction before the first write to them."""
        wanted = tuple(sorted({(tp.topic, tp.partition) for tp in tps}))
        written = self.state_log.partition_for(txn_id).run(
            txn_id, partial(decide.add_partitions, txn_id=txn_id, producer_id=producer_id,
                            epoch=epoch, wanted=wanted),
            complete=self.complete, expire=partial(self.abort_if_expired, txn_id),
            expired=self._owner_expired, owner=(producer_id, epoch))
        if written is not None:
            crashpoint("after_add_partitions")

    def _owner_expired(self, rec: TxnRecord) -> bool:
        return self.expired(rec, owner=True)

    # -- EndTxn ------------------------------------------------------------------------

    def end_txn(self, txn_id: str, producer_id: int, epoch: int, commit: bool) -> TxnEnd:
        """Commit or abort, markers and Complete* included; the end's next_id is the
        producer's (id, epoch) for its next transaction."""
        end = self.prepare_end(txn_id, producer_id, epoch, commit)
        return end if end.prep is None or end.completed else self.complete(end.prep)

    def prepare_end(self, txn_id: str, producer_id: int, epoch: int, commit: bool,
                    pending: tuple[PendingAppend, ...] = (), *,
                    register: Iterable[TopicPartition] = (),
                    inline: Mapping[str, bytes] | None = None,
                    claim: bool = False) -> TxnEnd:
        """EndTxn up to its decision.  Returns the end decided by the persisted Prepare*
        record (``prep``), which :meth:`complete` then rolls forward (the outcome is
        decided once it is durable, as Kafka answers EndTxn before its markers are
        written), or a completed end when there is nothing left to complete.

        ``pending`` (a commit only) names written batch objects that no entry appended
        yet: the PrepareCommit record carries them, and its COMMIT markers append them
        (one entry per partition), so the decision waits for no DATA entry.  Their
        partitions must be registered already, or be in ``register`` (AddPartitions
        folded into the decision: one state-log write).  ``inline``: the bytes of pending
        objects that may still be uploading; the record carries base64 copies, and
        whoever rolls it forward writes them first (TxnCompleter.write_markers).
        ``claim`` (an abort only): write a record even when there is nothing to abort,
        after a PrepareCommit of unknown outcome that needed no Ongoing record before it
        (decide.end_txn)."""
        assert commit or not (pending or inline)
        if inline:
            wanted = tuple(sorted({(tp.topic, tp.partition) for tp in register}))
            copies = tuple(sorted((k, base64.b64encode(v).decode())
                                  for k, v in inline.items()))
            decision = partial(decide.commit_folded, txn_id=txn_id, producer_id=producer_id,
                               epoch=epoch, wanted=wanted, pending=pending, inline=copies)
        else:
            assert not register
            decision = partial(decide.end_txn, txn_id=txn_id, producer_id=producer_id,
                               epoch=epoch, commit=commit, pending=pending, claim=claim)
        got = self.state_log.partition_for(txn_id).run(
            txn_id, decision, complete=self.complete,
            expire=partial(self.abort_if_expired, txn_id),
            expired=self._owner_expired, owner=(producer_id, epoch))
        if isinstance(got, TxnRecord):
            if got.state == EMPTY:  # a claim written: nothing was open
                return TxnEnd.nothing(txn_id, producer_id, epoch)
            return TxnEnd.decided(got)
        assert got is not None
        return got

    # -- liveness without a daemon -------------------------------------------------------

    def abort_if_expired(self, txn_id: str) -> TxnEnd | None:
        """Roll a Prepare* forward, or fence-and-abort an Ongoing transaction past its
        timeout.  Returns the end, or None if nothing was completed."""
        got = self.state_log.partition_for(txn_id).run(
            txn_id, decide.abort_if_expired, complete=self.complete, expired=self.expired)
        assert not isinstance(got, TxnRecord)
        return got

    def abort_open(self, txn_id: str, *, reason: str = "admin") -> TxnEnd:
        """End ``txn_id``'s open transaction: fence its producer and abort (as a newer
        instance's init_transactions() would), or roll a Prepare* forward to its
        decision (the end then says rolled_forward)."""
        got = self.state_log.partition_for(txn_id).run(
            txn_id, partial(decide.abort_open, txn_id=txn_id, reason=reason,
                            where=self.log.url),
            complete=self.complete)
        assert isinstance(got, TxnEnd)
        return got

    def resolve_open(self, tp: TopicPartition, producer_id: int, epoch: int,
                     txn_id: str | None) -> bool:
        """Settle an open transaction (producer_id, epoch) found at a partition's LSO.

        The caller must have read the partition before calling, so that any marker written
        before the state log moved on is already known.  Returns True if it acted.
        """
        rec = self.record(txn_id) if txn_id else None
        if rec is not None and (rec.producer_id, rec.epoch) == (producer_id, epoch):
            if rec.state in PREPARING:
                self.complete(rec)
                return True
            if rec.state == ONGOING:
                if self.expired(rec):
                    return self.abort_if_expired(rec.txn_id) is not None
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
                    and self.abort_if_expired(rec.txn_id) is not None:
                acted.append(rec.txn_id)
        return acted

    def expire_transactional_ids(self, now: int | None = None) -> list[str]:
        """Maintenance: forget every transactional.id idle (Empty or Complete*) for longer
        than transactional.id.expiration.ms, as Kafka's coordinator does: a Dead record
        removes it from the state log, and its next init_transactions() gets a new
        producer id.  Idle time is by this client's clock against the last update's:
        the limit is days (7 by default), far beyond any clock skew that matters."""
        limit = int(self.log.config["transactional.id.expiration.ms"])
        at = now_ms() if now is None else now
        gone = []
        for rec in self.state_log.all_records():
            if rec.state not in COMPLETE or at - rec.last_update_ms <= limit:
                continue
            new = self.state_log.partition_for(rec.txn_id).run(
                rec.txn_id, partial(decide.forget_idle, limit_ms=limit),
                complete=self.complete, clock=lambda: at, attempts=1000)
            if isinstance(new, TxnRecord) and new.state == DEAD:
                gone.append(rec.txn_id)
        return gone
