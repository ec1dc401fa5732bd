"""A Spark Connect server (its jar ships with pyspark) on 127.0.0.1 and a remote client,
the shape of Databricks serverless and shared clusters: the client has no JVM, so
``format("txlog")`` is the Python data source, registered from the client and run in
the server's Python workers."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import spark_procs

import txlog

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_remote_client_reads_and_writes_format_txlog(tmp_path: Path) -> None:
    pytest.importorskip("grpc")  # pyspark[connect]'s client dependencies (dev extras)
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
    records = c.poll(max_records=1000)
    assert all(r.headers[0][1] is not None for r in records)
    expected = sorted((r.partition, r.offset, bytes(r.value).decode(),
                       bytes(r.headers[0][1] or b"").decode()) for r in records)

    with spark_procs.connect_server(tmp_path) as remote:
        # The client in a process of its own: a Connect session switches pyspark to
        # Connect mode for the whole process.
        got = spark_procs.run([sys.executable, str(spark_procs.JOB), "connect", remote, url,
                               "in", "out", "connect-copy"], tmp_path, name="client")

    assert got["jvm_free"]
    assert [tuple(r) for r in got["rows"]] == expected
    assert "no JVM on the client side" in got["jvm_error"], got["jvm_error"]
    assert [tuple(r) for r in got["auto_rows"]] == expected
    c = log.consumer(auto_offset_reset="earliest")
    c.subscribe(["out"])
    assert sorted((r.partition, bytes(r.value).decode()) for r in c.poll(max_records=1000)) \
        == sorted((part, value) for part, _, value, _ in expected)
