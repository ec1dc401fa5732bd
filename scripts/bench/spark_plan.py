"""Planning a read of a topic with many partitions and a long history, on the driver.

The goal: a topic of 256 partitions x 10,000 batches planned in under 2 s.  Each
partition's log is one checkpoint of 10,000 committed batches, each naming its own batch
object (2,560,000 objects; planning reads logs, not data, so the objects are not
written).  It measures, interleaved over rounds:

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
import sys
import tempfile
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
        st.batches = b
        log.store.put(layout.checkpoint_key("plan", p, batches), encode_checkpoint(st))
    C.progress(f"wrote {partitions} checkpoints")


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
