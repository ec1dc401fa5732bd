"""The partition log on a real store: dense offsets, racing appenders, checkpoints."""

from __future__ import annotations

import multiprocessing as mp
import sys
from typing import Any

import pyarrow as pa
import pytest

import txlog
from txlog import TopicPartition
from txlog.errors import InvalidNameError, SchemaMismatchError, TopicExistsError, UnknownTopicError
from txlog.model import DATA
from txlog.partition_log import AppendSpec, PartitionLog
from txlog.partition_state import READ_COMMITTED

TP0 = TopicPartition("t", 0)


def _appender(root: str, n: int, tag: int, barrier: object) -> None:
    log = txlog.connect(root)
    plog = log.partition_log(TP0)
    barrier.wait()  # type: ignore[attr-defined]
    for i in range(n):
        table = pa.table({"value": [f"{tag}-{i}-{j}".encode() for j in range(3)]})
        from txlog.records import KAFKA_SCHEMA, conform

        table = conform(table, KAFKA_SCHEMA, "t", kafka_shaped=True)
        key, nbytes = plog.write_data(table)
        plog.append(AppendSpec(kind=DATA, count=3, data=key, nbytes=nbytes))


def test_racing_processes_get_dense_unique_offsets(tmp_path: object) -> None:
    root = str(tmp_path)
    log = txlog.connect(root)
    log.create_topic("t")
    procs, per = 4, 25
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    ps = [ctx.Process(target=_appender, args=(root, per, k, barrier)) for k in range(procs)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(120)
        assert p.exitcode == 0
    st = txlog.connect(root).partition_log(TP0).load()
    assert st.high_watermark == procs * per * 3
    assert st.batches.base_offset == list(range(0, procs * per * 3, 3))
    c = txlog.connect(root).consumer(auto_offset_reset="earliest")
    c.assign([TP0])
    recs = c.poll(max_records=10_000)
    assert [r.offset for r in recs] == list(range(procs * per * 3))
    values = [r.value for r in recs]
    assert len(set(values)) == len(values)  # every batch readable, none twice
    for k in range(procs):  # each appender's batches in its own order
        mine = [v for v in values if v.startswith(f"{k}-".encode())]
        assert mine == [f"{k}-{i}-{j}".encode() for i in range(per) for j in range(3)]
    print(f"appenders={procs} batches={procs * per} offsets dense 0..{st.high_watermark - 1}")


def test_single_writer_appends_with_one_atomic_request(tmp_path: object) -> None:
    log = txlog.connect(str(tmp_path))
    log.create_topic("t")
    p = log.producer(linger_ms=0)
    p.send("t", b"warm")
    p.flush()
    log.store.counter.reset()
    for i in range(10):
        p.send("t", b"x%d" % i)
        p.flush()
    req = log.store.counter.snapshot()["requests"]
    assert req.get("put_if_absent") == 10  # one claim per batch
    assert req.get("put") == 10  # one data object per batch
    assert "list" not in req  # a single writer predicts its slot: no listing


def test_open_reads_checkpoint_plus_tail(tmp_path: object) -> None:
    log = txlog.connect(str(tmp_path), checkpoint_interval_batches=50)
    log.create_topic("t")
    plog = log.partition_log(TP0)
    table = pa.table({"value": [b"v"]})
    from txlog.records import KAFKA_SCHEMA, conform

    table = conform(table, KAFKA_SCHEMA, "t", kafka_shaped=True)
    key, n = plog.write_data(table)
    for _ in range(120):
        plog.append(AppendSpec(kind=DATA, count=1, data=key, nbytes=n))
    fresh = txlog.connect(str(tmp_path))
    fresh.store.counter.reset()
    st = PartitionLog(fresh.store, "t", 0).load()
    req = fresh.store.counter.snapshot()["requests"]
    assert st.high_watermark == 120
    # checkpoint at slot 100: one list of checkpoints, one checkpoint get, one tail list
    # and the 20 tail entries; a tail that long leaves a checkpoint at slot 120 for the
    # next cold open (one put, and the list that cleans up older checkpoints).
    assert req["get"] == 1 + 20
    assert req["list"] == 2 + 1
    assert req["put"] == 1


def test_corrupt_checkpoint_falls_back(tmp_path: object) -> None:
    log = txlog.connect(str(tmp_path), checkpoint_interval_batches=10)
    log.create_topic("t")
    p = log.producer()
    for i in range(25):
        p.send("t", b"%d" % i)
        p.flush()
    keys = log.store.list("topics/t/0/checkpoints/")
    assert keys
    log.store.put(keys[-1], b"garbage")
    c = txlog.connect(str(tmp_path)).consumer(auto_offset_reset="earliest")
    c.assign([TP0])
    assert [r.value for r in c.poll(100)] == [b"%d" % i for i in range(25)]


def test_topics_lifecycle_and_errors(tmp_path: object) -> None:
    log = txlog.connect(str(tmp_path))
    log.create_topic("a", partitions=3)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())])
    log.create_topic("typed", schema=schema)
    assert log.list_topics() == ["a", "typed"]
    assert log.describe_topic("a")["partitions"] == 3
    with pytest.raises(TopicExistsError, match="already exists"):
        log.create_topic("a")
    for bad in ["../x", "a/b", "", ".", "..", "x" * 300, "with space"]:
        with pytest.raises(InvalidNameError):
            log.create_topic(bad)
    with pytest.raises(UnknownTopicError, match="unknown topic 'nope'"):
        log.producer().send("nope", b"x")
    p = log.producer()
    p.send_batch("typed", pa.table({"id": [1, 2], "name": ["a", None]}))
    with pytest.raises(SchemaMismatchError):
        p.send_batch("typed", pa.table({"id": ["not-an-int"]}))
    with pytest.raises(SchemaMismatchError):
        p.send_batch("typed", pa.table({"name": ["missing id"]}))
    p.flush()
    c = log.consumer(auto_offset_reset="earliest")
    c.assign([TopicPartition("typed", 0)])
    t = c.poll_arrow()
    assert t.column("id").to_pylist() == [1, 2]
    assert t.column("offset").to_pylist() == [0, 1]
    log.delete_topic("a")
    assert log.list_topics() == ["typed"]
    assert not log.store.list("topics/a/")


