"""format("txlog") through txlog's JVM connector (spark_ext/java, txlog.DefaultSource):
which path a query takes, column pruning, filters pruning batch objects before any is
opened, SQL tables, and the Python data source where the connector is absent."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import spark_ext
import txlog
from spark_ext import plan_file, pushdown
from txlog.records import TopicPartition

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]


def executed(df: Any) -> str:
    """The physical plan as Spark will run it (the scan's description included)."""
    return str(df._jdf.queryExecution().executedPlan().toString())


def build(url: str) -> list[Row]:
    """Topic "c", two partitions; six transactions of one batch per partition, each batch
    an object of its own (the tests prune and delete objects by partition; shared objects
    are tests/spark/test_shared_scan.py's), batch i's records stamped 10_000 * (i + 1) ms;
    the fourth transaction aborted. Returns the committed (partition, offset, value,
    timestamp ms) as the consumer reads them."""
    log = txlog.connect(url)
    log.create_topic("c", partitions=2)
    p = log.producer(transactional_id="c-tx", **{"batch.objects.shared": False})
    p.init_transactions()
    for i in range(6):
        p.begin_transaction()
        for part in (0, 1):
            for j in range(3):
                p.send("c", f"v{i}-{part}-{j}".encode(), key=b"k", partition=part,
                       timestamp_ms=10_000 * (i + 1))
        p.flush()
        p.abort_transaction() if i == 3 else p.commit_transaction()
    c = txlog.connect(url).consumer(auto_offset_reset="earliest")
    c.subscribe(["c"])
    return sorted((r.partition, r.offset, r.value, r.timestamp)
                  for r in c.poll(max_records=1000))


def rows(df: Any) -> list[Row]:
    return sorted((r["partition"], r["offset"], bytes(r["value"]),
                   int(r["timestamp"].timestamp() * 1000))
                  for r in df.select("partition", "offset", "value", "timestamp").collect())


def reader(spark: Any, url: str) -> Any:
    return spark.read.format("txlog").option("path", url).option("topic", "c").load()


def batch_objects(url: str, partition: int) -> list[tuple[int, int, str]]:
    """(base offset, count, object key) of each data batch of c-<partition>."""
    b = txlog.connect(url).partition_log(TopicPartition("c", partition)).refresh().batches
    return [(b.base_offset[i], b.count[i], b.data[i]) for i in range(len(b))]


def test_format_txlog_reads_through_the_jvm_connector(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    expected = build(url)
    df = reader(spark, url)
    assert rows(df) == expected  # read_committed: the aborted transaction is not there
    assert "txlog JVM scan" in executed(df)
    assert f"reading [topic=c] at {url}" in executed(df)  # what it reads, by name
    assert spark_ext.jvm_connector_loaded(spark)


def test_a_two_column_query_reads_two_columns(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    expected = build(url)
    q = reader(spark, url).selectExpr("count(*) AS n", "sum(length(value)) AS s",
                                      "max(offset) AS m")
    assert "txlog JVM scan: columns [value, offset]," in executed(q)
    got = q.collect()[0]
    assert (got.n, got.s, got.m) == (len(expected), sum(len(r[2]) for r in expected),
                                     max(r[1] for r in expected))
    assert "txlog JVM scan: columns []," in executed(reader(spark, url).selectExpr("count(*)"))


def test_filters_prune_batch_objects_before_any_is_opened(spark: Any, tmp_path: Path) -> None:
    """Objects the filters exclude are deleted: a read that opened one would fail
    (failOnDataLoss names it), so the reads below pass only if none is opened."""
    url = str(tmp_path / "lake")
    expected = build(url)
    for _, _, key in batch_objects(url, 1):
        (tmp_path / "lake" / key).unlink()
    p0 = batch_objects(url, 0)
    for _, _, key in p0[:2]:  # the first two transactions' batches of c-0
        (tmp_path / "lake" / key).unlink()
    with pytest.raises(Exception, match="is gone"):
        reader(spark, url).collect()
    third = p0[2][0]  # the first offset of the third transaction's batch
    by_partition = reader(spark, url).where(f"partition = 0 AND offset >= {third}")
    assert rows(by_partition) == [r for r in expected if r[0] == 0 and r[1] >= third]
    assert "pushed filters [" in executed(by_partition)
    by_time = reader(spark, url).where(
        "partition IN (0) AND timestamp >= timestamp_millis(30000)")
    assert rows(by_time) == [r for r in expected if r[0] == 0 and r[3] >= 30_000]
    plan = executed(by_time)
    committed_p0 = 5  # six transactions, one aborted: its batch is not planned either
    assert f"{committed_p0 - 2} of {2 * committed_p0} batch objects" in plan, plan


def test_sql_table_keeps_its_options(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    expected = build(url)
    spark.sql(f"CREATE TABLE conn_c USING txlog OPTIONS (path '{url}', topic 'c')")
    try:
        got = spark.sql("SELECT partition, offset, value, timestamp FROM conn_c")
        assert rows(got) == expected
        insert = "INSERT INTO conn_c SELECT 'k' AS key, 'inserted' AS value, 1 AS partition"
        plan = spark.sql(f"EXPLAIN {insert}").collect()[0][0]
        # Planned, not run; the table's root is its location (file:<path>).
        assert "txlog write [topic=c] at " in plan and url in plan, plan
        spark.sql(insert)
        values = [bytes(r.value) for r in spark.sql("SELECT value FROM conn_c "
                                                    "WHERE partition = 1").collect()]
        assert values.count(b"inserted") == 1
    finally:
        spark.sql("DROP TABLE conn_c")


def test_writes_take_the_jvm_writer_or_the_python_source(spark: Any, tmp_path: Path) -> None:
    """Rows the JVM writer takes are staged by it; rows with headers go to the Python
    source, and both commit."""
    url = str(tmp_path / "lake")
    txlog.connect(url).create_topic("w", partitions=1)
    (spark.createDataFrame([("a", "1"), ("b", "2")], "key string, value string")
     .write.format("txlog").mode("append").option("path", url).option("topic", "w").save())
    (spark.createDataFrame([("c", "3", [("h", b"x")])],
                           "key string, value string, headers array<struct<key:string,"
                           "value:binary>>")
     .write.format("txlog").mode("append").option("path", url).option("topic", "w").save())
    # Each write's objects end in its staging id; the JVM writer names them
    # p<partition>-t<task>-<task id>-<seq>-<id>, the Python stager
    # p<partition>-t<task>-<attempt id>-<attempt>-<seq>-<id>.
    fields: dict[str, set[int]] = {}
    for _, _, key in _batches(url, "w"):
        # (the Python stager's names also carry the object's checksum)
        name = re.sub(r"\.crc32-[0-9a-f]{8}$", "", key.rsplit("/", 1)[-1].removesuffix(".parquet"))
        fields.setdefault(name.rsplit("-", 1)[-1], set()).add(len(name.split("-")))
    assert list(fields.values()) == [{5}, {6}], fields
    got = spark.read.format("txlog").option("path", url).option("topic", "w").load()
    assert sorted((bytes(r.value), [(h.key, bytes(h.value)) for h in r.headers or []])
                  for r in got.collect()) == [(b"1", []), (b"2", []), (b"3", [("h", b"x")])]


def _batches(url: str, topic: str) -> list[tuple[int, int, str]]:
    b = txlog.connect(url).partition_log(TopicPartition(topic, 0)).refresh().batches
    return [(b.base_offset[i], b.count[i], b.data[i]) for i in range(len(b))]


_WITHOUT_JAR = """
import json, sys
import spark_ext
spark = spark_ext.local_session("no-jar", **{"spark.jars": ""})
df = spark.read.format("txlog").option("path", sys.argv[1]).option("topic", "c").load()
plan = df._jdf.queryExecution().executedPlan().toString()
print(json.dumps({"jvm": spark_ext.jvm_connector_loaded(spark), "n": df.count(),
                  "plan": plan}))
spark.stop()
"""


def test_without_the_jar_format_txlog_is_the_python_source(tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    expected = build(url)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_JAR, url], capture_output=True,
                          text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["jvm"] is False
    assert out["n"] == len(expected)
    assert "txlog JVM scan" not in out["plan"] and "Python" in out["plan"], out["plan"]


# -- the pushdown's bounds (no Spark) -----------------------------------------------------


def f(column: str, op: str, *values: Any) -> dict[str, Any]:
    return {"column": column, "op": op, "values": list(values)}


def test_bounds_from_filters() -> None:
    b = pushdown.bounds_from_filters([f("partition", "in", 0, 2), f("partition", "eq", 2),
                                      f("offset", "ge", 10), f("offset", "lt", 20),
                                      f("timestamp", "gt", 1_500), f("timestamp", "le", 9_001),
                                      f("topic", "eq", "a")])
    assert b.partitions == frozenset({2}) and b.topics == frozenset({"a"})
    assert (b.offset_lo, b.offset_hi) == (10, 20)
    # microseconds widened to whole milliseconds, never narrowed
    assert (b.ts_lo, b.ts_hi) == (1, 10)
    assert pushdown.bounds_from_filters([f("offset", "gt", 5), f("offset", "le", 5)]).empty
    ranges = {TopicPartition("a", 2): (0, 100), TopicPartition("a", 0): (0, 100)}
    assert pushdown.restrict_ranges(ranges, b) == {TopicPartition("a", 2): (10, 20),
                                                   TopicPartition("a", 0): (0, 0)}


@pytest.mark.parametrize("bad", [f("value", "eq", 1), f("offset", "ne", 1),
                                 f("offset", "eq", "x"), f("offset", "eq", 1, 2)])
def test_bounds_reject_what_is_not_a_pushed_filter(bad: dict[str, Any]) -> None:
    with pytest.raises(txlog.errors.ConfigError):
        pushdown.bounds_from_filters([bad])


# -- the planner's answers (no Spark) -----------------------------------------------------


def test_planner_answers_errors_with_their_class(tmp_path: Path) -> None:
    from spark_ext.jvm_plan import answer

    url = str(tmp_path / "lake")
    txlog.connect(url).create_topic("c", partitions=1)
    bad = answer({"op": "schema", "options": {"path": url, "topic": "c", "startingOfsets": "0"}})
    assert bad["error"]["type"] == "txlog.errors.ConfigError"
    assert "startingofsets" in bad["error"]["message"].lower()
    assert answer({"op": "nope"})["error"]["type"] == "txlog.errors.ConfigError"
    missing = answer({"op": "schema", "options": {"path": url, "topic": "gone"}})
    assert missing["error"]["type"] == "txlog.errors.UnknownTopicError"


def test_planner_takes_a_catalog_tables_options(tmp_path: Path) -> None:
    """CREATE TABLE ... OPTIONS (...) reaches the planner as option.<name> among the
    table's own properties, and path as its location."""
    from spark_ext.jvm_plan import answer

    url = str(tmp_path / "lake")
    expected = build(url)
    got = answer({"op": "scan", "filters": [f("partition", "eq", 1)], "planFormat": 1,
                  "options": {"option.topic": "c", "location": "file:" + url,
                              "provider": "txlog", "owner": "someone"}})
    assert "error" not in got, got
    assert got["objects"] == 5 and got["objectsBeforePushdown"] == 10
    _, slices = plan_file.read(got["planFile"])
    os.unlink(got["planFile"])
    assert sum(slices.column("take").to_pylist()) == sum(1 for r in expected if r[0] == 1)
