"""format("txlog") over a topic whose transactions wrote shared objects (one object
holding a transaction's batches of several partitions): exactly the consumer's records,
through the JVM connector and the Python data source, batch and streaming, with each
shared object read once per query (the JVM scan's decoder metrics and Spark's bytes read,
the Python source's fetches), and partition, offset and timestamp filters still pruning
objects before any is opened."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest
from test_compacted_scan import last_stage, stage_metrics
from test_direct_decode import decoded_by

import txlog
from txlog import layout
from txlog.model import ABORT, COMMIT, DATA
from txlog.partition_log import AppendSpec
from txlog.partition_state import VISIBLE
from txlog.records import KAFKA_SCHEMA, TopicPartition, conform
from txlog.shared_objects import write_shared

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]
TOPIC = "s"
PARTITIONS = 8
HAND_PID = 900_000  # far from the ids the root hands out
SEED = 3240


def kafka_table(rng: random.Random, txn: int, partition: int, *, headers: bool) -> pa.Table:
    n = rng.randint(1, 5)
    return conform(pa.table({
        "key": [f"k{txn}-{i}".encode() for i in range(n)],
        "value": [f"v{txn}-{partition}-{i}".encode() for i in range(n)],
        "headers": [[{"key": "h", "value": f"{txn}".encode()}] if headers and i % 2 else None
                    for i in range(n)],
        "timestamp": pa.array([1_000 * txn + i for i in range(n)], pa.timestamp("ms", "UTC")),
    }), KAFKA_SCHEMA, TOPIC, kafka_shaped=True)


def write_lake(url: str, seed: int, *, txns: int = 30, headers: bool = False) -> None:
    """``txns`` transactions over the topic's 8 partitions, every third aborted: most
    write one shared object of 2-8 partitions' batches (appended as the producer appends
    them: each partition's DATA entry names its rows, then its marker); some are a
    producer's transaction of one partition (an object of its own).  With ``headers``,
    every other record of every other transaction has a header (those objects go to
    Spark's Parquet reader, the others to txlog's decoder)."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    log = txlog.connect(url)
    log.create_topic(TOPIC, partitions=PARTITIONS)
    own = log.producer(transactional_id="own-tx")
    own.init_transactions()
    for i in range(txns):
        commit = i % 3 != 1
        with_headers = headers and i % 2 == 0
        if rng.random() < 0.2:
            own.begin_transaction()
            p = rng.randrange(PARTITIONS)
            own.send_batch(TOPIC, kafka_table(rng, i, p, headers=with_headers), partition=p)
            own.flush()
            own.commit_transaction() if commit else own.abort_transaction()
            continue
        parts = rng.sample(range(PARTITIONS), rng.randint(2, PARTITIONS))
        tables = {p: kafka_table(rng, i, p, headers=with_headers) for p in parts}
        for s in write_shared(log.store, TOPIC, list(tables.items())):
            ts = tables[s.partition].column("timestamp").cast(pa.int64()).to_pylist()
            log.partition_log(TopicPartition(TOPIC, s.partition)).append(AppendSpec(
                kind=DATA, count=0, producer_id=HAND_PID, epoch=i, transactional=True,
                txn_id="hand-tx", parts=[(s.key, s.count, s.nbytes, min(ts), max(ts), False,
                                          s.row, s.object_rows)]))
        for p in parts:
            log.partition_log(TopicPartition(TOPIC, p)).append(AppendSpec(
                kind=COMMIT if commit else ABORT, count=1, producer_id=HAND_PID, epoch=i,
                transactional=True))
    own.close()


def consume(url: str) -> list[Row]:
    c = txlog.connect(url).consumer(auto_offset_reset="earliest")
    c.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    got = []
    while batch := c.poll(max_records=100_000, timeout_ms=0):
        got += batch
    c.close()
    return sorted(row(r.partition, r.offset, r.key, r.value, r.headers, r.timestamp)
                  for r in got)


def row(partition: int, offset: int, key: Any, value: Any, headers: Any, ts: int) -> Row:
    hs = tuple((k, None if v is None else bytes(v)) for k, v in (headers or []))
    return (partition, offset, bytes(key), bytes(value), hs, ts)


def spark_rows(df: Any) -> list[Row]:
    """The rows of ``df`` (a query of :func:`selected`, whose metrics are then its)."""
    return sorted(row(r.partition, r.offset, r.key, r.value,
                      [(h["key"], h["value"]) for h in r.headers or []],
                      round(r.timestamp.timestamp() * 1000))
                  for r in df.collect())


def selected(df: Any) -> Any:
    return df.select("partition", "offset", "key", "value", "headers", "timestamp")


