"""format("txlog") meets a transaction that is decided (its PrepareCommit written) but whose
producer was killed before any marker: the planner rolls it forward, so the JVM scan, the
Python source and a JVM stream return what txlog's read_committed consumer returns, with an
aborted transaction invisible and an open one holding its partition back at the LSO."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog.records import TopicPartition

pytestmark = [pytest.mark.spark, pytest.mark.slow]

Row = tuple[int, int, bytes, bytes]

TOPIC = "t"

# A producer that commits one transaction to partitions 0 and 1; TXLOG_CRASH_AT kills it
# once the commit is decided, before its markers. argv: root, transactional.id, mode:
# "data" (its batches appended as DATA entries before the decision), "begin" (its batches
# travel with the markers: the partitions hold only its BEGIN entries) or "folded" (the
# defaults: PrepareCommit carries its small batches and registers the partitions itself,
# so no partition shows the transaction until its producer restarts or a sweep runs).
CHILD = """
import sys
import txlog
root, txn_id, mode = sys.argv[1:4]
config = {"data": {"commit.appends.batches": False}, "begin": {"commit.inline.bytes": 0},
          "folded": {}}[mode]
p = txlog.connect(root).producer(transactional_id=txn_id, transaction_timeout_ms=600_000,
                                 **config)
p.init_transactions()
p.begin_transaction()
for part in (0, 1):
    for j in range(3):
        p.send("t", f"{txn_id}-p{part}-{j}".encode(), key=txn_id.encode(), partition=part)
p.commit_transaction()
print("not killed", flush=True)
"""


def decided_then_killed(root: str, txn_id: str, mode: str) -> None:
    env = {**os.environ, "TXLOG_CRASH_AT": "after_prepare:1"}
    done = subprocess.run([sys.executable, "-c", CHILD, root, txn_id, mode], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, f"{txn_id} was not killed after PrepareCommit: {done}"


def send(p: Any, txn_id: str, parts: tuple[int, ...]) -> None:
    for part in parts:
        for j in range(3):
            p.send(TOPIC, f"{txn_id}-p{part}-{j}".encode(), key=txn_id.encode(),
                   partition=part)


def build(root: str) -> Any:
    """Topic "t", three partitions, in this order: "c1" committed to every partition,
    "ab" aborted on every partition, "d-data", "d-begin" and "d-folded" decided on
    partitions 0 and 1 by producers killed before their markers, "open" begun on
    partition 2 and never ended, then "c2" committed on every partition (held back on
    partition 2 by the open transaction). Returns the open transaction's producer."""
    log = txlog.connect(root)
    log.create_topic(TOPIC, partitions=3)
    for txn_id, commit in (("c1", True), ("ab", False)):
        p = log.producer(transactional_id=txn_id)
        p.init_transactions()
        p.begin_transaction()
        send(p, txn_id, (0, 1, 2))
        p.flush()
        p.commit_transaction() if commit else p.abort_transaction()
        p.close()
    decided_then_killed(root, "d-data", "data")
    decided_then_killed(root, "d-begin", "begin")
    decided_then_killed(root, "d-folded", "folded")
    opened = log.producer(transactional_id="open", transaction_timeout_ms=900_000)
    opened.init_transactions()
    opened.begin_transaction()
    send(opened, "open", (2,))
    opened.flush()
    p = log.producer(transactional_id="c2")
    p.init_transactions()
    p.begin_transaction()
    send(p, "c2", (0, 1, 2))
    p.commit_transaction()
    p.close()
    return opened


def consumed(root: str) -> list[Row]:
    c = txlog.connect(root).consumer(auto_offset_reset="earliest",
                                     isolation_level="read_committed")
    c.subscribe([TOPIC])
    out: list[Row] = []
    while batch := c.poll(max_records=1000):
        out.extend((r.partition, r.offset, r.key, r.value) for r in batch)
    return sorted(out)


