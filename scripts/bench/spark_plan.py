"""Planning a read of a topic with many partitions and a long history, on the driver.

The goal: a topic of 256 partitions x 10,000 batches planned in under 2 s.  Each
partition's log is one checkpoint of 10,000 committed batches, each naming its own batch
object (2,560,000 objects; planning reads logs, not data, so the objects are not
written).  It measures, interleaved over rounds:

* ``cold``: a fresh ``txlog.connect`` planning the whole topic read_committed
  (each partition's checkpoint and tail loaded, LSO resolved, batch objects chosen);
* ``warm``: the same with the process's cached log (a second query on the driver:
  only new log tails are read);
* ``planner_cold``: the JVM connector's whole question to the planner process
  (``spark_ext.jvm_plan.scan``) with no cached log, as a user's first
  ``spark.read.format("txlog")`` query on the driver asks it: the cold plan, grouped into
  Spark partitions and written as the binary plan file the JVM reads.  This is the goal;
* ``planner``: the same request again, with the process's cached log (a later query).

The plan file is deleted after the clock stops (the JVM deletes it once read, which is not
the driver's planning).

Each is reported as wall time and as the driver process's CPU time (on a machine shared
with other work, the CPU time is what planning itself costs).  The topic is built once
per size under ``--workdir`` (default ``$TXLOG_CACHE_DIR/bench``, else
``~/.cache/txlog/bench``) and reused by later runs.

    .venv/bin/python scripts/bench/spark_plan.py            # 256 x 1,000 (--small)
    .venv/bin/python scripts/bench/spark_plan.py --full     # 256 x 10,000: the goal
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

GOAL_S = 2.0
SEED = 32


def build(url: str, partitions: int, batches: int) -> None:
    """Every partition's log as one checkpoint of ``batches`` committed batches, each
    naming its own batch object, as a long-lived topic's log is: written through txlog's
    checkpoint encoder, so loading it is what a cold read of such a topic does (planning
    reads logs, not data: the objects themselves are not written)."""
    import random

    import txlog
    from txlog import layout
    from txlog.checkpoint import encode_checkpoint
    from txlog.partition_state import COMMITTED, BatchColumns, PartitionState

    log = txlog.connect(url)
    log.create_topic("plan", partitions=partitions)
    rng = random.Random(SEED)
    C.progress(f"seed {SEED}: writing {partitions} checkpoints of {batches:,} batches")
    records = 4
    for p in range(partitions):
        st = PartitionState(next_slot=batches, high_watermark=batches * records,
                            last_append_ms=1_700_000_000_000 + batches)
        b = BatchColumns()
        b.base_offset = list(range(0, batches * records, records))
        b.count = [records] * batches
        b.producer_id = [1000 + p] * batches
        b.epoch = [0] * batches
        b.status = [COMMITTED] * batches
        b.data = [layout.data_key("plan", p, f"{rng.getrandbits(132):033x}.crc32-"
                                              f"{rng.getrandbits(32):08x}")
                  for _ in range(batches)]
        b.nbytes = [rng.randrange(2_000, 4_000) for _ in range(batches)]
        b.ts_min = b.ts_max = b.append_ms = [1_700_000_000_000 + i for i in range(batches)]
        b.txn_id = [f"plan-{p}"] * batches
        b.row = [0] * batches
        b.object_rows = [0] * batches
        st.batches = b
        log.store.put(layout.checkpoint_key("plan", p, batches), encode_checkpoint(st))
    C.progress(f"wrote {partitions} checkpoints")


def _extra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the topic is built once and kept (default: "
                        "$TXLOG_CACHE_DIR/bench or ~/.cache/txlog/bench)")


def main() -> None:
    args = C.parse_args(__doc__.splitlines()[0], stores=False, extra=_extra)
    partitions = C.pick(args.mode, 16, 256, 256)
    batches = C.pick(args.mode, 1_000, 1_000, 10_000)
    rounds = args.rounds or C.pick(args.mode, 1, 3, 3)
    from spark_ext.jvm_scan import cache_dir

    work = args.workdir or cache_dir() / "bench"
    run(args.mode, partitions, batches, rounds, fixture(work, partitions, batches))


def fixture(work: Path, partitions: int, batches: int) -> str:
    """The topic's root, built on first use: a marker written last says it is whole."""
    root = work / f"spark-plan-{partitions}x{batches}-seed{SEED}"
    done = root / "built"
    if done.is_file():
        C.progress(f"reusing {root}")
        return str(root / "lake")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    build(str(root / "lake"), partitions, batches)
    done.write_text(f"{partitions} {batches} {SEED}\n")
    return str(root / "lake")


