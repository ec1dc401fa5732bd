"""What the coordinator does next with one transactional.id's record, decided purely.

Every state-log operation (InitProducerId, AddPartitionsToTxn, EndTxn, the timeout abort,
an administrator's abort, forgetting an idle id) is a function of the current record and
a few facts to a :data:`Decision`: write a new record, roll a Prepare* forward first,
return, or raise.  :meth:`txlog.state_log.StateLogPartition.run` is the one loop that
reads, asks, and acts, and re-asks whenever another client wins the compare-and-set.
No I/O here: what a decision needs beyond the record comes in :class:`Facts`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from txlog.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionalIdNotFoundError,
    TransactionTimeoutError,
    TxlogError,
)
from txlog.txn_state import (
    ABORTED,
    COMMITTED,
    COMPLETE,
    COMPLETE_ABORT,
    DEAD,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    PREPARING,
    PendingAppend,
    TxnEnd,
    TxnRecord,
    bump_epoch,
    ended_as,
    needs_new_producer_id,
)


def _not_given_expired(rec: TxnRecord) -> bool:
    raise AssertionError("this decision was given no timeout check")


def _not_given_pid() -> int:
    raise AssertionError("this decision was given no producer id allocator")


@dataclass(frozen=True)
class Facts:
    """What a decision knows besides the record.

    ``fresh``: the record was just read from the store (not the owner's cached copy).
    ``expired``: whether an open transaction ran past its timeout (on the store's clock).
    ``new_producer_id``: allocates a producer id (a new transactional.id, or epochs used up).
    """

    now: int
    fresh: bool = True
    expired: Callable[[TxnRecord], bool] = field(default=_not_given_expired, compare=False)
    new_producer_id: Callable[[], int] = field(default=_not_given_pid, compare=False)


@dataclass(frozen=True)
class Write:
    """Compare-and-set ``record`` against the record decided on; when that loses, read
    again and decide again.  ``complete``: then roll the written Prepare* forward;
    ``retry``: then decide again (otherwise the operation ends)."""

    record: TxnRecord
    complete: bool = False
    retry: bool = False


@dataclass(frozen=True)
class Complete:
    """Roll the persisted Prepare* ``record`` forward (markers, then Complete*); then
    raise ``error``, or decide again (``retry``), or end with the completion."""

    record: TxnRecord
    retry: bool = False
    error: TxlogError | None = None


@dataclass(frozen=True)
class Return:
    """End the operation with ``end`` (None: nothing ended, or nothing to write)."""

    end: TxnEnd | None = None


@dataclass(frozen=True)
class Fail:
    error: TxlogError


@dataclass(frozen=True)
class Expire:
    """Abort the open transaction for its timeout (as a client that finds it expired
    does), then raise ``error``."""

    error: TxlogError


@dataclass(frozen=True)
class Reread:
    """Decided on the owner's cached record, and this must be decided on the store's:
    read it and decide again."""


Decision = Write | Complete | Return | Fail | Expire | Reread


# -- errors ---------------------------------------------------------------------------------


def timeout_error(txn_id: str) -> TransactionTimeoutError:
    return TransactionTimeoutError(
        f"the transaction of {txn_id!r} ran past transaction.timeout.ms and was aborted; "
        "call abort_transaction() and start again")


def owner_error(txn_id: str, cur: TxnRecord | None, producer_id: int,
                epoch: int) -> TxlogError | None:
    """Why (producer_id, epoch) may not act on ``cur``, or None if it owns it."""
    if cur is None:
        return InvalidTxnStateError(
            f"transactional.id {txn_id!r} is not initialised (or it expired after "
            "transactional.id.expiration.ms idle); create a producer and call "
            "init_transactions()")
    if (cur.producer_id, cur.epoch) != (producer_id, epoch):
        if (cur.prev_producer_id, cur.prev_epoch) == (producer_id, epoch) and \
                cur.state == COMPLETE_ABORT and cur.abort_reason == "timeout":
            return TransactionTimeoutError(
                f"the transaction of {txn_id!r} ran past transaction.timeout.ms "
                f"({cur.timeout_ms} ms) and was aborted; call abort_transaction() "
                "and start again")
        return ProducerFencedError(
            f"producer for transactional.id {txn_id!r} (id {producer_id}, epoch {epoch}) "
            f"was fenced by a newer instance (id {cur.producer_id}, epoch {cur.epoch}); "
            "close this producer")
    return None


# -- the operations ---------------------------------------------------------------------------


def init_producer_id(cur: TxnRecord | None, facts: Facts, *, txn_id: str,
                     timeout_ms: int) -> Decision:
    """InitProducerId: fence any earlier instance (aborting its open transaction, rolling
    its decided one forward) and write Empty with the epoch bumped."""
    now = facts.now
    if cur is None or cur.state == DEAD:
        return Write(TxnRecord(txn_id, facts.new_producer_id(), 0, EMPTY, timeout_ms,
                               last_update_ms=now))
    if cur.state in PREPARING:
        return Complete(cur, retry=True)
    if cur.state == ONGOING:
        # A previous instance's transaction is open: fence it and abort it.
        return Write(cur.transition(PREPARE_ABORT, abort_reason="fenced", last_update_ms=now),
                     complete=True, retry=True)
    # Empty, Complete*
    pid, epoch = bump_epoch(
        cur, facts.new_producer_id() if needs_new_producer_id(cur) else None)
    return Write(TxnRecord(txn_id, pid, epoch, EMPTY, timeout_ms, (), 0, now,
                           cur.producer_id, cur.epoch, cur.abort_reason))


def add_partitions(cur: TxnRecord | None, facts: Facts, *, txn_id: str, producer_id: int,
                   epoch: int, wanted: tuple[tuple[str, int], ...]) -> Decision:
    """AddPartitionsToTxn: register ``wanted`` with the owner's transaction (opening it
    if none is open)."""
    err = owner_error(txn_id, cur, producer_id, epoch)
    if err is not None:
        return Fail(err)
    assert cur is not None  # (owner_error refuses a missing record)
    now = facts.now
    if cur.state in PREPARING:
        if cur.state == PREPARE_ABORT and cur.abort_reason == "timeout":
            return Complete(cur, error=timeout_error(txn_id))
        return Complete(cur, error=InvalidTxnStateError(
            f"transaction of {txn_id!r} is completing; begin a new one first"))
    if cur.state == ONGOING:
        if facts.expired(cur):
            return Expire(timeout_error(txn_id))
        merged = tuple(sorted(set(cur.partitions) | set(wanted)))
        if merged == cur.partitions:
            # "Nothing to write" is decided on a fresh read only.
            return Return() if facts.fresh else Reread()
        return Write(cur.transition(ONGOING, partitions=merged, last_update_ms=now))
    if cur.state in COMPLETE:
        return Write(cur.transition(ONGOING, partitions=wanted, txn_start_ms=now,
                                    last_update_ms=now, abort_reason=""))
    return Fail(InvalidTxnStateError(
        f"transactional.id {txn_id!r} is {cur.state}; call init_transactions()"))


def end_txn(cur: TxnRecord | None, facts: Facts, *, txn_id: str, producer_id: int,
            epoch: int, commit: bool, pending: tuple[PendingAppend, ...] = (),
            claim: bool = False) -> Decision:
    """EndTxn up to its decision: write Prepare* (``pending``: the batch objects its
    COMMIT markers append), or answer a retry from the record that ended it.

    ``claim`` (an abort): with nothing open, still write the record (Empty, the same
    producer id and epoch).  A PrepareCommit that registers its partitions follows an
    Empty or Complete* record directly; if its write failed with an unknown outcome, it
    may land later, and only a record written at the slot it claimed, or one that
    changes the record it expects, keeps it from landing after the abort returned."""
    ended = ended_as(cur, producer_id, epoch)
    if cur is not None and ended is not None:
        # The transaction already ended: our own retry, or a timeout abort.
        if (ended == COMMITTED) == commit:
            return Return(TxnEnd(txn_id, producer_id, epoch, ended,
                                 cur.abort_reason if ended == ABORTED else "",
                                 next_id=(cur.producer_id, cur.epoch)))
        if cur.abort_reason == "timeout":
            return Fail(timeout_error(txn_id))
        return Fail(ProducerFencedError(
            f"transaction of {txn_id!r} was aborted by another client (fenced)"))
    err = owner_error(txn_id, cur, producer_id, epoch)
    if err is not None:
        return Fail(err)
    assert cur is not None  # (owner_error refuses a missing record)
    if not {(a.topic, a.partition) for a in pending} <= set(cur.partitions):
        if not facts.fresh:
            return Reread()
        return Fail(InvalidTxnStateError(  # (a producer bug: registration comes first)
            f"transaction of {txn_id!r} would append to unregistered partitions"))
    if cur.state == EMPTY or (cur.state in COMPLETE and not cur.partitions):
        if not facts.fresh:
            return Reread()
        if claim and not commit:
            return Write(cur.transition(EMPTY, partitions=(),
                                        last_update_ms=max(facts.now, cur.last_update_ms + 1)))
        return Return(TxnEnd.nothing(txn_id, producer_id, epoch))  # nothing was written
    if cur.state in PREPARING:
        if (cur.state == PREPARE_COMMIT) != commit:
            if cur.abort_reason == "timeout":
                return Complete(cur, error=timeout_error(txn_id))
            return Fail(InvalidTxnStateError(
                f"transaction of {txn_id!r} is already {cur.state}"))
        return Return(TxnEnd.decided(cur))  # our own decision, met again on a retry
    if cur.state != ONGOING:
        return Fail(InvalidTxnStateError(f"transaction of {txn_id!r} is {cur.state}"))
    if commit and facts.expired(cur):
        return Expire(timeout_error(txn_id))
    return Write(cur.transition(PREPARE_COMMIT if commit else PREPARE_ABORT,
                                last_update_ms=facts.now, pending=pending,
                                abort_reason="" if commit else "client"))


def commit_folded(cur: TxnRecord | None, facts: Facts, *, txn_id: str, producer_id: int,
                  epoch: int, wanted: tuple[tuple[str, int], ...],
                  pending: tuple[PendingAppend, ...],
                  inline: tuple[tuple[str, str], ...]) -> Decision:
    """EndTxn(commit) with AddPartitionsToTxn folded in: register ``wanted`` and decide
    in one write (PrepareCommit straight from Empty or Complete*, or from the owner's
    Ongoing record with ``wanted`` merged in), carrying ``inline`` copies of pending
    objects whose uploads may not have landed.  Anything else decides as EndTxn."""
    err = owner_error(txn_id, cur, producer_id, epoch)
    if err is None and cur is not None and (
            cur.state == ONGOING or cur.state in COMPLETE):
        merged = tuple(sorted(set(cur.partitions if cur.state == ONGOING else ())
                              | set(wanted)))
        if cur.state == ONGOING and facts.expired(cur):
            return Expire(timeout_error(txn_id))
        changes: dict[str, object] = {}
        if cur.state != ONGOING:  # the transaction begins and is decided in this write
            changes = {"txn_start_ms": facts.now}
        return Write(cur.transition(PREPARE_COMMIT, partitions=merged, pending=pending,
                                    inline=inline, last_update_ms=facts.now,
                                    abort_reason="", **changes))
    return end_txn(cur, facts, txn_id=txn_id, producer_id=producer_id, epoch=epoch,
                   commit=True, pending=pending)


def abort_if_expired(cur: TxnRecord | None, facts: Facts) -> Decision:
    """Liveness without a daemon: roll a Prepare* forward, or fence and abort an open
    transaction past its timeout; otherwise nothing."""
    if cur is None:
        return Return()
    if cur.state in PREPARING:
        return Complete(cur)
    if cur.state == ONGOING and facts.expired(cur):
        return Write(cur.transition(PREPARE_ABORT, abort_reason="timeout",
                                    last_update_ms=facts.now), complete=True)
    return Return()


def abort_open(cur: TxnRecord | None, facts: Facts, *, txn_id: str, reason: str,
               where: str) -> Decision:
    """An administrator's abort: fence the producer and abort its open transaction (as a
    newer instance would), or roll a Prepare* forward to its decision."""
    if cur is None:
        return Fail(TransactionalIdNotFoundError(f"no transactional.id {txn_id!r} in {where}"))
    if cur.state in PREPARING:
        return Complete(cur)
    if cur.state == ONGOING:
        return Write(cur.transition(PREPARE_ABORT, abort_reason=reason,
                                    last_update_ms=facts.now), complete=True)
    return Fail(InvalidTxnStateError(
        f"transactional.id {txn_id!r} has no open transaction (state {cur.state}); "
        "nothing to abort"))


def forget_idle(cur: TxnRecord | None, facts: Facts, *, limit_ms: int) -> Decision:
    """Maintenance: a transactional.id idle (Empty or Complete*) for longer than
    ``limit_ms`` at ``facts.now`` becomes Dead (the state log forgets it)."""
    if cur is None or cur.state not in COMPLETE or facts.now - cur.last_update_ms <= limit_ms:
        return Return()  # (a producer used it meanwhile)
    return Write(cur.transition(DEAD, last_update_ms=facts.now, partitions=()))