def load(spark: Any, fmt: str, url: str, **options: str) -> Any:
    return selected(spark.read.format(fmt).option("path", url).option("topic", TOPIC)
                    .options(**options).load())


def visible_objects(url: str, partitions: range | list[int] = range(PARTITIONS),
                    ) -> dict[str, int]:
    """The objects read_committed reads (per the logs themselves), with their sizes."""
    log = txlog.connect(url)
    out: dict[str, int] = {}
    for p in partitions:
        b = log.partition_log(TopicPartition(TOPIC, p)).refresh().batches
        for d, s, n, size in zip(b.data, b.status, b.count, b.nbytes, strict=True):
            if s in VISIBLE and n:
                out[d] = size
    return out


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Row]]:
    url = str(tmp_path_factory.mktemp("shared") / "lake")
    write_lake(url, SEED)
    want = consume(url)
    objects = visible_objects(url)
    shared = [k for k in objects if layout.is_shared(k)]
    assert len(shared) >= 10 and len(objects) > len(shared), objects
    assert len({r[0] for r in want}) == PARTITIONS
    return url, want


@pytest.fixture(scope="module")
def lake_with_headers(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Row]]:
    url = str(tmp_path_factory.mktemp("shared_headers") / "lake")
    write_lake(url, SEED + 1, headers=True)
    return url, consume(url)


@pytest.mark.parametrize("fmt", ["txlog", "txlog_python"])
@pytest.mark.parametrize("partitions", [None, "3", "50"])
def test_a_topic_of_shared_objects_reads_as_the_consumer_reads_it(
        spark: Any, lake: tuple[str, list[Row]], lake_with_headers: tuple[str, list[Row]],
        fmt: str, partitions: str | None) -> None:
    options = {} if partitions is None else {"minPartitions": partitions}
    for url, want in (lake, lake_with_headers):
        assert spark_rows(load(spark, fmt, url, **options)) == want
        assert load(spark, fmt, url, **options).count() == len(want)
    # Ranges that start and end inside shared objects' batches.
    url, want = lake
    for start, end in ((1, 9), (3, 4), (6, 40)):
        offsets = {str(p): start for p in range(PARTITIONS)}
        ends = {str(p): end for p in range(PARTITIONS)}
        got = spark_rows(load(spark, fmt, url, startingOffsets=json.dumps({TOPIC: offsets}),
                              endingOffsets=json.dumps({TOPIC: ends}), **options))
        assert got == [r for r in want if start <= r[1] < end], (start, end)


@pytest.mark.parametrize("partitions", [None, "3", "8", "50"])
def test_the_jvm_scan_reads_each_shared_object_once(
        spark: Any, lake: tuple[str, list[Row]], lake_with_headers: tuple[str, list[Row]],
        partitions: str | None) -> None:
    """However the read is cut into input partitions, each object is opened and decoded
    once (txlog's decoder, or Spark's Parquet reader where records have headers) and its
    bytes are read once."""
    options = {} if partitions is None else {"minPartitions": partitions}
    for url, want in (lake, lake_with_headers):
        objects = visible_objects(url)
        after = last_stage(spark)
        df = load(spark, "txlog", url, **options)
        got = spark_rows(df)
        assert got == want
        direct, parquet = decoded_by(df)
        assert direct + parquet == len(objects), (direct, parquet, len(objects))
        if url == lake_with_headers[0]:
            assert direct and parquet, (direct, parquet)
        nbytes, records = stage_metrics(spark, after)
        assert records == len(want)
        assert nbytes == sum(objects.values())
        plan = executed(df)
        assert f"{len(objects)} of {len(objects)} batch objects" in plan, plan


def test_objects_fetched_ahead_are_shared_objects_fetched_once(
        spark: Any, lake_with_headers: tuple[str, list[Row]]) -> None:
    """With the scan's prefetch on for local disk too, each object is still fetched (and
    its bytes counted) once, whichever task and slice reads it."""
    url, want = lake_with_headers
    objects = visible_objects(url)
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop.set("txlog.scan.prefetch.local", "true")
    hadoop.set("txlog.scan.prefetch.objects", "3")
    try:
        for partitions in ("1", "4"):
            after = last_stage(spark)
            df = load(spark, "txlog", url, minPartitions=partitions)
            assert spark_rows(df) == want
            assert sum(decoded_by(df)) == len(objects)
            assert stage_metrics(spark, after) == (sum(objects.values()), len(want))
    finally:
        hadoop.unset("txlog.scan.prefetch.local")
        hadoop.unset("txlog.scan.prefetch.objects")


