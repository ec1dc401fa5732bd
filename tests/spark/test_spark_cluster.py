"""A standalone Spark cluster on 127.0.0.1 (one master, two one-core workers, from
pyspark's own ``spark-class``) running what the README tells a cluster's users to run:
``spark-submit --jars "$(python -m spark_ext.jvm_scan)" job.py``, a job that reads a
txlog topic and writes another with ``format("txlog")``, exactly once, in executor JVMs
and Python workers of their own; both through txlog's JVM connector."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import spark_procs

import txlog
from txlog.records import TopicPartition

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[spark_procs.Cluster]:
    with spark_procs.standalone(tmp_path) as c:
        yield c


def connector_jar() -> str:
    """The path the README's ``python -m spark_ext.jvm_scan`` prints."""
    done = subprocess.run([sys.executable, "-m", "spark_ext.jvm_scan"], capture_output=True,
                          text=True, cwd=spark_procs.REPO, timeout=600, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_spark_submit_copies_a_topic_exactly_once_on_a_standalone_cluster(
        cluster: spark_procs.Cluster, tmp_path: Path) -> None:
    seed = 6
    print(f"seed={seed}")
    rng = random.Random(seed)
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    log.create_topic("in", partitions=3)
    log.create_topic("out", partitions=3)
    p = log.producer(transactional_id="cluster-tx")
    p.init_transactions()
    sent: list[tuple[int, bytes, bytes]] = []
    for i in range(8):
        p.begin_transaction()
        batch = [(rng.randrange(3), f"k{rng.randrange(4)}".encode(), f"v{i}-{j}".encode())
                 for j in range(rng.randint(1, 8))]
        for part, key, value in batch:
            p.send("in", value, key=key, partition=part)
        p.flush()
        if i % 4 == 1:
            p.abort_transaction()
        else:
            p.commit_transaction()
            sent += batch

    events = tmp_path / "events"
    events.mkdir()
    got = spark_procs.submit(
        ["--master", cluster.url, "--jars", connector_jar(),
         "--conf", "spark.executor.memory=512m",
         "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2",
         # The first job waits for both executors, so both are there to be counted.
         "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
         "--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=300s",
         "--conf", "spark.sql.shuffle.partitions=2",
         # Which plan each query ran and where its tasks ran.
         "--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir={events}",
         "--conf", "spark.eventLog.compress=false",
         "--conf", "spark.eventLog.rolling.enabled=false",
         str(spark_procs.JOB), "copy", url, "in", "out", "cluster-copy"], tmp_path)

    assert got["master"] == cluster.url
    assert got["executors"] == 2
    assert got["python_pids"] and got["driver_pid"] not in got["python_pids"]
    c = txlog.connect(url).consumer(auto_offset_reset="earliest")
    c.subscribe(["out"])
    records = c.poll(max_records=1000)
    out = [(r.partition, bytes(r.key), bytes(r.value)) for r in records]
    # Every committed record once (the job's second, retried write committed nothing),
    # no aborted one, each in its partition and in its partition's order.
    assert sorted(out) == sorted(sent)
    for part in range(3):
        assert [v for q, _, v in out if q == part] == [v for q, _, v in sent if q == part]
    assert [tuple(r) for r in got["back_rows"]] == sorted(
        (r.partition, r.offset, bytes(r.key).decode(), bytes(r.value).decode())
        for r in records)

    # format("txlog") was the JVM connector: its scan in the plans of the reads ...
    assert "txlog JVM scan" in got["read_plan"], got["read_plan"]
    assert "txlog JVM scan" in got["back_plan"], got["back_plan"]
    # ... and of both writes, which the JVM writer took, its tasks in the executors.
    writes = [e for e in spark_procs.event_log(events)
              if any("txlog write [topic=out]" in plan for plan in e.plans)]
    assert len(writes) == 2, [e.plans for e in spark_procs.event_log(events)]
    for e in writes:
        assert all("txlog JVM scan" in plan for plan in e.plans), e.plans
        assert e.executors and e.executors <= {"0", "1"}, e.executors
    driver = (tmp_path / "job.log").read_text(errors="replace")
    assert 'format("txlog") read through the JVM connector' in driver
    assert driver.count('format("txlog") write through the JVM connector') == 2, driver[-3000:]
    assert "through txlog's Python data source" not in driver
    # The JVM writer staged every object of "out" (its names have five fields, the
    # Python data source's six).
    for part in range(3):
        b = txlog.connect(url).partition_log(TopicPartition("out", part)).refresh().batches
        for i in range(len(b)):
            name = re.sub(r"\.crc32-[0-9a-f]{8}$", "",
                          b.data[i].rsplit("/", 1)[-1].removesuffix(".parquet"))
            assert len(name.split("-")) == 5, name
