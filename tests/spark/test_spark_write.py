"""The Spark writer on a real local Spark session.

In-process tests share the run's ``spark`` fixture.  Crash and retry tests need their own
driver (a process to SIGKILL, or ``local[2,4]`` so that a task may fail and be retried):
they run this file as a child script (``python tests/spark/test_spark_write.py <scenario> ...``)
and steer it with the writer's test hooks (TXLOG_TEST_PAUSE_* stops a commit at a chosen
point until the child is killed; TXLOG_TEST_FAIL_STAGED fails tasks after staging).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import spark_procs

import txlog
from txlog.app_versions import committed_app_version
from txlog.partitioner import partition_for_key

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


# -- helpers ---------------------------------------------------------------------------------


def read_all(lg: txlog.Log, topic: str) -> list[txlog.Record]:
    c = lg.consumer(isolation_level="read_committed")
    c.assign(lg.partitions_for(topic))
    c.seek_to_beginning()
    out: list[txlog.Record] = []
    while True:
        got = c.poll(max_records=100_000)
        if not got:
            return out
        out.extend(got)


def staged_objects(root: str, topic: str) -> list[str]:
    base = Path(root) / "topics" / topic / "_staging"
    if not base.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in base.rglob("*") if p.is_file())


def referenced(lg: txlog.Log, topic: str) -> set[str]:
    out: set[str] = set()
    for tp in lg.partitions_for(topic):
        out.update(lg.partition_log(tp).refresh().batches.data)
    return out


def write(df: Any, root: str, topic: str, **options: Any) -> None:
    w = df.write.format("txlog").option("path", root).option("topic", topic)
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()


# -- in-process tests --------------------------------------------------------------------------


def test_job_is_one_transaction_over_every_partition(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("events", partitions=3)
    df = (spark.range(0, 300, numPartitions=3)
          .select(F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
                  F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"),
                  F.array(F.struct(F.lit("h").alias("key"),
                                   F.col("id").cast("string").cast("binary").alias("value")))
                  .alias("headers"),
                  F.timestamp_millis(F.lit(1_700_000_000_000) + F.col("id")).alias("timestamp")))
    write(df, root, "events")

    recs = read_all(lg, "events")
    assert sorted(r.value for r in recs) == sorted(f"v{i}".encode() for i in range(300))
    for r in recs:
        i = int(r.value[1:])
        assert r.key == f"k{i}".encode()
        assert r.partition == partition_for_key(r.key, 3)  # Kafka's murmur2 placement
        assert r.headers == [("h", str(i).encode())]
        assert r.timestamp == 1_700_000_000_000 + i
    # One transaction: every batch of every partition has the same producer id and epoch.
    owners: set[tuple[int, int]] = set()
    for tp in lg.partitions_for("events"):
        b = lg.partition_log(tp).refresh().batches
        owners.update(zip(b.producer_id, b.epoch, strict=True))
        assert len(b) >= 1
    assert len(owners) == 1
    # Committing copied nothing: the log references the staged objects, and nothing else
    # is left in staging.
    assert set(staged_objects(root, "events")) == referenced(lg, "events")


def test_schema_mismatch_fails_before_anything_is_staged(spark: Any, tmp_path: Path) -> None:
    import pyarrow as pa

    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("kafka", partitions=2)
    lg.create_topic("typed", partitions=2,
                    schema=pa.schema([pa.field("id", pa.int64(), nullable=False),
                                      pa.field("name", pa.string())]))
    cases = [
        ("kafka", spark.range(5).selectExpr("id as value"), "column 'value' of type int64"),
        ("kafka", spark.range(5).selectExpr("cast(id as string) as key"), "'value'"),
        ("kafka", spark.range(5).selectExpr("'x' as value", "1 as extra"), "extra"),
        ("typed", spark.range(5).selectExpr("'n' as name"), "missing columns ['id']"),
        ("typed", spark.range(5).selectExpr("id", "'n' as name", "2.5 as score"), "score"),
    ]
    for topic, df, needle in cases:
        with pytest.raises(Exception, match="SchemaMismatchError") as info:
            write(df, root, topic)
        assert needle in str(info.value)
    with pytest.raises(Exception, match="append-only"):
        (spark.range(1).selectExpr("'x' as value").write.format("txlog")
         .option("path", root).option("topic", "kafka").mode("overwrite").save())
    assert staged_objects(root, "kafka") == [] and staged_objects(root, "typed") == []
    assert all(lg.partition_log(tp).refresh().high_watermark == 0
               for t in ("kafka", "typed") for tp in lg.partitions_for(t))


def test_typed_topic_explicit_partitions_and_topic_column(spark: Any, tmp_path: Path) -> None:
    import pyarrow as pa

    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("typed", partitions=4,
                    schema=pa.schema([pa.field("id", pa.int64(), nullable=False),
                                      pa.field("name", pa.string())]))
    df = spark.range(0, 40, numPartitions=2).selectExpr(
        "id", "concat('n', id) as name", "cast(id % 4 as int) as partition")
    write(df, root, "typed")
    recs = read_all(lg, "typed")
    assert sorted(r.value["id"] for r in recs) == list(range(40))
    assert all(r.partition == r.value["id"] % 4 for r in recs)

    # Rows naming their topics (no 'topic' option): one transaction over both topics.
    lg.create_topic("a", partitions=1)
    lg.create_topic("b", partitions=2)
    df = spark.range(0, 10, numPartitions=2).selectExpr(
        "if(id % 2 = 0, 'a', 'b') as topic", "cast(id as string) as value")
    (df.write.format("txlog").option("path", root).mode("append").save())
    assert sorted(int(r.value) for r in read_all(lg, "a")) == [0, 2, 4, 6, 8]
    assert sorted(int(r.value) for r in read_all(lg, "b")) == [1, 3, 5, 7, 9]
    assert set(staged_objects(root, "b")) == referenced(lg, "b")


def test_txn_app_version_reruns_commit_nothing(spark: Any, tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("backfill", partitions=2)

    def chunk(v: int) -> Any:
        return spark.range(v * 100, v * 100 + 50, numPartitions=2).selectExpr(
            "cast(id as string) as key", "cast(id as string) as value")

    for v in (1, 2, 1, 2, 0):  # a re-run from the top, then an older version
        write(chunk(v), root, "backfill", txnAppId="daily", txnVersion=str(v))
    empty = spark.range(0).selectExpr("cast(id as string) as value")
    write(empty, root, "backfill", txnAppId="daily", txnVersion="3")  # commits the version
    write(empty, root, "backfill")  # no rows, no version: no transaction at all
    values = sorted(int(r.value) for r in read_all(lg, "backfill"))
    assert values == list(range(100, 150)) + list(range(200, 250))
    assert committed_app_version(lg, "daily") == 3
    assert set(staged_objects(root, "backfill")) == referenced(lg, "backfill")


def test_exactly_once_helper_reads_committed_and_commits_offsets(spark: Any,
                                                                 tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    import spark_ext.exactly_once as eos

    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("in", partitions=3)
    lg.create_topic("out", partitions=2)
    expected: set[bytes] = set()

    def produce(first: int, txns: int) -> None:
        p = lg.producer(transactional_id="gen")
        p.init_transactions()
        for t in range(first, first + txns):
            p.begin_transaction()
            vals = [f"{t}-{i}".encode() for i in range(10)]
            for v in vals:
                p.send("in", v, key=v)
            p.flush()  # aborted records reach the log: read_committed must skip them
            if t % 3 == 1:
                p.abort_transaction()
            else:
                p.commit_transaction()
                expected.update(vals)

    def transform(df: Any) -> Any:
        return df.select("key", F.concat(F.lit(b"out:"), F.col("value")).alias("value"))

    produce(0, 6)
    res = eos.run(spark, path=root, source_topic="in", sink_topic="out", group_id="g",
                  transform=transform, max_records_per_round=25)
    assert res.committed_rounds == len(res.rounds) >= 2
    assert eos.run(spark, path=root, source_topic="in", sink_topic="out", group_id="g",
                   transform=transform).rounds == []
    produce(6, 3)
    eos.run(spark, path=root, source_topic="in", sink_topic="out", group_id="g",
            transform=transform)
    out = [r.value for r in read_all(lg, "out")]
    assert sorted(out) == sorted(b"out:" + v for v in expected)  # once each, none aborted
    c = lg.consumer(group_id="g")
    lso = c.end_offsets(lg.partitions_for("in"))
    assert c.committed(lg.partitions_for("in")) == lso


# -- driver-side logic without Spark ----------------------------------------------------------


def test_vectorised_partitioner_matches_kafka() -> None:
    import random

    import pyarrow as pa

    from spark_ext.staging import partitions_for_keys

    rng = random.Random(5)
    keys: list[bytes | None] = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 20)))
                                for _ in range(3000)]
    keys += [None, b"", "k\u00e9y".encode()]
    for n in (1, 3, 7, 64):
        got = partitions_for_keys(pa.array(keys, pa.binary()), n).to_pylist()
        want = [partition_for_key(k, n) if k else None for k in keys]
        assert got == want


def test_write_options_are_checked() -> None:
    from spark_ext.write_options import parse_write_options
    from txlog.errors import ConfigError

    ok = parse_write_options({"PATH": "/x", "Topic": "t", "TXNAPPID": "a", "txnversion": "3",
                              "partitioner": "round_robin"}, streaming=False)
    assert (ok.url, ok.topic, ok.app_id, ok.app_version, ok.partitioner) == \
        ("/x", "t", "a", 3, "roundrobin")
    bad = [
        ({"topic": "t"}, "'path' is required"),
        ({"path": "/x", "kafka.bootstrap.servers": "h:9092"}, "not to Kafka brokers"),
        ({"path": "/x", "txnAppId": "a"}, "go together"),
        ({"path": "/x", "txnAppId": "a", "txnVersion": "-1"}, "at least 0"),
        ({"path": "/x", "txnAppId": "a", "txnVersion": "1", "transactional.id": "x"},
         "cannot be combined"),
        ({"path": "/x", "partitioner": "hash"}, "unknown partitioner"),
        ({"path": "/x", "storage_options": "{nope"}, "not valid JSON"),
        ({"path": "/x", "txlog.txnAfterVersion": "0"}, "needs txnAppId"),
        ({"path": "/x", "txnAppId": "a", "txnVersion": "2", "txlog.txnAfterVersion": "2"},
         "must be below"),
        ({"path": "/x", "txnAppId": "a", "txnVersion": "2", "txlog.txnAfterVersion": "-2"},
         "at least -1"),
    ]
    for opts, needle in bad:
        with pytest.raises(ConfigError, match=needle):
            parse_write_options(opts, streaming=False)
    with pytest.raises(ConfigError, match="micro-batch id"):
        parse_write_options({"path": "/x", "txnVersion": "1"}, streaming=True)
    s = parse_write_options({"path": "/x", "checkpointLocation": "/c"}, streaming=True)
    assert s.app_id is None


def test_a_write_after_a_version_the_app_moved_past_commits_nothing(tmp_path: Path) -> None:
    """With txlog.txnAfterVersion (incremental exports), the commit goes ahead only while
    the app's committed version is the one named: a write that read versions 1-2 as new
    commits nothing once another committed version 1, and its staged files are swept."""
    from spark_ext import write_options, writer
    from txlog.app_versions import committed_app_version

    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("t", partitions=2)
    txn = ""

    def write(version: int, after: int, rows: int) -> Any:
        nonlocal txn
        txn = writer.new_staging_id()
        files = _staged(root, "t", txn, rows)
        wo = write_options.parse_write_options(
            {"path": root, "topic": "t", "txnAppId": "exp", "txnVersion": str(version),
             write_options.AFTER_VERSION_OPTION: str(after)}, streaming=False)
        return writer.commit_staged(wo, files, [txn], ["t"], app_id=wo.app_id,
                                    app_version=wo.app_version)

    assert write(0, -1, 4).skipped is None
    assert write(1, 0, 3).skipped is None  # the first of two exports that read after 0
    late = write(2, 0, 5)  # the second: versions 1-2, read before version 1 was committed
    assert late.skipped is not None and "committed version 1" in late.skipped
    assert committed_app_version(lg, "exp") == 1
    c = lg.consumer(isolation_level="read_committed")
    c.assign(lg.partitions_for("t"))
    c.seek_to_beginning()
    assert len(c.poll(max_records=100)) == 7
    assert late.swept >= 1
    assert writer._list_staged(lg, writer._staging_prefixes(lg, ["t"], [txn])) == []


def _staged(root: str, topic: str, txn: str, rows: int, attempt: int = 0) -> list[Any]:
    import pyarrow as pa

    from spark_ext import staging

    lg = txlog.connect(root)
    info = lg.topic(topic)
    spec = staging.StageSpec(url=root, storage_options={}, txn=txn, topic=topic,
                             targets={topic: staging.TopicTarget(topic, info.partitions, True,
                                                                 info.schema)},
                             columns=["key", "value"])
    batch = pa.record_batch({"key": pa.array([f"k{i}" for i in range(rows)]),
                             "value": pa.array([f"v{i}".encode() for i in range(rows)])})
    return staging.stage(spec, [batch], task=0, attempt_id=attempt, attempt=attempt)


def test_abort_after_a_commit_died_settles_and_keeps_listed_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark calls abort() when commit() fails.  If the commit had appended batches, the
    files the messages list stay (they are referenced by the log), unlisted ones go, and a
    job-owned transaction left open is settled at once instead of holding the LSO."""
    from spark_ext import write_options, writer

    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("t", partitions=2)
    txn = writer.new_staging_id()
    files = _staged(root, "t", txn, 20)
    stray = _staged(root, "t", txn, 5, attempt=1)  # another attempt's files: in no message
    wo = write_options.parse_write_options({"path": root, "topic": "t"}, streaming=False)

    class Died(BaseException):
        pass

    def die(point: str) -> None:
        if point == "before-commit":
            raise Died  # as if the worker died: no abort_transaction either

    monkeypatch.setattr(writer, "_pause_point", die)
    monkeypatch.setattr("txlog.producer.Producer.abort_transaction", lambda self: None)
    with pytest.raises(Died):
        writer.commit_staged(wo, files, [txn], ["t"])
    states = [lg.partition_log(tp).refresh() for tp in lg.partitions_for("t")]
    assert any(st.open_txns for st in states)  # the transaction is open, holding the LSO
    monkeypatch.undo()

    msg = writer.TxlogCommitMessage(txn, files)
    writer.abort_staged(wo, [msg, None], [txn], ["t"])
    states = [lg.partition_log(tp).refresh() for tp in lg.partitions_for("t")]
    assert not any(st.open_txns for st in states)
    assert all(st.last_stable_offset == st.high_watermark for st in states)
    assert read_all(lg, "t") == []
    left = set(staged_objects(root, "t"))
    assert {f.key for f in files} <= left
    assert not {f.key for f in stray} & left


