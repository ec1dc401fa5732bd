"""Exactly-once from a txlog topic into a Delta table, across real SIGKILLs.

Every Spark run is a child process (this file run as a script) with its own local Spark
and delta-spark's jars; the test SIGKILLs the whole child session (driver, JVM, Python
workers) at a chosen step and runs the job again.  The table is then read with delta-rs
(``deltalake``), a reader that shares no code with Spark or txlog: each committed input
record must be there exactly once and no record of an aborted transaction at all.

Batch (``exactly_once.run(sink_delta=...)``): the child stops at one of the round's steps
(``TXLOG_TEST_PAUSE_AT``, the writer's pause hook) and is killed there.  Streaming
(``readStream.format("txlog")`` -> ``writeStream.format("delta")``): the test watches the
checkpoint and the table's log and kills the child as soon as a micro-batch was planned,
its Delta commit appeared, or the checkpoint marked it done.
"""

from __future__ import annotations

import collections
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import spark_procs

import txlog
from txlog.app_versions import committed_app_version
from txlog.testing.workloads import transactions_with_aborts

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
SOURCE = "orders"
GROUP = "to-delta"


def _delta_ready() -> str | None:
    """Why Delta tests cannot run here (None: they can)."""
    try:
        import delta  # noqa: F401
        import deltalake  # noqa: F401
    except ImportError:
        return "delta-spark and deltalake are not installed (the .venv-latest lane)"
    from spark_ext.delta import delta_jars

    try:
        delta_jars()
    except Exception as exc:
        return str(exc)
    return None


def skip_without_delta() -> None:
    why = _delta_ready()
    if why:
        pytest.skip(why)


# -- input and checks ----------------------------------------------------------------------


def produce(root: str, *, seed: int, txns: int, per_txn: int,
            partitions: int = 3) -> tuple[set[int], set[int]]:
    """``txns`` transactions of ``per_txn`` records ({"id": n} values); a quarter of them,
    picked by ``seed``, aborted after their records reached the log."""
    lg = txlog.connect(root)
    lg.create_topic(SOURCE, partitions=partitions)
    return transactions_with_aborts(
        lg, SOURCE, seed=seed, txns=txns, per_txn=per_txn,
        record=lambda i, rng: (json.dumps({"id": i}).encode(),
                               f"k{rng.randrange(20)}".encode()))


def table_ids(table: str) -> collections.Counter[int]:
    """The ``id`` column of the Delta table, read with delta-rs."""
    from deltalake import DeltaTable

    return collections.Counter(DeltaTable(table).to_pyarrow_table(columns=["id"])
                               .column("id").to_pylist())


def check_exactly_once(table: str, committed: set[int], aborted: set[int]) -> dict[str, int]:
    ids = table_ids(table)
    counts = {"rows": sum(ids.values()), "duplicates": sum(c - 1 for c in ids.values() if c > 1),
              "lost": len(committed - set(ids)), "aborted": len(aborted & set(ids)),
              "unknown": len(set(ids) - committed - aborted)}
    print("delta-rs check:", counts)
    assert counts == {"rows": len(committed), "duplicates": 0, "lost": 0, "aborted": 0,
                      "unknown": 0}
    return counts


def delta_version(table: str) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(table).version())


def delta_txn_version(table: str, app_id: str) -> int | None:
    from deltalake import DeltaTable

    if not (Path(table) / "_delta_log").exists():
        return None
    v = DeltaTable(table).transaction_version(app_id)
    return None if v is None else int(v)


# -- child processes -----------------------------------------------------------------------


class Child(spark_procs.Child):
    """This file run as a script in its own session, optionally paused at a round's step."""

    script = HERE


# -- batch: exactly_once.run(sink_delta=...) ---------------------------------------------------

ROUND_OFFSETS = 40
#: (step, how many times the child passes it before stopping there); 12 kills.
BATCH_KILLS = [
    ("delta-before-write", 0), ("delta-after-write", 0), ("delta-in-offset-commit", 0),
    ("delta-after-round", 0), ("delta-after-write", 1), ("delta-before-write", 1),
    ("delta-in-offset-commit", 1), ("delta-after-write", 0), ("delta-after-round", 1),
    ("delta-before-write", 0), ("delta-in-offset-commit", 0), ("delta-after-write", 0),
]


@pytest.mark.timeout(3600)
def test_batch_into_delta_exactly_once_across_sigkills(tmp_path: Path) -> None:
    """Twelve SIGKILLs, three at each step of a round (before the Delta write, after it and
    before the offset commit, inside the offset commit's transaction, after the round),
    each followed by a new run: delta-rs then finds every committed record exactly once
    and no aborted one, each kill after the Delta write was settled from the table's
    record, and a run of the finished job writes no new Delta version."""
    skip_without_delta()
    from spark_ext.exactly_once import delta_app_id

    seed = 3301
    print("seed", seed)
    root, table = str(tmp_path / "lake"), str(tmp_path / "table")
    committed, aborted = produce(root, seed=seed, txns=24, per_txn=30)
    lg = txlog.connect(root)
    app = delta_app_id(GROUP)
    settled_windows = 0
    for step, skip in BATCH_KILLS:
        child = Child(tmp_path, "batch", root, table, pause_at=step, skip=skip)
        child.wait_paused()
        child.kill()
        in_table = delta_txn_version(table, app) or 0
        done = committed_app_version(lg, app) or 0
        # Only the Delta commit may be ahead of the offsets, by one round: always after a
        # kill right after the write, and after a kill inside the commit that settles it.
        assert in_table - done in (0, 1), (step, in_table, done)
        if step == "delta-after-write":
            assert in_table - done == 1, (step, in_table, done)
        settled_windows += in_table - done
    assert settled_windows >= 4
    out = Child(tmp_path, "batch", root, table).result()
    assert out["settled"] <= 1 and out["rounds"] >= 1
    check_exactly_once(table, committed, aborted)
    # The group has consumed the whole source, and its round count is the table's.
    c = lg.consumer(group_id=GROUP, isolation_level="read_committed")
    tps = lg.partitions_for(SOURCE)
    assert c.committed(tps) == c.end_offsets(tps)
    assert committed_app_version(lg, app) == delta_txn_version(table, app)

    version = delta_version(table)
    again = Child(tmp_path, "batch", root, table).result()
    assert again == {"rounds": 0, "settled": 0, "delta_version": version}
    assert delta_version(table) == version


