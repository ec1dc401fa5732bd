"""Delta to txlog: :func:`spark_ext.delta.to_txlog` writes a Delta table, or its
change data feed between two versions, to a topic with txnAppId = the table and
txnVersion = the Delta version read up to, so re-runs never duplicate, also after a
SIGKILL inside the topic's commit.  Spark runs in child processes (this file as a script)
with delta-spark's jars; the topics are read back with txlog's read_committed consumer.
"""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog.app_versions import committed_app_version

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


def read_values(lg: txlog.Log, topic: str) -> list[dict[str, Any]]:
    c = lg.consumer(isolation_level="read_committed")
    c.assign(lg.partitions_for(topic))
    c.seek_to_beginning()
    out: list[dict[str, Any]] = []
    while True:
        got = c.poll(max_records=100_000)
        if not got:
            return out
        out.extend(json.loads(r.value) for r in got)


@pytest.mark.timeout(2400)
def test_delta_to_txlog_reruns_and_a_killed_export_never_duplicate(tmp_path: Path) -> None:
    """A table exported whole (``snap``) and through its change data feed (``cdf``,
    incremental: from the version after the last one exported); the second incremental
    export is SIGKILLed inside its txlog commit (its batches appended, the transaction
    open) and run again, and every export is run twice more: ``snap`` holds the table at
    versions 0 and 2 once each, ``cdf`` each change of versions 0-2 once, and the app's
    txnVersion is the last Delta version exported."""
    from test_delta_exactly_once import Child, skip_without_delta

    skip_without_delta()
    root, table = str(tmp_path / "lake"), str(tmp_path / "table")
    lg = txlog.connect(root)
    lg.create_topic("snap", partitions=2)
    lg.create_topic("cdf", partitions=2)

    first = Child(tmp_path, "export", root, table, "first", script=HERE).result()
    assert first["snap"]["version"] == 0 and first["snap"]["rows"] == 10
    assert first["cdf"]["from"] == 0 and first["cdf"]["rows"] == 10
    app = first["app"]
    assert committed_app_version(lg, app) == 0

    # Versions 1 (ids 10-14 appended) and 2 (id 3 deleted), then the killed export.
    killed = Child(tmp_path, "export", root, table, "change", script=HERE,
                   pause_at="before-commit")
    killed.wait_paused()
    open_txns = sum(len(lg.partition_log(tp).refresh().open_txns)
                    for tp in lg.partitions_for("cdf"))
    assert open_txns >= 1  # killed with the transaction open
    killed.kill()
    assert committed_app_version(lg, app) == 0

    again = Child(tmp_path, "export", root, table, "again", script=HERE).result()
    assert again["cdf"]["from"] == 1 and again["cdf"]["rows"] == 6
    assert again["snap"]["version"] == 2 and again["snap"]["rows"] == 14
    assert again["cdf_rerun"]["skipped"] and again["snap_rerun"]["skipped"]
    assert committed_app_version(lg, app) == 2

    snap = collections.Counter((r["version"], r["id"]) for r in read_values(lg, "snap"))
    want_v2 = set(range(15)) - {3}
    assert snap == collections.Counter([(0, i) for i in range(10)] + [(2, i) for i in want_v2])
    cdf = collections.Counter((r["_commit_version"], r["_change_type"], r["id"])
                              for r in read_values(lg, "cdf"))
    assert cdf == collections.Counter(
        [(0, "insert", i) for i in range(10)] + [(1, "insert", i) for i in range(10, 15)]
        + [(2, "delete", 3)])


# -- the child -------------------------------------------------------------------------------


def _export_child(root: str, table: str, phase: str) -> dict[str, Any]:
    from pyspark.sql import functions as F
    from test_delta_exactly_once import _session

    import spark_ext.delta as sd

    spark = _session()

    def snapshot(df: Any) -> Any:  # the whole table, tagged with the version read
        return sd.default_records(df.withColumn("version", F.lit(version)))

    def summary(res: sd.ExportResult) -> dict[str, Any]:
        c = res.commit
        return {"version": res.version, "from": res.from_version,
                "rows": c.rows if c is not None else 0,
                "skipped": c is None or c.skipped is not None}

    out: dict[str, Any] = {}
    if phase == "first":
        # The change data feed from the table's first version on.
        spark.conf.set("spark.databricks.delta.properties.defaults.enableChangeDataFeed",
                       "true")
        spark.range(10).write.format("delta").save(table)
    elif phase == "change":
        spark.range(10, 15).write.format("delta").mode("append").save(table)
        spark.sql(f"DELETE FROM delta.`{table}` WHERE id = 3")
    version = int(spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").first()["version"])
    if phase != "change":
        out["snap"] = summary(sd.to_txlog(spark, table=table, path=root, topic="snap",
                                          app_id="snapshot-export", to_records=snapshot))
    res = sd.to_txlog(spark, table=table, path=root, topic="cdf", changes_from="next")
    out["app"], out["cdf"] = res.app_id, summary(res)
    if phase == "again":
        out["snap_rerun"] = summary(sd.to_txlog(spark, table=table, path=root, topic="snap",
                                                app_id="snapshot-export", to_records=snapshot))
        out["cdf_rerun"] = summary(sd.to_txlog(spark, table=table, path=root, topic="cdf",
                                               changes_from="next"))
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(HERE.parent))
    result = _export_child(*sys.argv[2:])
    print(json.dumps(result), flush=True)
    os._exit(0)
