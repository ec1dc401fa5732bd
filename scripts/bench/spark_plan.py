"""Planning a read of a topic with many partitions and a long history, on the driver.

The goal: a topic of 256 partitions x 10,000 batches planned in under 2 s.  One
partition's log is built with 10,000 committed batches (each naming one shared batch
object), then hard-linked as every other partition's log (planning reads logs, not
data).  It measures, interleaved over rounds:

* ``cold``: a fresh ``txlog.connect`` planning the whole topic read_committed
  (each partition's checkpoint and tail loaded, LSO resolved, batch objects chosen);
* ``warm``: the same with the process's cached log (a second query on the driver:
  only new log tails are read);
* ``planner``: the JVM connector's whole question to the planner process
  (``spark_ext.jvm_plan.scan``: the warm plan, grouped into Spark partitions and
  encoded as the plan lines the JVM reads).

    .venv/bin/python scripts/bench/spark_plan.py            # 256 x 1,000 (--small)
    .venv/bin/python scripts/bench/spark_plan.py --full     # 256 x 10,000: the goal
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

GOAL_S = 2.0


def build(url: str, partitions: int, batches: int) -> None:
    import txlog
    from txlog.records import TopicPartition

    log = txlog.connect(url)
    log.create_topic("plan", partitions=partitions)
    plog = log.partition_log(TopicPartition("plan", 0))
    key, nbytes = plog.write_data(C.kafka_records(1, 16))
    C.progress(f"building one partition of {batches:,} batches")
    C.build_history(plog, batches, shared_key=key, nbytes=nbytes,
                    quick_store=C.quick_local_store(url), report_every=5_000)
    first = Path(url) / "topics" / "plan" / "0"
    for p in range(1, partitions):
        dest = first.parent / str(p)
        shutil.rmtree(dest, ignore_errors=True)
        # Hard links: the same log objects under every partition, without copying them.
        subprocess.run(["cp", "-al", str(first), str(dest)], check=True)
    C.progress(f"linked as {partitions} partitions")


def main() -> None:
    args = C.parse_args(__doc__.splitlines()[0], stores=False)
    partitions = C.pick(args.mode, 16, 256, 256)
    batches = C.pick(args.mode, 1_000, 1_000, 10_000)
    rounds = args.rounds or C.pick(args.mode, 1, 3, 3)
    work = Path(tempfile.mkdtemp(prefix="txlog-spark-plan-"))
    try:
        run(args.mode, partitions, batches, rounds, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(mode: str, partitions: int, batches: int, rounds: int, work: Path) -> None:
    from spark_ext import jvm_plan
    from spark_ext.options import forget_cached_log, parse_read_options
    from spark_ext.read_plan import cached_log, plan_batch

    url = str(work / "lake")
    build(url, partitions, batches)
    opts = {"path": url, "topic": "plan"}
    ro = parse_read_options(opts, streaming=False)
    want = partitions * batches

    def cold() -> int:
        return len(plan_batch(ro, ro.connect()).slices)

    def warm() -> int:
        return len(plan_batch(ro, cached_log(ro)).slices)

    def planner() -> int:
        return len(jvm_plan.scan({"options": opts, "filters": []})["plan"].splitlines())

    variants = {"cold": cold, "warm": warm, "planner": planner}
    for fn in variants.values():  # warm-up, and every batch planned
        assert fn() == want
    times: dict[str, list[float]] = {n: [] for n in variants}
    for r in range(rounds):
        order = list(variants.items()) if r % 2 == 0 else list(variants.items())[::-1]
        for name, fn in order:
            with C.Timer() as t:
                fn()
            times[name].append(t.elapsed)
            C.progress(f"round {r + 1}/{rounds} {name}: {t.elapsed:.2f}s")
    forget_cached_log(cached_log(ro))
    med = {n: C.median(v) for n, v in times.items()}
    C.print_table(f"Planning {partitions} partitions x {batches:,} batches read_committed "
                  f"(median of {rounds})", ["plan", "seconds", "batches/s"],
                  [[n, med[n], want / med[n]] for n in variants])
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    goals: list[dict[str, Any]] = [
        {"name": f"planning {partitions} partitions x {batches:,} batches, cold (s)",
         "store": "local", "measured": med["cold"], "target": GOAL_S, "cmp": "<=",
         "pass": bool(med["cold"] <= GOAL_S)},
        {"name": "(info) the same, warm (a later query on the driver) (s)", "store": "local",
         "measured": med["warm"], "target": None, "cmp": "info", "pass": None},
        {"name": "(info) the JVM connector's scan request to the planner, warm (s)",
         "store": "local", "measured": med["planner"], "target": None, "cmp": "info",
         "pass": None}]
    C.emit_json("spark_plan", mode, partitions=partitions, batches=batches, rounds=rounds,
                seconds=C.clean(times), median_seconds=C.clean(med),
                load_average=C.clean(os.getloadavg()[0]), goals=C.clean(goals))


if __name__ == "__main__":
    main()
