"""What stops a job into or out of Delta instead of duplicating: a table whose round record
no crash can explain (exactly-once into Delta), and a second incremental export of one app
racing the first (Delta to txlog).  Spark runs in a child process (this file as a script)
with delta-spark's jars; the results are read back with delta-rs and txlog's consumer.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog.app_versions import committed_app_version

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


@pytest.mark.timeout(1800)
def test_a_table_no_crash_explains_stops_the_job_without_writing(tmp_path: Path) -> None:
    """DeltaSinkStateError, with nothing written to the table and no offset committed, when
    the table records a round two ahead of the group's (written there by something else),
    when the table is behind the group (a new, empty table for a group that committed two
    rounds), and when the table's next round does not start where the group stands."""
    from test_delta_exactly_once import SOURCE, Child, produce, skip_without_delta

    skip_without_delta()
    seed = 3303
    print("seed", seed)
    root = str(tmp_path / "lake")
    produce(root, seed=seed, txns=8, per_txn=10)
    out = Child(tmp_path, "state-error", root, str(tmp_path), script=HERE).result()
    print(json.dumps(out, indent=1))
    lg = txlog.connect(root)
    tps = lg.partitions_for(SOURCE)

    def committed(group: str) -> dict[str, int | None]:
        got = lg.consumer(group_id=group).committed(tps)
        return {str(tp.partition): off for tp, off in got.items()}

    ahead = out["ahead"]
    assert "holds round 2" in ahead["error"] and "committed the offsets of round 0" \
        in ahead["error"]
    assert ahead["versions"] == [0, 0]  # the table as it was
    assert set(committed("ahead").values()) == {None}

    behind = out["behind"]
    assert behind["rounds"] == 2
    assert "holds round 0" in behind["error"] and "round 2" in behind["error"]
    assert not (tmp_path / "behind-new" / "_delta_log").exists()
    assert committed("behind") == behind["committed"]  # where the two rounds left them

    moved = out["moved"]
    assert "does not start where group 'moved' stands" in moved["error"]
    assert moved["versions"][0] == moved["versions"][1]
    assert committed("moved") == moved["committed"]
    assert committed_app_version(lg, "txlog-eos-moved") == 1


@pytest.mark.timeout(1800)
def test_a_racing_incremental_export_of_one_app_commits_nothing(tmp_path: Path) -> None:
    """Two incremental exports (``changes_from="next"``) of one table and app: the second
    reads versions 1-2 as new and stops before its txlog write; the first exports version
    1 and commits; the second then commits nothing (its versions 1-2 would repeat version
    1's changes), and a third export continues with version 2.  The topic holds every
    change of versions 0-2 exactly once."""
    from test_delta_exactly_once import Child, skip_without_delta

    skip_without_delta()
    root, table = str(tmp_path / "lake"), str(tmp_path / "table")
    lg = txlog.connect(root)
    lg.create_topic("changes", partitions=2)
    out = Child(tmp_path, "race", root, table, str(tmp_path / "pause"), script=HERE).result()
    print(json.dumps(out, indent=1))
    assert out["first"] == {"from": 1, "version": 1, "skipped": False}
    assert out["racing"]["from"] == 1 and out["racing"]["version"] == 2
    assert out["racing"]["skipped"]
    assert out["next"] == {"from": 2, "version": 2, "skipped": False}
    assert committed_app_version(lg, "race") == 2

    c = lg.consumer(isolation_level="read_committed")
    c.assign(lg.partitions_for("changes"))
    c.seek_to_beginning()
    got: list[dict[str, Any]] = []
    while batch := c.poll(max_records=10_000):
        got.extend(json.loads(r.value) for r in batch)
    changes = collections.Counter((r["_commit_version"], r["id"]) for r in got)
    want = [(0, i) for i in range(5)] + [(1, i) for i in range(5, 8)] \
        + [(2, i) for i in range(8, 10)]
    assert changes == collections.Counter(want)


# -- the child -------------------------------------------------------------------------------


def _versions(table: str) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(table).version())


