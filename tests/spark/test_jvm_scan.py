"""The JVM scan (spark_ext/jvm_scan.py + spark_ext/java): txlog's own Spark source for
planned reads. Results are also compared with the consumer and the SQL path in
test_spark_read.py; here: what only this engine does (batches cut mid-way, reading no
object when no stored column is asked for, its errors, building the jar)."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_ext
import txlog
from spark_ext import jvm_scan
from txlog.errors import ConfigError
from txlog.records import HEADER_TYPE, KAFKA_SCHEMA, TopicPartition

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]


def build(url: str, seed: int) -> list[Row]:
    """Two partitions, transactions of 1-9 records (headers on some, own timestamps on
    some), a third aborted; returns the committed records as the consumer reads them."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    log = txlog.connect(url)
    log.create_topic("j", partitions=2)
    p = log.producer(transactional_id="j-tx")
    p.init_transactions()
    n = 0
    for i in range(15):
        p.begin_transaction()
        for _ in range(rng.randint(1, 9)):
            part = rng.randrange(2)
            headers = [("h", f"{n}".encode()), ("n", None)] if n % 3 == 0 else None
            if n % 4 == 0:  # no timestamp of its own (Kafka's LogAppendTime applies)
                p.send_batch("j", pa.table([pa.array([f"k{n % 5}".encode()]),
                                            pa.array([f"v{n}".encode()]),
                                            pa.array([headers], HEADER_TYPE),
                                            pa.nulls(1, pa.timestamp("ms", tz="UTC"))],
                                           schema=KAFKA_SCHEMA), partition=part)
            else:
                p.send("j", f"v{n}".encode(), key=f"k{n % 5}".encode(), partition=part,
                       headers=headers, timestamp_ms=5_000 + n)
            n += 1
        p.flush()
        p.abort_transaction() if i % 3 == 1 else p.commit_transaction()
    c = txlog.connect(url).consumer(auto_offset_reset="earliest")
    c.subscribe(["j"])
    return sorted(row(r.partition, r.offset, r.key, r.value, r.headers)
                  for r in c.poll(max_records=1000))


def row(partition: int, offset: int, key: Any, value: Any, headers: Any) -> Row:
    hs = tuple((k, None if v is None else bytes(v)) for k, v in (headers or []))
    return (partition, offset, None if key is None else bytes(key), bytes(value), hs)


def rows(df: Any) -> list[Row]:
    return sorted(row(r.partition, r.offset, r.key, r.value,
                      [(h["key"], h["value"]) for h in r.headers or []])
                  for r in df.select("partition", "offset", "key", "value", "headers").collect())


@pytest.fixture
def small_batches(spark: Any) -> Iterator[None]:
    """Three rows per columnar batch, so planned slices start and end inside batches."""
    key = "spark.sql.parquet.columnarReaderBatchSize"
    old = spark.conf.get(key, None)
    spark.conf.set(key, "3")
    yield
    if old is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, old)


