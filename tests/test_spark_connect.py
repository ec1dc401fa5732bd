"""A Spark Connect server (its jar ships with pyspark) on 127.0.0.1 and a remote client,
the shape of Databricks serverless and shared clusters: the client has no JVM, so
``format("txlog")`` is the Python data source, registered from the client and run in
the server's Python workers."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import spark_procs

import spark_ext
import txlog

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[Any]:
    """A Connect client session of a server started for the test."""
    pytest.importorskip("grpc")  # pyspark[connect]'s client dependencies (dev extras)
    from pyspark.sql import SparkSession

    with spark_procs.connect_server(tmp_path) as url:
        session = SparkSession.builder.remote(url).getOrCreate()
        try:
            yield session
        finally:
            session.stop()


def test_remote_client_reads_and_writes_format_txlog(remote: Any, tmp_path: Path) -> None:
    seed = 11
    print(f"seed={seed}")
    rng = random.Random(seed)
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    log.create_topic("in", partitions=2)
    log.create_topic("out", partitions=2)
    p = log.producer(transactional_id="connect-tx")
    p.init_transactions()
    for i in range(6):
        p.begin_transaction()
        for j in range(rng.randint(1, 5)):
            p.send("in", f"v{i}-{j}".encode(), key=b"k", partition=rng.randrange(2),
                   headers=[("h", str(i).encode())])
        p.flush()
        p.abort_transaction() if i % 3 == 1 else p.commit_transaction()
    c = log.consumer(auto_offset_reset="earliest")
    c.subscribe(["in"])
    expected = sorted((r.partition, r.offset, bytes(r.value), r.headers[0][1])
                      for r in c.poll(max_records=1000))

    # No JVM on the client: the JVM paths say so, and format("txlog") serves.
    assert not hasattr(remote, "_jsparkSession")
    spark_ext.register(remote)
    df = (remote.read.format("txlog").option("path", url).option("topic", "in")
          .option("storage_options", json.dumps({})).load())
    got = sorted((r.partition, r.offset, bytes(r.value), bytes(r.headers[0]["value"]))
                 for r in df.collect())
    assert got == expected

    df.select("key", "value", "partition").write.format("txlog").mode("append").option(
        "path", url).option("topic", "out").option("txnAppId", "connect-copy").option(
        "txnVersion", "0").save()
    c = log.consumer(auto_offset_reset="earliest")
    c.subscribe(["out"])
    assert sorted((r.partition, bytes(r.value)) for r in c.poll(max_records=1000)) == sorted(
        (part, value) for part, _, value, _ in expected)
