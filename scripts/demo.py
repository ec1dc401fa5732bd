"""The README's main job: an exactly-once Spark pipeline that survives a SIGKILL.

    scripts/run-demo.sh                 # or: .venv/bin/python scripts/demo.py [--dir DIR]

On a local directory (default ./demo-data, wiped at start) and a local Spark session:

1. produce transactional input into the topic ``orders`` (4 partitions) with the Python
   producer; a quarter of the transactions are aborted on purpose;
2. run the exactly-once pipeline (:func:`spark_ext.exactly_once.run`: read_committed from
   the group's committed offsets, transform, write ``orders-enriched`` and commit the
   source offsets in the same transaction) in a child process, in rounds, and SIGKILL
   that process (driver, JVM and Python workers) while it is inside the commit of round 3,
   with that round's transaction open and its output already appended;
3. run the pipeline again to completion;
4. read ``orders-enriched`` with the Python read_committed consumer and print the proof:
   output records = committed input records, duplicates 0, aborted records seen 0,
   missing 0.  Exits non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCE, SINK, GROUP = "orders", "orders-enriched", "enrich"
TXNS, PER_TXN = 40, 50
ROUND_RECORDS = 450  # offsets per round: the backlog takes about six rounds
KILL_IN_ROUND = 3

_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {msg}", flush=True)


# -- 1. input -------------------------------------------------------------------------------


def produce(root: str) -> tuple[set[int], set[int]]:
    """TXNS transactions of PER_TXN orders each; every fourth one (at random) aborted."""
    import txlog

    lg = txlog.connect(root)
    lg.create_topic(SOURCE, partitions=4)
    lg.create_topic(SINK, partitions=3)
    rng = random.Random(7)
    aborted_txns = set(rng.sample(range(TXNS), TXNS // 4))
    committed: set[int] = set()
    aborted: set[int] = set()
    p = lg.producer(transactional_id="order-service")
    p.init_transactions()
    n = 0
    for t in range(TXNS):
        p.begin_transaction()
        ids = list(range(n, n + PER_TXN))
        n += PER_TXN
        for i in ids:
            customer = f"c{rng.randrange(60)}"
            order = {"id": i, "customer": customer, "amount": round(rng.uniform(1, 500), 2)}
            p.send(SOURCE, json.dumps(order).encode(), key=customer.encode())
        p.flush()  # the records are in the log now, committed or not
        if t in aborted_txns:
            p.abort_transaction()
            aborted.update(ids)
        else:
            p.commit_transaction()
            committed.update(ids)
    p.close()
    return committed, aborted


# -- 2./3. the pipeline (child process) -----------------------------------------------------


def transform(df: Any) -> Any:
    """orders -> enriched orders: amount in cents and a size class, keyed by customer."""
    from pyspark.sql import functions as F

    order = F.from_json(F.col("value").cast("string"),
                        "id long, customer string, amount double")
    o = df.select(F.col("key"), order.alias("o"), F.col("partition").alias("src_partition"),
                  F.col("offset").alias("src_offset"))
    enriched = F.struct(
        F.col("o.id").alias("id"), F.col("o.customer").alias("customer"),
        F.round(F.col("o.amount") * 100).cast("long").alias("amount_cents"),
        F.when(F.col("o.amount") >= 250, "large").otherwise("small").alias("size"),
        F.col("src_partition"), F.col("src_offset"))
    return o.select("key", F.to_json(enriched).alias("value"))


def pipeline(root: str, run: int) -> None:
    import spark_ext
    import spark_ext.exactly_once as eos

    spark = spark_ext.local_session("txlog-demo")

    def report(r: eos.Round) -> None:
        state = "committed" if r.committed else "already done by an earlier run"
        say(f"    run {run}, round {r.number}: source offsets {sum(r.start.values())}.."
            f"{sum(r.end.values())} ({r.offsets} offsets) {state}")

    res = eos.run(spark, path=root, source_topic=SOURCE, sink_topic=SINK, group_id=GROUP,
                  transform=transform, max_records_per_round=ROUND_RECORDS, on_round=report)
    say(f"    pipeline finished: {res.committed_rounds} rounds committed")
    spark.stop()


def kill_session(sid: int) -> int:
    """SIGKILL every process in the child's session (driver, JVM, Python workers)."""
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[3]) == sid:
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def run_child(root: str, pause_dir: Path | None, run: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    if pause_dir is not None:
        # The writer's crash-test hook: stop inside the commit of round KILL_IN_ROUND, after
        # its output was appended and before the transaction commits.
        env.update(TXLOG_TEST_PAUSE_DIR=str(pause_dir), TXLOG_TEST_PAUSE_AT="before-commit",
                   TXLOG_TEST_PAUSE_SKIP=str(KILL_IN_ROUND - 1))
    return subprocess.Popen([sys.executable, __file__, "--pipeline", "--dir", root,
                             "--run", str(run)], env=env,
                            cwd=REPO, start_new_session=True)


# -- 4. proof -------------------------------------------------------------------------------


def verify(root: str, committed: set[int], aborted: set[int]) -> bool:
    import txlog

    lg = txlog.connect(root)
    c = lg.consumer(isolation_level="read_committed")
    c.assign(lg.partitions_for(SINK))
    c.seek_to_beginning()
    out: list[Any] = []
    while True:
        got = c.poll(max_records=100_000)
        if not got:
            break
        out.extend(got)
    ids = collections.Counter(json.loads(r.value)["id"] for r in out)
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
    slots = sum(lg.partition_log(tp).refresh().high_watermark
                for tp in lg.partitions_for(SINK))

    rows = [
        ("input records produced", len(committed) + len(aborted), None),
        ("  in committed transactions", len(committed), None),
        ("  in aborted transactions", len(aborted), None),
        ("  aborted ones in the source log", in_log, in_log == len(aborted)),
        ("output records (read_committed)", len(out), len(out) == len(committed)),
        ("distinct input ids in output", len(ids), len(ids) == len(committed)),
        ("duplicates", dupes, dupes == 0),
        ("aborted records seen", seen_aborted, seen_aborted == 0),
        ("missing records", missing, missing == 0),
        ("records from nowhere", unknown, unknown == 0),
        ("group offsets = source LSO", "yes" if offsets_ok else "no", offsets_ok),
        ("sink offsets used (incl. killed round, markers)", slots, None),
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
    print("exactly once: every committed input record is in the output once, no aborted "
          "record was read" if good else "EXACTLY-ONCE CHECK FAILED")
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

    shutil.rmtree(root, ignore_errors=True)
    Path(root).mkdir(parents=True)
    say(f"txlog root: {root}")
    committed, aborted = produce(root)
    say(f"1. produced {len(committed) + len(aborted)} orders into '{SOURCE}' (4 partitions) "
        f"in {TXNS} transactions; {len(aborted)} of them in aborted transactions")

    say(f"2. exactly-once pipeline '{SOURCE}' -> '{SINK}' in a child process; it will be "
        f"SIGKILLed inside the commit of round {KILL_IN_ROUND}")
    pause = Path(tempfile.mkdtemp(prefix="txlog-demo-pause-"))
    child = run_child(root, pause, 1)
    while not (pause / "paused").exists():
        if child.poll() is not None:
            say(f"the pipeline exited ({child.returncode}) before reaching the kill point")
            return 1
        time.sleep(0.05)
    import txlog

    lg = txlog.connect(root)
    open_txns = sum(len(lg.partition_log(tp).refresh().open_txns)
                    for tp in lg.partitions_for(SINK))
    killed = kill_session(child.pid)
    child.wait()
    kill_session(child.pid)  # anything forked meanwhile
    shutil.rmtree(pause, ignore_errors=True)
    say(f"    SIGKILL -> {killed} processes (driver, JVM, Python workers) while round "
        f"{KILL_IN_ROUND}'s transaction was open in {open_txns} sink partitions")

    say("3. the same pipeline again, to completion")
    child = run_child(root, None, 2)
    if child.wait() != 0:
        say(f"the pipeline failed ({child.returncode})")
        return 1

    say("4. verify with the Python read_committed consumer")
    ok = verify(root, committed, aborted)
    say("done")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
