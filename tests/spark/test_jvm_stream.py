"""Structured Streaming through txlog's JVM connector: ``readStream.format("txlog")`` is a
micro-batch stream planned by txlog's Python planner (offsets bounded by the last stable
offset, maxOffsetsPerTrigger, Trigger.AvailableNow) and ``writeStream.format("txlog")``
commits each micro-batch as one transaction, idempotent when Spark replays it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog.app_versions import committed_app_version
from txlog.records import TopicPartition

pytestmark = pytest.mark.spark

LONG_TXN = {"transaction.timeout.ms": 900_000}


def produce(url: str, *, seed: int, txns: int) -> tuple[list[str], Any]:
    """Topic "src" (3 partitions): ``txns`` transactions of 1-9 records, about one in
    four aborted, then one left open (its records past the last stable offset). Returns
    the committed values and the open transaction's producer."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    log = txlog.connect(url)
    log.create_topic("src", partitions=3)
    log.create_topic("out", partitions=2)
    p = log.producer(transactional_id="src-tx", **LONG_TXN)
    p.init_transactions()
    committed: list[str] = []
    n = 0
    for _ in range(txns):
        p.begin_transaction()
        values = [f"v{n + i}" for i in range(rng.randint(1, 9))]
        n += len(values)
        for v in values:
            p.send("src", v.encode(), key=v.encode(), partition=rng.randrange(3))
        p.flush()
        if rng.random() < 0.25:
            p.abort_transaction()
        else:
            p.commit_transaction()
            committed.extend(values)
    p.close()
    held = log.producer(transactional_id="src-open", **LONG_TXN)
    held.init_transactions()
    held.begin_transaction()
    for part in range(3):
        held.send("src", f"open{part}".encode(), partition=part)
    held.flush()
    return committed, held


def out_values(url: str) -> list[str]:
    c = txlog.connect(url).consumer(auto_offset_reset="earliest")
    c.subscribe(["out"])
    return sorted(bytes(r.value).decode() for r in c.poll(max_records=100_000))


def high_watermarks(url: str) -> list[int]:
    log = txlog.connect(url)
    return [log.partition_log(TopicPartition("out", p)).refresh().high_watermark
            for p in range(2)]


