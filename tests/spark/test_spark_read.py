"""The Spark reader: format("txlog") batch + streaming, and the native path.

Everything is compared with the Python consumer (auto_offset_reset="earliest"), which is
the reference for what read_committed / read_uncommitted return.  One local[2] session
serves the whole run (conftest's ``spark``); logs are small.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import spark_ext
import txlog
from spark_ext import native
from spark_ext.native import ENGINES as ALL_ENGINES
from spark_ext.options import ConfigError, parse_read_options
from spark_ext.read_plan import group_slices, offsets_from_json, rate_limit
from txlog.errors import ProducerFencedError, TxlogError
from txlog.model import DATA
from txlog.partition_log import AppendSpec
from txlog.records import HEADER_TYPE, KAFKA_SCHEMA, TopicPartition, kafka_table

pytestmark = pytest.mark.spark

LONG_TXN = {"transaction.timeout.ms": 600_000}  # open transactions must stay open in tests

Row = tuple[Any, ...]


# --- building logs ----------------------------------------------------------------------


#: The native read's two engines (``auto`` picks ``jvm`` here, where a JDK is present).
ENGINES = [e for e in ALL_ENGINES if e != "auto"]


def null_ts_table(values: list[str]) -> pa.Table:
    n = len(values)
    return pa.table([pa.nulls(n, pa.binary()), pa.array([v.encode() for v in values]),
                     pa.nulls(n, HEADER_TYPE), pa.nulls(n, pa.timestamp("ms", tz="UTC"))],
                    schema=KAFKA_SCHEMA)


class LogBuilder:
    """Randomized transactional traffic: committed, aborted, plain, open and fenced-late."""

    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.rng = random.Random(seed)
        self.log = txlog.connect(url)
        self.parts = {"events": 3, "other": 2}
        for t, n in self.parts.items():
            self.log.create_topic(t, partitions=n)
        self.n = 0
        self.written = 0  # data records appended (any status)

    def _send(self, p: Any, k: int) -> None:
        rng = self.rng
        for _ in range(k):
            topic = rng.choice(sorted(self.parts))
            headers = None if rng.random() < 0.6 else [("h", f"{self.n}".encode()),
                                                       ("n", None)]
            ts = None if rng.random() < 0.3 else 1_600_000_000_000 + self.n
            p.send(topic, f"v{self.n}".encode(), key=f"k{self.n % 7}".encode(),
                   partition=rng.randrange(self.parts[topic]), headers=headers,
                   timestamp_ms=ts)
            self.n += 1
            self.written += 1

    def txn(self, p: Any, commit: bool) -> None:
        p.begin_transaction()
        self._send(p, self.rng.randint(1, 12))
        if self.rng.random() < 0.3:  # a batch with null timestamps (timestampType 1)
            rows = self.rng.randint(1, 3)
            # (full Kafka columns: the producer concatenates before it conforms)
            p.send_batch("events", null_ts_table([f"nts{self.n + i}" for i in range(rows)]),
                         partition=self.rng.randrange(3))
            self.n += rows
            self.written += rows
        p.flush()
        if commit:
            p.commit_transaction()
        else:
            p.abort_transaction()

    def fenced_late(self, tid: str) -> Any:
        """A zombie's batch after it was fenced, in a partition its transaction never
        registered (it must never be visible nor hold the LSO)."""
        z = self.log.producer(transactional_id=tid)
        z.init_transactions()
        z.begin_transaction()
        z.send("events", b"zombie-registered", partition=0)
        z.flush()
        newer = self.log.producer(transactional_id=tid)
        newer.init_transactions()  # fences z and aborts its transaction
        with pytest.raises(ProducerFencedError):
            z._append_now(TopicPartition("events", 0), kafka_table([(None, b"late0", None, 1)]))
        plog = self.log.partition_log(TopicPartition("events", 1))
        table = kafka_table([(b"z", f"late{i}".encode(), None, 5) for i in range(3)])
        key, nbytes = plog.write_data(table)
        plog.append(AppendSpec(kind=DATA, count=3, producer_id=z.producer_id, epoch=z.epoch,
                               transactional=True, txn_id=tid, data=key, nbytes=nbytes,
                               ts_min=5, ts_max=5))
        self.written += 1 + 3
        return newer

    def random_traffic(self, steps: int) -> None:
        producers = [self.log.producer(transactional_id=f"tx-{i}", **LONG_TXN)
                     for i in range(2)]
        for p in producers:
            p.init_transactions()
        plain = self.log.producer()
        zombies = 0
        for _ in range(steps):
            r = self.rng.random()
            p = self.rng.choice(producers)
            if r < 0.5:
                self.txn(p, commit=True)
            elif r < 0.75:
                self.txn(p, commit=False)
            elif r < 0.88:
                self._send(plain, self.rng.randint(1, 4))
                plain.flush()
            else:
                zombies += 1
                newer = self.fenced_late(f"zombie-{zombies}")
                self.txn(newer, commit=self.rng.random() < 0.7)
        if self.rng.random() < 0.7:  # an open transaction holding the LSO, data after it
            o = self.log.producer(transactional_id="open", **LONG_TXN)
            o.init_transactions()
            o.begin_transaction()
            self._send(o, 4)
            o.flush()
            self.txn(producers[0], commit=True)


def consume(url: str, topics: list[str], isolation: str = "read_committed") -> list[Row]:
    c = txlog.connect(url).consumer(isolation_level=isolation, auto_offset_reset="earliest")
    c.subscribe(topics)
    out: list[Row] = []
    empty = 0
    while empty < 2:
        recs = c.poll(max_records=10_000)
        empty = 0 if recs else empty + 1
        out.extend((r.topic, r.partition, r.offset, r.key, r.value,
                    tuple((k, v) for k, v in r.headers), r.timestamp) for r in recs)
    return sorted(out)


def spark_rows(df: Any) -> list[Row]:
    rows = df.selectExpr("topic", "partition", "offset", "key", "value", "headers",
                         "unix_millis(timestamp) AS ts").collect()
    out = []
    for r in rows:
        headers = tuple((h["key"], None if h["value"] is None else bytes(h["value"]))
                        for h in (r["headers"] or []))
        out.append((r["topic"], r["partition"], r["offset"],
                    None if r["key"] is None else bytes(r["key"]),
                    None if r["value"] is None else bytes(r["value"]), headers, r["ts"]))
    return sorted(out)


def load(spark: Any, url: str, **options: str) -> Any:
    r = spark.read.format("txlog").option("path", url)
    for k, v in options.items():
        r = r.option(k.replace("_", "."), v) if k == "isolation_level" else r.option(k, v)
    return r.load()


# --- pure planning (no Spark) -----------------------------------------------------------


def test_parse_read_options_defaults_and_values() -> None:
    ro = parse_read_options({"PATH": "/x", "subscribe": "a, b", "isolation.level":
                             "READ_UNCOMMITTED", "maxOffsetsPerTrigger": "10",
                             "startingOffsets": '{"a": {"0": 5, "1": -2}}'})
    assert ro.topics == ("a", "b") and ro.isolation == "read_uncommitted"
    assert ro.max_offsets_per_trigger == 10
    assert ro.starting is not None and ro.starting.offsets == {"a": {0: 5, 1: -2}}
    ro = parse_read_options({"path": "/x", "assign": '{"a": [1, 0]}',
                             "storage_options": '{"anon": true}'})
    assert ro.assign == {"a": (0, 1)} and ro.storage_options == {"anon": True}


@pytest.mark.parametrize(("options", "needle"), [
    ({"subscribe": "a", "bogus": "1"}, "bogus"),
    ({"subscribe": "a", "kafka.bootstrap.servers": "h:9092"}, "kafka.bootstrap.servers"),
    ({"topic": "a", "subscribe": "b"}, "exactly one"),
    ({}, "exactly one"),
    ({"subscribe": "a", "startingOffsets": "soon"}, "startingOffsets"),
    ({"subscribe": "a", "startingOffsets": '{"a": {"0": -3}}'}, "startingOffsets"),
    ({"subscribe": "a", "endingOffsets": '{"a": {"x": 1}}'}, "endingOffsets"),
    ({"subscribe": "a", "isolation.level": "serializable"}, "isolation.level"),
    ({"subscribe": "a", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
    ({"subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"subscribe": "a", "storage_options": "{not json"}, "storage_options"),
    ({"subscribe": "a", "startingTimestamp": "yesterday"}, "startingTimestamp"),
    ({"subscribe": "a/../b"}, "subscribe"),
    ({"assign": '{"a": "0"}'}, "assign"),
])
def test_bad_options_name_the_option(options: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        parse_read_options({"path": "/x", **options})


def test_path_required_and_query_kind_checks() -> None:
    with pytest.raises(ConfigError, match="path"):
        parse_read_options({"subscribe": "a"})
    with pytest.raises(ConfigError, match="startingOffsets"):
        parse_read_options({"path": "/x", "subscribe": "a", "startingOffsets": "latest"},
                           streaming=False)
    with pytest.raises(ConfigError, match="endingOffsets"):
        parse_read_options({"path": "/x", "subscribe": "a", "endingOffsets": "latest"},
                           streaming=True)
    assert issubclass(ConfigError, TxlogError)


def test_rate_limit_and_offsets_json() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    assert rate_limit({a: 0, b: 0}, {a: 100, b: 300}, 40) == {a: 10, b: 30}
    assert rate_limit({a: 0, b: 0}, {a: 1, b: 1000}, 10) == {a: 1, b: 9}
    assert rate_limit({a: 5, b: 0}, {a: 5, b: 3}, 10) == {a: 5, b: 3}
    assert offsets_from_json({"t": {"0": 4}, "u/2": 7}) == {a: 4, TopicPartition("u", 2): 7}


def test_group_slices_packs_small_and_splits_large() -> None:
    from spark_ext.read_plan import FileSlice

    small = [FileSlice(f"k{i}", "t", i % 4, 0, 0, 10, 0, 1000) for i in range(40)]
    assert len(group_slices(small, min_partitions=None, max_partition_bytes=10**9)) == 1
    assert len(group_slices(small, min_partitions=4, max_partition_bytes=10**9)) == 4
    big = [FileSlice(f"k{i}", "t", 0, 0, 0, 10, 0, 50 << 20) for i in range(8)]
    groups = group_slices(big, min_partitions=None, max_partition_bytes=128 << 20)
    assert len(groups) == 4 and sum(len(g) for g in groups) == 8


# --- batch reads ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [11, 2024, 777])
def test_batch_read_matches_consumer(spark: Any, tmp_path: Path, seed: int,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    print(f"randomized log seed={seed}")
    b = LogBuilder(str(tmp_path / "lake"), seed)
    b.random_traffic(steps=10)
    topics = ["events", "other"]
    spark_rc = spark_rows(load(spark, b.url, subscribe="events,other"))
    native_rc = {e: spark_rows(spark_ext.read(spark, b.url, subscribe="events,other",
                                              engine=e)) for e in ENGINES}
    expected_rc = consume(b.url, topics)
    assert spark_rc == expected_rc, f"seed={seed}"
    assert native_rc == dict.fromkeys(ENGINES, expected_rc), f"seed={seed}"

    # The SQL path lists directories (with a glob, or a file-name filter) above a few
    # files.
    def sql_rows() -> list[Row]:
        return spark_rows(spark_ext.read(spark, b.url, subscribe="events,other", engine="sql"))

    monkeypatch.setattr(native, "MAX_EXPLICIT_FILES", 2)
    assert sql_rows() == expected_rc
    monkeypatch.setattr(native, "MAX_GLOB_FILES", 2)
    assert sql_rows() == expected_rc
    monkeypatch.setattr(native, "MAX_GLOB_FILES", 2000)
    spark_ru = spark_rows(load(spark, b.url, subscribePattern="ev.*|oth.*",
                               isolation_level="read_uncommitted"))
    native_ru = [spark_rows(spark_ext.read(spark, b.url, subscribe="events,other",
                                           isolation_level="read_uncommitted", engine=e))
                 for e in ENGINES]
    expected_ru = consume(b.url, topics, "read_uncommitted")
    assert [spark_ru, expected_ru] == [expected_ru, expected_ru] and native_ru == [
        expected_ru] * len(ENGINES), f"seed={seed}"
    assert len(spark_ru) == b.written, f"seed={seed}"
    assert set(spark_rc) <= set(spark_ru)


def test_schema_columns_and_timestamp_type(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    log.create_topic("k", partitions=1)
    p = log.producer()
    p.send("k", b"a", key=b"x", headers=[("h", b"1")], timestamp_ms=1234)
    p.send_batch("k", null_ts_table(["b"]))
    p.flush()
    df = load(spark, url, topic="k")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                          "timestampType", "headers"]
    natives = [spark_ext.read(spark, url, topic="k", engine=e) for e in ENGINES]
    for native_df in natives:
        assert native_df.columns == df.columns
        assert [f.dataType for f in native_df.schema.fields] == [
            f.dataType for f in df.schema.fields]
    append_ms = txlog.connect(url).partition_log(TopicPartition("k", 0)).refresh() \
        .batches.append_ms
    for frame in (df, *natives):
        rows = frame.orderBy("offset").selectExpr("offset", "timestampType",
                                                  "unix_millis(timestamp) AS ts").collect()
        assert [(r.offset, r.timestampType) for r in rows] == [(0, 0), (1, 1)]
        assert rows[0].ts == 1234 and rows[1].ts in append_ms
    txlog.connect(url).create_topic("empty", partitions=2)
    assert load(spark, url, topic="empty").count() == 0
    for e in ENGINES:
        assert spark_ext.read(spark, url, topic="empty", engine=e).count() == 0
    no_headers = load(spark, url, topic="k", includeHeaders="false")
    assert "headers" not in no_headers.columns and no_headers.count() == 2
    # A user-given schema that is not ours is refused with a clear message.
    with pytest.raises(Exception, match="fixed schema"):
        spark.read.format("txlog").schema("value string").option("path", url) \
            .option("topic", "k").load().collect()


def test_typed_topic(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()),
                        ("score", pa.float64())])
    log.create_topic("typed", partitions=2, schema=schema)
    p = log.producer(transactional_id="typed-tx")
    p.init_transactions()
    for i, commit in enumerate([True, False, True]):
        p.begin_transaction()
        for j in range(5):
            p.send("typed", {"id": i * 10 + j, "name": None if j == 3 else f"n{j}",
                             "score": j / 2}, partition=j % 2)
        p.flush()
        p.commit_transaction() if commit else p.abort_transaction()
    df = load(spark, url, topic="typed")
    assert df.columns == ["id", "name", "score", "topic", "partition", "offset", "timestamp"]
    assert not df.schema["id"].nullable and not df.schema["offset"].nullable
    c = txlog.connect(url).consumer(auto_offset_reset="earliest")
    c.subscribe(["typed"])
    expected = sorted((r.partition, r.offset, r.value["id"], r.value["name"], r.value["score"],
                       r.timestamp) for r in c.poll(max_records=1000))
    for frame in (df, *(spark_ext.read(spark, url, topic="typed", engine=e) for e in ENGINES)):
        got = sorted(tuple(r) for r in frame.selectExpr(
            "partition", "offset", "id", "name", "score", "unix_millis(timestamp)").collect())
        assert got == expected
    assert len(expected) == 10


@pytest.mark.parametrize("files", ["named", "globbed", "filtered"])
def test_offset_ranges_and_timestamps(spark: Any, tmp_path: Path, files: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # How the SQL path picks the files; trimmed slices filter rows by index in all.
    if files != "named":
        monkeypatch.setattr(native, "MAX_EXPLICIT_FILES", 1)
    if files == "filtered":
        monkeypatch.setattr(native, "MAX_GLOB_FILES", 1)
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    log.create_topic("r", partitions=2)
    p = log.producer(transactional_id="r-tx")
    p.init_transactions()
    n = 0
    for i in range(6):
        p.begin_transaction()
        for j in range(4):
            p.send("r", f"v{n}".encode(), partition=j % 2, timestamp_ms=10_000 + 100 * n)
            n += 1
        p.flush()
        p.commit_transaction() if i != 2 else p.abort_transaction()
    everything = consume(url, ["r"])
    assert len(everything) == 20

    def both(**opts: Any) -> list[Row]:
        if "assign" not in opts:
            opts["subscribe"] = "r"
        a = spark_rows(load(spark, url, **opts))
        for e in ENGINES:
            assert spark_rows(spark_ext.read(spark, url, engine=e, **opts)) == a, (e, opts)
        return a

    got = both(startingOffsets='{"r": {"0": 3, "1": -2}}',
               endingOffsets='{"r": {"0": 9, "1": -1}}')
    assert got == [r for r in everything if r[1] == 1 or 3 <= r[2] < 9]
    got = both(assign='{"r": [1]}', startingOffsets='{"r": {"1": 4}}')
    assert got == [r for r in everything if r[1] == 1 and r[2] >= 4]
    t0 = 10_000 + 100 * 13
    got = both(startingTimestamp=str(t0))
    assert got == [r for r in everything if r[6] >= t0]
    got = both(startingTimestamp=str(t0 - 50), endingTimestamp=str(t0 + 600))
    assert got == [r for r in everything if t0 - 50 <= r[6] < t0 + 600]
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):
        both(startingTimestamp="99999999999999")
    assert both(startingTimestamp="99999999999999",
                startingOffsetsByTimestampStrategy="latest") == []
    # Offsets from the JSON that the query does not read are named.
    with pytest.raises(Exception, match="r-7"):
        both(startingOffsets='{"r": {"7": 0}}')


def test_bad_options_fail_at_load_with_the_cause(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    txlog.connect(url).create_topic("b", partitions=1)
    cases = [({"topic": "b", "startingOfsets": "earliest"}, "startingOfsets"),
             ({"topic": "b", "isolation.level": "dirty"}, "isolation.level"),
             ({"topic": "nope"}, "unknown topic 'nope'"),
             ({"topic": "b", "startingOffsets": "latest"}, "startingOffsets")]
    for opts, needle in cases:
        r = spark.read.format("txlog").option("path", url)
        for k, v in opts.items():
            r = r.option(k, v)
        with pytest.raises(Exception) as info:
            r.load().collect()
        msg = str(info.value)
        assert needle.lower() in msg.lower(), msg  # Spark lowercases option names
        assert "Error" in msg  # the txlog error class appears, not a bare Java trace
        for e in ENGINES:
            with pytest.raises(TxlogError, match="(?i)" + needle.replace(".", r"\.")):
                spark_ext.read(spark, url, options=opts, engine=e)


def test_discoverable_as_pyspark_module() -> None:
    """pyspark imports top-level ``pyspark_*`` modules and registers their DefaultSource."""
    import importlib
    import pkgutil

    from pyspark.sql.datasource import DataSource

    root = str(Path(__file__).resolve().parents[2])
    found = [m.name for m in pkgutil.iter_modules([root]) if m.name.startswith("pyspark_")]
    assert "pyspark_txlog" in found
    sys.path.insert(0, root)
    try:
        mod = importlib.import_module("pyspark_txlog")
    finally:
        sys.path.remove(root)
    assert issubclass(mod.DefaultSource, DataSource) and mod.DefaultSource.name() == "txlog"


# --- streaming --------------------------------------------------------------------------


class FileSink:
    """foreachBatch sink: one JSON file per batch id (a replayed batch overwrites)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [[r["topic"], r["partition"], r["offset"], r["value"].decode()]
                for r in df.selectExpr("topic", "partition", "offset", "value").collect()]
        tmp = self.out / f".b{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, self.out / f"batch-{batch_id:05d}.json")

    def batches(self) -> list[list[list[Any]]]:
        return [json.loads(f.read_text()) for f in sorted(self.out.glob("batch-*.json"))]

    def rows(self) -> list[tuple[Any, ...]]:
        return [tuple(r) for b in self.batches() for r in b]


