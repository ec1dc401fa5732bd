"""A Spark Connect server on 127.0.0.1 and a remote client, the shape of Databricks
serverless and shared clusters: the client has no JVM, so what ``format("txlog")`` is
depends on the server. Without txlog's jar it is the Python data source the client
registers (``spark_ext.register``), run in the server's Python workers; with the jar
(``--jars``, a cluster with the library installed) it is txlog's JVM connector, which
registering from the client does not shadow."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import spark_procs

import txlog

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _topic(url: str) -> list[tuple[int, int, str, str]]:
    """Topic ``in`` with an aborted transaction among committed ones, and an empty
    ``out``; returns what txlog's read_committed consumer reads of ``in``."""
    seed = 11
    print(f"seed={seed}")
    rng = random.Random(seed)
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
    return sorted((r.partition, r.offset, bytes(r.value).decode(),
                   bytes(r.headers[0][1] or b"").decode()) for r in records)


def _client(remote: str, url: str, tmp_path: Path) -> dict[str, Any]:
    # The client in a process of its own: a Connect session switches pyspark to
    # Connect mode for the whole process.
    return spark_procs.run([sys.executable, str(spark_procs.JOB), "connect", remote, url,
                            "in", "out", "connect-copy"], tmp_path, name="client")


def _check(got: dict[str, Any], url: str, expected: list[tuple[int, int, str, str]]) -> None:
    assert got["jvm_free"]
    assert [tuple(r) for r in got["rows"]] == expected
    assert "no JVM on the client side" in got["jvm_error"], got["jvm_error"]
    assert [tuple(r) for r in got["auto_rows"]] == expected
    c = txlog.connect(url).consumer(auto_offset_reset="earliest")
    c.subscribe(["out"])
    assert sorted((r.partition, bytes(r.value).decode()) for r in c.poll(max_records=1000)) \
        == sorted((part, value) for part, _, value, _ in expected)


def test_remote_client_reads_and_writes_format_txlog(tmp_path: Path) -> None:
    pytest.importorskip("grpc")  # pyspark[connect]'s client dependencies (dev extras)
    url = str(tmp_path / "lake")
    expected = _topic(url)
    with spark_procs.connect_server(tmp_path) as remote:
        got = _client(remote, url, tmp_path)
    _check(got, url, expected)
    # The server has no JVM txlog: the client's registration made format("txlog").
    assert "DATA_SOURCE_NOT_FOUND" in got["plan_before"], got["plan_before"]
    assert "(Python)" in got["plan_after"] and "txlog JVM scan" not in got["plan_after"], \
        got["plan_after"]


def test_remote_client_of_a_server_with_the_jar_takes_the_jvm_connector(
        tmp_path: Path) -> None:
    pytest.importorskip("grpc")
    url = str(tmp_path / "lake")
    expected = _topic(url)
    jar = subprocess.run([sys.executable, "-m", "spark_ext.jvm_scan"], capture_output=True,
                         text=True, cwd=spark_procs.REPO, timeout=600,
                         check=True).stdout.strip().splitlines()[-1]
    with spark_procs.connect_server(tmp_path, jars=[Path(jar)]) as remote:
        got = _client(remote, url, tmp_path)
    _check(got, url, expected)
    # The server's plans, as the client sees them: its JVM connector, before the client
    # registered txlog's Python source and after (registering does not shadow it).
    assert "txlog JVM scan" in got["plan_before"], got["plan_before"]
    assert "txlog JVM scan" in got["plan_after"], got["plan_after"]
    server = (tmp_path / "connect.log").read_text(errors="replace")
    assert 'format("txlog") read through the JVM connector' in server
    assert 'format("txlog") write through the JVM connector' in server, server[-3000:]
    assert "through txlog's Python data source" not in server
