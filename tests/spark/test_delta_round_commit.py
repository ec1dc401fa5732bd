"""How a round of exactly-once into Delta commits (``spark_ext.delta_txn``): through
Delta's transaction API with the app's SetTransaction in the same commit, without
rebuilding the table's state, and with Delta's conflict checker between two runs of the
same round.  Spark runs in a child process (this file as a script) with delta-spark's
jars; the table is read back with delta-rs.
"""

from __future__ import annotations

import json
import logging
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
#: What Delta names the Spark jobs that rebuild a snapshot's state.
STATE_JOBS = "Delta: Compute snapshot"


@pytest.mark.timeout(1800)
def test_rounds_commit_their_txn_record_without_rebuilding_the_table_state(
        tmp_path: Path) -> None:
    """A run of several rounds into an existing table: no round after the first (which
    creates the table) runs a Spark job rebuilding the table's state; delta-rs reads the
    app's txn record at the last round's number, which is txlog's round count, and each
    round's commit carries its userMetadata; every committed record is in the table once
    and no aborted one."""
    from test_delta_exactly_once import Child, check_exactly_once, produce, skip_without_delta

    from spark_ext.exactly_once import delta_app_id

    skip_without_delta()
    seed = 3304
    print("seed", seed)
    root, table = str(tmp_path / "lake"), str(tmp_path / "table")
    committed, aborted = produce(root, seed=seed, txns=8, per_txn=10)
    out = Child(tmp_path, "rounds", root, table, script=HERE).result()
    print(json.dumps(out, indent=1))
    assert out["rounds"] >= 4
    assert out["state_jobs_after_round_1"] == []
    check_exactly_once(table, committed, aborted)

    from deltalake import DeltaTable

    app = delta_app_id("rounds")
    dt = DeltaTable(table)
    assert dt.transaction_version(app) == out["rounds"]
    assert committed_app_version(txlog.connect(root), app) == out["rounds"]
    rounds = sorted(json.loads(h["userMetadata"])["txlog"]["round"] for h in dt.history()
                    if h.get("userMetadata"))
    assert rounds == list(range(1, out["rounds"] + 1))


@pytest.mark.timeout(1800)
def test_a_second_run_of_the_same_round_conflicts_and_writes_nothing(tmp_path: Path) -> None:
    """Run A of a group writes round 1's data files and stops before its Delta commit;
    run B of the same group then commits round 1 (and its offsets).  A's commit fails
    with Delta's ConcurrentTransactionException (B's commit recorded the same app id):
    the table keeps B's commit only, A stops (fenced: B committed the round's offsets)
    instead of committing offsets, and delta-rs finds every committed record once."""
    from test_delta_exactly_once import Child, check_exactly_once, produce, skip_without_delta

    skip_without_delta()
    seed = 3305
    print("seed", seed)
    root, table = str(tmp_path / "lake"), str(tmp_path / "table")
    committed, aborted = produce(root, seed=seed, txns=8, per_txn=10)
    out = Child(tmp_path, "conflict", root, table, str(tmp_path / "pause"),
                script=HERE).result()
    print(json.dumps(out, indent=1))
    assert out["b"] == {"rounds": 1, "committed": True}
    assert out["a_conflicted"], out["a_log"]
    assert out["a_error"].startswith("ProducerFencedError: another run of group 'race' "
                                      "committed round 1"), out["a_error"]
    assert out["versions"]["after_b"] == out["versions"]["after_a"]
    check_exactly_once(table, committed, aborted)

    from deltalake import DeltaTable

    from spark_ext.exactly_once import delta_app_id

    app = delta_app_id("race")
    assert DeltaTable(table).transaction_version(app) == 1
    assert committed_app_version(txlog.connect(root), app) == 1


# -- the child -------------------------------------------------------------------------------


def _state_jobs_after(spark: Any, last: int) -> list[str]:
    """Descriptions of the Spark jobs after job ``last`` that rebuilt a Delta state."""
    out = []
    it = spark._jsc.sc().statusStore().jobsList(None).iterator()
    while it.hasNext():
        job = it.next()
        desc = job.description()
        text = str(desc.get()) if desc.isDefined() else ""
        if job.jobId() > last and text.startswith(STATE_JOBS):
            out.append(text)
    return out


def _last_job(spark: Any) -> int:
    it = spark._jsc.sc().statusStore().jobsList(None).iterator()
    last = -1
    while it.hasNext():
        last = max(last, int(it.next().jobId()))
    return last


def _rounds(root: str, table: str) -> dict[str, Any]:
    from test_delta_exactly_once import SOURCE, _session, to_rows

    import spark_ext.exactly_once as eos

    spark = _session()
    after_first: list[int] = []

    def on_round(rnd: eos.Round) -> None:
        if rnd.number == 1:
            after_first.append(_last_job(spark))

    res = eos.run(spark, path=root, source_topic=SOURCE, group_id="rounds",
                  transform=to_rows, sink_delta=table, max_records_per_round=20,
                  on_round=on_round)
    assert all(r.committed and not r.settled for r in res.rounds)
    return {"rounds": len(res.rounds),
            "state_jobs_after_round_1": _state_jobs_after(spark, after_first[0])}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: Any) -> None:
        self.lines.append(record.getMessage())


def _conflict(root: str, table: str, pause_dir: str) -> dict[str, Any]:
    from deltalake import DeltaTable
    from test_delta_exactly_once import SOURCE, _session, to_rows

    import spark_ext.exactly_once as eos

    spark = _session()
    lines = _Lines()
    logging.getLogger("spark_ext.delta_txn").addHandler(lines)
    logging.getLogger("spark_ext.delta_txn").setLevel(logging.INFO)

    def run() -> eos.RunResult:
        return eos.run(spark, path=root, source_topic=SOURCE, group_id="race",
                       transform=to_rows, sink_delta=table)

    # The table exists (a round through the transaction API needs one), without the app.
    spark.range(0).selectExpr("id", "cast(0 as int) as partition", "id as offset") \
        .write.format("delta").save(table)
    out: dict[str, Any] = {"a_error": None}

    def run_a() -> None:
        try:
            run()
        except Exception as exc:
            out["a_error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"

    os.environ.update(TXLOG_TEST_PAUSE_DIR=pause_dir, TXLOG_TEST_PAUSE_AT="delta-before-commit")
    a = threading.Thread(target=run_a)
    a.start()
    paused = Path(pause_dir) / "paused"
    while not paused.exists() and a.is_alive():
        a.join(0.05)
    assert paused.exists(), "run A never reached its pause before the Delta commit"
    del os.environ["TXLOG_TEST_PAUSE_AT"]
    b = run()
    out["b"] = {"rounds": len(b.rounds), "committed": all(r.committed for r in b.rounds)}
    after_b = int(DeltaTable(table).version())
    (Path(pause_dir) / "resume").touch()
    a.join()
    out["versions"] = {"after_b": after_b, "after_a": int(DeltaTable(table).version())}
    out["a_log"] = lines.lines
    out["a_conflicted"] = any("another commit of the app won" in line for line in lines.lines)
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(HERE.parent))
    scenarios: dict[str, Callable[..., dict[str, Any]]] = {"rounds": _rounds,
                                                           "conflict": _conflict}
    result = scenarios[sys.argv[1]](*sys.argv[2:])
    print(json.dumps(result), flush=True)
    os._exit(0)