# -- child-process scenarios -------------------------------------------------------------------


class Child(spark_procs.Child):
    """This file run as a script in its own session, optionally paused at a commit point."""

    script = HERE


CHUNKS = 3
CHUNK_ROWS = 60


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_backfill_driver_killed_during_commit_then_rerun(tmp_path: Path) -> None:
    """A backfill in txnAppId/txnVersion chunks, SIGKILLed inside the commit of chunk 2
    (its transaction open, its batches appended), then re-run from the top, twice: every
    chunk lands exactly once.  (A kill right after a commit is the streaming test's case.)
    The re-run also checks task retries (every first attempt fails after staging) and a
    job that fails outright."""
    root = str(tmp_path / "lake")
    lg = txlog.connect(root)
    lg.create_topic("backfill", partitions=3)
    lg.create_topic("retry", partitions=2)
    lg.create_topic("fail", partitions=2)

    first = Child(tmp_path, "backfill", root, pause_at="before-commit", skip=1)
    first.wait_paused()
    # Chunk 2's transaction is open with its batches appended: its data holds the LSO.
    states = [lg.partition_log(tp).refresh() for tp in lg.partitions_for("backfill")]
    assert any(st.open_txns for st in states)
    assert sum(st.high_watermark for st in states) > CHUNK_ROWS  # chunk 1 + chunk 2 staged
    first.kill()
    assert committed_app_version(lg, "bf") == 1

    second = Child(tmp_path, "backfill", root, "--passes", "2", "--retry",
                   env={"TXLOG_TEST_FAIL_STAGED": "retry:first,fail:always"})
    res = second.result()
    assert res["skipped"] == [1, 3]  # chunk 1 was committed; the second pass is all no-ops
    assert committed_app_version(lg, "bf") == CHUNKS
    values = sorted(int(r.value) for r in read_all(lg, "backfill"))
    assert values == list(range(CHUNKS * CHUNK_ROWS))  # each record exactly once
    # A crashed commit leaves its staging folder behind; the maintenance sweep clears
    # what no batch references.
    from spark_ext.writer import sweep_staging

    sweep_staging(lg, "backfill", older_than_ms=0)
    assert set(staged_objects(root, "backfill")) == referenced(lg, "backfill")

    # Every task failed once after staging, and was retried: each record once, and the
    # failed attempts' files are gone.
    assert res["retry_error"] is None
    values = sorted(int(r.value) for r in read_all(lg, "retry"))
    assert values == list(range(100))
    assert set(staged_objects(root, "retry")) == referenced(lg, "retry")
    # A job whose task fails every attempt: nothing committed, its staging swept.
    assert "fails after staging" in res["fail_error"]
    assert read_all(lg, "fail") == []
    assert staged_objects(root, "fail") == []
    assert all(lg.partition_log(tp).refresh().high_watermark == 0
               for tp in lg.partitions_for("fail"))


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_streaming_query_killed_and_restarted_from_checkpoint(tmp_path: Path) -> None:
    """A micro-batch whose transaction committed but whose batch Spark never marked done
    (SIGKILL right after our commit) is replayed with the same batch id on restart: it
    commits nothing new.  Each input record reaches the topic exactly once."""
    root = str(tmp_path / "lake")
    src = tmp_path / "input"
    src.mkdir()
    for i in range(3):
        (src / f"part-{i}.json").write_text(
            "\n".join(json.dumps({"k": f"k{i}-{j}", "v": f"{i}-{j}"}) for j in range(25)))
    lg = txlog.connect(root)
    lg.create_topic("stream", partitions=2)
    ckpt = str(tmp_path / "checkpoint")

    first = Child(tmp_path, "stream", root, str(src), ckpt, pause_at="after-commit", skip=1)
    first.wait_paused()  # batch 0 done, batch 1 committed in txlog, not in Spark's log
    first.kill()
    qid = json.loads(Path(ckpt, "metadata").read_text())["id"]
    assert committed_app_version(lg, f"stream-{qid}") == 1

    restart = Child(tmp_path, "stream", root, str(src), ckpt)
    res = restart.result()
    assert res["query_id"] == qid
    assert "txlog JVM streaming write [topic=stream]" in res["plan"], res["plan"]
    # Spark replayed batch 1; its commit said so and wrote nothing.
    assert "already committed version 1; this write (version 1) commits nothing" in \
        restart.log.read_text()
    values = sorted(r.value.decode() for r in read_all(lg, "stream"))
    assert values == sorted(f"{i}-{j}" for i in range(3) for j in range(25))
    assert committed_app_version(lg, f"stream-{qid}") == 2  # batches 0, 1 (replayed), 2
    # The killed commit never swept its staging folder (only its marker is left over).
    from spark_ext.writer import sweep_staging

    assert sweep_staging(lg, "stream", older_than_ms=0) == 1
    assert set(staged_objects(root, "stream")) == referenced(lg, "stream")


