"""The JVM writer (``spark_ext.write``, spark_ext/jvm_write.py + StagedWriteProvider):
rows routed and encoded in the JVM, committed by the driver as one transaction.

Each test compares it with what ``format("txlog")`` (the Python engine) writes for the
same rows, and reads the result back with the consumer and every Spark read path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import spark_ext
import txlog
from spark_ext import jvm_scan
from txlog.errors import ConfigError, UnknownTopicError
from txlog.maintenance import compact_partition
from txlog.partitioner import partition_for_key
from txlog.records import Record, TopicPartition

pytestmark = pytest.mark.spark


def consume(lg: txlog.Log, topic: str) -> list[Record]:
    c = lg.consumer(isolation_level="read_committed")
    c.assign(lg.partitions_for(topic))
    c.seek_to_beginning()
    out: list[Record] = []
    while got := c.poll(max_records=100_000):
        out.extend(got)
    return out


def by_partition(recs: list[Record]) -> dict[int, list[tuple[Any, Any]]]:
    """Each partition's (key, value) in offset order."""
    out: dict[int, list[tuple[Any, Any]]] = {}
    for r in sorted(recs, key=lambda r: (r.partition, r.offset)):
        out.setdefault(r.partition, []).append((r.key, r.value))
    return out


def staged(root: str, topic: str) -> set[str]:
    base = Path(root) / "topics" / topic / "_staging"
    return {str(p.relative_to(root)) for p in base.rglob("*") if p.is_file()} \
        if base.exists() else set()


def referenced(lg: txlog.Log, topic: str) -> set[str]:
    return {d for tp in lg.partitions_for(topic)
            for d in lg.partition_log(tp).refresh().batches.data}


def spark_rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((r.partition, r.offset, r.key, r.value, r.timestamp, r.timestampType)
                  for r in df.select("partition", "offset", "key", "value", "timestamp",
                                     "timestampType").collect())


def test_rows_land_where_format_txlog_puts_them(spark: Any, tmp_path: Path) -> None:
    """String and binary keys, null and empty keys, string values: the JVM writer puts
    each row in the partition and position the Python engine does, in one transaction,
    and every reader sees the same records."""
    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    for t in ("jvm", "py"):
        lg.create_topic(t, partitions=5)
    df = spark.range(0, 600, numPartitions=2).selectExpr(
        "CASE WHEN id % 10 = 3 THEN NULL WHEN id % 10 = 7 THEN '' "
        "ELSE concat('user-', id % 37) END AS key",
        "concat('v', id) AS value")
    res = spark_ext.write(df, root, topic="jvm", engine="jvm")
    assert res is not None and res.rows == 600 and not res.skipped
    assert spark_ext.write(df, root, topic="py", engine="python") is None

    recs = consume(lg, "jvm")
    assert sorted(r.value for r in recs) == sorted(f"v{i}".encode() for i in range(600))
    for r in recs:
        if r.key:
            assert r.partition == partition_for_key(r.key, 5)  # Kafka's murmur2
        assert r.headers == []
    # Same rows, same partitions, same order within each partition as format("txlog").
    assert by_partition(recs) == by_partition(consume(lg, "py"))
    # One transaction, and the log references the staged objects themselves.
    owners = {(b.producer_id[i], b.epoch[i]) for tp in lg.partitions_for("jvm")
              for b in [lg.partition_log(tp).refresh().batches] for i in range(len(b))}
    assert len(owners) == 1
    assert staged(root, "jvm") == referenced(lg, "jvm")
    # Encoded as the Python engine encodes: no column statistics (no reader looks at
    # them, and they cost the JVM writer a tenth of its CPU).
    for key in staged(root, "jvm") | staged(root, "py") | referenced(lg, "py"):
        md = pq.ParquetFile(Path(root) / key).metadata
        assert not any(md.row_group(g).column(c).is_stats_set
                       for g in range(md.num_row_groups) for c in range(md.num_columns)), key

    # No timestamp column: no CreateTime; every reader gives the batch's append time.
    appended = {}
    for tp in lg.partitions_for("jvm"):
        st = lg.partition_log(tp).refresh()
        for i in range(len(st.batches)):
            first = st.batches.base_offset[i]
            for o in range(first, first + st.batches.count[i]):
                appended[(tp.partition, o)] = st.batches.append_ms[i]
            # ... which is the batch's time range, for time lookups and retention.
            assert st.batches.ts_min[i] == st.batches.ts_max[i] == st.batches.append_ms[i]
    assert all(r.timestamp == appended[(r.partition, r.offset)] and r.timestamp_type == 1
               for r in recs)
    expected = sorted((r.partition, r.offset, r.key, r.value) for r in recs)
    for engine in ("jvm", "sql"):
        got = spark_rows(spark_ext.read(spark, root, topic="jvm", engine=engine))
        assert [g[:4] for g in got] == expected, engine
        assert all(g[5] == 1 and int(g[4].timestamp() * 1000) == appended[g[:2]]
                   for g in got), engine
    got = spark_rows(spark.read.format("txlog").option("path", root).option("topic", "jvm")
                     .load())
    assert [g[:4] for g in got] == expected


