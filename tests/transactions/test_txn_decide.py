"""txlog.txn_decide: the coordinator's decisions as a table of (record, facts) -> decision,
without a store; and the one read-decide-write loop that carries them out
(StateLogPartition.run) on an in-memory store."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from txlog import txn_decide as decide
from txlog.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionalIdNotFoundError,
    TransactionTimeoutError,
)
from txlog.state_log import StateLogPartition
from txlog.storage.memory import MemoryStore
from txlog.txn_decide import Complete, Decision, Expire, Facts, Fail, Reread, Return, Write
from txlog.txn_state import (
    MAX_EPOCH,
    PendingAppend,
    TxnEnd,
    TxnRecord,
)

NOW = 1_000_000
PID, EPOCH = 7, 3


def rec(state: str, *, pid: int = PID, epoch: int = EPOCH, parts: tuple[str, ...] = ("a",),
        **kw: Any) -> TxnRecord:
    return TxnRecord("t", pid, epoch, state, 60_000,
                     tuple((p, 0) for p in parts), **{"last_update_ms": NOW - 10, **kw})


def facts(*, fresh: bool = True, expired: bool = False) -> Facts:
    return Facts(NOW, fresh, expired=lambda r: expired, new_producer_id=lambda: 99)


def shape(d: Decision) -> tuple[Any, ...]:
    """A decision as a comparable value (errors by type)."""
    if isinstance(d, Write):
        return ("write", d.record, d.complete, d.retry)
    if isinstance(d, Complete):
        return ("complete", d.record, d.retry, type(d.error) if d.error else None)
    if isinstance(d, Return):
        return ("return", d.end)
    if isinstance(d, (Fail, Expire)):
        return (type(d).__name__.lower(), type(d.error))
    assert isinstance(d, Reread)
    return ("reread",)


ONGOING = rec("Ongoing")
PREP_COMMIT = ONGOING.transition("PrepareCommit")
PREP_ABORT_TIMEOUT = ONGOING.transition("PrepareAbort", abort_reason="timeout")
PREP_ABORT_CLIENT = ONGOING.transition("PrepareAbort", abort_reason="client")
COMPLETED = rec("CompleteCommit", epoch=EPOCH - 1, parts=(), prev_producer_id=PID,
                prev_epoch=EPOCH - 2, prev_outcome="commit")
EMPTY = rec("Empty", parts=())
# The transaction (PID, EPOCH) as it ended: Complete* with the epoch bumped, or the next
# transaction's Ongoing record naming it.
ENDED_COMMIT = rec("CompleteCommit", epoch=EPOCH + 1, parts=(), prev_producer_id=PID,
                   prev_epoch=EPOCH, prev_outcome="commit")
ENDED_ABORT_TIMEOUT = rec("CompleteAbort", epoch=EPOCH + 1, parts=(), prev_producer_id=PID,
                          prev_epoch=EPOCH, prev_outcome="abort", abort_reason="timeout")
ENDED_ABORT_FENCED = rec("CompleteAbort", epoch=EPOCH + 1, parts=(), prev_producer_id=PID,
                         prev_epoch=EPOCH, prev_outcome="abort", abort_reason="fenced")
FOLDED_ABORT = rec("Ongoing", epoch=EPOCH + 1, parts=("b",), prev_producer_id=PID,
                   prev_epoch=EPOCH, prev_outcome="abort")
IDLE = rec("CompleteAbort", parts=(), prev_producer_id=PID, prev_epoch=EPOCH - 1,
           prev_outcome="abort", abort_reason="client")
NEWER = rec("Empty", epoch=EPOCH + 5, parts=())
PENDING = (PendingAppend("a", 0, 0, (("topics/a/0/x", 1, 10, None, None, True),)),)
PENDING_ELSEWHERE = (PendingAppend("z", 0, 0, (("topics/z/0/x", 1, 10, None, None, True),)),)

INIT = partial(decide.init_producer_id, txn_id="t", timeout_ms=30_000)
INIT_CASES: list[tuple[str, TxnRecord | None, tuple[Any, ...]]] = [
    ("a new transactional.id gets a producer id and epoch 0", None,
     ("write", TxnRecord("t", 99, 0, "Empty", 30_000, last_update_ms=NOW), False, False)),
    ("a forgotten (Dead) one starts afresh", rec("Dead", parts=()),
     ("write", TxnRecord("t", 99, 0, "Empty", 30_000, last_update_ms=NOW), False, False)),
    ("a decided transaction is rolled forward first", PREP_COMMIT,
     ("complete", PREP_COMMIT, True, None)),
    ("an open transaction is fenced and aborted, then decided again", ONGOING,
     ("write", ONGOING.transition("PrepareAbort", abort_reason="fenced", last_update_ms=NOW),
      True, True)),
    ("an idle one bumps the epoch", COMPLETED,
     ("write", TxnRecord("t", PID, EPOCH, "Empty", 30_000, (), 0, NOW, PID, EPOCH - 1, ""),
      False, False)),
    ("epochs used up: a new producer id", rec("Empty", epoch=MAX_EPOCH, parts=()),
     ("write", TxnRecord("t", 99, 0, "Empty", 30_000, (), 0, NOW, PID, MAX_EPOCH, ""),
      False, False)),
]


@pytest.mark.parametrize(("case", "cur", "want"), INIT_CASES, ids=[c[0] for c in INIT_CASES])
def test_init_producer_id(case: str, cur: TxnRecord | None, want: tuple[Any, ...]) -> None:
    assert shape(INIT(cur, facts())) == want


ADD = partial(decide.add_partitions, txn_id="t", producer_id=PID, epoch=EPOCH,
              wanted=(("a", 0), ("b", 0)))
ADD_CASES: list[tuple[str, TxnRecord | None, Facts, tuple[Any, ...]]] = [
    ("no record: not initialised", None, facts(), ("fail", InvalidTxnStateError)),
    ("another instance owns it: fenced", NEWER, facts(), ("fail", ProducerFencedError)),
    ("ours ended for its timeout", ENDED_ABORT_TIMEOUT, facts(),
     ("fail", TransactionTimeoutError)),
    ("aborted for its timeout: rolled forward, then the timeout error", PREP_ABORT_TIMEOUT,
     facts(), ("complete", PREP_ABORT_TIMEOUT, False, TransactionTimeoutError)),
    ("completing: rolled forward, then refused", PREP_COMMIT, facts(),
     ("complete", PREP_COMMIT, False, InvalidTxnStateError)),
    ("open past its timeout: the timeout abort", ONGOING, facts(expired=True),
     ("expire", TransactionTimeoutError)),
    ("open: the new partition is merged in", ONGOING, facts(),
     ("write", ONGOING.transition("Ongoing", partitions=(("a", 0), ("b", 0)),
                                  last_update_ms=NOW), False, False)),
    ("none open: the transaction begins", IDLE, facts(),
     ("write", IDLE.transition("Ongoing", partitions=(("a", 0), ("b", 0)), txn_start_ms=NOW,
                               last_update_ms=NOW, abort_reason=""), False, False)),
]


@pytest.mark.parametrize(("case", "cur", "f", "want"), ADD_CASES, ids=[c[0] for c in ADD_CASES])
def test_add_partitions(case: str, cur: TxnRecord | None, f: Facts,
                        want: tuple[Any, ...]) -> None:
    assert shape(ADD(cur, f)) == want


def test_add_partitions_decides_nothing_to_write_on_a_fresh_read_only() -> None:
    both = ONGOING.transition("Ongoing", partitions=(("a", 0), ("b", 0)))
    assert shape(ADD(both, facts(fresh=False))) == ("reread",)
    assert shape(ADD(both, facts(fresh=True))) == ("return", None)


def end(commit: bool, pending: tuple[PendingAppend, ...] = ()) -> Callable[..., Decision]:
    return partial(decide.end_txn, txn_id="t", producer_id=PID, epoch=EPOCH, commit=commit,
                   pending=pending)


NEXT = (PID, EPOCH + 1)
END_CASES: list[tuple[str, Callable[..., Decision], TxnRecord | None, Facts,
                      tuple[Any, ...]]] = [
    ("a retried commit is answered from Complete*", end(True), ENDED_COMMIT, facts(),
     ("return", TxnEnd("t", PID, EPOCH, "commit", "", NEXT))),
    ("a retried abort is answered from the next transaction's record", end(False),
     FOLDED_ABORT, facts(), ("return", TxnEnd("t", PID, EPOCH, "abort", "", NEXT))),
    ("a commit that ended in a timeout abort", end(True), ENDED_ABORT_TIMEOUT, facts(),
     ("fail", TransactionTimeoutError)),
    ("a commit that ended in a fence abort", end(True), ENDED_ABORT_FENCED, facts(),
     ("fail", ProducerFencedError)),
    ("another instance owns it: fenced", end(False), NEWER, facts(),
     ("fail", ProducerFencedError)),
    ("nothing written: nothing to end", end(True), EMPTY, facts(),
     ("return", TxnEnd("t", PID, EPOCH, "none", "", (PID, EPOCH)))),
    ("nothing written, on a cached record: read it first", end(True), EMPTY,
     facts(fresh=False), ("reread",)),
    ("our decision met again (a retry)", end(True), PREP_COMMIT, facts(),
     ("return", TxnEnd.decided(PREP_COMMIT))),
    ("a commit of a transaction aborted for its timeout", end(True), PREP_ABORT_TIMEOUT,
     facts(), ("complete", PREP_ABORT_TIMEOUT, False, TransactionTimeoutError)),
    ("a commit of a transaction the client is aborting", end(True), PREP_ABORT_CLIENT,
     facts(), ("fail", InvalidTxnStateError)),
    ("a commit past its timeout: the timeout abort", end(True), ONGOING, facts(expired=True),
     ("expire", TransactionTimeoutError)),
    ("an abort past its timeout is still the client's abort", end(False), ONGOING,
     facts(expired=True),
     ("write", ONGOING.transition("PrepareAbort", abort_reason="client", last_update_ms=NOW),
      False, False)),
    ("a commit: PrepareCommit naming the pending objects", end(True, PENDING), ONGOING,
     facts(), ("write", ONGOING.transition("PrepareCommit", last_update_ms=NOW,
                                           pending=PENDING), False, False)),
    ("pending objects in an unregistered partition, cached: read first",
     end(True, PENDING_ELSEWHERE), ONGOING, facts(fresh=False), ("reread",)),
    ("pending objects in an unregistered partition: refused",
     end(True, PENDING_ELSEWHERE), ONGOING, facts(), ("fail", InvalidTxnStateError)),
    ("an abort claiming the slot a decision of unknown outcome wanted: Empty written",
     partial(decide.end_txn, txn_id="t", producer_id=PID, epoch=EPOCH, commit=False,
             claim=True), EMPTY, facts(),
     ("write", EMPTY.transition("Empty", partitions=(),
                                last_update_ms=max(NOW, EMPTY.last_update_ms + 1)),
      False, False)),
    ("an abort claiming the slot finds the decision landed: refused",
     partial(decide.end_txn, txn_id="t", producer_id=PID, epoch=EPOCH, commit=False,
             claim=True), PREP_COMMIT, facts(), ("fail", InvalidTxnStateError)),
]


@pytest.mark.parametrize(("case", "fn", "cur", "f", "want"), END_CASES,
                         ids=[c[0] for c in END_CASES])
def test_end_txn(case: str, fn: Callable[..., Decision], cur: TxnRecord | None, f: Facts,
                 want: tuple[Any, ...]) -> None:
    assert shape(fn(cur, f)) == want


OTHER_CASES: list[tuple[str, Callable[..., Decision], TxnRecord | None, Facts,
                        tuple[Any, ...]]] = [
    ("timeout check: no record", decide.abort_if_expired, None, facts(), ("return", None)),
    ("timeout check: a Prepare* is rolled forward", decide.abort_if_expired, PREP_COMMIT,
     facts(), ("complete", PREP_COMMIT, False, None)),
    ("timeout check: expired is fenced and aborted", decide.abort_if_expired, ONGOING,
     facts(expired=True),
     ("write", ONGOING.transition("PrepareAbort", abort_reason="timeout", last_update_ms=NOW),
      True, False)),
    ("timeout check: in time", decide.abort_if_expired, ONGOING, facts(), ("return", None)),
    ("admin abort: unknown id", partial(decide.abort_open, txn_id="t", reason="admin",
                                        where="memory://x"), None, facts(),
     ("fail", TransactionalIdNotFoundError)),
    ("admin abort: a Prepare* is rolled forward",
     partial(decide.abort_open, txn_id="t", reason="admin", where="x"), PREP_ABORT_CLIENT,
     facts(), ("complete", PREP_ABORT_CLIENT, False, None)),
    ("admin abort: the open transaction", partial(decide.abort_open, txn_id="t",
                                                  reason="admin", where="x"), ONGOING,
     facts(), ("write", ONGOING.transition("PrepareAbort", abort_reason="admin",
                                           last_update_ms=NOW), True, False)),
    ("admin abort: nothing open", partial(decide.abort_open, txn_id="t", reason="admin",
                                          where="x"), EMPTY, facts(),
     ("fail", InvalidTxnStateError)),
    ("forget: idle past the limit", partial(decide.forget_idle, limit_ms=5), EMPTY, facts(),
     ("write", EMPTY.transition("Dead", last_update_ms=NOW, partitions=()), False, False)),
    ("forget: used recently", partial(decide.forget_idle, limit_ms=60_000), EMPTY, facts(),
     ("return", None)),
    ("forget: never an open transaction", partial(decide.forget_idle, limit_ms=5), ONGOING,
     facts(), ("return", None)),
]


@pytest.mark.parametrize(("case", "fn", "cur", "f", "want"), OTHER_CASES,
                         ids=[c[0] for c in OTHER_CASES])
def test_liveness_admin_and_maintenance(case: str, fn: Callable[..., Decision],
                                        cur: TxnRecord | None, f: Facts,
                                        want: tuple[Any, ...]) -> None:
    assert shape(fn(cur, f)) == want


# -- the loop ---------------------------------------------------------------------------------


def partition() -> StateLogPartition:
    return StateLogPartition(MemoryStore("memory://", f"decide/{uuid.uuid4().hex}"), 0)


def no_complete(prep: TxnRecord) -> TxnEnd:
    raise AssertionError("nothing to complete here")


def test_run_trusts_the_owners_cached_record_and_re_decides_when_it_was_stale() -> None:
    """The owner's cached record is decided on without a read; when another client wrote
    since, the compare-and-set loses and the loop reads and decides again (fresh)."""
    mine = partition()
    other = StateLogPartition(mine.store, 0)
    assert mine.compare_and_set("t", None, ONGOING)
    other.refresh()
    moved = ONGOING.transition("Ongoing", partitions=(("a", 0), ("c", 0)))
    assert other.compare_and_set("t", ONGOING, moved)  # mine's cache is now stale
    seen: list[tuple[TxnRecord | None, bool]] = []

    def add_b(cur: TxnRecord | None, f: Facts) -> Decision:
        seen.append((cur, f.fresh))
        assert cur is not None
        return Write(cur.transition("Ongoing", partitions=(*cur.partitions, ("b", 0))))

    got = mine.run("t", add_b, complete=no_complete, owner=(PID, EPOCH))
    assert seen == [(ONGOING, False), (moved, True)]
    assert isinstance(got, TxnRecord) and got.partitions == (("a", 0), ("c", 0), ("b", 0))
    other.refresh()
    assert other.get("t") == got


def test_run_re_reads_when_a_cached_decision_asks() -> None:
    part = partition()
    assert part.compare_and_set("t", None, EMPTY)
    calls: list[bool] = []

    def nothing_on_fresh(cur: TxnRecord | None, f: Facts) -> Decision:
        calls.append(f.fresh)
        return Return() if f.fresh else Reread()

    assert part.run("t", nothing_on_fresh, complete=no_complete, owner=(PID, EPOCH)) is None
    assert calls == [False, True]


def test_run_completes_then_retries_or_raises() -> None:
    """Complete(retry) rolls the Prepare* forward and decides again; Complete(error)
    rolls it forward and raises; Write(complete) completes what it wrote."""
    part = partition()
    assert part.compare_and_set("t", None, ONGOING)
    completed: list[TxnRecord] = []

    def complete(prep: TxnRecord) -> TxnEnd:
        completed.append(prep)
        done = prep.transition(prep.state.replace("Prepare", "Complete"),
                               epoch=prep.epoch + 1, partitions=())
        assert part.compare_and_set("t", prep, done)
        return TxnEnd.decided(prep)

    got = part.run("t", decide.abort_if_expired, complete=complete, expired=lambda r: True)
    assert isinstance(got, TxnEnd) and got.outcome == "abort" and got.reason == "timeout"
    assert not got.rolled_forward and [r.state for r in completed] == ["PrepareAbort"]
    rec_now = part.get("t")
    assert rec_now is not None and rec_now.state == "CompleteAbort"
    prep = rec_now.transition("Ongoing").transition("PrepareCommit")
    assert part.compare_and_set("t", rec_now, rec_now.transition("Ongoing"))
    assert part.compare_and_set("t", rec_now.transition("Ongoing"), prep)
    with pytest.raises(InvalidTxnStateError, match="completing"):
        part.run("t", partial(decide.add_partitions, txn_id="t", producer_id=prep.producer_id,
                              epoch=prep.epoch, wanted=(("a", 0),)),
                 complete=complete, owner=(prep.producer_id, prep.epoch))
    assert completed[-1] == prep


def test_run_gives_up_after_its_attempts() -> None:
    from txlog.errors import ConcurrentTransactionsError

    part = partition()
    with pytest.raises(ConcurrentTransactionsError):
        part.run("t", lambda cur, f: Complete(ONGOING, retry=True),
                 complete=lambda prep: TxnEnd.decided(PREP_COMMIT), attempts=3)


FOLD = partial(decide.commit_folded, txn_id="t", producer_id=PID, epoch=EPOCH,
               wanted=(("b", 0), ("a", 0)), pending=(), inline=(("k", "eA=="),))


@pytest.mark.parametrize("case,cur,f,want", [
    ("from Complete*: begins and decides in one write", rec("CompleteCommit", parts=()),
     facts(), ("write", rec("CompleteCommit", parts=()).transition(
         "PrepareCommit", partitions=(("a", 0), ("b", 0)), txn_start_ms=NOW,
         last_update_ms=NOW, abort_reason="", inline=(("k", "eA=="),)), False, False)),
    ("from Empty, on the owner's cached record", rec("Empty", parts=()),
     facts(fresh=False), ("write", rec("Empty", parts=()).transition(
         "PrepareCommit", partitions=(("a", 0), ("b", 0)), txn_start_ms=NOW,
         last_update_ms=NOW, abort_reason="", inline=(("k", "eA=="),)), False, False)),
    ("from Ongoing: the registered partitions merged", ONGOING, facts(),
     ("write", ONGOING.transition("PrepareCommit", partitions=(("a", 0), ("b", 0)),
                                  last_update_ms=NOW, abort_reason="",
                                  inline=(("k", "eA=="),)), False, False)),
    ("Ongoing past its timeout", ONGOING, facts(expired=True),
     ("expire", TransactionTimeoutError)),
    ("fenced by a newer instance", rec("CompleteCommit", epoch=EPOCH + 1), facts(),
     ("fail", ProducerFencedError)),
    ("our own decision met again on a retry", PREP_COMMIT, facts(),
     ("return", TxnEnd.decided(PREP_COMMIT))),
])
def test_commit_folded(case: str, cur: TxnRecord, f: Facts, want: tuple[Any, ...]) -> None:
    """EndTxn(commit) with AddPartitions folded in: PrepareCommit straight from Empty or
    Complete* (txlog's own transition), or from the owner's Ongoing record; anything
    else decides as EndTxn does."""
    assert shape(FOLD(cur, f)) == want, case


def test_only_prepare_commit_carries_copies_and_they_are_checked() -> None:
    """A record with copies is version 3 and round-trips; every later transition drops
    them; a copy of an object the record does not name as pending is refused, and a
    copy whose bytes fail the key's CRC-32 is not used."""
    import base64
    import zlib

    from txlog.errors import CorruptObjectError
    from txlog.txn_state import INLINE_VERSION

    data = b"PAR1 object bytes"
    key = f"topics/a/0/data/x.crc32-{zlib.crc32(data):08x}.parquet"
    bad = f"topics/a/0/data/y.crc32-{zlib.crc32(b'other'):08x}.parquet"
    pending = (PendingAppend("a", 0, 0, ((key, 1, len(data), None, None, False),
                                         (bad, 1, len(data), None, None, False))),)
    copies = tuple(sorted((k, base64.b64encode(data).decode()) for k in (key, bad)))
    prep = ONGOING.transition("PrepareCommit", pending=pending, inline=copies)
    d = prep.to_json()
    assert d["v"] == INLINE_VERSION == 3 and set(d["inline"]) == {key, bad}
    assert TxnRecord.from_json(d, "t") == prep
    assert prep.inline_bytes() == {key: data}  # (the other fails its key's checksum)
    done = prep.transition("CompleteCommit", partitions=())
    assert done.inline == () and "inline" not in done.to_json() and done.to_json()["v"] == 1
    with pytest.raises(InvalidTxnStateError):
        ONGOING.transition("Ongoing", inline=copies)
    stray = dict(d, inline={"topics/a/0/data/z.parquet": "eA=="})
    with pytest.raises(CorruptObjectError, match="does not name as pending"):
        TxnRecord.from_json(stray, "t")