def test_partitioner_and_records(tmp_path: object) -> None:
    log = txlog.connect(str(tmp_path))
    log.create_topic("t", partitions=4)
    p = log.producer()
    futs = [p.send("t", b"v%d" % i, key=b"k%d" % (i % 5), headers=[("h", b"1")],
                   timestamp_ms=1000 + i) for i in range(20)]
    p.flush()
    from txlog.partitioner import partition_for_key

    for i, f in enumerate(futs):
        assert f.get().partition == partition_for_key(b"k%d" % (i % 5), 4)
    c = log.consumer(auto_offset_reset="earliest")
    c.subscribe(["t"])
    recs = c.poll(100)
    assert len(recs) == 20
    r = next(r for r in recs if r.value == b"v3")
    assert (r.key, r.headers, r.timestamp) == (b"k3", [("h", b"1")], 1003)
    ts = c.offsets_for_times({TopicPartition("t", r.partition): 1003})
    assert ts[TopicPartition("t", r.partition)] == r.offset
    assert c.end_offsets([TopicPartition("t", r.partition)])[
        TopicPartition("t", r.partition)] >= 1


def test_send_futures_report_the_offsets_the_log_assigned(tmp_path: object) -> None:
    log = txlog.connect(str(tmp_path))
    log.create_topic("t", partitions=1)
    # Several batches (offsets cross batches); the last one waits for flush(), as the
    # linger thread would write it only after an hour.
    conf: dict[str, Any] = {"batch.size": 400, "linger.ms": 3_600_000}
    p = log.producer(**conf)
    futs = [p.send("t", b"v%03d" % i, partition=0) for i in range(50)]
    assert not futs[-1].done()
    with pytest.raises(txlog.errors.InvalidTxnStateError, match="not written within"):
        futs[-1].get(timeout=0.01)
    p.flush()
    assert all(f.done() for f in futs)
    metas = [f.get() for f in futs]
    assert [m.offset for m in metas] == list(range(50))
    assert metas[7] is futs[7].get()  # built once
    c = log.consumer(auto_offset_reset="earliest")
    c.assign([TopicPartition("t", 0)])
    by_offset = {r.offset: r.value for r in c.poll(100)}
    assert [by_offset[m.offset] for m in metas] == [b"v%03d" % i for i in range(50)]


def test_store_is_picklable_and_log_too(tmp_path: object) -> None:
    import pickle

    log = txlog.connect(str(tmp_path))
    log.create_topic("t")
    log2 = pickle.loads(pickle.dumps(log))
    p = log2.producer()
    p.send("t", b"x")
    p.flush()
    st = log.partition_log(TP0).refresh()
    assert st.plan_read(0, None, READ_COMMITTED)[1] == 1


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))


def test_batch_objects_of_kafka_and_typed_topics_encode_and_decode() -> None:
    """encode_parquet skips the dictionary for Kafka values, also in objects without the
    optional columns, and takes typed tables with other columns (one named value too)."""
    import pyarrow.parquet as pq

    from txlog.batch_codec import decode_parquet, encode_parquet

    kv = pa.table({"key": pa.array([b"k"] * 3), "value": pa.array([b"v"] * 3)})
    typed = pa.table({"id": pa.array(["a", "b", "c"]), "value": pa.array([1, 2, 3])})
    for table, value_dict in ((kv, False), (typed, True)):
        raw = encode_parquet(table)
        assert decode_parquet(raw, "x").equals(table)
        meta = pq.ParquetFile(pa.BufferReader(raw)).metadata.row_group(0)
        encodings = meta.column(table.column_names.index("value")).encodings
        assert ("RLE_DICTIONARY" in encodings or "PLAIN_DICTIONARY" in encodings) == value_dict


