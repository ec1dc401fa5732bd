"""The main job: a txlog topic -> Spark -> Delta table pipeline that survives a SIGKILL.

    scripts/run-demo.sh                 # or: .venv/bin/python scripts/demo.py [--dir DIR]

On a local directory (default ./demo-data, wiped at start) and a local Spark session with
delta-spark (jars fetched by scripts/bootstrap.sh):

1. produce transactional input into the topic ``orders`` (4 partitions) with the Python
   producer; a quarter of the transactions are aborted on purpose;
2. run the exactly-once pipeline (:func:`spark_ext.exactly_once.run` with ``sink_delta``:
   read_committed from the group's committed offsets, transform, append to the Delta
   table with ``txnAppId``/``txnVersion``, then commit the source offsets in txlog) in a
   child process, in rounds, and SIGKILL that process (driver, JVM and Python workers)
   right after round 3's Delta commit, before its source offsets were committed;
3. run the pipeline again to completion: it finds round 3 in the table's transaction
   record, commits its offsets without writing it again, and goes on;
4. run it once more: the job is finished, so it writes no new Delta version;
5. read the Delta table with delta-rs (``deltalake``, a reader independent of Spark and
   txlog) and print the proof: rows = committed input records, duplicates 0, aborted
   records 0, missing 0.  Exits non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCE, TABLE, GROUP = "orders", "orders-delta", "enrich"
TXNS, PER_TXN = 40, 50
ROUND_RECORDS = 450  # offsets per round: the backlog takes about six rounds
KILL_IN_ROUND = 3

# The pipeline's child processes print times from the demo's start, as the demo does.
_T0 = float(os.environ.get("DEMO_STARTED_AT") or time.time())


def say(msg: str) -> None:
    print(f"[{time.time() - _T0:6.1f}s] {msg}", flush=True)


# -- 1. input -------------------------------------------------------------------------------


def produce(root: str) -> tuple[set[int], set[int]]:
    """TXNS transactions of PER_TXN orders each; every fourth one (at random) aborted."""
    import txlog
    from txlog.testing.workloads import transactions_with_aborts

    lg = txlog.connect(root)
    lg.create_topic(SOURCE, partitions=4)

    def order(i: int, rng: random.Random) -> tuple[bytes, bytes]:
        customer = f"c{rng.randrange(60)}"
        o = {"id": i, "customer": customer, "amount": round(rng.uniform(1, 500), 2)}
        return json.dumps(o).encode(), customer.encode()

    return transactions_with_aborts(lg, SOURCE, seed=7, txns=TXNS, per_txn=PER_TXN,
                                    record=order)


# -- 2./3. the pipeline (child process) -----------------------------------------------------


def transform(df: Any) -> Any:
    """orders -> enriched orders: amount in cents and a size class, with their source."""
    from pyspark.sql import functions as F

    order = F.from_json(F.col("value").cast("string"),
                        "id long, customer string, amount double")
    o = df.select(order.alias("o"), F.col("partition").alias("src_partition"),
                  F.col("offset").alias("src_offset"))
    return o.select(
        F.col("o.id").alias("id"), F.col("o.customer").alias("customer"),
        F.round(F.col("o.amount") * 100).cast("long").alias("amount_cents"),
        F.when(F.col("o.amount") >= 250, "large").otherwise("small").alias("size"),
        "src_partition", "src_offset")


def pipeline(root: str, run: int) -> None:
    import spark_ext.delta
    import spark_ext.exactly_once as eos

    spark = spark_ext.delta.local_session("txlog-demo")

    def report(r: eos.Round) -> None:
        state = ("found in the Delta table: offsets committed, nothing written" if r.settled
                 else "committed" if r.committed else "already done by an earlier run")
        say(f"    run {run}, round {r.number}: source offsets {sum(r.start.values())}.."
            f"{sum(r.end.values())} ({r.offsets} offsets) {state}")

    res = eos.run(spark, path=root, source_topic=SOURCE, sink_delta=table_path(root),
                  group_id=GROUP, transform=transform, max_records_per_round=ROUND_RECORDS,
                  on_round=report)
    say(f"    pipeline finished: {len(res.rounds)} rounds, "
        f"{sum(not r.settled for r in res.rounds)} of them wrote the table")
    spark.stop()


def table_path(root: str) -> str:
    return str(Path(root) / TABLE)


def run_child(root: str, pause_dir: Path | None, run: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               DEMO_STARTED_AT=str(_T0))
    if pause_dir is not None:
        # The crash-test hook: stop right after round KILL_IN_ROUND's Delta commit, before
        # its source offsets are committed in txlog.
        env.update(TXLOG_TEST_PAUSE_DIR=str(pause_dir), TXLOG_TEST_PAUSE_AT="delta-after-write",
                   TXLOG_TEST_PAUSE_SKIP=str(KILL_IN_ROUND - 1))
    return subprocess.Popen([sys.executable, __file__, "--pipeline", "--dir", root,
                             "--run", str(run)], env=env,
                            cwd=REPO, start_new_session=True)


# -- 5. proof -------------------------------------------------------------------------------


def delta_state(root: str) -> tuple[int, int | None, int]:
    """(the table's version, its txnVersion for the pipeline, the group's committed rounds),
    read with delta-rs and txlog."""
    from deltalake import DeltaTable

    import txlog
    from spark_ext.exactly_once import delta_app_id
    from txlog.app_versions import committed_app_version

    dt = DeltaTable(table_path(root))
    app = delta_app_id(GROUP)
    return (int(dt.version()), dt.transaction_version(app),
            committed_app_version(txlog.connect(root), app) or 0)


def verify(root: str, committed: set[int], aborted: set[int], versions_before: int) -> bool:
    from deltalake import DeltaTable

    import txlog

    dt = DeltaTable(table_path(root))
    table = dt.to_pyarrow_table(columns=["id"])
    ids = collections.Counter(table.column("id").to_pylist())
    lg = txlog.connect(root)
    raw = lg.consumer(isolation_level="read_uncommitted")
    raw.assign(lg.partitions_for(SOURCE))
    raw.seek_to_beginning()
    in_log = 0
    while True:
        got = raw.poll(max_records=100_000)
        if not got:
            break
        in_log += sum(1 for r in got if json.loads(r.value)["id"] in aborted)
    dupes = sum(n - 1 for n in ids.values() if n > 1)
    seen_aborted = len(set(ids) & aborted)
    missing = len(committed - set(ids))
    unknown = len(set(ids) - committed - aborted)
    g = lg.consumer(group_id=GROUP)
    tps = lg.partitions_for(SOURCE)
    offsets_ok = g.committed(tps) == g.end_offsets(tps)
    version, in_table, rounds = delta_state(root)

    rows = [
        ("input records produced", len(committed) + len(aborted), None),
        ("  in committed transactions", len(committed), None),
        ("  in aborted transactions", len(aborted), None),
        ("  aborted ones in the source log", in_log, in_log == len(aborted)),
        ("Delta table rows (delta-rs)", table.num_rows, table.num_rows == len(committed)),
        ("distinct input ids in the table", len(ids), len(ids) == len(committed)),
        ("duplicates", dupes, dupes == 0),
        ("aborted records in the table", seen_aborted, seen_aborted == 0),
        ("missing records", missing, missing == 0),
        ("records from nowhere", unknown, unknown == 0),
        ("group offsets = source LSO", "yes" if offsets_ok else "no", offsets_ok),
        ("rounds in the table = rounds committed", f"{in_table}={rounds}", in_table == rounds),
        ("Delta versions (one per round)", version + 1, version + 1 == rounds),
        ("new versions from the finished re-run", version + 1 - versions_before,
         version + 1 == versions_before),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    print(f"{'proof':<{width}}  {'value':>8}  check")
    print(f"{'-' * width}  {'-' * 8}  -----")
    for name, value, ok in rows:
        mark = "" if ok is None else ("ok" if ok else "FAILED")
        print(f"{name:<{width}}  {value!s:>8}  {mark}")
    good = all(ok for _, _, ok in rows if ok is not None)
    print()
    print("exactly once into Delta: every committed input record is in the table once, no "
          "aborted record, and the re-run wrote nothing" if good
          else "EXACTLY-ONCE CHECK FAILED")
    return good


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="./demo-data", help="txlog root (wiped at start)")
    ap.add_argument("--pipeline", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    root = str(Path(args.dir).resolve())
    if args.pipeline:
        pipeline(root, args.run)
        return 0

    from txlog.testing.processes import kill_session

    shutil.rmtree(root, ignore_errors=True)
    Path(root).mkdir(parents=True)
    say(f"txlog root: {root}")
    committed, aborted = produce(root)
    say(f"1. produced {len(committed) + len(aborted)} orders into '{SOURCE}' (4 partitions) "
        f"in {TXNS} transactions; {len(aborted)} of them in aborted transactions")

    say(f"2. exactly-once pipeline '{SOURCE}' -> Delta table {table_path(root)} in a child "
        f"process; it will be SIGKILLed right after round {KILL_IN_ROUND}'s Delta commit")
    pause = Path(tempfile.mkdtemp(prefix="txlog-demo-pause-"))
    child = run_child(root, pause, 1)
    while not (pause / "paused").exists():
        if child.poll() is not None:
            say(f"the pipeline exited ({child.returncode}) before reaching the kill point")
            return 1
        time.sleep(0.05)
    killed = kill_session(child.pid)
    child.wait()
    kill_session(child.pid)  # anything forked meanwhile
    shutil.rmtree(pause, ignore_errors=True)
    version, in_table, rounds = delta_state(root)
    say(f"    SIGKILL -> {killed} processes (driver, JVM, Python workers); the table holds "
        f"round {in_table} (Delta version {version}), the group's offsets only round {rounds}")

    say("3. the same pipeline again, to completion")
    child = run_child(root, None, 2)
    if child.wait() != 0:
        say(f"the pipeline failed ({child.returncode})")
        return 1
    versions = delta_state(root)[0] + 1

    say("4. and once more: the job is finished, nothing to write")
    child = run_child(root, None, 3)
    if child.wait() != 0:
        say(f"the pipeline failed ({child.returncode})")
        return 1

    say("5. verify with delta-rs, reading the Delta table independently of Spark")
    ok = verify(root, committed, aborted, versions)
    say("done")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
