"""Regression tests for bugs the torture harness (scripts/torture.py) found.

Each test names the anomaly the harness reported and the seed that found it.
"""

from __future__ import annotations

import uuid

import pytest

import txlog
import txlog.producer
from txlog.errors import ProducerFencedError, UnstableOffsetCommitError
from txlog.records import TopicPartition
from txlog.testing.faults import FaultyStore


def _log(tmp_path: object) -> tuple[txlog.Log, FaultyStore]:
    log = txlog.connect(f"memory://regressions/{uuid.uuid4().hex}")
    store = FaultyStore(log.store, seed=0)
    log.store = store  # before first use: partition logs and the coordinator take it
    return log, store


def test_failed_poll_does_not_skip_records(tmp_path: object) -> None:
    """poll_skip (torture seed 202, local): a poll that read partition 0 and then failed on
    partition 1 had already moved partition 0's position past the records it never
    returned.  Positions now move only when the whole poll succeeds."""
    log, store = _log(tmp_path)
    log.create_topic("t", partitions=2)
    # (an object per partition: the fault hits partition 1's fetch, after partition 0's)
    p = log.producer(transactional_id="tx", **{"batch.objects.shared": False})
    p.init_transactions()
    p.begin_transaction()
    for i in range(3):
        p.send("t", value=f"a{i}".encode(), partition=0)
        p.send("t", value=f"b{i}".encode(), partition=1)
    p.commit_transaction()

    c = log.consumer()
    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    c.assign(tps)
    c.seek_to_beginning()
    store.script("get", "topics/t/1/data/", "error_before")
    try:
        c.poll(max_records=100)
    except txlog.errors.StorageError:
        pass
    else:  # pragma: no cover - the scripted fault must hit this poll
        raise AssertionError("the scripted fault did not fire")
    assert c.position(tps[0]) == 0 and c.position(tps[1]) == 0
    got = sorted(r.value for r in c.poll(max_records=100))
    assert got == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]


def test_committed_offsets_not_hidden_by_another_groups_open_transaction() -> None:
    """duplicate (torture seed 206, local): a consume-transform-produce client restarted
    and read its group's committed offset while another group's transaction was open in
    the same offsets partition.  The read stopped at that partition's LSO, returned an
    older offset, and the client processed its input twice.  Committed offset batches
    above the LSO now count."""
    log = txlog.connect(f"memory://regressions/{uuid.uuid4().hex}",
                        offsets_topic_num_partitions=1)
    log.create_topic("in", partitions=1)
    tp = TopicPartition("in", 0)
    other = log.producer(transactional_id="other")
    other.init_transactions()
    other.begin_transaction()
    other.send_offsets_to_transaction({tp: 1}, "other-group")  # stays open

    ctp = log.producer(transactional_id="ctp")
    ctp.init_transactions()
    ctp.begin_transaction()
    ctp.send_offsets_to_transaction({tp: 5}, "g")
    ctp.commit_transaction()

    c = log.consumer(group_id="g")
    assert c.committed([tp]) == {tp: 5}
    # The open transaction's offsets are not answered until it commits (KIP-447).
    with pytest.raises(UnstableOffsetCommitError):
        log.consumer(group_id="other-group").committed([tp], timeout=0)
    other.commit_transaction()
    assert log.consumer(group_id="other-group").committed([tp]) == {tp: 1}


def test_instance_that_loses_the_completion_race_is_fenced() -> None:
    """lost_write, aborted_read, torn_txn, inconsistent_offsets (torture seed 304, local,
    race mode): instance A's commit wrote its markers; meanwhile a new instance B of the
    same transactional.id rolled A's PrepareCommit forward and bumped the epoch for
    itself.  A's own Complete* write then lost the race and A took the *current* epoch,
    B's: two live instances shared one epoch, so neither fenced the other and their
    transactions mixed.  A now keeps the epoch its transaction ended with, which B's
    initialisation has already fenced."""
    url = f"memory://regressions/{uuid.uuid4().hex}"
    log_a, log_b = txlog.connect(url), txlog.connect(url)
    log_a.create_topic("t", partitions=1)
    a = log_a.producer(transactional_id="tx")
    a.init_transactions()
    a.begin_transaction()
    a.send("t", value=b"a1", partition=0)
    coord = log_a.coordinator
    write_marker = coord.write_marker
    started: list[txlog.producer.Producer] = []

    def write_marker_then_new_instance(*args: object, **kw: object) -> None:
        write_marker(*args, **kw)  # type: ignore[arg-type]
        if not started:
            b = log_b.producer(transactional_id="tx")
            b.init_transactions()  # rolls A's PrepareCommit forward, then fences A
            started.append(b)

    coord.write_marker = write_marker_then_new_instance  # type: ignore[method-assign]
    a.commit_transaction()  # committed (by B's roll-forward): a success for A
    a_ids = (a.producer_id, a.epoch)  # waits for A's markers and Complete* (background)
    b = started[0]
    assert a_ids != (b.producer_id, b.epoch)
    b.begin_transaction()
    b.send("t", value=b"b1", partition=0)
    a.begin_transaction()
    with pytest.raises(ProducerFencedError):
        a.send("t", value=b"a2", partition=0)
        a.flush()
    b.commit_transaction()
    c = log_b.consumer()
    c.assign([TopicPartition("t", 0)])
    c.seek_to_beginning()
    assert [r.value for r in c.poll(max_records=100)] == [b"a1", b"b1"]


