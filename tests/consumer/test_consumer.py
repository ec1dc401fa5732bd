"""The read_committed consumer over interleaved producers on one partition."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

import txlog
from txlog import TopicPartition
from txlog.consumer import Consumer
from txlog.errors import ConfigError, InvalidTxnStateError
from txlog.partition_log import AppendSpec
from txlog.records import kafka_table

TP = TopicPartition("t", 0)
SEED = 4242


def drain(c: Consumer) -> list[txlog.Record]:
    out: list[txlog.Record] = []
    while got := c.poll(1000):
        out.extend(got)
    return out


def test_interleaved_producers(tmp_path: object) -> None:
    """Committed, aborted, open and fenced-late batches mixed on one partition."""
    rng = random.Random(SEED)
    print(f"seed={SEED}")
    log = txlog.connect(str(tmp_path))
    log.create_topic("t")
    producers = [log.producer(transactional_id=f"p{i}") for i in range(3)]
    for p in producers:
        p.init_transactions()
    plain = log.producer()
    committed: list[bytes] = []
    everything: list[bytes] = []
    in_txn: dict[int, list[bytes]] = {}
    zombies: list[tuple[int, int]] = []
    for step in range(120):
        i = rng.randrange(3)
        p = producers[i]
        action = rng.random()
        if i not in in_txn:
            p.begin_transaction()
            in_txn[i] = []
        if action < 0.6:
            v = b"p%d-%d" % (i, step)
            p.send("t", v, partition=0)
            p.flush()
            in_txn[i].append(v)
            everything.append(v)
        elif action < 0.8:
            p.commit_transaction()
            committed.extend(in_txn.pop(i))
        elif action < 0.9:
            p.abort_transaction()
            in_txn.pop(i)
        elif action < 0.95:
            v = b"plain-%d" % step
            plain.send("t", v, partition=0)
            plain.flush()
            committed.append(v)
            everything.append(v)
        else:
            zombies.append((p.producer_id, p.epoch - 1))
    # A late write from a fenced epoch of p0 (its previous transaction already ended here).
    pid, epoch = producers[0].producer_id, producers[0].epoch - 1
    plog = log.partition_log(TP)
    key, n = plog.write_data(kafka_table([(None, b"zombie", None, None)]))
    with pytest.raises(txlog.errors.ProducerFencedError):
        plog.append(AppendSpec(kind="data", count=1, producer_id=pid, epoch=epoch,
                               transactional=True, txn_id="p0", data=key, nbytes=n))
    # Leave p1 open with data: it holds the LSO.
    if 1 not in in_txn:
        producers[1].begin_transaction()
        in_txn[1] = []
    producers[1].send("t", b"open-1", partition=0)
    producers[1].flush()
    everything.append(b"open-1")
    in_txn[1].append(b"open-1")
    for i in list(in_txn):
        if i != 1:
            producers[i].commit_transaction()
            committed.extend(in_txn.pop(i))

    c = log.consumer(auto_offset_reset="earliest")
    c.assign([TP])
    got = drain(c)
    st = log.partition_log(TP).refresh()
    lso = st.last_stable_offset
    open_first = st.open_txns[(producers[1].producer_id, producers[1].epoch)].first_offset
    assert lso == open_first
    assert all(r.offset < lso for r in got)
    assert [r.offset for r in got] == sorted(r.offset for r in got)
    # Exactly the committed records below the LSO, in offset order.
    offsets_of = {}
    u = log.consumer(isolation_level="read_uncommitted", auto_offset_reset="earliest")
    u.assign([TP])
    all_recs = drain(u)
    for r in all_recs:
        offsets_of[r.value] = r.offset
    assert sorted(offsets_of) == sorted(everything)  # read_uncommitted: every data record
    want = sorted((v for v in committed if offsets_of[v] < lso), key=offsets_of.__getitem__)
    assert [r.value for r in got] == want
    assert c.position(TP) == lso
    # Once p1 commits, the rest becomes visible and nothing is returned twice.
    producers[1].commit_transaction()
    committed.extend(in_txn.pop(1))
    more = drain(c)
    assert [r.value for r in got + more] == sorted(committed, key=offsets_of.__getitem__)


def test_positions_seek_and_offsets(tmp_path: object) -> None:
    log = txlog.connect(str(tmp_path))
    log.create_topic("t")
    p = log.producer(transactional_id="x")
    p.init_transactions()
    p.begin_transaction()
    for i in range(5):
        p.send("t", b"%d" % i, timestamp_ms=1000 * i)
    p.commit_transaction()  # offsets 0-4, marker 5
    p.begin_transaction()
    p.send("t", b"open")
    p.flush()  # offset 6, open
    c = log.consumer(group_id="g")  # Kafka's default: start at the end
    c.assign([TP])
    assert c.position(TP) == 6  # the LSO under read_committed
    u = log.consumer(isolation_level="read_uncommitted")
    u.assign([TP])
    assert u.position(TP) == 7  # the high watermark
    assert c.end_offsets([TP]) == {TP: 6} and u.end_offsets([TP]) == {TP: 7}
    assert c.beginning_offsets([TP]) == {TP: 0}
    c.seek(TP, 2)
    assert [r.value for r in c.poll(2)] == [b"2", b"3"]
    assert c.position(TP) == 4
    c.commit()
    assert c.committed([TP]) == {TP: 4}
    c2 = log.consumer(group_id="g")
    c2.assign([TP])
    assert [r.value for r in c2.poll(10)] == [b"4"]  # resumes at the committed offset
    c.seek_to_beginning()
    assert c.position(TP) == 0
    c.seek_to_end()
    assert c.position(TP) == 6
    assert c.offsets_for_times({TP: 2500}) == {TP: 3}
    assert c.offsets_for_times({TP: 10**13}) == {TP: None}
    assert c.last_stable_offset(TP) == 6
    t = c.poll_arrow()
    assert t.num_rows == 0
    c.seek(TP, 0)
    t = c.poll_arrow(3)
    assert t.column("offset").to_pylist() == [0, 1, 2]
    assert t.column("value").to_pylist() == [b"0", b"1", b"2"]
    assert isinstance(t, pa.Table)


def test_records_without_timestamps_have_their_append_time(tmp_path: object) -> None:
    """A null timestamp is Kafka's LogAppendTime: poll, poll_arrow and time lookups give
    the batch's append time, and the batch's entry takes it into its time range (so a
    lookup finds the record without reading batches whose own times are older)."""
    from txlog.records import HEADER_TYPE, KAFKA_SCHEMA

    log = txlog.connect(str(tmp_path))
    log.create_topic("t")
    p = log.producer()
    p.send("t", b"old", timestamp_ms=1_000)  # offset 0
    p.flush()
    p.send_batch("t", pa.table([pa.array([None, None], pa.binary()),
                                pa.array([b"own", b"none"]), pa.nulls(2, HEADER_TYPE),
                                pa.array([2_000, None], pa.timestamp("ms", tz="UTC"))],
                               schema=KAFKA_SCHEMA))  # offsets 1-2
    p.flush()
    b = log.partition_log(TP).refresh().batches
    assert (b.ts_min[0], b.ts_max[0]) == (1_000, 1_000)  # CreateTime only: unchanged
    assert (b.ts_min[1], b.ts_max[1]) == (2_000, b.append_ms[1])
    appended = b.append_ms[1]
    c = log.consumer(auto_offset_reset="earliest")
    c.assign([TP])
    assert [(r.value, r.timestamp, r.timestamp_type) for r in c.poll(10)] == [
        (b"old", 1_000, 0), (b"own", 2_000, 0), (b"none", appended, 1)]
    c.seek(TP, 0)
    t = c.poll_arrow(10)
    assert t.column("timestamp").cast(pa.int64()).to_pylist() == [1_000, 2_000, appended]
    assert t.column("timestampType").to_pylist() == [0, 0, 1]
    assert c.offsets_for_times({TP: 1_500}) == {TP: 1}
    assert c.offsets_for_times({TP: 2_001}) == {TP: 2}  # the record with no timestamp
    assert c.offsets_for_times({TP: appended + 1}) == {TP: None}


def test_consumer_errors(tmp_path: object) -> None:
    log = txlog.connect(str(tmp_path))
    log.create_topic("t")
    with pytest.raises(ConfigError, match="isolation_level"):
        log.consumer(isolation_level="read_dirty")
    c = log.consumer()
    with pytest.raises(InvalidTxnStateError, match="no partitions assigned"):
        c.poll()
    with pytest.raises(InvalidTxnStateError, match="group_id"):
        c.commit()
    with pytest.raises(txlog.errors.UnknownTopicError):
        c.assign([TopicPartition("t", 3)])


def test_poll_arrow_columns_match_poll_across_aborted_batches(tmp_path: object) -> None:
    """poll_arrow's topic, partition and offset columns (built per poll, not per row)
    name the same records as poll(): offsets skip the aborted batch and the markers."""
    log = txlog.connect(str(tmp_path))
    log.create_topic("t", 2)
    p = log.producer(transactional_id="cols")
    p.init_transactions()
    for n, outcome in ((5, "commit"), (3, "abort"), (4, "commit")):
        p.begin_transaction()
        for i in range(n):
            p.send("t", f"{outcome}-{i}".encode(), partition=1)
        if outcome == "commit":
            p.commit_transaction()
        else:
            p.abort_transaction()
    p.close()
    tp1 = TopicPartition("t", 1)
    polled = log.consumer(auto_offset_reset="earliest")
    polled.assign([tp1])
    expected = [(r.offset, r.value) for r in drain(polled)]
    assert len(expected) == 9 and all(v.startswith(b"commit") for _, v in expected)
    c = log.consumer(auto_offset_reset="earliest")
    c.assign([tp1])
    t = c.poll_arrow(100)
    assert list(zip(t.column("offset").to_pylist(), t.column("value").to_pylist(),
                    strict=True)) == expected
    assert set(t.column("topic").to_pylist()) == {"t"}
    assert set(t.column("partition").to_pylist()) == {1}
    assert t.schema.field("offset").type == pa.int64()
    assert t.schema.field("partition").type == pa.int32()


def test_offset_range_grows_past_its_cache() -> None:
    from txlog.records import offset_range

    assert offset_range(7, 0).to_pylist() == []
    assert offset_range(7, 3).to_pylist() == [7, 8, 9]
    big = offset_range(2**40, 200_000)
    assert len(big) == 200_000 and big[0].as_py() == 2**40
    assert big[-1].as_py() == 2**40 + 199_999
    assert offset_range(5, 2).to_pylist() == [5, 6]


def test_offset_range_survives_a_shorter_cache_swapped_in(monkeypatch: pytest.MonkeyPatch,
                                                          ) -> None:
    """Another thread may replace the shared cache with a shorter array between the length
    check and the slice: the call must use the array it checked."""
    from txlog import records

    class Swapping:
        """Reads as a long cache once, then as a short one."""

        reads = 0

        def __get__(self, obj: object, cls: type) -> pa.Array:
            Swapping.reads += 1
            return pa.array(range(5000 if Swapping.reads == 1 else 200), pa.int64())

        def __set__(self, obj: object, value: pa.Array) -> None:
            pass

    monkeypatch.setattr(records._Iota, "arr", Swapping())
    assert records.offset_range(7, 1000).to_pylist() == list(range(7, 1007))


def test_offset_range_beyond_its_cache_limit_and_near_overflow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from txlog import records

    monkeypatch.setattr(records, "_IOTA_MAX", 1000)
    monkeypatch.setattr(records._Iota, "arr", pa.array([], pa.int64()))
    got = records.offset_range(10, 2500)
    assert got.to_pylist() == list(range(10, 2510))
    assert len(records._Iota.arr) <= 1000
    with pytest.raises(pa.ArrowInvalid, match="overflow"):
        records.offset_range(2**63 - 3, 5)