def spark_rows(df: Any) -> list[Row]:
    return sorted((r["partition"], r["offset"], bytes(r["key"]), bytes(r["value"]))
                  for r in df.select("partition", "offset", "key", "value").collect())


def executed(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


@pytest.fixture(scope="module")
def lakes(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One log, copied before anything reads it once per reader: a reader that meets the
    decided transactions rolls them forward (writes their markers), and each reader must
    be the one that does."""
    base = tmp_path_factory.mktemp("roll-forward")
    root = str(base / "lake")
    opened = build(root)
    log = txlog.connect(root)
    for part in (0, 1):
        st = log.partition_log(TopicPartition(TOPIC, part)).refresh()
        assert st.open_txns, f"partition {part}: the decided transactions should be unmarked"
    copies = {}
    for name in ("consumer", "jvm", "python", "stream"):
        copies[name] = str(base / name)
        shutil.copytree(root, copies[name], symlinks=True)
    yield copies
    opened.close()


def test_the_consumer_rolls_the_decided_transactions_forward(lakes: dict[str, str]) -> None:
    got = consumed(lakes["consumer"])
    values = {v.decode() for _, _, _, v in got}
    by_txn = {t: {v for v in values if v.startswith(t + "-p")}
              for t in ("c1", "ab", "d-data", "d-begin", "d-folded", "open", "c2")}
    assert by_txn["c1"] == {f"c1-p{p}-{j}" for p in (0, 1, 2) for j in range(3)}
    assert by_txn["d-data"] == {f"d-data-p{p}-{j}" for p in (0, 1) for j in range(3)}
    assert by_txn["d-begin"] == {f"d-begin-p{p}-{j}" for p in (0, 1) for j in range(3)}
    # Decided, but no reader meets it before its producer restarts or a sweep: invisible
    # everywhere (never torn), holding nothing back.
    assert by_txn["d-folded"] == set()
    assert by_txn["ab"] == set() and by_txn["open"] == set()
    # The open transaction holds partition 2 back: c2 is committed there but after it.
    assert by_txn["c2"] == {f"c2-p{p}-{j}" for p in (0, 1) for j in range(3)}
    assert len(got) == len(values) == 9 + 6 + 6 + 6
    lake = txlog.connect(lakes["consumer"])
    tp2 = TopicPartition(TOPIC, 2)
    assert lake.consumer().last_stable_offset(tp2) < \
        lake.partition_log(tp2).refresh().high_watermark


def test_format_txlog_jvm_scan_rolls_them_forward(spark: Any, lakes: dict[str, str]) -> None:
    want = consumed(lakes["consumer"])
    df = spark.read.format("txlog").option("path", lakes["jvm"]).option("topic", TOPIC).load()
    assert "txlog JVM scan" in executed(df)
    assert spark_rows(df) == want


def test_the_python_source_rolls_them_forward(spark: Any, lakes: dict[str, str]) -> None:
    want = consumed(lakes["consumer"])
    df = (spark.read.format("txlog_python").option("path", lakes["python"])
          .option("topic", TOPIC).load())
    assert "txlog JVM scan" not in executed(df)
    assert spark_rows(df) == want


def test_a_jvm_stream_rolls_them_forward(spark: Any, lakes: dict[str, str],
                                         tmp_path: Path) -> None:
    want = consumed(lakes["consumer"])
    q = (spark.readStream.format("txlog").option("path", lakes["stream"])
         .option("topic", TOPIC).option("startingOffsets", "earliest").load()
         .select("partition", "offset", "key", "value")
         .writeStream.format("memory").queryName("roll_forward_stream")
         .option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(600), "the AvailableNow query did not end"
        assert q.exception() is None
        sources = {p["sources"][0]["description"] for p in q.recentProgress}
    finally:
        q.stop()
    assert sources == {f"txlog JVM stream [topic={TOPIC}]"}
    assert spark_rows(spark.table("roll_forward_stream")) == want
