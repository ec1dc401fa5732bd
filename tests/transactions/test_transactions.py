"""Transactions: atomic commit/abort, fencing, idempotence, timeouts, offsets in txns."""

from __future__ import annotations

import pytest
from helpers import read_all

import txlog
from txlog import TopicPartition
from txlog.errors import (
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    TransactionTimeoutError,
    UnstableOffsetCommitError,
)
from txlog.partition_log import AppendSpec
from txlog.txn_state import MAX_EPOCH, VALID_PREVIOUS, TxnRecord


@pytest.fixture
def log(tmp_path: object) -> txlog.Log:
    lg = txlog.connect(str(tmp_path))
    lg.create_topic("a", partitions=3)
    lg.create_topic("b", partitions=2)
    return lg


def test_commit_and_abort_are_all_or_nothing_across_topics(log: txlog.Log) -> None:
    p = log.producer(transactional_id="t1")
    p.init_transactions()
    for n in range(6):
        p.begin_transaction()
        for part in range(3):
            p.send("a", b"a%d-%d" % (n, part), partition=part)
        for part in range(2):
            p.send("b", b"b%d-%d" % (n, part), partition=part)
        if n % 2:
            p.abort_transaction()
        else:
            p.flush()  # data is in the log before the decision
            p.commit_transaction()
    # Also abort after the data was written.
    p.begin_transaction()
    p.send("a", b"late-abort", partition=0)
    p.flush()
    p.abort_transaction()
    got_a = sorted(read_all(log, "a"))
    got_b = sorted(read_all(log, "b"))
    assert got_a == sorted(b"a%d-%d" % (n, part) for n in (0, 2, 4) for part in range(3))
    assert got_b == sorted(b"b%d-%d" % (n, part) for n in (0, 2, 4) for part in range(2))
    assert b"late-abort" in read_all(log, "a", "read_uncommitted")


def test_fenced_producer_leaves_no_batch_objects_behind(log: txlog.Log) -> None:
    """A transaction's batch objects are written while its partitions are registered;
    when registering fails (the producer was fenced), the objects are deleted: no entry
    names them, and nothing else would ever remove them."""
    zombie = log.producer(transactional_id="tz")
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("a", b"zombie", partition=1)
    log.producer(transactional_id="tz").init_transactions()  # fences the zombie
    with pytest.raises(ProducerFencedError):
        zombie.flush()
    assert log.store.list("topics/a/1/data/") == []
    assert read_all(log, "a", "read_uncommitted") == []


def test_zombie_is_fenced_and_invisible(log: txlog.Log) -> None:
    z = log.producer(transactional_id="t1")
    z.init_transactions()
    z.begin_transaction()
    z.send("a", b"zombie-1", partition=0)
    z.flush()
    new = log.producer(transactional_id="t1")
    new.init_transactions()  # fences z and aborts its open transaction
    with pytest.raises(ProducerFencedError):
        z.send("a", b"zombie-2", partition=1)
        z.flush()
    with pytest.raises(ProducerFencedError):
        z.send_offsets_to_transaction({TopicPartition("a", 0): 1}, "g")
    with pytest.raises(ProducerFencedError):
        z.commit_transaction()
    new.begin_transaction()
    new.send("a", b"new", partition=0)
    new.commit_transaction()
    assert read_all(log, "a") == [b"new"]
    c = log.consumer(auto_offset_reset="earliest")
    c.assign([TopicPartition("a", 0)])
    assert c.last_stable_offset(TopicPartition("a", 0)) == c.end_offsets(
        [TopicPartition("a", 0)])[TopicPartition("a", 0)]


def test_zombie_late_write_to_unregistered_partition_never_visible(log: txlog.Log) -> None:
    """A write from a fenced epoch to a partition its transaction never registered has no
    marker there: a reader aborts it instead of letting it hold the LSO."""
    z = log.producer(transactional_id="t1")
    z.init_transactions()
    z.begin_transaction()
    z.send("a", b"z", partition=0)
    z.flush()
    pid, epoch = z.producer_id, z.epoch
    new = log.producer(transactional_id="t1")
    new.init_transactions()
    # Simulate the zombie's delayed append that skipped registration (a paused process).
    plog = log.partition_log(TopicPartition("b", 1))
    key, n = plog.write_data(__import__("txlog.records", fromlist=["kafka_table"]).kafka_table(
        [(None, b"late", None, None)]))
    plog.append(AppendSpec(kind="data", count=1, producer_id=pid, epoch=epoch,
                           transactional=True, txn_id="t1", data=key, nbytes=n))
    c = log.consumer(auto_offset_reset="earliest")
    tp = TopicPartition("b", 1)
    assert c.last_stable_offset(tp) == 2  # resolved: aborted, LSO not held
    c.assign([tp])
    assert c.poll(10) == []