def run(spark: Any, url: str, ckpt: Path, **opts: str) -> Any:
    """readStream "src" -> writeStream "out", Trigger.AvailableNow, to its end."""
    r = (spark.readStream.format("txlog").option("path", url).option("topic", "src")
         .option("startingOffsets", "earliest"))
    for k, v in opts.items():
        r = r.option(k, v)
    q = (r.load().selectExpr("key", "value").writeStream.format("txlog").option("path", url)
         .option("topic", "out").option("checkpointLocation", str(ckpt))
         .trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(600), "the AvailableNow query did not end"
        assert q.exception() is None
    finally:
        q.stop()
    return q


def plan_of(q: Any) -> str:
    return str(q._jsq.explainInternal(False))


def test_topic_to_topic_stream_goes_through_the_jvm_connector(spark: Any,
                                                               tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    committed, held = produce(url, seed=3201, txns=14)
    ckpt = tmp_path / "ckpt"
    q = run(spark, url, ckpt, maxOffsetsPerTrigger="7")
    progress = q.recentProgress
    assert {p["sources"][0]["description"] for p in progress} == {"txlog JVM stream [topic=src]"}
    plan = plan_of(q)
    assert "txlog JVM streaming write [topic=out]" in plan and "txlog JVM scan" in plan, plan
    # Admission control split the backlog; the open transaction holds the LSO back.
    assert sum(1 for p in progress if p["numInputRows"]) >= 3
    assert max(p["numInputRows"] for p in progress) <= 7
    assert out_values(url) == sorted(committed)
    last = max(p["batchId"] for p in progress)
    assert committed_app_version(txlog.connect(url), f"stream-{q.id}") == last

    # The open transaction commits: exactly its records arrive, once.
    held.commit_transaction()
    again = run(spark, url, ckpt, maxOffsetsPerTrigger="7")
    assert again.id == q.id
    assert out_values(url) == sorted([*committed, "open0", "open1", "open2"])


def test_a_replayed_micro_batch_commits_nothing_new(spark: Any, tmp_path: Path) -> None:
    """The checkpoint loses its last "done" mark (as when the driver dies after the
    commit): Spark runs that micro-batch again with the same id, and the topic gets
    nothing new."""
    url = str(tmp_path / "lake")
    committed, held = produce(url, seed=3202, txns=8)
    held.abort_transaction()
    ckpt = tmp_path / "ckpt"
    q = run(spark, url, ckpt, maxOffsetsPerTrigger="10")
    assert out_values(url) == sorted(committed)
    marks = high_watermarks(url)
    done = sorted(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
    (ckpt / "commits" / str(done[-1])).unlink()
    (ckpt / "commits" / f".{done[-1]}.crc").unlink(missing_ok=True)

    replay = run(spark, url, ckpt, maxOffsetsPerTrigger="10")
    assert [p["batchId"] for p in replay.recentProgress if p["numInputRows"]] == [done[-1]]
    assert "txlog JVM streaming write [topic=out]" in plan_of(replay)
    assert out_values(url) == sorted(committed)
    assert high_watermarks(url) == marks  # no transaction, not even a marker
    assert committed_app_version(txlog.connect(url), f"stream-{q.id}") == done[-1]


def test_rows_the_jvm_writer_does_not_take_stream_through_the_python_source(
        spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "lake")
    committed, held = produce(url, seed=3203, txns=4)
    held.abort_transaction()
    q = (spark.readStream.format("txlog").option("path", url).option("topic", "src")
         .option("startingOffsets", "earliest").load()
         .selectExpr("key", "value", "headers")
         .writeStream.format("txlog").option("path", url).option("topic", "out")
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True)
         .start())
    try:
        assert q.awaitTermination(600)
    finally:
        q.stop()
    assert "txlog JVM streaming write" not in plan_of(q)
    assert out_values(url) == sorted(committed)


_PYTHON_SOURCE_RUN = """
import json, sys
import spark_ext
spark = spark_ext.local_session("no-jar", **{"spark.jars": ""})
q = (spark.readStream.format("txlog").option("path", sys.argv[1]).option("topic", "src")
     .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "10").load()
     .selectExpr("key", "value").writeStream.format("txlog").option("path", sys.argv[1])
     .option("topic", "out").option("checkpointLocation", sys.argv[2])
     .trigger(availableNow=True).start())
q.awaitTermination()
print(json.dumps({"jvm": spark_ext.jvm_connector_loaded(spark), "id": str(q.id),
                  "sources": sorted({s["description"] for p in q.recentProgress
                                     for s in p["sources"]})}))
spark.stop()
"""


def test_a_checkpoint_of_the_python_source_continues_in_the_jvm_connector(
        spark: Any, tmp_path: Path) -> None:
    """A query run by the Python data source (a session without the jar) and restarted
    from its checkpoint where the connector serves: it goes on from the Python source's
    offsets, and its writes continue the same app versions, each record once."""
    url = str(tmp_path / "lake")
    committed, held = produce(url, seed=3204, txns=6)
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, "-c", _PYTHON_SOURCE_RUN, url, str(ckpt)],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(done.stdout.strip().splitlines()[-1])
    assert first["jvm"] is False and first["sources"], first
    assert not any(d.startswith("txlog JVM") for d in first["sources"]), first
    assert out_values(url) == sorted(committed)
    version = committed_app_version(txlog.connect(url), f"stream-{first['id']}")
    assert version is not None

    held.commit_transaction()
    q = run(spark, url, ckpt, maxOffsetsPerTrigger="10")
    assert str(q.id) == first["id"]
    assert {p["sources"][0]["description"] for p in q.recentProgress} == \
        {"txlog JVM stream [topic=src]"}
    assert out_values(url) == sorted([*committed, "open0", "open1", "open2"])
    last = committed_app_version(txlog.connect(url), f"stream-{q.id}")
    assert last is not None and last > version


def open_writes(spark: Any) -> int:
    """Writes the driver's planner process holds begun and not yet committed or aborted."""
    return int(spark.sparkContext._jvm.io.txlog.spark.PlannerState.openWrites())


def test_a_stream_leaves_no_write_open_and_names_its_topics_and_root(
        spark: Any, tmp_path: Path) -> None:
    """Only a micro-batch that runs begins a write in the planner (planning the query's
    write checks the rows and begins nothing), and its commit ends it: a query leaves
    no entry behind, whether it ran micro-batches or none. The progress and the plan
    name the sink's topic and root, never as an object's hash."""
    url = str(tmp_path / "lake")
    committed, held = produce(url, seed=3205, txns=6)
    held.abort_transaction()
    before = open_writes(spark)
    q = run(spark, url, tmp_path / "ckpt", maxOffsetsPerTrigger="5")
    assert sum(1 for p in q.recentProgress if p["numInputRows"]) >= 2
    assert out_values(url) == sorted(committed)
    assert open_writes(spark) == before
    assert {p["sink"]["description"] for p in q.recentProgress} == {f"txlog [topic=out] at {url}"}
    plan = plan_of(q)
    assert f"txlog JVM streaming write [topic=out] at {url}]" in plan, plan
    assert f"reading [topic=src] at {url}" in plan, plan
    # Started again with nothing new: no micro-batch runs, and none is left begun.
    again = run(spark, url, tmp_path / "ckpt", maxOffsetsPerTrigger="5")
    assert again.id == q.id
    assert open_writes(spark) == before


def test_checking_a_streaming_write_begins_none(tmp_path: Path) -> None:
    """What the connector asks when Spark plans a micro-batch's write: the answer the JVM
    writer needs (or why the Python source writes instead), and no write begun."""
    from spark_ext.jvm_plan import answer

    url = str(tmp_path / "lake")
    txlog.connect(url).create_topic("out", partitions=2)
    schema = json.dumps({"type": "struct", "fields": [
        {"name": n, "type": "binary", "nullable": True, "metadata": {}} for n in ("key", "value")]})
    req = {"options": {"path": url, "topic": "out", "checkpointLocation": "/x"},
           "schema": schema}
    open_before = answer({"op": "writes_open"})["writes"]
    checked = answer({"op": "stream_write_check", **req})
    assert checked["spec"]["txlog.topic"] == "out", checked
    assert answer({"op": "writes_open"})["writes"] == open_before
    begun = answer({"op": "stream_write_begin", **req})
    assert answer({"op": "writes_open"})["writes"] == open_before + 1
    assert answer({"op": "write_abort", "staging": begun["spec"]["txlog.staging"]})["swept"] == 0
    assert answer({"op": "writes_open"})["writes"] == open_before