def run(mode: str, partitions: int, batches: int, rounds: int, url: str) -> None:
    from spark_ext import jvm_plan
    from spark_ext.options import forget_cached_log, parse_read_options
    from spark_ext.plan_file import PLAN_VERSION
    from spark_ext.read_plan import cached_log, plan_batch

    opts = {"path": url, "topic": "plan"}
    ro = parse_read_options(opts, streaming=False)
    want = partitions * batches
    plan_bytes: list[int] = []
    unread: list[str] = []

    def cold() -> int:
        return len(plan_batch(ro, ro.connect()).arrays)

    def warm() -> int:
        return len(plan_batch(ro, cached_log(ro)).arrays)

    def planner() -> int:
        got = jvm_plan.scan({"options": opts, "filters": [], "planFormat": PLAN_VERSION})
        unread.append(got["planFile"])
        return int(got["objects"])

    def planner_cold() -> int:
        forget_cached_log(cached_log(ro))
        return planner()

    def read_plans() -> None:
        # What the JVM does with each plan file once read, off the clock.
        for path in unread:
            plan_bytes.append(os.path.getsize(path))
            os.unlink(path)
        unread.clear()

    variants = {"cold": cold, "warm": warm, "planner_cold": planner_cold,
                "planner": planner}
    for fn in variants.values():  # warm-up, and every batch planned
        assert fn() == want
        read_plans()
    times: dict[str, list[float]] = {n: [] for n in variants}
    cpu: dict[str, list[float]] = {n: [] for n in variants}
    for r in range(rounds):
        order = list(variants.items()) if r % 2 == 0 else list(variants.items())[::-1]
        for name, fn in order:
            c0 = time.process_time()
            with C.Timer() as t:
                fn()
            cpu[name].append(time.process_time() - c0)
            times[name].append(t.elapsed)
            read_plans()
            C.progress(f"round {r + 1}/{rounds} {name}: {t.elapsed:.2f}s "
                       f"(CPU {cpu[name][-1]:.2f}s)")
    forget_cached_log(cached_log(ro))
    med = {n: C.median(v) for n, v in times.items()}
    med_cpu = {n: C.median(v) for n, v in cpu.items()}
    load = os.getloadavg()[0]
    C.print_table(f"Planning {partitions} partitions x {batches:,} batches read_committed "
                  f"(median of {rounds})", ["plan", "seconds", "CPU seconds", "batches/s"],
                  [[n, med[n], med_cpu[n], want / med[n]] for n in variants])
    print(f"plan file: {plan_bytes[-1]:,} bytes; load average while measuring: {load:.1f} "
          f"on {os.cpu_count()} CPUs")
    goals: list[dict[str, Any]] = [
        {"name": f"the JVM connector's scan request for {partitions} partitions x "
                 f"{batches:,} batches, cold (s)",
         "store": "local", "measured": med["planner_cold"], "target": GOAL_S, "cmp": "<=",
         "pass": bool(med["planner_cold"] <= GOAL_S)},
        {"name": "(info) the same, driver CPU time (s)", "store": "local",
         "measured": med_cpu["planner_cold"], "target": None, "cmp": "info", "pass": None},
        {"name": "(info) the same request, warm (a later query on the driver) (s)",
         "store": "local", "measured": med["planner"], "target": None, "cmp": "info",
         "pass": None},
        {"name": "(info) plan_batch alone, cold (s)", "store": "local",
         "measured": med["cold"], "target": None, "cmp": "info", "pass": None},
        {"name": "(info) plan_batch alone, warm (s)", "store": "local",
         "measured": med["warm"], "target": None, "cmp": "info", "pass": None}]
    C.emit_json("spark_plan", mode, partitions=partitions, batches=batches, rounds=rounds,
                seconds=C.clean(times), cpu_seconds=C.clean(cpu),
                median_seconds=C.clean(med), median_cpu_seconds=C.clean(med_cpu),
                plan_file_bytes=plan_bytes[-1], load_average=C.clean(load),
                goals=C.clean(goals))


if __name__ == "__main__":
    main()