def test_idempotent_retries_appear_once_and_gaps_fail(log: txlog.Log) -> None:
    p = log.producer()
    tp = TopicPartition("a", 0)
    plog = log.partition_log(tp)
    from txlog.records import kafka_table

    table = kafka_table([(None, b"x", None, None), (None, b"y", None, None)])
    key, n = plog.write_data(table)
    spec = AppendSpec(kind="data", count=2, producer_id=p.producer_id, epoch=0,
                      base_sequence=0, data=key, nbytes=n)
    first = plog.append(spec)
    again = log.partition_log(tp).append(spec)  # a retry after an ambiguous outcome
    assert again.duplicate and again.base_offset == first.base_offset
    fresh = txlog.connect(log.url).partition_log(tp)  # a different client sees it too
    assert fresh.append(spec).duplicate
    gap = AppendSpec(kind="data", count=1, producer_id=p.producer_id, epoch=0,
                     base_sequence=5, data=key, nbytes=n)
    with pytest.raises(OutOfOrderSequenceError):
        plog.append(gap)
    assert read_all(log, "a") == [b"x", b"y"]


def test_timeout_aborts_and_lso_moves_on(log: txlog.Log) -> None:
    # Long enough for a healthy transaction on a loaded machine, short for the test.
    p = log.producer(transactional_id="slow", transaction_timeout_ms=2000)
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"abandoned", partition=0)
    p.flush()
    tp = TopicPartition("a", 0)
    import time

    deadline = time.monotonic() + 60
    c = log.consumer(auto_offset_reset="earliest")
    while c.last_stable_offset(tp) != 2 and time.monotonic() < deadline:
        pass  # the reader resolves the expired transaction on its own
    assert c.last_stable_offset(tp) == 2
    with pytest.raises(TransactionTimeoutError):
        p.commit_transaction()
    p.abort_transaction()  # abortable: the producer carries on
    p.begin_transaction()
    p.send("a", b"next", partition=0)
    p.commit_transaction()
    assert read_all(log, "a") == [b"next"]


def test_offsets_visible_only_when_committed(log: txlog.Log) -> None:
    tp = TopicPartition("a", 0)
    p = log.producer(transactional_id="copier")
    p.init_transactions()
    p.begin_transaction()
    p.send_offsets_to_transaction({tp: 5}, "g1")
    p.abort_transaction()
    c = log.consumer(group_id="g1")
    assert c.committed([tp]) == {tp: None}
    p.begin_transaction()
    p.send_offsets_to_transaction({tp: 7}, "g1")
    p.flush()
    with pytest.raises(UnstableOffsetCommitError):  # still open: not answered (KIP-447)
        c.committed([tp], timeout=0)
    p.commit_transaction()
    assert c.committed([tp]) == {tp: 7}
    c.commit({tp: 9})
    assert c.committed([tp]) == {tp: 9}


def test_client_state_errors(log: txlog.Log) -> None:
    p = log.producer(transactional_id="s")
    with pytest.raises(InvalidTxnStateError):
        p.begin_transaction()
    p.init_transactions()
    with pytest.raises(InvalidTxnStateError):
        p.send("a", b"x")
    with pytest.raises(InvalidTxnStateError):
        p.commit_transaction()
    plain = log.producer()
    with pytest.raises(InvalidTxnStateError):
        plain.begin_transaction()


def test_epoch_bumps_every_end_and_exhaustion_rotates_producer_id(log: txlog.Log) -> None:
    p = log.producer(transactional_id="e")
    p.init_transactions()
    e0 = p.epoch
    p.begin_transaction()
    p.send("a", b"1", partition=0)
    p.commit_transaction()
    assert p.epoch == e0 + 1
    # Force the record to the last epoch, then end a transaction.
    coord = log.coordinator
    part = coord.state_log.partition_for("e")
    cur = coord.record("e")
    assert cur is not None
    from dataclasses import replace

    assert part.compare_and_set("e", cur, replace(cur, epoch=MAX_EPOCH))
    p.epoch = MAX_EPOCH
    old_pid = p.producer_id
    p.begin_transaction()
    p.send("a", b"2", partition=0)
    p.commit_transaction()
    assert p.producer_id != old_pid and p.epoch == 0
    assert read_all(log, "a") == [b"1", b"2"]