def test_timestamps_and_partition_columns(spark: Any, tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("t", partitions=4)
    df = spark.range(0, 200, numPartitions=2).selectExpr(
        "cast(concat('k', id) AS binary) AS key", "cast(concat('v', id) AS binary) AS value",
        "timestamp_micros(1700000000000000 + id * 1001) AS timestamp",
        # Long partitions, some null (routed by key), as a Spark job may compute them.
        "CASE WHEN id % 5 = 0 THEN NULL ELSE id % 4 END AS partition")
    spark_ext.write(df, root, topic="t", engine="jvm")
    recs = consume(lg, "t")
    assert len(recs) == 200
    for r in recs:
        i = int(r.value[1:])
        assert r.timestamp == (1_700_000_000_000_000 + i * 1001) // 1000  # ms, truncated
        assert r.partition == (partition_for_key(r.key, 4) if i % 5 == 0 else i % 4)
    got = spark_rows(spark_ext.read(spark, root, topic="t", engine="jvm"))
    assert {g[5] for g in got} == {0}  # CreateTime
    for tp in lg.partitions_for("t"):  # each batch's range is its records' own times
        b = lg.partition_log(tp).refresh().batches
        for i in range(len(b)):
            own = [r.timestamp for r in recs if r.partition == tp.partition
                   and b.base_offset[i] <= r.offset < b.base_offset[i] + b.count[i]]
            assert (b.ts_min[i], b.ts_max[i]) == (min(own), max(own))
    c = lg.consumer()
    tp = TopicPartition("t", 1)
    c.assign([tp])
    first = min((r for r in recs if r.partition == 1), key=lambda r: r.offset)
    assert c.offsets_for_times({tp: first.timestamp})[tp] == first.offset

    # A partition the topic lacks fails the write; nothing is visible or left staged.
    before = {tp: lg.partition_log(tp).refresh().high_watermark for tp in lg.partitions_for("t")}
    bad = spark.range(0, 50, numPartitions=2).selectExpr(
        "'v' AS value", "cast(IF(id = 41, 9, 1) AS int) AS partition")
    with pytest.raises(UnknownTopicError, match=r"partitions 0\.\.3, not 9"):
        spark_ext.write(bad, root, topic="t", engine="jvm")
    assert {tp: lg.partition_log(tp).refresh().high_watermark
            for tp in lg.partitions_for("t")} == before
    assert staged(root, "t") == referenced(lg, "t")


def test_txn_app_version_reruns_commit_nothing(spark: Any, tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("backfill", partitions=3)

    def chunk(v: int) -> Any:
        return spark.range(v * 100, v * 100 + 50, numPartitions=2).selectExpr(
            "cast(id as string) as key", "cast(id as string) as value")

    results = [spark_ext.write(chunk(v), root, topic="backfill", engine="jvm",
                               txnAppId="daily", txnVersion=str(v)) for v in (1, 2, 1, 2, 0)]
    assert [bool(r and r.skipped) for r in results] == [False, False, True, True, True]
    values = sorted(int(r.value) for r in consume(lg, "backfill"))
    assert values == list(range(100, 150)) + list(range(200, 250))
    assert staged(root, "backfill") == referenced(lg, "backfill")


def test_staged_objects_and_folders_get_hadoops_permissions(spark: Any,
                                                            tmp_path: Path) -> None:
    """The JVM writer's local file system (LocalFiles) sets permissions in the JVM, not
    with a chmod process per object: files and folders end up as Hadoop's own would."""
    root = str(tmp_path / "lake")
    txlog.connect(root).create_topic("m", partitions=4)
    df = spark.range(0, 200, numPartitions=2).selectExpr("cast(id AS string) AS key",
                                                         "cast(id AS string) AS value")
    res = spark_ext.write(df, root, topic="m", engine="jvm")
    assert res is not None and res.files == 8
    base = Path(root) / "topics" / "m" / "_staging"
    files = [p for p in base.rglob("*") if p.is_file()]
    folders = [p for p in base.rglob("*") if p.is_dir()]
    assert len(files) == 8 and folders
    # Hadoop's defaults with its umask (fs.permissions.umask-mode, 022)
    assert {p.stat().st_mode & 0o7777 for p in files} == {0o644}
    assert {p.stat().st_mode & 0o7777 for p in folders} == {0o755}

    # LocalFiles itself (the tasks load it in a class loader of their own, out of
    # reach; that the writer uses it, and forks no chmod, shows in spark_write.py).
    jvm = spark.sparkContext._jvm
    fs = jvm.io.txlog.spark.LocalFiles()
    target = tmp_path / "mode"
    target.write_bytes(b"x")
    for mode in ("600", "750", "444", "1777", "000"):
        fs.setPermission(jvm.org.apache.hadoop.fs.Path(str(target)),
                         jvm.org.apache.hadoop.fs.permission.FsPermission(mode))
        assert target.stat().st_mode & 0o7777 == int(mode, 8), mode
    # A group-shared folder keeps its setgid bit, as chmod keeps it.
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o2775)
    fs.setPermission(jvm.org.apache.hadoop.fs.Path(str(shared)),
                     jvm.org.apache.hadoop.fs.permission.FsPermission("755"))
    assert shared.stat().st_mode & 0o7777 == 0o2755


def test_a_failed_task_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("f", partitions=3)
    df = spark.range(0, 400, numPartitions=2).selectExpr(
        "cast(id AS string) AS key",
        "IF(id = 350, raise_error('boom at 350'), cast(id AS string)) AS value")
    with pytest.raises(Exception, match="boom at 350"):
        spark_ext.write(df, root, topic="f", engine="jvm")
    assert all(lg.partition_log(tp).refresh().high_watermark == 0
               for tp in lg.partitions_for("f"))
    assert staged(root, "f") == set()


def test_writes_the_jvm_writer_does_not_take(spark: Any, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """auto goes through format("txlog"); jvm says why."""
    import pyarrow as pa

    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("k", partitions=2)
    lg.create_topic("typed", partitions=2, schema=pa.schema([pa.field("id", pa.int64())]))
    headers = spark.range(0, 10).selectExpr(
        "cast(id AS string) AS value",
        "array(named_struct('key', 'h', 'value', cast('x' AS binary))) AS headers")
    typed = spark.range(0, 10).selectExpr("id")
    for df, topic, why in ((headers, "k", "the rows have headers"),
                           (typed, "typed", "topic 'typed' is typed")):
        with pytest.raises(ConfigError, match=why):
            spark_ext.write(df, root, topic=topic, engine="jvm")
        # auto: format("txlog")
        assert spark_ext.write(df, root, topic=topic, engine="auto") is None
    assert [r.headers for r in consume(lg, "k")] == [[("h", b"x")]] * 10
    assert sorted(r.value["id"] for r in consume(lg, "typed")) == list(range(10))

    def no_jdk(spark: Any) -> None:
        raise jvm_scan.JvmScanUnavailable("no javac (a JDK 17+) on the PATH or in JAVA_HOME")

    monkeypatch.setattr(jvm_scan, "ensure_loaded", no_jdk)
    plain = spark.range(0, 10).selectExpr("cast(id AS string) AS value")
    with pytest.raises(ConfigError, match="JVM writer is unavailable: no javac"):
        spark_ext.write(plain, root, topic="k", engine="jvm")
    with pytest.warns(RuntimeWarning, match="JVM writer is unavailable: no javac"):
        assert spark_ext.write(plain, root, topic="k", engine="auto") is None
    assert len(consume(lg, "k")) == 20


def test_compaction_merges_objects_with_and_without_timestamps(spark: Any,
                                                              tmp_path: Path) -> None:
    """A partition and its compacted segment of batches with and without timestamp
    columns (one from a non-null timestamp expression, one from a producer) keep every
    record's timestamp, its own or its batch's append time, and time lookups agree."""
    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("m", partitions=1)
    plain = spark.range(0, 30, numPartitions=1).selectExpr("cast(id AS string) AS value")

    def stamped(base: int) -> Any:
        return spark.range(30, 60, numPartitions=1).selectExpr(
            "cast(id AS string) AS value", f"timestamp_millis({base} + id) AS timestamp")

    spark_ext.write(stamped(1000), root, topic="m", engine="python")
    spark_ext.write(stamped(2000), root, topic="m", engine="jvm")  # a non-null column
    spark_ext.write(plain, root, topic="m", engine="jvm")
    spark_ext.write(plain, root, topic="m", engine="python")
    p = lg.producer()
    p.send("m", b"60", timestamp_ms=5_000)
    p.flush()
    before = [(r.offset, r.value, r.timestamp) for r in consume(lg, "m")]
    assert len(before) == 121
    tp = TopicPartition("m", 0)
    # The first record at or after each time, in offset order (commit markers take
    # offsets too): inside the first batch, inside the second, the third's first.
    wanted = {ts: next(o for o, _, t in before if t >= ts) for ts in (1_040, 2_040, 5_000)}
    assert wanted == {1_040: 10, 2_040: 41, 5_000: 62}
    c = lg.consumer()
    c.assign([tp])
    assert {ts: c.offsets_for_times({tp: ts})[tp] for ts in wanted} == wanted
    spark_before = spark_rows(spark_ext.read(spark, root, topic="m"))

    report = compact_partition(lg, tp)
    assert report.compacted_batches == 5
    fresh = txlog.connect(root)
    assert len(fresh.partition_log(tp).refresh().batches) == 5  # runs of one segment
    assert [(r.offset, r.value, r.timestamp) for r in consume(fresh, "m")] == before
    c = fresh.consumer()
    c.assign([tp])
    assert {ts: c.offsets_for_times({tp: ts})[tp] for ts in wanted} == wanted
    for engine in ("jvm", "sql"):
        assert spark_rows(spark_ext.read(spark, root, topic="m", engine=engine)) \
            == spark_before, engine


def test_a_store_spark_cannot_open_goes_through_format_txlog(spark: Any, seaweed: Any) -> None:
    """pyspark ships no S3 connector: auto writes through txlog's own store instead, and
    engine='jvm' says what to add, before any task runs."""
    url = seaweed.fresh_url("jvm-write")
    lg = txlog.connect(url, seaweed.storage_options)
    lg.create_topic("s", partitions=2)
    df = spark.range(0, 20, numPartitions=2).selectExpr("cast(id AS string) AS value")
    with pytest.raises(ConfigError, match=r"spark_ext.write writes .* has none for s3a://.*"
                                          r"hadoop-aws.*write with format\('txlog'\)"):
        spark_ext.write(df, url, topic="s", engine="jvm",
                        storage_options=seaweed.storage_options)
    assert all(lg.partition_log(tp).refresh().high_watermark == 0
               for tp in lg.partitions_for("s"))
    assert spark_ext.write(df, url, topic="s", storage_options=seaweed.storage_options,
                           engine="auto") is None
    assert sorted(int(r.value) for r in consume(lg, "s")) == list(range(20))


def test_foreach_batch_with_the_batch_id_as_version_is_exactly_once(spark: Any,
                                                                   tmp_path: Path) -> None:
    """The streaming recipe: each micro-batch is one spark_ext.write with the query's id
    as txnAppId and the batch id as txnVersion, so a replayed batch commits nothing."""
    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("out", partitions=3)
    src = tmp_path / "src"
    (spark.range(0, 60, numPartitions=1).selectExpr("cast(id AS string) AS value")
     .repartition(3).write.json(str(src)))
    calls: list[int] = []

    def sink(df: Any, batch_id: int) -> None:
        calls.append(batch_id)
        for _ in range(2):  # the second time stands for a replay after a restart
            spark_ext.write(df, root, topic="out", engine="jvm", txnAppId="query-1",
                            txnVersion=batch_id)

    q = (spark.readStream.schema("value string").option("maxFilesPerTrigger", 1)
         .json(str(src)).writeStream.foreachBatch(sink)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True)
         .start())
    try:
        assert q.awaitTermination(600) and q.exception() is None
    finally:
        q.stop()
    assert calls == [0, 1, 2]
    assert sorted(int(r.value) for r in consume(lg, "out")) == list(range(60))


def test_rows_keep_their_order_across_files(spark: Any, tmp_path: Path) -> None:
    """A small maxFileBytes closes each partition's file many times within a task (16
    partitions): each partition still holds the Python engine's rows, in its order, and
    every file's reported row count is the rows it holds (the consumer checks)."""
    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    for t in ("jvm", "py"):
        lg.create_topic(t, partitions=16)
    df = spark.range(0, 40_000, numPartitions=2).selectExpr(
        "concat('user-', id % 101) AS key", "concat(repeat('v', 40), id) AS value")
    res = spark_ext.write(df, root, topic="jvm", engine="jvm", maxFileBytes="50000")
    assert res is not None and res.rows == 40_000
    assert spark_ext.write(df, root, topic="py", engine="python",
                           maxFileBytes="50000") is None
    jvm = consume(lg, "jvm")
    assert len(jvm) == 40_000
    assert by_partition(jvm) == by_partition(consume(lg, "py"))
    assert res.files > 2 * 16  # files were closed mid-task