# -- streaming: readStream.format("txlog") -> writeStream.format("delta") ---------------------

MAX_OFFSETS = 50


def _checkpoint_files(ckpt: Path, sub: str) -> set[int]:
    d = ckpt / sub
    if not d.exists():
        return set()
    return {int(p.name) for p in d.iterdir() if p.name.isdigit()}


def _delta_commits(table: Path) -> int:
    d = table / "_delta_log"
    return len(list(d.glob("*.json"))) if d.exists() else 0


@pytest.mark.timeout(3600)
def test_streaming_into_delta_exactly_once_across_sigkills(tmp_path: Path) -> None:
    """readStream.format("txlog") with maxOffsetsPerTrigger into writeStream.format("delta")
    with a checkpoint and Trigger.AvailableNow, SIGKILLed eight times: as soon as a new
    micro-batch is planned (offsets log), as soon as its Delta commit appears, and as soon
    as the checkpoint marks it done; then run to the end twice.  delta-rs finds every
    committed record once and no aborted one; the second full run adds no Delta version."""
    skip_without_delta()
    seed = 3302
    print("seed", seed)
    root = str(tmp_path / "lake")
    table, ckpt = tmp_path / "table", tmp_path / "ckpt"
    committed, aborted = produce(root, seed=seed, txns=24, per_txn=30)
    kills = ["planned", "delta-commit", "done", "planned", "delta-commit", "done",
             "delta-commit", "planned"]
    for when in kills:
        planned, done, commits = (_checkpoint_files(ckpt, "offsets"),
                                  _checkpoint_files(ckpt, "commits"), _delta_commits(table))
        child = Child(tmp_path, "stream", root, str(table), str(ckpt))
        if when == "planned":
            child.wait_for(lambda p=planned: len(_checkpoint_files(ckpt, "offsets") - p) >= 1,
                           "a new micro-batch")
        elif when == "delta-commit":
            child.wait_for(lambda n=commits: _delta_commits(table) > n, "a new Delta commit")
        else:
            child.wait_for(lambda d=done: len(_checkpoint_files(ckpt, "commits") - d) >= 1,
                           "a micro-batch marked done")
        child.kill()
    out = Child(tmp_path, "stream", root, str(table), str(ckpt)).result()
    assert out["batches"] >= 1
    assert out["sources"] == [f"txlog JVM stream [subscribe={SOURCE}]"], out["sources"]
    check_exactly_once(str(table), committed, aborted)
    version = delta_version(str(table))
    Child(tmp_path, "stream", root, str(table), str(ckpt)).result()
    assert delta_version(str(table)) == version


# -- the child -------------------------------------------------------------------------------


def _session() -> Any:
    from spark_ext.delta import local_session

    return local_session("txlog-delta-tests", **{
        "spark.default.parallelism": "2", "spark.driver.memory": "1g",
        "spark.python.authenticate.socketTimeout": "120s"})


def to_rows(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.select(F.get_json_object(F.col("value").cast("string"), "$.id")
                     .cast("long").alias("id"), "partition", "offset")


def _child_batch(root: str, table: str) -> dict[str, Any]:
    import spark_ext.exactly_once as eos

    spark = _session()
    res = eos.run(spark, path=root, source_topic=SOURCE, group_id=GROUP, transform=to_rows,
                  sink_delta=table, max_records_per_round=ROUND_OFFSETS)
    version = delta_version(table) if (Path(table) / "_delta_log").exists() else -1
    return {"rounds": len(res.rounds), "settled": sum(r.settled for r in res.rounds),
            "delta_version": version}


def _child_stream(root: str, table: str, ckpt: str) -> dict[str, Any]:
    spark = _session()
    q = (spark.readStream.format("txlog").option("path", root).option("subscribe", SOURCE)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", MAX_OFFSETS)
         .load().transform(to_rows)
         .writeStream.format("delta").option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start(table))
    q.awaitTermination()
    return {"batches": len(q.recentProgress),
            "sources": sorted({s["description"] for p in q.recentProgress
                               for s in p["sources"]})}


def _child_main(argv: list[str]) -> None:
    scenario, args = argv[0], argv[1:]
    scenarios: dict[str, Callable[..., dict[str, Any]]] = {"batch": _child_batch,
                                                           "stream": _child_stream}
    out = scenarios[scenario](*args)
    print(json.dumps(out), flush=True)
    os._exit(0)  # skip the JVM's slow orderly shutdown; everything is committed


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    _child_main(sys.argv[1:])