def test_state_machine_matches_kafka() -> None:
    rec = TxnRecord("x", 1, 0, "Empty", 1000)
    ongoing = rec.transition("Ongoing")
    with pytest.raises(InvalidTxnStateError):
        ongoing.transition("CompleteCommit")
    # txlog's own: a commit that registers its partitions in its decision goes to
    # PrepareCommit from Empty or Complete* (Kafka needs Ongoing first).
    assert VALID_PREVIOUS["PrepareCommit"] == {"Ongoing", "Empty", "CompleteCommit",
                                               "CompleteAbort"}
    assert rec.transition("PrepareCommit").state == "PrepareCommit"
    prep = ongoing.transition("PrepareCommit")
    with pytest.raises(InvalidTxnStateError):
        prep.transition("CompleteAbort")
    assert prep.transition("CompleteCommit").state == "CompleteCommit"
    # Fencing persists PrepareAbort at once (Kafka's in-memory PrepareEpochFence is no
    # state here); Dead is written only for an idle transactional.id.
    assert VALID_PREVIOUS["PrepareAbort"] == {"Ongoing"}
    assert "PrepareEpochFence" not in VALID_PREVIOUS
    assert VALID_PREVIOUS["Dead"] == {"Empty", "CompleteCommit", "CompleteAbort"}
    assert TxnRecord.from_json(prep.to_json(), "t") == prep


def test_commit_returns_when_decided_and_markers_follow(log: txlog.Log, tmp_path: object,
                                                        ) -> None:
    """commit_transaction() returns once PrepareCommit is durable (markers and
    CompleteCommit follow in the background, as Kafka's EndTxn answers before its
    markers); a read in the committing process still sees the commit, and the next
    transaction and close() wait for the background work."""
    import threading

    p = log.producer(transactional_id="bg")
    p.init_transactions()
    gate = threading.Event()
    coord = log.coordinator
    real_marker = coord.write_marker

    def gated_marker(*args: object, **kw: object) -> None:
        assert gate.wait(60), "test gate never opened"
        real_marker(*args, **kw)  # type: ignore[arg-type]

    coord.write_marker = gated_marker  # type: ignore[method-assign]
    p.begin_transaction()
    p.send("a", b"v1", partition=0)
    p.send("b", b"v2", partition=1)
    p.commit_transaction()  # returns although no marker can be written yet
    other = txlog.connect(str(tmp_path))  # another process's view: decided, not complete
    rec = other.coordinator.record("bg")
    assert rec is not None and rec.state == "PrepareCommit"
    seen: list[bytes] = []
    reader = threading.Thread(target=lambda: seen.extend(read_all(log, "a") + read_all(log, "b")))
    reader.start()  # waits for this process's markers instead of missing the commit
    gate.set()
    reader.join(60)
    assert sorted(seen) == [b"v1", b"v2"]
    coord.write_marker = real_marker  # type: ignore[method-assign]
    p.begin_transaction()
    p.send("a", b"v3", partition=0)
    p.commit_transaction()
    p.close()  # leaves nothing in Prepare*
    rec = other.coordinator.record("bg")
    assert rec is not None and rec.state == "CompleteCommit"
    assert sorted(read_all(other, "a")) == [b"v1", b"v3"]