def test_the_sql_engine_reads_each_partitions_rows_of_shared_objects(
        spark: Any, lake: tuple[str, list[Row]]) -> None:
    """The side path that hands the plan to Spark's Parquet source: a shared object's
    rows of each partition are that partition's, also where a query reads one partition
    (its batch is then never the whole object)."""
    import spark_ext

    url, want = lake
    df = selected(spark_ext.read(spark, url, topic=TOPIC, engine="sql"))
    assert spark_rows(df) == want
    for p in (0, 5):
        df = selected(spark_ext.read(spark, url, assign=json.dumps({TOPIC: [p]}),
                                     engine="sql"))
        assert spark_rows(df) == [r for r in want if r[0] == p], p


def executed(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


def test_filters_prune_shared_objects_before_any_is_opened(
        spark: Any, lake: tuple[str, list[Row]]) -> None:
    url, want = lake
    everything = len(visible_objects(url))
    cases: list[tuple[str, Any, list[int] | None]] = [
        ("partition = 3", lambda r: r[0] == 3, [3]),
        ("partition IN (1, 6)", lambda r: r[0] in (1, 6), [1, 6]),
        ("offset >= 12", lambda r: r[1] >= 12, None),
        ("timestamp >= CAST(20 AS TIMESTAMP)", lambda r: r[5] >= 20_000, None),
    ]
    for where, keep, partitions in cases:
        df = load(spark, "txlog", url).where(where)
        expected = [r for r in want if keep(r)]
        assert expected and len(expected) < len(want), where
        assert spark_rows(df) == expected, where
        got = re.search(r"(\d+) of (\d+) batch objects", executed(df))
        assert got is not None and int(got.group(2)) == everything, where
        read = int(got.group(1))
        assert read < everything, where
        if partitions is not None:
            assert read == len(visible_objects(url, partitions)), where
        direct, parquet = decoded_by(df)
        assert direct + parquet == read, where
        assert spark_rows(load(spark, "txlog_python", url).where(where)) == expected, where


class CountingStore:
    """The lake's store, counting each object's fetches."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.local_requests = store.local_requests
        self.gets: Counter[str] = Counter()

    def get(self, key: str) -> bytes:
        self.gets[key] += 1
        return bytes(self.store.get(key))


@pytest.mark.parametrize("partitions", [None, 3, 50])
def test_the_python_source_fetches_each_shared_object_once(
        lake: tuple[str, list[Row]], partitions: int | None) -> None:
    """What the Python source's tasks run (its plan's input partitions, each read by
    read_slices): every object fetched once in all, and the consumer's records."""
    from spark_ext.options import parse_read_options
    from spark_ext.read_plan import plan_batch
    from spark_ext.reader import (
        TxlogInputPartition,
        arrow_target,
        make_partitions,
        read_slices,
    )

    url, want = lake
    options = {"path": url, "topic": TOPIC}
    if partitions is not None:
        options["minPartitions"] = str(partitions)
    ro = parse_read_options(options, streaming=False)
    log = ro.connect()
    plan = plan_batch(ro, log)
    store = CountingStore(log.store)
    target = arrow_target(plan.shape.schema_json)
    rows = []
    for part in make_partitions(plan.groups(ro)):
        assert isinstance(part, TxlogInputPartition)
        for b in read_slices(cast(Any, store), part.slices, plan.shape, target, True):
            rows += [row(r["partition"], r["offset"], r["key"], r["value"],
                         [(h["key"], h["value"]) for h in r["headers"] or []],
                         round(r["timestamp"].timestamp() * 1000)) for r in b.to_pylist()]
    assert sorted(rows) == want
    objects = visible_objects(url)
    assert dict(store.gets) == dict.fromkeys(objects, 1)


@pytest.mark.parametrize("fmt", ["txlog", "txlog_python"])
def test_a_stream_of_shared_objects_reads_the_consumers_records(
        spark: Any, lake: tuple[str, list[Row]], tmp_path: Path, fmt: str) -> None:
    """Micro-batches cut by maxOffsetsPerTrigger inside shared objects' batches return
    each committed record once."""
    url, want = lake
    name = f"shared_{fmt}"
    q = (spark.readStream.format(fmt).option("path", url).option("topic", TOPIC)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "37").load()
         .writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True)
         .start())
    try:
        assert q.awaitTermination(600), "the AvailableNow query did not end"
        assert q.exception() is None
        assert sum(1 for p in q.recentProgress if p["numInputRows"]) >= 3
        if fmt == "txlog":
            assert {p["sources"][0]["description"] for p in q.recentProgress} == {
                f"txlog JVM stream [topic={TOPIC}]"}
    finally:
        q.stop()
    assert spark_rows(selected(spark.table(name))) == want