def _stream(spark: Any, url: str, ckpt: Path, sink: FileSink, **opts: str) -> Any:
    r = spark.readStream.format("txlog").option("path", url)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load().writeStream.foreachBatch(sink).option(
        "checkpointLocation", str(ckpt))


#: Spark waits a hard-coded 10 s for a new Python worker to connect back; on an overloaded
#: machine the streaming source's worker can miss it before the query has done anything.
#: Such a start is retried (from the same checkpoint: a restart, which the tests check).
_SLOW_WORKER = "Python worker failed to connect back"


def _drain(writer: Any, *, available_now: bool = False, attempts: int = 3) -> None:
    """Start the query and run it until it has processed everything available."""
    for attempt in range(attempts):
        q = writer.start()
        try:
            if available_now:
                assert q.awaitTermination(600), "AvailableNow query did not terminate"
                assert q.exception() is None
            else:
                q.processAllAvailable()
            # The shared session has txlog's connector: the JVM stream served the query.
            sources = {s["description"] for p in q.recentProgress for s in p["sources"]}
            assert sources and all(d.startswith("txlog JVM stream") for d in sources), sources
            return
        except Exception as exc:
            if _SLOW_WORKER not in str(exc) or attempt == attempts - 1:
                raise
        finally:
            q.stop()