# -- the child script ----------------------------------------------------------------------------


def _child_session(**conf: str) -> Any:
    sys.path.insert(0, str(HERE.parent))
    from spark_session import start_spark

    return start_spark("txlog-write-child", **{"spark.master": "local[2,4]", **conf})


def _child_backfill(root: str, passes: int, with_retry: bool) -> dict[str, Any]:
    spark = _child_session()
    lg = txlog.connect(root)
    skipped = []
    for _ in range(passes):  # each pass re-runs the backfill from the top
        n = 0
        for v in range(1, CHUNKS + 1):
            before = committed_app_version(lg, "bf")
            df = spark.range((v - 1) * CHUNK_ROWS, v * CHUNK_ROWS, numPartitions=2).selectExpr(
                "cast(id as string) as key", "cast(id as string) as value")
            write(df, root, "backfill", txnAppId="bf", txnVersion=str(v))
            n += before is not None and before >= v
        skipped.append(n)
    out: dict[str, Any] = {"skipped": skipped, "retry_error": None, "fail_error": None}
    if with_retry:
        df = spark.range(0, 100, numPartitions=4).selectExpr("cast(id as string) as value")
        try:
            write(df, root, "retry", maxFileBytes="1")
        except Exception as exc:
            out["retry_error"] = str(exc)[-2000:]
        df = spark.range(0, 10, numPartitions=1).selectExpr("cast(id as string) as value")
        try:
            write(df, root, "fail")
        except Exception as exc:
            out["fail_error"] = str(exc)[-2000:]
    return out


def _child_stream(root: str, src: str, ckpt: str) -> dict[str, Any]:
    spark = _child_session()
    q = (spark.readStream.schema("k string, v string").option("maxFilesPerTrigger", 1)
         .json(src).selectExpr("k as key", "v as value")
         .writeStream.format("txlog").option("path", root).option("topic", "stream")
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    q.awaitTermination()
    return {"query_id": str(q.id), "plan": str(q._jsq.explainInternal(False))}


def _child_main(argv: list[str]) -> None:
    scenario = argv[0]
    if scenario == "backfill":
        passes = int(argv[argv.index("--passes") + 1]) if "--passes" in argv else 1
        out = _child_backfill(argv[1], passes, "--retry" in argv)
    elif scenario == "stream":
        out = _child_stream(argv[1], argv[2], argv[3])
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