def _state_error(root: str, tmp: str) -> dict[str, Any]:
    from test_delta_exactly_once import SOURCE, _session, to_rows

    import spark_ext.delta as sd
    import spark_ext.exactly_once as eos

    spark = _session()
    lg = txlog.connect(root)
    tps = lg.partitions_for(SOURCE)
    out: dict[str, Any] = {}

    def run(group: str, table: str, **kw: Any) -> eos.RunResult:
        return eos.run(spark, path=root, source_topic=SOURCE, group_id=group,
                       transform=to_rows, sink_delta=table, max_records_per_round=20, **kw)

    def failure(group: str, table: str) -> str:
        try:
            run(group, table)
        except sd.DeltaSinkStateError as exc:
            return str(exc)
        raise AssertionError(f"group {group!r} into {table!r} did not stop")

    def committed(group: str) -> dict[str, int | None]:
        got = lg.consumer(group_id=group).committed(tps)
        return {str(tp.partition): off for tp, off in got.items()}

    # Ahead by two: another writer recorded round 2 of the group's app id.
    ahead = f"{tmp}/ahead"
    (spark.range(3).selectExpr("id", "0 as partition", "id as offset").write.format("delta")
     .option("txnAppId", eos.delta_app_id("ahead")).option("txnVersion", "2").save(ahead))
    before = _versions(ahead)
    out["ahead"] = {"error": failure("ahead", ahead), "versions": [before, _versions(ahead)]}

    # Behind: two rounds into one table, then the same group into a new one.
    res = run("behind", f"{tmp}/behind", max_rounds=2)
    out["behind"] = {"rounds": sum(r.committed for r in res.rounds),
                     "committed": committed("behind"),
                     "error": failure("behind", f"{tmp}/behind-new")}

    # One ahead, but that round starts elsewhere than where the group's offsets stand.
    moved = f"{tmp}/moved"
    run("moved", moved, max_rounds=1)
    here = committed("moved")
    meta = sd.user_metadata(app=eos.delta_app_id("moved"), round=2, group="moved",
                            topic=SOURCE, start={p: (o or 0) + 1 for p, o in here.items()},
                            end={p: (o or 0) + 2 for p, o in here.items()})
    (spark.range(1).selectExpr("id", "0 as partition", "id as offset").write.format("delta")
     .mode("append").option("txnAppId", eos.delta_app_id("moved")).option("txnVersion", "2")
     .option("userMetadata", meta).save(moved))
    before = _versions(moved)
    out["moved"] = {"error": failure("moved", moved), "versions": [before, _versions(moved)],
                    "committed": committed("moved")}
    return out


def _race(root: str, table: str, pause_dir: str) -> dict[str, Any]:
    from test_delta_exactly_once import _session

    import spark_ext.delta as sd

    spark = _session()
    spark.conf.set("spark.databricks.delta.properties.defaults.enableChangeDataFeed", "true")
    spark.range(5).write.format("delta").save(table)

    def export(**kw: Any) -> dict[str, Any]:
        res = sd.to_txlog(spark, table=table, path=root, topic="changes", app_id="race",
                          changes_from="next", **kw)
        return {"from": res.from_version, "version": res.version,
                "skipped": res.commit is None or res.commit.skipped is not None}

    export()  # version 0
    spark.range(5, 8).write.format("delta").mode("append").save(table)  # version 1
    spark.range(8, 10).write.format("delta").mode("append").save(table)  # version 2

    out: dict[str, Any] = {}
    os.environ.update(TXLOG_TEST_PAUSE_DIR=pause_dir, TXLOG_TEST_PAUSE_AT="export-before-write")
    racing = threading.Thread(target=lambda: out.update(racing=export(version=2)))
    racing.start()
    paused = Path(pause_dir) / "paused"
    while not paused.exists() and racing.is_alive():
        racing.join(0.05)
    assert paused.exists(), "the racing export never reached its pause point"
    del os.environ["TXLOG_TEST_PAUSE_AT"]
    out["first"] = export(version=1)
    (Path(pause_dir) / "resume").touch()
    racing.join()
    out["next"] = export()
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(HERE.parent))
    scenarios: dict[str, Callable[..., dict[str, Any]]] = {"state-error": _state_error,
                                                           "race": _race}
    result = scenarios[sys.argv[1]](*sys.argv[2:])
    print(json.dumps(result), flush=True)
    os._exit(0)