def test_commit_after_a_raw_os_error_in_a_send_fails() -> None:
    """lost_write, torn_txn (torture seeds 430, 432, 433, local, commit-after-error mode):
    a send whose write raised a raw OSError (not a txlog error: e.g. a local disk's EIO)
    left the producer in the transaction; a client that committed anyway was told the
    transaction committed, without the failed batch.  Kafka's contract: the commit fails.
    Any non-txlog error during a transaction is now fatal, like a StorageError."""
    log = txlog.connect(f"memory://regressions/{uuid.uuid4().hex}")
    store = FaultyStore(log.store, seed=0, error_style="os")
    log.store = store
    log.create_topic("t", partitions=2)
    p = log.producer(transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", value=b"kept", partition=1)
    p.flush()
    store.script("put_if_absent", "topics/t/0/log/", "error_before")
    p.send("t", value=b"failed", partition=0)
    with pytest.raises(OSError):
        p.flush()
    with pytest.raises(txlog.errors.TxlogError):
        p.commit_transaction()
    p2 = log.producer(transactional_id="tx")
    p2.init_transactions()  # aborts what the failed instance left open
    c = log.consumer()
    c.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
    c.seek_to_beginning()
    assert c.poll(max_records=10) == []


def test_idempotent_producer_never_reuses_sequences_after_an_unknown_outcome() -> None:
    """lost_write (torture seed 455, local, idempotent producer): an append raised after
    it had landed; the producer kept the batch's sequence numbers for its next batch,
    which the log took for a retry of the landed one: acknowledged, never written.  After
    an append of unknown outcome the producer now starts again with a fresh producer id."""
    log = txlog.connect(f"memory://regressions/{uuid.uuid4().hex}")
    store = FaultyStore(log.store, seed=0, error_style="os")
    log.store = store
    log.create_topic("t")
    p = log.producer()
    p.send("t", value=b"first", partition=0)
    p.flush()
    store.script("put_if_absent", "topics/t/0/log/", "error_after")
    p.send("t", value=b"landed-but-unknown", partition=0)
    with pytest.raises(OSError):
        p.flush()
    p.send("t", value=b"next", partition=0)
    p.flush()
    c = log.consumer()
    c.assign([TopicPartition("t", 0)])
    c.seek_to_beginning()
    assert [r.value for r in c.poll(max_records=10)] == \
        [b"first", b"landed-but-unknown", b"next"]


def test_failed_partition_load_leaves_no_partial_state() -> None:
    """Harness run of seed 455 after a change of ours: a partition load that failed with a
    transient error part-way kept the partial state, which writers trust as complete: an
    idempotent producer's next batch failed its sequence check forever
    (OutOfOrderSequenceError).  Only a damaged entry keeps the valid prefix now."""
    log = txlog.connect(f"memory://regressions/{uuid.uuid4().hex}")
    store = FaultyStore(log.store, seed=0)
    log.store = store
    log.create_topic("t")
    p = log.producer()
    for i in range(3):
        p.send("t", value=f"v{i}".encode(), partition=0)
        p.flush()
    plog = log.partition_log(TopicPartition("t", 0))
    plog.state = None
    store.script("get", "topics/t/0/log/", "error_before")
    with pytest.raises(txlog.errors.StorageError):
        plog.load()
    assert plog.state is None
    p.send("t", value=b"v3", partition=0)
    p.flush()
    assert plog.current().high_watermark == 4


def test_commit_after_a_send_failed_reading_topic_metadata_fails() -> None:
    """lost_write (torture seeds 20399 and 20403 of the long local run, commit-after-error
    mode): send() failed reading the topic's metadata, before anything was queued, and
    left the transaction untouched; a client that committed anyway got an acknowledged
    commit without the record.  The transaction now fails (abortable), as Kafka's does
    after a metadata timeout."""
    url = f"memory://regressions/{uuid.uuid4().hex}"
    txlog.connect(url).create_topic("t")
    log = txlog.connect(url)  # no cached topic metadata
    store = FaultyStore(log.store, seed=0)
    log.store = store
    p = log.producer(transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    store.script("get", "_meta/topics/t.json", "error_after")
    with pytest.raises(txlog.errors.StorageError):
        p.send("t", value=b"v", partition=0)
    with pytest.raises(txlog.errors.InvalidTxnStateError, match="abort_transaction"):
        p.commit_transaction()
    p.abort_transaction()
    p.begin_transaction()  # the producer carries on after the abort
    p.send("t", value=b"w", partition=0)
    p.commit_transaction()
    c = log.consumer()
    c.assign([TopicPartition("t", 0)])
    c.seek_to_beginning()
    assert [r.value for r in c.poll(max_records=10)] == [b"w"]


def test_commit_after_offsets_failed_reading_their_topic_metadata_fails() -> None:
    """lost_write, torn_txn (torture seeds 20420 and 20448 of the long local run): the
    same as above for send_offsets_to_transaction(), which read the offsets topic's
    metadata before its guard: the data committed, the offsets were silently left out."""
    url = f"memory://regressions/{uuid.uuid4().hex}"
    log0 = txlog.connect(url)
    log0.create_topic("t")
    log0.consumer(group_id="g").committed([TopicPartition("t", 0)])  # offsets topic exists
    log = txlog.connect(url)
    store = FaultyStore(log.store, seed=0)
    log.store = store
    p = log.producer(transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", value=b"v", partition=0)
    p.flush()
    store.script("get", "_meta/topics/__consumer_offsets.json", "error_before")
    with pytest.raises(txlog.errors.StorageError):
        p.send_offsets_to_transaction({TopicPartition("t", 0): 1}, "g")
    with pytest.raises(txlog.errors.InvalidTxnStateError, match="abort_transaction"):
        p.commit_transaction()
    p.abort_transaction()
    assert log.consumer(group_id="g").committed([TopicPartition("t", 0)]) == \
        {TopicPartition("t", 0): None}