def _committed_keys(url: str, topics: list[str]) -> list[tuple[Any, ...]]:
    return sorted((t, p, o, v.decode()) for t, p, o, _k, v, _h, _ts in consume(url, topics))


def test_stream_restart_exactly_once_and_lso(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    b = LogBuilder(url, seed=5)
    b.rng = random.Random(5)
    a = b.log.producer(transactional_id="s-a", **LONG_TXN)
    a.init_transactions()
    for commit in (True, False, True, True):
        b.txn(a, commit)
    sink = FileSink(tmp_path / "out")
    ckpt = tmp_path / "ckpt"
    opts = {"subscribe": "events,other", "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": "7"}

    _drain(_stream(spark, url, ckpt, sink, **opts))
    first = sink.rows()
    assert sorted(first) == _committed_keys(url, ["events", "other"])
    n_batches = len(sink.batches())
    assert n_batches >= 2 and max(len(x) for x in sink.batches()) <= 7

    # More traffic while stopped: aborted, committed, an open transaction with committed
    # data after it (past the LSO of the partitions it touched).
    b.txn(a, commit=False)
    b.txn(a, commit=True)
    o = b.log.producer(transactional_id="s-open", **LONG_TXN)
    o.init_transactions()
    o.begin_transaction()
    for part in range(3):
        o.send("events", b"open", partition=part)
    o.flush()
    b.txn(a, commit=True)

    _drain(_stream(spark, url, ckpt, sink, **opts))
    rows = sink.rows()
    assert len(rows) == len(set(rows)), "a record was delivered twice"
    expected = _committed_keys(url, ["events", "other"])  # the consumer stops at the LSO
    assert sorted(rows) == expected
    lso = {p: b.log.partition_log(TopicPartition("events", p)).refresh().last_stable_offset
           for p in range(3)}
    assert all(o_ < lso[p] for t, p, o_, _ in rows if t == "events")

    # The open transaction commits: exactly the rest arrives, once.
    o.commit_transaction()
    _drain(_stream(spark, url, ckpt, sink, **opts))
    rows = sink.rows()
    assert len(rows) == len(set(rows))
    assert sorted(rows) == _committed_keys(url, ["events", "other"])
    assert sum(1 for r in rows if r[3] == "open") == 3


def test_available_now_terminates(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    b = LogBuilder(url, seed=9)
    b.random_traffic(steps=6)
    sink = FileSink(tmp_path / "out")
    _drain(_stream(spark, url, tmp_path / "ckpt", sink, subscribe="events,other",
                   startingOffsets="earliest", maxOffsetsPerTrigger="5")
           .trigger(availableNow=True), available_now=True)
    assert len(sink.batches()) > 1  # admission control split the backlog
    rows = sink.rows()
    assert len(rows) == len(set(rows))
    assert sorted(rows) == _committed_keys(url, ["events", "other"])


def test_stream_starts_at_latest_by_default(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    log.create_topic("l", partitions=1)
    p = log.producer()
    p.send("l", b"before")
    p.flush()
    sink = FileSink(tmp_path / "out")
    ckpt = tmp_path / "ckpt"
    _drain(_stream(spark, url, ckpt, sink, topic="l"))  # starts at the latest offsets
    p.send("l", b"after")  # while the query is stopped: a restart must not skip it
    p.flush()
    _drain(_stream(spark, url, ckpt, sink, topic="l"))
    assert [r[3] for r in sink.rows()] == ["after"]
    with pytest.raises(Exception, match="endingOffsets"):
        _drain(_stream(spark, url, tmp_path / "ckpt-bad", sink, topic="l",
                       endingOffsets="latest"))


# --- the native path's file lookup --------------------------------------------------------


def executed_plan(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


def plan_nodes(df: Any) -> list[str]:
    """The operator names of the executed plan ("Project", "Filter", "BroadcastHashJoin")."""
    import re

    return [m.group(1) for line in executed_plan(df).splitlines()
            if (m := re.match(r"[\s:+|-]*(?:\*\(\d+\) )?(\w+)", line))]


def test_spark_hash_is_the_one_the_perfect_hash_replicates(spark: Any) -> None:
    from spark_ext import perfect_hash as ph

    seed = 4242
    print(f"seed={seed}")
    rng = random.Random(seed)
    alphabet = "abcxyz0189-_.%é€ \u00ff"
    strings = ["", "a", "abcd", "abcde"] + ["".join(rng.choice(alphabet) for _ in
                                                  range(rng.randint(0, 70)))
                                          for _ in range(300)]
    df = spark.createDataFrame([(t, i) for i, t in enumerate(strings)], "s string, d int")
    for r in df.selectExpr("s", "d", "hash(s) AS h", "hash(hash(s), d) AS h2").collect():
        h = ph.spark_hash_bytes(r.s.encode())
        assert (h, ph.spark_hash_int_pair(h, r.d)) == (r.h, r.h2), repr(r.s)


def _many_batches(url: str) -> list[Row]:
    """Three partitions, one batch per partition per transaction, each an object of its
    own (a shared object's slices take the join), a quarter aborted."""
    log = txlog.connect(url)
    log.create_topic("m", partitions=3)
    p = log.producer(transactional_id="m-tx", **{"batch.objects.shared": False})
    p.init_transactions()
    for i in range(12):
        p.begin_transaction()
        for part in range(3):
            p.send("m", f"v{i}-{part}".encode(), key=b"k", partition=part)
            p.send("m", f"w{i}-{part}".encode(), partition=part, timestamp_ms=1000 + i)
        p.flush()
        p.abort_transaction() if i % 4 == 1 else p.commit_transaction()
    return consume(url, ["m"])


def test_native_read_finds_slices_by_file_name_without_a_join(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "lake")
    expected = _many_batches(url)
    assert len(expected) == 9 * 3 * 2
    # Files named one by one; directories listed with a glob; with a file-name filter.
    for explicit, glob in ((32, 2000), (2, 2000), (2, 2)):
        monkeypatch.setattr(native, "MAX_EXPLICIT_FILES", explicit)
        monkeypatch.setattr(native, "MAX_GLOB_FILES", glob)
        df = spark_ext.read(spark, url, topic="m", engine="sql")
        nodes = plan_nodes(df)
        assert not any("Join" in n for n in nodes), nodes
        assert ("Filter" in nodes) == (glob == 2), nodes  # no per-row filter but the pick
        assert "hash(" in executed_plan(df)
        assert spark_rows(df) == expected
        # Only the columns the lookup feeds need it: Spark prunes it with them.
        kv = df.select("key", "value")
        assert "hash(" not in executed_plan(kv)
        assert sorted(bytes(r.value) for r in kv.collect()) == sorted(r[4] for r in expected)
        # A read starting inside a batch trims it: those rows are filtered by row index.
        trimmed = spark_ext.read(spark, url, topic="m", engine="sql",
                                 startingOffsets='{"m": {"0": 1, "1": 0, "2": 0}}')
        assert "Filter" in plan_nodes(trimmed)
        assert spark_rows(trimmed) == [r for r in expected if (r[1], r[2]) != (0, 0)]
    # Above MAX_LOOKUP_FILES the slice table is joined instead; same rows.
    monkeypatch.setattr(native, "MAX_LOOKUP_FILES", 1)
    df = spark_ext.read(spark, url, topic="m", engine="sql")
    assert any("Join" in n for n in plan_nodes(df))
    assert spark_rows(df) == expected


def test_native_read_of_compacted_segments(spark: Any, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from txlog.maintenance import compact_partition

    url = str(tmp_path / "lake")
    expected = _many_batches(url)
    log = txlog.connect(url)
    for tp in log.partitions_for("m"):
        assert compact_partition(log, tp).segments_written == 1
    assert consume(url, ["m"]) == expected
    for explicit, glob in ((32, 2000), (1, 2000), (1, 1)):
        monkeypatch.setattr(native, "MAX_EXPLICIT_FILES", explicit)
        monkeypatch.setattr(native, "MAX_GLOB_FILES", glob)
        # A segment holds several runs with gaps in their offsets (the markers and aborted
        # batches are gone): the slice table is joined.
        df = spark_ext.read(spark, url, topic="m", engine="sql")
        assert any("Join" in n for n in plan_nodes(df))
        assert spark_rows(df) == expected == spark_rows(load(spark, url, topic="m"))
    # The JVM scan reads each run of a segment as its own slice.
    assert spark_rows(spark_ext.read(spark, url, topic="m", engine="jvm")) == expected


def test_file_glob_reads_exactly_the_named_files(spark: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    names = ["a{b}.parquet", "c,d.parquet", "e*f.parquet", "g[h].parquet", "i?j.parquet",
             "k\\l.parquet", "plain.parquet", "ab.parquet", "ab.parquet2", "abc.parquet",
             "abd.parquet", "b.parquet"]
    for i, n in enumerate(names):
        pq.write_table(pa.table({"i": [i]}), tmp_path / n)
    for n in ("other.parquet", "abe.parquet", "ab.parquet3", "a.parquet", "abcd.parquet"):
        pq.write_table(pa.table({"i": [99]}), tmp_path / n)
    pattern = native.glob_of(names)
    got = spark.read.option("pathGlobFilter", pattern).parquet(str(tmp_path)).collect()
    assert sorted(r.i for r in got) == list(range(len(names))), pattern


def test_uri_quote_matches_spark_metadata_names() -> None:
    # As Spark 4.3 reported _metadata.file_name for such files (probed on local paths).
    assert native.uri_quote("x y+z=1.parquet") == "x%20y+z=1.parquet"
    assert native.uri_quote("p%20q@r.parquet") == "p%2520q@r.parquet"
    assert native.uri_quote("topics/t/0/data/ab12.parquet") == "topics/t/0/data/ab12.parquet"