def test_an_append_of_parts_stamps_each_and_drops_parts_of_no_records(
        tmp_path: object) -> None:
    """Each part's timestamps are stamped as a single object's entry would be (none of
    its own: the append time); a part of no records is left out (readers refuse an
    entry with one), and one part left is written as an ordinary entry."""
    import json

    from txlog import layout

    lg = txlog.connect(str(tmp_path))
    lg.create_topic("t", partitions=1)
    plog = lg.partition_log(TopicPartition("t", 0))
    d = layout.data_prefix("t", 0)  # (an entry may name only its partition's objects)
    res = plog.append(AppendSpec(kind=DATA, count=0, parts=[
        (d + "k0", 0, 5, 1, 1, False), (d + "k1", 2, 10, 100, 200, False),
        (d + "k2", 3, 20, None, None, True)]))
    one = plog.append(AppendSpec(kind=DATA, count=0, parts=[
        (d + "k3", 0, 5, 1, 1, False), (d + "k4", 4, 40, 300, 400, False)]))
    assert (res.base_offset, one.base_offset) == (0, 5)
    raw = [json.loads(lg.store.get(layout.entry_key("t", 0, i))) for i in (0, 1)]
    assert [r["v"] for r in raw] == [2, 1]
    assert raw[0]["data"] == d + "k1" and raw[0]["count"] == 5 and raw[0]["nbytes"] == 30
    appended = raw[0]["append_ms"]
    assert raw[0]["extra"]["parts"] == [[d + "k1", 2, 10, 100, 200],
                                        [d + "k2", 3, 20, appended, appended]]
    assert (raw[1]["data"], raw[1]["count"], raw[1]["ts_min"], raw[1]["extra"]) == (
        d + "k4", 4, 300, None)
    st = txlog.connect(str(tmp_path)).partition_log(TopicPartition("t", 0)).refresh()
    assert (st.batches.data, st.batches.base_offset, st.batches.count) == (
        [d + "k1", d + "k2", d + "k4"], [0, 2, 5], [2, 3, 4])


def test_a_large_batch_object_is_written_in_row_groups_of_bounded_size() -> None:
    """A reader holds a row group's columns at a time (the JVM scan): an object's row
    groups hold at most ROW_GROUP_BYTES, whatever the object's size."""
    import random

    import pyarrow.parquet as pq

    from txlog.batch_codec import encode_parquet
    from txlog.model import ROW_GROUP_BYTES
    from txlog.records import KAFKA_SCHEMA

    rng = random.Random(3505)
    print("seed=3505")
    rows = (3 * ROW_GROUP_BYTES) // 1024 + 100
    chunk = rng.randbytes(1 << 20)
    values = [chunk[j:j + 1024] for j in ((i * 1024) % len(chunk) for i in range(rows))]
    table = pa.table({"key": pa.nulls(rows, pa.binary()), "value": pa.array(values, pa.binary())})
    table = table.cast(pa.schema([KAFKA_SCHEMA.field("key"), KAFKA_SCHEMA.field("value")]))
    meta = pq.ParquetFile(pa.BufferReader(encode_parquet(table))).metadata
    assert meta.num_row_groups >= 3
    assert sum(meta.row_group(g).num_rows for g in range(meta.num_row_groups)) == rows
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        stored = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        assert stored <= ROW_GROUP_BYTES, (g, stored)


def test_kafka_objects_carry_no_arrow_schema_and_typed_ones_keep_it() -> None:
    """A Kafka-shaped object's footer has no Arrow schema (its Parquet types read back as
    exactly the Kafka schema); a typed topic's keeps it, restoring types Parquet lacks."""
    import pyarrow.parquet as pq

    from txlog.batch_codec import decode_parquet, encode_parquet
    from txlog.records import KAFKA_SCHEMA, kafka_table

    kafka = kafka_table([(b"k", b"v", [("h", b"x"), ("n", None)], 5),
                         (None, b"w", None, None), (b"", None, [], 7)])
    typed = pa.table({"id": pa.array(["a", "b"], pa.large_string()),
                      "n": pa.array([1, 2], pa.uint32()),
                      "d": pa.array([3, 4], pa.duration("s")),
                      "at": pa.array([5, 6], pa.timestamp("ms", tz="Europe/Paris"))})
    for table, schema_kept in ((kafka, False), (kafka.select(["key", "value"]), False),
                               (typed, True)):
        raw = encode_parquet(table)
        meta = pq.ParquetFile(pa.BufferReader(raw)).metadata.metadata or {}
        assert (b"ARROW:schema" in meta) == schema_kept, table.schema
        back = decode_parquet(raw, "x")
        assert back.equals(table) and back.schema.equals(table.schema), back.schema
    assert decode_parquet(encode_parquet(kafka), "x").schema.equals(KAFKA_SCHEMA)
