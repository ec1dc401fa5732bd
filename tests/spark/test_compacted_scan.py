"""format("txlog") over a topic that ``txlog maintain`` compacted (segments holding runs
of several batches, aborted batches dropped): the same rows as before compaction and as
the consumer, through the JVM connector and the Python data source; and the JVM scan's
Spark input metrics (bytes and records read), which also show that each segment is read
once by each task that reads runs of it."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import txlog
from spark_ext import plan_file
from txlog.maintenance import maintain
from txlog.partition_state import VISIBLE

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]
TOPIC = "k"


def write(url: str, rng: random.Random, txns: int, *, headers: bool = True) -> None:
    """``txns`` transactions of 1-6 records over two partitions, every third aborted;
    with ``headers``, every other record has one."""
    log = txlog.connect(url)
    if TOPIC not in log.list_topics():
        log.create_topic(TOPIC, partitions=2)
    p = log.producer(transactional_id="k-tx")
    p.init_transactions()
    for i in range(txns):
        p.begin_transaction()
        for j in range(rng.randint(1, 6)):
            hs = [("h", f"{i}".encode())] if headers and j % 2 else None
            p.send(TOPIC, f"v{i}-{j}".encode(), key=f"k{j}".encode(),
                   partition=rng.randrange(2), headers=hs, timestamp_ms=1_000 + i)
        p.flush()
        p.abort_transaction() if i % 3 == 1 else p.commit_transaction()
    p.close()


def compact(url: str) -> int:
    """``txlog maintain`` until nothing more compacts; returns the segments written."""
    log = txlog.connect(url)
    segments = 0
    while True:
        report = maintain(log, [TOPIC])
        assert report.failures == []
        segments += sum(p.segments_written for p in report.partitions)
        if not sum(p.compacted_batches for p in report.partitions):
            return segments


def consume(url: str) -> list[Row]:
    c = txlog.connect(url).consumer(auto_offset_reset="earliest")
    c.subscribe([TOPIC])
    out = sorted(row(r.partition, r.offset, r.key, r.value, r.headers, r.timestamp)
                 for r in c.poll(max_records=100_000))
    c.close()
    return out


def row(partition: int, offset: int, key: Any, value: Any, headers: Any, ts: int) -> Row:
    hs = tuple((k, None if v is None else bytes(v)) for k, v in (headers or []))
    return (partition, offset, bytes(key), bytes(value), hs, ts)


def spark_rows(df: Any) -> list[Row]:
    return sorted(row(r.partition, r.offset, r.key, r.value,
                      [(h["key"], h["value"]) for h in r.headers or []],
                      round(r.timestamp.timestamp() * 1000))
                  for r in df.select("partition", "offset", "key", "value", "headers",
                                     "timestamp").collect())


def load(spark: Any, fmt: str, url: str, **options: str) -> Any:
    return spark.read.format(fmt).option("path", url).option("topic", TOPIC).options(
        **options).load()


def executed(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


@pytest.fixture
def lake(tmp_path: Path) -> tuple[str, list[Row]]:
    """A topic written, compacted, then written to again (segments, then batch
    objects); returns its URL and its records as the consumer read them before
    compaction (and after the last writes)."""
    seed = 3207
    print(f"seed={seed}")
    rng = random.Random(seed)
    url = str(tmp_path / "lake")
    write(url, rng, 24)
    before = consume(url)
    assert compact(url) == 2
    assert consume(url) == before
    write(url, rng, 6)
    return url, consume(url)


def test_a_segments_runs_are_estimated_at_their_share_of_it(
        lake: tuple[str, list[Row]]) -> None:
    """Input partitions are cut by estimated bytes: each run of a segment counts its share
    of the segment, not the whole of it (which made a segment of many runs as many input
    partitions, each decoding the segment up to its runs)."""
    from spark_ext.options import parse_read_options
    from spark_ext.read_plan import plan_batch

    url, want = lake
    ro = parse_read_options({"path": url, "topic": TOPIC}, streaming=False)
    s = plan_batch(ro).arrays
    keys = s.key.to_pylist()
    assert sum(s.take) == len(want)
    for key in set(keys):
        est = sum(int(n) for k, n in zip(keys, s.nbytes, strict=True) if k == key)
        size = int(s.object_bytes[keys.index(key)])
        runs = keys.count(key)
        assert size - runs <= est <= size, (key, est, size, runs)


@pytest.mark.parametrize("fmt", ["txlog", "txlog_python"])
def test_a_compacted_topic_reads_as_before_compaction(
        spark: Any, lake: tuple[str, list[Row]], fmt: str) -> None:
    url, want = lake
    assert spark_rows(load(spark, fmt, url)) == want
    assert load(spark, fmt, url).count() == len(want)
    # Ranges that start and end inside segments' runs.
    for start in (1, 4, 9):
        offsets = json.dumps({TOPIC: {"0": start, "1": start}})
        got = spark_rows(load(spark, fmt, url, startingOffsets=offsets))
        assert got == [r for r in want if r[1] >= start], start
    if fmt == "txlog":
        # The JVM scan reads the segments and the batch objects written after them, not
        # the batch objects the segments replaced.
        log = txlog.connect(url)
        objects = set()
        for tp in log.partitions_for(TOPIC):
            b = log.partition_log(tp).refresh().batches
            objects |= {d for d, s, n in zip(b.data, b.status, b.count, strict=True)
                        if s in VISIBLE and n}
        assert sum("/seg-" in d for d in objects) == 2
        plan = executed(load(spark, fmt, url))
        assert f"{len(objects)} of {len(objects)} batch objects" in plan, plan


def stage_metrics(spark: Any, after: int) -> tuple[int, int]:
    """The input bytes and records of the stages after stage ``after``, as Spark's UI
    and REST API report them."""
    sc = spark.sparkContext._jsc.sc()
    sc.listenerBus().waitUntilEmpty(120_000)  # every task's end is in the store
    store = sc.statusStore()
    stages = store.stageList(None, False, False, getattr(store, "stageList$default$4")(),
                             getattr(store, "stageList$default$5")()).iterator()
    nbytes = records = 0
    while stages.hasNext():
        s = stages.next()
        if s.stageId() > after:
            nbytes += s.inputBytes()
            records += s.inputRecords()
    return nbytes, records


def last_stage(spark: Any) -> int:
    sc = spark.sparkContext._jsc.sc()
    sc.listenerBus().waitUntilEmpty(120_000)
    store = sc.statusStore()
    stages = store.stageList(None, False, False, getattr(store, "stageList$default$4")(),
                             getattr(store, "stageList$default$5")()).iterator()
    most = -1
    while stages.hasNext():
        most = max(most, stages.next().stageId())
    return most


def bytes_per_task(url: str, options: dict[str, str]) -> int:
    """What the planner's input partitions read if each opens each object once: the
    sizes of the distinct objects of each, summed."""
    from spark_ext.jvm_plan import answer

    got = answer({"op": "scan", "planFormat": plan_file.PLAN_VERSION,
                  "options": {"path": url, "topic": TOPIC, **options}})
    assert "error" not in got, got
    header, slices = plan_file.read(got["planFile"])
    os.unlink(got["planFile"])
    sizes = slices.column("object_bytes").to_pylist()
    names = [f"{d}/{n}" for d, n in zip(slices.column("dir").to_pylist(),
                                        slices.column("name").to_pylist(), strict=True)]
    total, at = 0, 0
    for size in header["groups"]:
        total += sum(dict(zip(names[at:at + size], sizes[at:at + size], strict=True)).values())
        at += size
    assert at == len(names)
    return total


@pytest.mark.parametrize("partitions", ["1", "3"])
def test_the_jvm_scan_reports_the_bytes_and_records_it_read(
        spark: Any, lake: tuple[str, list[Row]], partitions: str) -> None:
    """Bytes read are each task's objects once each (a segment whose runs a task reads
    one after another is read once by it); records read are the rows returned."""
    url, want = lake
    options = {"minPartitions": partitions}
    expected_bytes = bytes_per_task(url, options)
    after = last_stage(spark)
    df = load(spark, "txlog", url, **options)
    got = spark_rows(df)
    assert got == want
    nbytes, records = stage_metrics(spark, after)
    assert records == len(want)
    assert nbytes > 0
    assert nbytes == expected_bytes


@pytest.fixture
def grouped_lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[Row]]:
    """As ``lake``, with segments written in row groups of a few records each."""
    from txlog import batch_codec

    seed = 3208
    print(f"seed={seed}")
    rng = random.Random(seed)
    url = str(tmp_path / "lake")
    write(url, rng, 24)
    before = consume(url)
    with monkeypatch.context() as m:
        m.setattr(batch_codec, "ROW_GROUP_BYTES", 200)
        assert compact(url) == 2
    assert consume(url) == before
    segments = [f for f in (tmp_path / "lake").rglob("seg-*.parquet")]
    assert len(segments) == 2
    assert all(pq.ParquetFile(f).metadata.num_row_groups >= 4 for f in segments)
    write(url, rng, 6)
    return url, consume(url)


def test_segments_of_many_row_groups_read_alike_through_both_paths(
        spark: Any, grouped_lake: tuple[str, list[Row]]) -> None:
    """The Python data source decodes a segment's row groups one at a time, only those
    its runs need: its rows are the JVM scan's, for whole reads, ranges that start and
    end inside runs and row groups, and runs split over several input partitions."""
    url, want = grouped_lake
    assert "txlog JVM scan" in executed(load(spark, "txlog", url))
    assert "txlog JVM scan" not in executed(load(spark, "txlog_python", url))
    cases: list[dict[str, str]] = [{}, {"minPartitions": "3"}, {"minPartitions": "7"}]
    for start, end in ((2, 11), (5, 30), (13, 14)):
        cases.append({"startingOffsets": json.dumps({TOPIC: {"0": start, "1": start}}),
                      "endingOffsets": json.dumps({TOPIC: {"0": end, "1": end}}),
                      "minPartitions": "3"})
    for options in cases:
        jvm = spark_rows(load(spark, "txlog", url, **options))
        python = spark_rows(load(spark, "txlog_python", url, **options))
        assert python == jvm, options
        if "startingOffsets" not in options:
            assert python == want
        assert load(spark, "txlog_python", url, **options).count() == len(jvm)


def test_a_segments_runs_are_read_by_txlogs_decoder(spark: Any, tmp_path: Path) -> None:
    """A compacted topic without headers: its segments' consecutive runs are decoded by
    txlog's own decoder (none by Spark's Parquet reader), with the consumer's rows, also
    for ranges that start inside runs."""
    from test_direct_decode import decoded_by

    seed = 3208
    print(f"seed={seed}")
    url = str(tmp_path / "plain")
    write(url, random.Random(seed), 30, headers=False)
    want = consume(url)
    assert compact(url) == 2
    assert consume(url) == want
    for start in (0, 3, 7):
        offsets = json.dumps({TOPIC: {"0": start, "1": start}})
        df = load(spark, "txlog", url, startingOffsets=offsets).select(
            "partition", "offset", "key", "value", "headers", "timestamp")
        df.collect()  # the metrics of this query's own scan
        direct, parquet = decoded_by(df)
        assert parquet == 0 and direct >= 2, (start, direct, parquet)
        assert spark_rows(df) == [r for r in want if r[1] >= start], start
