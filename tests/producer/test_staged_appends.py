"""Producer.send_staged_many (a Spark commit's appends): partitions at once, each in
order; failures stop the others and leave the transaction uncommittable."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest

import txlog
from txlog import TopicPartition, layout
from txlog.errors import InvalidTxnStateError, ProducerFencedError, StorageError
from txlog.offsets import offsets_partition
from txlog.partition_log import AppendSpec, PartitionLog
from txlog.producer import StagedObject, State
from txlog.records import kafka_table
from txlog.testing.faults import FaultRates, FaultyStore

SEED = 13


def faulty_log(**kw: object) -> tuple[txlog.Log, FaultyStore]:
    lg = txlog.connect(f"memory://staged/{uuid.uuid4().hex}")
    store = FaultyStore(lg.store, **kw)  # type: ignore[arg-type]
    lg.store = store
    return lg, store


def stage(lg: txlog.Log, topic: str, per_part: dict[int, int], tag: str = "",
          ) -> list[StagedObject]:
    """Write ``per_part[p]`` one-record objects per partition, as a Spark task stages."""
    items = []
    for part, n in per_part.items():
        plog = lg.partition_log(TopicPartition(topic, part))
        for j in range(n):
            key, nbytes = plog.write_data(kafka_table([(None, f"{tag}{part}-{j}".encode(),
                                                        None, None)]))
            items.append(StagedObject(TopicPartition(topic, part), key, 1, nbytes))
    return items


def values(lg: txlog.Log, tp: TopicPartition) -> list[tuple[int, bytes]]:
    c = lg.consumer(auto_offset_reset="earliest")
    c.assign([tp])
    out: list[tuple[int, bytes]] = []
    while batch := c.poll(10_000):
        out.extend((r.offset, r.value) for r in batch)
    return out


def entries(lg: txlog.Log, tp: TopicPartition) -> int:
    return len(lg.store.list(layout.log_prefix(tp.topic, tp.partition)))


def test_concurrent_partitions_with_ambiguous_appends_land_once_in_order() -> None:
    """16 partitions x 6 objects, 4 transactions, 15% of entry creates take effect but
    report an error (retried with the same sequence numbers): every partition holds its
    objects once, in order, at the offsets returned."""
    print(f"seed={SEED}")
    lg, store = faulty_log(seed=SEED, rates={
        "put_if_absent": FaultRates(latency=0.5, latency_ms=3, error_after=0.15),
        "*": FaultRates(latency=0.3, latency_ms=2)})
    with store.paused():
        lg.create_topic("t", partitions=16)
        p = lg.producer(transactional_id="stress")
        p.init_transactions()
    for n in range(4):
        with store.paused():
            items = stage(lg, "t", dict.fromkeys(range(16), 6), tag=f"{n}:")
            p.begin_transaction()
            p.add_partitions_to_transaction([it.tp for it in items])
        bases = p.send_staged_many(items)
        with store.paused():
            p.commit_transaction()
        assert bases == [n * 7 + j for _ in range(16) for j in range(6)]  # + 1 marker
    with store.paused():
        p.close()
        assert store.injected["put_if_absent.error_after"] > 5
        for part in range(16):
            got = values(lg, TopicPartition("t", part))
            assert [o for o, _ in got] == [n * 7 + j for n in range(4) for j in range(6)]
            assert [v for _, v in got] == [f"{n}:{part}-{j}".encode()
                                           for n in range(4) for j in range(6)]


def failing_partition_zero() -> tuple[txlog.Log, list[StagedObject]]:
    lg, store = faulty_log(seed=1)
    lg.create_topic("t", partitions=3)
    items = stage(lg, "t", {0: 1, 1: 20, 2: 20})
    store.script("put_if_absent", layout.log_prefix("t", 0), "error_before", times=1)
    return lg, items


def test_a_failed_partition_stops_the_others_and_the_transaction_aborts() -> None:
    lg, items = failing_partition_zero()
    p = lg.producer(transactional_id="fail", retries=0)
    p.init_transactions()
    p.begin_transaction()
    p.add_partitions_to_transaction([it.tp for it in items])
    with pytest.raises(StorageError):
        p.send_staged_many(items)
    assert not [t for t in threading.enumerate() if t.name.startswith("txlog-staged")]
    # Each other partition had at most the append in flight and one more before it
    # saw the stop (of 20).
    assert all(entries(lg, TopicPartition("t", k)) <= 2 for k in (1, 2))
    assert p.state == State.ABORTABLE_ERROR
    with pytest.raises(InvalidTxnStateError):
        p.commit_transaction()
    p.abort_transaction()
    for part in range(3):
        tp = TopicPartition("t", part)
        assert values(lg, tp) == []
        st = lg.partition_log(tp).refresh()
        assert st.last_stable_offset == st.high_watermark and not st.open_txns
    p.begin_transaction()  # the producer goes on
    p.send_staged_many(stage(lg, "t", {0: 1, 1: 1}, tag="ok"))
    p.commit_transaction()
    p.close()
    assert [v for _, v in values(lg, TopicPartition("t", 0))] == [b"ok0-0"]


def test_the_gravest_of_several_failures_decides_and_the_others_are_logged(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Partition 0 fails with an abortable store error, partition 1 with an error whose
    outcome is unknown (fatal on its own): the fatal one is raised and sets the state,
    the other is logged."""
    lg = txlog.connect(f"memory://staged/{uuid.uuid4().hex}")
    lg.create_topic("t", partitions=2)
    items = stage(lg, "t", {0: 1, 1: 1})
    real = PartitionLog.append
    both = threading.Barrier(2, timeout=30)

    def append(plog: PartitionLog, spec: AppendSpec) -> object:
        if spec.data is not None:
            both.wait()  # both partitions fail, whichever first
            if plog.partition == 0:
                raise StorageError("partition 0: store error")
            raise TimeoutError("partition 1: outcome unknown")
        return real(plog, spec)

    p = lg.producer(transactional_id="two-failures", retries=0)
    p.init_transactions()
    p.begin_transaction()
    p.add_partitions_to_transaction([it.tp for it in items])
    monkeypatch.setattr(PartitionLog, "append", append)
    caplog.set_level(logging.WARNING)
    with pytest.raises(TimeoutError, match="partition 1"):
        p.send_staged_many(items)
    assert p.state == State.FATAL_ERROR
    assert "partition 0: store error" in caplog.text