def test_slices_cut_inside_batches_keep_every_column(spark: Any, tmp_path: Path,
                                                      small_batches: None) -> None:
    url = str(tmp_path / "lake")
    expected = build(url, seed=5150)
    df = spark_ext.read(spark, url, topic="j", engine="jvm")
    assert rows(df) == expected
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "txlog planned scan" in plan and not re.search(r"\b(Filter|\w*Join)\b", plan), plan
    # Reads starting and ending at every offset: the slices are cut at arbitrary rows.
    high = {p: max(r[1] for r in expected if r[0] == p) + 1 for p in (0, 1)}
    for start in range(0, high[0], 2):
        for end in (start + 1, start + 4, high[0]):
            opts: dict[str, Any] = {
                "startingOffsets": f'{{"j": {{"0": {start}, "1": {start // 2}}}}}',
                "endingOffsets": f'{{"j": {{"0": {end}, "1": -1}}}}'}
            trimmed = spark_ext.read(spark, url, topic="j", engine="jvm", **opts)
            plan = trimmed._jdf.queryExecution().executedPlan().toString()
            assert not re.search(r"\bFilter\b", plan), plan  # cut by the reader itself
            got = rows(trimmed)
            want = [r for r in expected
                    if (r[0] == 0 and start <= r[1] < end) or (r[0] == 1 and r[1] >= start // 2)]
            assert got == want, opts


def test_derived_columns_and_timestamps(spark: Any, tmp_path: Path, small_batches: None) -> None:
    url = str(tmp_path / "lake")
    build(url, seed=77)
    got = spark_ext.read(spark, url, topic="j", engine="jvm").selectExpr(
        "topic", "partition", "offset", "timestampType", "unix_millis(timestamp) AS ts",
        "value").collect()
    sql = spark_ext.read(spark, url, topic="j", engine="sql").selectExpr(
        "topic", "partition", "offset", "timestampType", "unix_millis(timestamp) AS ts",
        "value").collect()
    assert sorted(map(tuple, got)) == sorted(map(tuple, sql))
    # timestampType alone still reads the object's timestamps, as timestamps.
    for cols in (["timestampType"], ["offset", "timestampType"], ["value", "timestampType"]):
        jvm = spark_ext.read(spark, url, topic="j", engine="jvm").select(*cols).collect()
        assert sorted(map(tuple, jvm)) == sorted(
            tuple(r[c] for c in cols) for r in got), cols
    log = txlog.connect(url)
    append = {p: set(log.partition_log(TopicPartition("j", p)).refresh().batches.append_ms)
              for p in (0, 1)}
    for r in got:
        n = int(bytes(r.value)[1:])
        assert r.topic == "j"
        if n % 4 == 0:  # no timestamp of its own: the append time (Kafka's LogAppendTime)
            assert r.timestampType == 1 and r.ts in append[r.partition]
        else:
            assert (r.timestampType, r.ts) == (0, 5_000 + n)


def test_a_batch_read_has_as_many_input_partitions_as_spark_splits_files(
        spark: Any, tmp_path: Path) -> None:
    """format("txlog") sizes a batch read's input partitions by Spark's parallelism (two in
    local[2]) as Spark's file scans do, not one per topic-partition; minPartitions and
    spark.sql.leafNodeDefaultParallelism are honoured."""
    seed = 3232
    print(f"seed={seed}")
    rng = random.Random(seed)
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    log.create_topic("w", partitions=8)
    # An object per partition and transaction (a shared object's slices are never split).
    p = log.producer(transactional_id="w-tx", **{"batch.objects.shared": False})
    p.init_transactions()
    for _ in range(2):  # 8 partitions x 2 objects of about 1 MB: 16 MB
        p.begin_transaction()
        for part in range(8):
            values = pa.array([rng.randbytes(1000) for _ in range(1000)], pa.binary())
            p.send_batch("w", pa.table([pa.nulls(1000, pa.binary()), values,
                                        pa.nulls(1000, HEADER_TYPE),
                                        pa.nulls(1000, pa.timestamp("ms", tz="UTC"))],
                                       schema=KAFKA_SCHEMA), partition=part)
        p.commit_transaction()

    def read(**options: str) -> Any:
        r = spark.read.format("txlog").option("path", url).option("topic", "w")
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()

    df = read()
    assert df.rdd.getNumPartitions() == 2  # 16 MB over Spark's parallelism of 2
    got = df.selectExpr("count(*)", "count(DISTINCT partition, offset)",
                        "sum(length(value))").collect()[0]
    assert tuple(got) == (16_000, 16_000, 16_000_000)
    assert read(minPartitions="4").rdd.getNumPartitions() == 4
    spark.conf.set("spark.sql.leafNodeDefaultParallelism", "4")
    try:
        assert read().rdd.getNumPartitions() == 4
    finally:
        spark.conf.unset("spark.sql.leafNodeDefaultParallelism")


def test_derived_columns_alone_read_only_footers(spark: Any, tmp_path: Path) -> None:
    """Offsets, partitions and counts come from the plan, but each object's footer is
    still read (as a Parquet count reads footers): a damaged object is found."""
    url = str(tmp_path / "lake")
    expected = build(url, seed=3)
    df = spark_ext.read(spark, url, topic="j", engine="jvm")
    assert df.count() == len(expected)
    assert sorted(tuple(r) for r in df.select("partition", "offset").collect()) == [
        r[:2] for r in expected]
    for f in (tmp_path / "lake").rglob("*.parquet"):
        if "/data/" in f.as_posix():
            f.write_bytes(b"not parquet")
    for query in (df.select("offset"), df.select("value")):
        with pytest.raises(Exception, match=r"cannot read batch object .*corrupt, truncated"):
            query.collect()
    with pytest.raises(Exception, match=r"cannot read batch object"):
        df.count()


def test_an_object_deleted_after_planning_fails_or_is_skipped(spark: Any,
                                                               tmp_path: Path) -> None:
    """As format("txlog"): failOnDataLoss=true names the object, false skips it."""
    url = str(tmp_path / "lake")
    expected = build(url, seed=21)
    strict = spark_ext.read(spark, url, topic="j", engine="jvm")
    lenient = spark_ext.read(spark, url, topic="j", engine="jvm", failOnDataLoss="false")
    sql = spark_ext.read(spark, url, topic="j", engine="sql", failOnDataLoss="false")
    log = txlog.connect(url)
    batches = log.partition_log(TopicPartition("j", 1)).refresh().batches
    # A committed batch of partition 1 (the batches hold data only; markers are apart).
    victim = next(i for i in range(len(batches))
                  if batches.base_offset[i] in {r[1] for r in expected if r[0] == 1})
    lo = int(batches.base_offset[victim])
    hi = lo + int(batches.count[victim])
    (tmp_path / "lake" / batches.data[victim]).unlink()
    for query in (strict.select("value"), strict.select("offset")):
        with pytest.raises(Exception, match=rf"j-1 \(offsets {lo}\.\.{hi - 1}\) is gone.*"
                                            "failOnDataLoss=false"):
            query.collect()
    kept = [r for r in expected if not (r[0] == 1 and lo <= r[1] < hi)]
    assert rows(lenient) == kept
    assert lenient.count() == len(kept)  # a count skips the same rows
    assert rows(sql) == kept


def test_compacted_segments_with_runs_cut_inside_batches(
        spark: Any, tmp_path: Path, small_batches: None) -> None:
    """A segment holds several runs (slices) of one object: the reader reads on through
    it instead of reopening it per run."""
    from txlog.maintenance import compact_partition

    url = str(tmp_path / "lake")
    expected = build(url, seed=99)
    log = txlog.connect(url)
    for tp in log.partitions_for("j"):
        assert compact_partition(log, tp).segments_written == 1
    assert rows(spark_ext.read(spark, url, topic="j", engine="jvm")) == expected
    for start in range(0, 12, 3):
        opts: dict[str, Any] = {"startingOffsets": f'{{"j": {{"0": {start}, "1": {start}}}}}'}
        got = rows(spark_ext.read(spark, url, topic="j", engine="jvm", **opts))
        assert got == [r for r in expected if r[1] >= start], opts
        count = spark_ext.read(spark, url, topic="j", engine="jvm", **opts).count()
        assert count == len(got)


def test_reads_from_other_threads(spark: Any, tmp_path: Path) -> None:
    """The jar is added from one thread; pyspark runs each Python thread on its own JVM
    thread, whose class loader must be given the session's."""
    import threading

    url = str(tmp_path / "lake")
    expected = build(url, seed=4)
    results: dict[int, Any] = {}
    jvm = spark.sparkContext._jvm

    def forget_the_jar() -> None:
        """This JVM thread's class loader as on a thread that never ran ADD JAR."""
        jvm.java.lang.Thread.currentThread().setContextClassLoader(
            jvm.java.lang.ClassLoader.getSystemClassLoader())

    def read(i: int) -> None:
        try:
            forget_the_jar()
            results[i] = rows(spark_ext.read(spark, url, topic="j", engine="jvm"))
        except Exception as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=read, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == dict.fromkeys(range(3), expected)
    forget_the_jar()
    assert rows(spark_ext.read(spark, url, topic="j", engine="jvm")) == expected


def test_another_build_on_the_classpath_is_refused(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "lake")
    expected = build(url, seed=8)
    spark_ext.read(spark, url, topic="j", engine="jvm")  # this build is loaded
    monkeypatch.setattr(jvm_scan, "_digest", lambda: "0123456789abcdef")
    with pytest.raises(ConfigError, match=r"another build of txlog's JVM scan .*spark\.jars"):
        spark_ext.read(spark, url, topic="j", engine="jvm")
    with pytest.warns(RuntimeWarning, match="another build"):
        df = spark_ext.read(spark, url, topic="j", engine="auto")
    assert rows(df) == expected


def test_an_object_shorter_than_its_entry_is_named(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    log.create_topic("s", partitions=1)
    p = log.producer()
    p.send_batch("s", pa.table({"value": [b"a", b"b", b"c"]}))
    p.flush()
    objects = [f for f in (tmp_path / "lake").rglob("*.parquet") if "/data/" in f.as_posix()]
    assert len(objects) == 1
    table = pq.read_table(objects[0])
    pq.write_table(table.slice(0, 2), objects[0])  # a valid object, one row short
    # Opened at the size its entry declares, the object no longer parses there.
    for query in ("value", "offset"):
        with pytest.raises(Exception, match=re.escape(objects[0].name)
                           + r".* is \d+ bytes, but its log entry says \d+"):
            spark_ext.read(spark, url, topic="s", engine="jvm").select(query).collect()


def test_an_object_that_fails_its_checksum_is_refused(spark: Any, tmp_path: Path) -> None:
    """A batch object changed after it was written (same size, still valid Parquet, one
    value different) fails on the CRC-32 its key names instead of returning the changed
    value; a query of derived columns alone reads only the footer and still counts it."""
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    log.create_topic("c", partitions=1)
    p = log.producer()
    p.send_batch("c", pa.table({"value": [b"first-7Qx9", b"second-Zr4w", b"third-Lm2p"]}))
    p.flush()
    df = spark_ext.read(spark, url, topic="c", engine="jvm")
    assert sorted(bytes(r.value) for r in df.select("value").collect()) == [
        b"first-7Qx9", b"second-Zr4w", b"third-Lm2p"]
    obj = next(f for f in (tmp_path / "lake").rglob("*.parquet") if "/data/" in f.as_posix())
    assert ".crc32-" in obj.name
    data = obj.read_bytes()
    assert data.count(b"second-Zr4w") == 1  # stored as written (a literal in the page)
    obj.write_bytes(data.replace(b"second-Zr4w", b"second-Zr5w"))
    assert pq.read_table(obj).column("value").to_pylist()[1] == b"second-Zr5w"
    with pytest.raises(Exception, match=re.escape(obj.name) + r" fails its checksum"):
        spark_ext.read(spark, url, topic="c", engine="jvm").select("value").collect()
    assert spark_ext.read(spark, url, topic="c", engine="jvm").count() == 3
    # Damage in the footer (the same size): named by the checksum too, parsed or not.
    footer = bytearray(data)
    footer[-40] ^= 0xFF
    obj.write_bytes(bytes(footer))
    with pytest.raises(Exception, match=re.escape(obj.name) + r" fails its checksum"):
        spark_ext.read(spark, url, topic="c", engine="jvm").select("value").collect()


def test_typed_topic_with_a_wrong_object_type_is_refused(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    log.create_topic("t", partitions=1, schema=pa.schema([("id", pa.int64())]))
    p = log.producer()
    p.send("t", {"id": 7})
    p.flush()
    assert spark_ext.read(spark, url, topic="t", engine="jvm").select("id").collect()[0].id == 7
    obj = next(f for f in (tmp_path / "lake").rglob("*.parquet") if "/data/" in f.as_posix())
    pq.write_table(pa.table({"id": pa.array(["seven"])}), obj)
    with pytest.raises(Exception, match=re.escape(obj.name)):
        spark_ext.read(spark, url, topic="t", engine="jvm").select("id").collect()


def test_without_a_jdk_auto_falls_back_and_jvm_says_why(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "lake")
    expected = build(url, seed=9)

    def unavailable(_spark: Any) -> None:
        raise jvm_scan.JvmScanUnavailable("no javac (a JDK 17+) on the PATH or in JAVA_HOME")

    monkeypatch.setattr(jvm_scan, "ensure_loaded", unavailable)
    with pytest.warns(RuntimeWarning, match="using the SQL scan"):
        df = spark_ext.read(spark, url, topic="j", engine="auto")
    assert "txlog planned scan" not in df._jdf.queryExecution().executedPlan().toString()
    assert rows(df) == expected
    with pytest.raises(ConfigError, match=r"JVM scan is unavailable: no javac.*engine='sql'"):
        spark_ext.read(spark, url, topic="j", engine="jvm")
    with pytest.raises(ConfigError, match="engine='fast'"):
        spark_ext.read(spark, url, topic="j", engine="fast")


def test_jar_build_errors_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXLOG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jvm_scan, "SHIPPED", tmp_path / "no-shipped.jar")  # a source checkout
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(jvm_scan.shutil, "which", lambda _name: None)
    with pytest.raises(jvm_scan.JvmScanUnavailable, match="no javac"):
        jvm_scan.jar()
    monkeypatch.undo()
    monkeypatch.setenv("TXLOG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jvm_scan, "SHIPPED", tmp_path / "no-shipped.jar")
    broken = tmp_path / "src" / "io" / "txlog" / "spark"
    broken.mkdir(parents=True)
    (broken / "Broken.java").write_text("package io.txlog.spark; class Broken { int x = ; }\n")
    monkeypatch.setattr(jvm_scan, "SOURCES", tmp_path / "src")
    with pytest.raises(jvm_scan.JvmScanUnavailable, match=r"javac failed.*Broken\.java"):
        jvm_scan.jar()
    assert not list((tmp_path / "cache").glob("*.jar"))


def test_jar_is_built_once_per_source_and_pyspark(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import zipfile

    monkeypatch.setenv("TXLOG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jvm_scan, "SHIPPED", tmp_path / "no-shipped.jar")  # a source checkout
    first = jvm_scan.jar()
    assert first.parent == tmp_path / "cache"
    with zipfile.ZipFile(first) as z:
        assert "io/txlog/spark/PlannedScanProvider.class" in z.namelist()
    mtime = first.stat().st_mtime_ns
    assert jvm_scan.jar() == first and first.stat().st_mtime_ns == mtime
    assert list((tmp_path / "cache").iterdir()) == [first]  # no temporary left behind


def test_the_shipped_jar_serves_when_built_from_these_sources(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wheel's Maven-built jar is used when its recorded digest is these sources';
    a stale one (another txlog's) is not, and javac builds one instead."""
    import zipfile

    monkeypatch.setenv("TXLOG_CACHE_DIR", str(tmp_path / "cache"))
    shipped = tmp_path / "txlog-spark.jar"
    monkeypatch.setattr(jvm_scan, "SHIPPED", shipped)
    with zipfile.ZipFile(shipped, "w") as z:
        z.writestr(jvm_scan.DIGEST_RESOURCE, jvm_scan.source_digest())
    assert jvm_scan.jar() == shipped
    with zipfile.ZipFile(shipped, "w") as z:
        z.writestr(jvm_scan.DIGEST_RESOURCE, "0123456789abcdef")
    built = jvm_scan.jar()
    assert built.parent == tmp_path / "cache"
    with zipfile.ZipFile(built) as z:
        assert z.read(jvm_scan.DIGEST_RESOURCE).decode() == jvm_scan.source_digest()
        assert "txlog/DefaultSource.class" in z.namelist()


@pytest.mark.s3
def test_a_store_spark_cannot_open_is_refused_at_read(spark: Any, seaweed: Any) -> None:
    """Both engines open the objects with Spark's Hadoop filesystems; pyspark ships no S3
    connector, so an s3:// root fails at read() with what to do, not in a task."""
    url = seaweed.fresh_url("jvm-scan")
    log = txlog.connect(url, seaweed.storage_options)
    log.create_topic("s", partitions=1)
    p = log.producer()
    p.send("s", b"v")
    p.flush()
    for engine in ("jvm", "sql"):
        with pytest.raises(ConfigError, match=r"has none for s3a://.*hadoop-aws.*format\('txlog'\)"):
            spark_ext.read(spark, url, topic="s", storage_options=seaweed.storage_options,
                           engine=engine)
    df = (spark.read.format("txlog").option("path", url).option("topic", "s")
          .option("storage_options", json.dumps(seaweed.storage_options)).load())
    assert [bytes(r.value) for r in df.collect()] == [b"v"]


def in_range(r: Row, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]) -> bool:
    """Whether record ``r`` (topic, partition, offset, ...) is inside the read's range
    (an end of -1 is the latest offset)."""
    lo, hi = start[r[0]][str(r[1])], end[r[0]][str(r[1])]
    return bool(r[2] >= lo and (hi == -1 or r[2] < hi))


def test_random_logs_ranges_batch_sizes_and_compaction_match_the_consumer(
        spark: Any, small_batches: None) -> None:
    """Randomized: the LogBuilder's traffic (commits, aborts, plain sends, zombies, an open
    transaction), either isolation level, random offset ranges per partition, columnar
    batches of 1-5 rows, and compaction on some logs (seeds printed)."""
    import tempfile

    from test_spark_read import LogBuilder, consume, spark_rows

    from txlog.maintenance import compact_partition

    key = "spark.sql.parquet.columnarReaderBatchSize"
    checked = 0
    for seed in range(7001, 7016):
        print(f"seed={seed}")
        rng = random.Random(seed)
        spark.conf.set(key, str(rng.choice([1, 2, 3, 5])))
        b = LogBuilder(tempfile.mkdtemp(prefix="jvm-scan-") + "/lake", seed)
        b.random_traffic(steps=rng.randint(4, 12))
        if rng.random() < 0.4:
            log = txlog.connect(b.url)
            for topic in ("events", "other"):
                for tp in log.partitions_for(topic):
                    compact_partition(log, tp)
        isolation = rng.choice(["read_committed", "read_uncommitted"])
        want = consume(b.url, ["events", "other"], isolation)
        high: dict[tuple[str, int], int] = {}
        for r in want:
            high[(r[0], r[1])] = max(high.get((r[0], r[1]), 0), r[2] + 1)
        start: dict[str, dict[str, int]] = {}
        end: dict[str, dict[str, int]] = {}
        for (topic, part), h in sorted(high.items()):
            lo = rng.randint(0, h)
            hi = rng.randint(lo, h + 1)
            start.setdefault(topic, {})[str(part)] = lo
            end.setdefault(topic, {})[str(part)] = hi if hi <= h else -1

        opts: dict[str, Any] = {"subscribe": "events,other", "isolation_level": isolation,
                "startingOffsets": json.dumps(start), "endingOffsets": json.dumps(end)}
        want = [r for r in want if in_range(r, start, end)]
        df = spark_ext.read(spark, b.url, engine="jvm", **opts)
        assert spark_rows(df) == want, f"seed={seed}"
        assert df.count() == len(want), f"seed={seed}"
        checked += len(want)
    assert checked > 100  # the ranges left rows to compare


def test_objects_written_with_and_without_the_arrow_schema_read_alike(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka-shaped objects are written without the Arrow schema in their footer; those
    written before, with it, still read alike (JVM scan, Python source, consumer)."""
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    log.create_topic("m", partitions=1)
    p = log.producer(transactional_id="m-tx")
    p.init_transactions()
    write = pq.write_table
    for old in (True, False, True, False):
        if old:  # as objects were written before: with the Arrow schema
            monkeypatch.setattr(pq, "write_table",
                                lambda *a, **k: write(*a, **{**k, "store_schema": True}))
        p.begin_transaction()
        for n in range(3):
            p.send("m", f"v{old}{n}".encode(), key=b"k" if n else None,
                   headers=[("h", b"x"), ("n", None)] if n == 1 else None,
                   timestamp_ms=None if n == 2 else 1_000 + n)
        p.commit_transaction()
        monkeypatch.undo()
    schemas = [b"ARROW:schema" in (pq.read_metadata(f).metadata or {})
               for f in sorted((tmp_path / "lake").rglob("*.parquet"))]
    assert sorted(schemas) == [False, False, True, True], schemas
    c = txlog.connect(url).consumer(auto_offset_reset="earliest")
    c.subscribe(["m"])
    want = sorted(row(r.partition, r.offset, r.key, r.value, r.headers)
                  for r in c.poll(max_records=100))
    assert len(want) == 12
    jvm = spark_ext.read(spark, url, topic="m", engine="jvm")
    assert rows(jvm) == want
    assert rows(spark_ext.read(spark, url, topic="m", engine="sql")) == want
    python_source = spark.read.format("txlog_python").option("path", url).option("topic", "m")
    assert rows(python_source.load()) == want
    cols = ["offset", "timestampType", "unix_millis(timestamp) AS ts"]
    assert sorted(map(tuple, jvm.selectExpr(*cols).collect())) == sorted(
        map(tuple, spark_ext.read(spark, url, topic="m", engine="sql").selectExpr(*cols)
            .collect()))
