"""A standalone Spark cluster on 127.0.0.1 (one master, two one-core workers, from
pyspark's own ``spark-class``) running a ``spark-submit`` job that reads a txlog topic
and writes another with ``format("txlog")``, exactly once, in executor JVMs and Python
workers of their own, then reads it back with the JVM scan."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import spark_procs

import txlog

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[spark_procs.Cluster]:
    with spark_procs.standalone(tmp_path) as c:
        yield c


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

    got = spark_procs.submit(
        ["--master", cluster.url, "--conf", "spark.executor.memory=512m",
         "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2",
         # The first job waits for both executors, so both are there to be counted.
         "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
         "--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=300s",
         "--conf", "spark.sql.shuffle.partitions=2",
         str(spark_procs.JOB), "copy", url, "in", "out", "cluster-copy"], tmp_path)

    assert got["master"] == cluster.url
    assert got["executors"] == 2
    assert got["python_pids"] and got["driver_pid"] not in got["python_pids"]
    c = txlog.connect(url).consumer(auto_offset_reset="earliest")
    c.subscribe(["out"])
    records = c.poll(max_records=1000)
    out = [(r.partition, bytes(r.key), bytes(r.value)) for r in records]
    # The executors read it back with the JVM scan (its jar shipped by the driver).
    assert "txlog planned scan" in got["jvm_plan"], got["jvm_plan"]
    assert [tuple(r) for r in got["jvm_rows"]] == sorted(
        (r.partition, r.offset, bytes(r.key).decode(), bytes(r.value).decode())
        for r in records)
    # Every committed record once (the job's second, retried write committed nothing),
    # no aborted one, each in its partition and in its partition's order.
    assert sorted(out) == sorted(sent)
    for part in range(3):
        assert [v for q, _, v in out if q == part] == [v for q, _, v in sent if q == part]