def test_a_newer_instance_fences_the_appends_midway(monkeypatch: pytest.MonkeyPatch) -> None:
    lg = txlog.connect(f"memory://staged/{uuid.uuid4().hex}")
    lg.create_topic("t", partitions=3)
    items = stage(lg, "t", {0: 30, 1: 30, 2: 30})
    real = PartitionLog.append
    calls = {"p1": 0}
    newer = lg.producer(transactional_id="z")

    def append(plog: PartitionLog, spec: AppendSpec) -> object:
        if spec.data is not None and plog.partition == 1:
            calls["p1"] += 1
            if calls["p1"] == 5:
                newer.init_transactions()
        return real(plog, spec)

    old = lg.producer(transactional_id="z")
    old.init_transactions()
    old.begin_transaction()
    old.add_partitions_to_transaction([it.tp for it in items])
    monkeypatch.setattr(PartitionLog, "append", append)
    with pytest.raises(ProducerFencedError):
        old.send_staged_many(items)
    monkeypatch.undo()
    assert old.state == State.FATAL_ERROR
    for part in range(3):
        tp = TopicPartition("t", part)
        assert values(lg, tp) == []
        st = lg.partition_log(tp).refresh()
        assert st.last_stable_offset == st.high_watermark and not st.open_txns
    newer.begin_transaction()
    newer.send_staged_many(stage(lg, "t", {0: 1, 2: 1}, tag="new"))
    newer.commit_transaction()
    newer.close()
    assert [v for _, v in values(lg, TopicPartition("t", 2))] == [b"new2-0"]


def test_a_plain_producer_appends_in_the_given_order() -> None:
    """Without a transaction every append is visible at once: items [p0:x, p1:y, p0:z]
    with y failing leave x visible and never z."""
    lg, store = faulty_log(seed=2)
    lg.create_topic("t", partitions=2)
    a = stage(lg, "t", {0: 2, 1: 1})  # p0-0, p0-1, p1-0
    store.script("put_if_absent", layout.log_prefix("t", 1), "error_before", times=1)
    p = lg.producer(retries=0)
    with pytest.raises(StorageError):
        p.send_staged_many([a[0], a[2], a[1]])
    p.close()
    assert [v for _, v in values(lg, TopicPartition("t", 0))] == [b"0-0"]


def test_crash_point_hits_are_counted_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """TXLOG_CRASH_AT=name:n counts every hit, also from the staged-append threads."""
    import sys

    import txlog.crashpoints as cp

    monkeypatch.setattr(cp, "_KILL", ("x", 10**12))
    monkeypatch.setattr(cp, "_hits", {})
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        def hit_often() -> None:
            for _ in range(20_000):
                cp.crashpoint("x")

        ts = [threading.Thread(target=hit_often) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert cp._hits["x"] == 8 * 20_000


def test_objects_and_offsets_of_no_records_are_left_out() -> None:
    """A staged object of no records, and empty offsets, append nothing (a DATA entry of
    no records would start where the next batch does): send_staged() gives -1 for it,
    as Kafka gives for an offset it does not know, and the rest land as usual."""
    lg = txlog.connect(f"memory://staged/{uuid.uuid4().hex}")
    lg.create_topic("t", partitions=2)
    p = lg.producer(transactional_id="zero")
    p.init_transactions()
    p.begin_transaction()
    [one] = stage(lg, "t", {0: 1})
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    empty_key, empty_bytes = lg.partition_log(tp1).write_data(kafka_table([]))
    empty = StagedObject(tp1, empty_key, 0, empty_bytes)
    assert p.send_staged_many([empty, one, empty]) == [-1, 0, -1]
    assert p.send_staged(tp1, empty_key, 0, empty_bytes) == -1
    p.send_offsets_to_transaction({}, "g")
    p.commit_transaction()
    assert entries(lg, tp1) == 0
    assert entries(lg, offsets_partition(lg, "g")) == 0
    assert values(lg, tp0) == [(0, b"0-0")]
    p.close()