def test_exit_without_close_completes_the_commit(tmp_path: object) -> None:
    """A script that commits and ends without close() still writes its markers."""
    import subprocess
    import sys

    root = str(tmp_path)
    log = txlog.connect(root)
    log.create_topic("a", partitions=1)
    code = ("import txlog\n"
            f"p = txlog.connect({root!r}).producer(transactional_id='x')\n"
            "p.init_transactions(); p.begin_transaction()\n"
            "p.send('a', b'v', partition=0); p.commit_transaction()\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    rec = log.coordinator.record("x")
    assert rec is not None and rec.state == "CompleteCommit"
    st = log.partition_log(TopicPartition("a", 0)).refresh()
    assert not st.open_txns and st.last_stable_offset == st.high_watermark


def test_failed_background_completion_is_retried_by_the_next_operation(
        log: txlog.Log) -> None:
    """Torture seed 100001 (local): the background markers of a commit hit a store error
    and reading ``producer.epoch`` raised it.  Attributes never raise; the next
    transaction retries the markers, and the commit holds throughout."""
    from txlog.errors import StorageError

    p = log.producer(transactional_id="retry")
    p.init_transactions()
    coord = log.coordinator
    real_marker = coord.write_marker
    # Fails in the background and again when reading the epoch retries it, the second
    # time as a raw OS error (torture seed 100270: a filesystem's TimeoutError).
    failures: list[Exception] = [TimeoutError("injected: marker read timed out"),
                                 StorageError("injected: marker write timed out")]

    def flaky_marker(*args: object, **kw: object) -> None:
        if failures:
            raise failures.pop()
        real_marker(*args, **kw)  # type: ignore[arg-type]

    coord.write_marker = flaky_marker  # type: ignore[method-assign]
    p.begin_transaction()
    p.send("a", b"first", partition=0)
    e0 = p._epoch
    p.commit_transaction()
    assert p.epoch == e0  # both attempts failed: still the ended one's epoch, no raise
    assert not failures
    p.begin_transaction()
    p.send("a", b"second", partition=0)
    p.commit_transaction()  # its first write finished the first commit's markers
    p.close()
    assert read_all(log, "a") == [b"first", b"second"]
    rec = log.coordinator.record("retry")
    assert rec is not None and rec.state == "CompleteCommit"


def test_send_staged_many_appends_partitions_at_once_each_in_order(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Spark commit's staged objects: the three partitions' first appends are in flight
    together (a barrier that sequential appends would never pass), each partition's
    objects land in the given order, and the returned base offsets are theirs."""
    import threading

    from txlog.partition_log import PartitionLog
    from txlog.producer import StagedObject
    from txlog.records import kafka_table

    staged = []
    for part in range(3):
        plog = log.partition_log(TopicPartition("a", part))
        for j in range(2):
            table = kafka_table([(None, f"p{part}-{j}".encode(), None, None)] * (j + 1))
            key, nbytes = plog.write_data(table)
            staged.append(StagedObject(TopicPartition("a", part), key, j + 1, nbytes))
    first_appends = threading.Barrier(3, timeout=30)
    seen: set[int] = set()
    real = PartitionLog.append

    def append(plog: PartitionLog, spec: AppendSpec) -> object:
        if spec.data is not None and plog.partition not in seen:
            seen.add(plog.partition)
            first_appends.wait()  # raises BrokenBarrierError unless all three meet
        return real(plog, spec)

    monkeypatch.setattr(PartitionLog, "append", append)
    p = log.producer(transactional_id="staged")
    p.init_transactions()
    p.begin_transaction()
    bases = p.send_staged_many(staged)
    p.commit_transaction()
    p.close()
    assert bases == [0, 1, 0, 1, 0, 1]
    c = log.consumer(auto_offset_reset="earliest")
    for part in range(3):
        tp = TopicPartition("a", part)
        c.assign([tp])
        got = [(r.offset, r.value) for r in c.poll(100)]
        assert got == [(0, f"p{part}-0".encode()), (1, f"p{part}-1".encode()),
                       (2, f"p{part}-1".encode())]


def test_an_abort_that_hits_a_raw_os_error_can_be_retried(log: txlog.Log) -> None:
    """A raw OSError (a filesystem's TimeoutError, not a txlog error) while aborting
    leaves the transaction abortable, not stuck in ABORTING: the abort is retried and
    the producer goes on."""
    p = log.producer(transactional_id="abort-raw")
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"gone", partition=0)
    p.flush()
    coord = log.coordinator
    real = coord.prepare_end
    failures = [TimeoutError("injected: state-log write timed out")]

    def flaky(*args: object, **kw: object) -> object:
        if failures:
            raise failures.pop()
        return real(*args, **kw)  # type: ignore[arg-type]

    coord.prepare_end = flaky  # type: ignore[method-assign,assignment]
    with pytest.raises(TimeoutError):
        p.abort_transaction()
    assert p.state.value == "ABORTABLE_ERROR"
    p.abort_transaction()
    p.begin_transaction()
    p.send("a", b"kept", partition=0)
    p.commit_transaction()
    p.close()
    assert read_all(log, "a") == [b"kept"]
