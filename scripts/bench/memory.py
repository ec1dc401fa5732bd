"""Peak memory of a producer and a consumer moving many times their buffers, against
pyarrow writing and reading the same bytes as Parquet files (the baseline), in the same
run, interleaved.

Each side runs in a process of its own, started for the round; its peak resident set is
the kernel's high-water mark for it (``VmHWM``), read as it ends, so it counts every
allocator (Python's, glibc's, Arrow's) and every thread.  The sides:

* ``produce``: a producer (``buffer.memory`` 32 MiB, ``batch.size`` 1 MiB, the defaults)
  sends ``--mb`` MiB of 1 KiB records to one partition with ``send()``, then ``flush()``;
* ``poll`` / ``poll_arrow``: a consumer reads them back with ``poll()`` (Record objects)
  or ``poll_arrow()`` (one table per poll) until the end of the partition, and checks
  that no poll returned more than ``fetch.max.bytes`` plus one batch;
* ``pyarrow_write`` / ``pyarrow_read``: the same records, in tables of 1 MiB, written
  with ``pyarrow.parquet.ParquetWriter`` into files of 4 MiB (a txlog object's size
  behind a backlog), and read back with ``ParquetFile.iter_batches``;
* ``source_read``: after the reads, ``txlog maintain`` compacts the partition into
  segments of ``segment.bytes`` (128 MiB, its default; in a process of its own, not
  measured), and one process reads them back as the tasks of a Spark read through
  txlog's Python data source do (``spark_ext.reader.read_slices`` over each input
  partition of the plan, one after another), without Spark around it;
* ``floor``: the interpreter with txlog and pyarrow imported and nothing done, which
  every other side pays too.

The processes run without pandas on the import path (pyarrow imports it, when present,
the first time it converts Python values; txlog does not need it, and it adds about
50 MB to every process), which ``--with-pandas`` turns off.  Both stores are the local
disk, without fsync (pyarrow's files are not synced either).  The goals: producer and
``poll()`` consumer under 150 MB peak with 2 GiB through them (``--full``).

    .venv/bin/python scripts/bench/memory.py [--tiny|--small|--full] [--mb N] [--with-pandas]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


class _NoPandas:
    """A finder that makes ``import pandas`` fail, as it does where pandas is not
    installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


# (before anything imports txlog, whose first Arrow conversion would load pandas)
if "--child" in sys.argv and "--with-pandas" not in sys.argv:
    sys.meta_path.insert(0, _NoPandas())

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

GOAL_MB = 150.0
RECORD = 1024
BUFFER_MEMORY = 32 * 1024 * 1024
SIDES = ("produce", "pyarrow_write", "poll", "poll_arrow", "pyarrow_read", "source_read",
         "floor")


# -- the child processes --------------------------------------------------------------------

def _values(mb: int) -> Any:
    """1 KiB values: slices of 1 MiB of seeded random bytes (snappy finds no repeats
    within its window, so neither side gains from compression)."""
    import random

    pool = random.Random(35).randbytes(1024 * 1024)
    per = len(pool) // RECORD
    return [pool[i * RECORD:(i + 1) * RECORD] for i in range(per)], mb * 1024


def child(side: str, root: str, mb: int) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    import txlog

    out: dict[str, Any] = {"side": side}
    t0 = time.perf_counter()
    if side == "floor":
        pa.array([1], pa.int64())  # the modules a first conversion loads
    elif side == "produce":
        values, n = _values(mb)
        log = txlog.connect(root, {"fsync": False})
        log.create_topic("m", 1)
        p = log.producer(buffer_memory=BUFFER_MEMORY)
        worst = 0
        for i in range(n):
            p.send("m", values[i % len(values)], partition=0)
            if i % 4096 == 0:
                worst = max(worst, p.metrics()["buffered_bytes"])
        p.flush()
        p.close()
        out.update(records=n, worst_buffered_bytes=worst)
    elif side in ("poll", "poll_arrow"):
        log = txlog.connect(root, {"fsync": False})
        c = log.consumer()
        tp = txlog.TopicPartition("m", 0)
        c.assign([tp])
        c.seek_to_beginning()
        got = polls = biggest = 0
        while True:
            recs: Any = None
            t: Any = None
            if side == "poll":
                recs = c.poll(max_records=100_000)
                k, size = len(recs), sum(len(r.value or b"") for r in recs)
            else:
                t = c.poll_arrow(max_records=100_000)
                k, size = t.num_rows, (t.column("value").nbytes if t.num_rows else 0)
            if not k:
                break
            got += k
            polls += 1
            biggest = max(biggest, size)
            recs = t = None  # no poll's result is held across the next
        out.update(records=got, polls=polls, largest_poll_bytes=biggest,
                   fetch_max_bytes=c.fetch_max_bytes)
    elif side == "pyarrow_write":
        from txlog.records import KAFKA_SCHEMA

        values, n = _values(mb)
        os.makedirs(root, exist_ok=True)
        per_table = 1024 * 1024 // RECORD
        per_file = 4 * per_table
        writer = None
        files = 0
        for start in range(0, n, per_table):
            k = min(per_table, n - start)
            now = int(time.time() * 1000)
            table = pa.table([pa.nulls(k, pa.binary()),
                              pa.array([values[(start + j) % len(values)] for j in range(k)],
                                       pa.binary()),
                              pa.nulls(k, KAFKA_SCHEMA.field("headers").type),
                              pa.array([now] * k, pa.timestamp("ms", tz="UTC"))],
                             schema=KAFKA_SCHEMA)
            if writer is None:
                writer = pq.ParquetWriter(os.path.join(root, f"{files:06d}.parquet"),
                                          KAFKA_SCHEMA, compression="snappy")
                files += 1
            writer.write_table(table)
            if (start + k) % per_file == 0:
                writer.close()
                writer = None
        if writer is not None:
            writer.close()
        out.update(records=n, files=files)
    elif side == "compact":
        from txlog.maintenance import maintain

        log = txlog.connect(root, {"fsync": False})
        segments = 0
        while True:
            report = maintain(log, ["m"])
            if report.failures:
                raise RuntimeError(f"txlog maintain failed: {report.failures}")
            segments += sum(p.segments_written for p in report.partitions)
            if not sum(p.compacted_batches for p in report.partitions):
                break
        out.update(segments=segments)
    elif side == "source_read":
        from spark_ext.options import parse_read_options
        from spark_ext.read_plan import plan_batch
        from spark_ext.reader import arrow_target, read_slices

        ro = parse_read_options({"path": root, "topic": "m"}, streaming=False)
        plan = plan_batch(ro)
        store = ro.connect(cached=True).store
        target = arrow_target(plan.shape.schema_json)
        got = largest = tasks = 0
        for group in plan.groups(ro):
            tasks += 1
            for b in read_slices(store, group, plan.shape, target, True):
                got += b.num_rows
                largest = max(largest, b.nbytes)
        sizes = {s.key: s.object_bytes for s in plan.slices}
        out.update(records=got, tasks=tasks, objects=len(sizes),
                   largest_object_bytes=max(sizes.values(), default=0),
                   largest_batch_bytes=largest)
    elif side == "pyarrow_read":
        got = 0
        for name in sorted(os.listdir(root)):
            for b in pq.ParquetFile(os.path.join(root, name)).iter_batches(batch_size=500):
                got += b.num_rows
        out.update(records=got)
    else:
        raise SystemExit(f"unknown side {side!r}")
    out["seconds"] = time.perf_counter() - t0
    # The high-water mark of this process's own memory (wait4's ru_maxrss would start
    # from the parent's, which the child was forked from).
    with open("/proc/self/status") as f:
        hwm = next(line for line in f if line.startswith("VmHWM:"))
    out["peak_mb"] = int(hwm.split()[1]) / 1024  # kB
    return out


# -- the parent ----------------------------------------------------------------------------


def run_side(side: str, root: str, mb: int, *, with_pandas: bool) -> dict[str, Any]:
    """Run one side in a process of its own; its JSON line plus its peak RSS in MB."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--root", root,
           "--mb", str(mb)] + (["--with-pandas"] if with_pandas else [])
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=str(C.REPO))
    if proc.returncode:
        raise RuntimeError(f"{side} exited with {proc.returncode}: {proc.stdout[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    if argv is None and "--child" in sys.argv:
        import argparse

        p = argparse.ArgumentParser()
        p.add_argument("--child")
        p.add_argument("--root")
        p.add_argument("--mb", type=int)
        p.add_argument("--with-pandas", action="store_true")
        a = p.parse_args()
        print(json.dumps(child(a.child, a.root, a.mb)), flush=True)
        return {}

    def extra(p: Any) -> None:
        p.add_argument("--mb", type=int, default=None, help="MiB through each side")
        p.add_argument("--with-pandas", action="store_true",
                       help="leave pandas importable in the measured processes")

    args = C.parse_args(__doc__.splitlines()[0], stores=False, argv=argv, extra=extra)
    mb = args.mb or C.pick(args.mode, 16, 256, 2048)
    rounds = args.rounds or C.pick(args.mode, 1, 3, 3)
    peaks: dict[str, list[float]] = {s: [] for s in SIDES}
    last: dict[str, dict[str, Any]] = {}
    base = tempfile.mkdtemp(prefix="txlog-bench-mem-", dir=os.environ.get("TXLOG_BENCH_TMP"))
    try:
        for r in range(rounds):
            # Each round writes fresh data; the order of txlog and pyarrow flips each
            # round, so that the machine's drift hits both alike.
            tx, pq_dir = f"file://{base}/txlog-{r}", os.path.join(base, f"parquet-{r}")
            order = [("produce", tx), ("pyarrow_write", pq_dir)]
            reads = [("poll", tx), ("poll_arrow", tx), ("pyarrow_read", pq_dir)]
            if r % 2:
                order.reverse()
                reads.reverse()
            # Compaction rewrites the topic the reads above read: it comes after them.
            for side, root in [*order, *reads, ("compact", tx), ("source_read", tx),
                               ("floor", tx)]:
                res = run_side(side, root, mb, with_pandas=args.with_pandas)
                if side == "compact":
                    C.progress(f"round {r + 1}/{rounds} compact: {res['segments']} "
                               f"segments, {res['seconds']:.1f} s")
                    continue
                C.progress(f"round {r + 1}/{rounds} {side}: peak {res['peak_mb']:.1f} MB, "
                           f"{res['seconds']:.1f} s")
                peaks[side].append(res["peak_mb"])
                last[side] = res
            shutil.rmtree(os.path.join(base, f"txlog-{r}"), ignore_errors=True)
            shutil.rmtree(pq_dir, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    n = mb * 1024
    for side in ("produce", "poll", "poll_arrow", "pyarrow_write", "pyarrow_read",
                 "source_read"):
        if last[side].get("records") != n:
            raise RuntimeError(f"{side} moved {last[side].get('records')} records, not {n}")
    med = {s: C.median(v) for s, v in peaks.items()}
    floor = med["floor"]
    largest = max(last["poll"]["largest_poll_bytes"], last["poll_arrow"]["largest_poll_bytes"])
    ratios = {"produce_vs_pyarrow_write": C.ratio(med["produce"], med["pyarrow_write"]),
              "poll_vs_pyarrow_read": C.ratio(med["poll"], med["pyarrow_read"]),
              "poll_arrow_vs_pyarrow_read": C.ratio(med["poll_arrow"], med["pyarrow_read"]),
              "source_read_vs_pyarrow_read": C.ratio(med["source_read"], med["pyarrow_read"])}
    C.print_table(f"peak RSS, MB ({mb} MiB through each side; median of {rounds})",
                  ["side", "peak MB", "above floor", "rounds"],
                  [[s, med[s], med[s] - floor, " ".join(f"{v:.0f}" for v in peaks[s])]
                   for s in SIDES])
    goals = [
        {"name": f"producer peak RSS, {mb} MiB through buffer.memory 32 MiB (MB)",
         "store": "local", "measured": med["produce"], "target": GOAL_MB, "cmp": "<",
         "pass": med["produce"] < GOAL_MB},
        {"name": f"consumer poll() peak RSS reading {mb} MiB back (MB)", "store": "local",
         "measured": med["poll"], "target": GOAL_MB, "cmp": "<",
         "pass": med["poll"] < GOAL_MB},
        {"name": "(info) poll_arrow() peak RSS (MB)", "store": "local",
         "measured": med["poll_arrow"], "target": None, "pass": None},
        {"name": "(info) peak RSS vs pyarrow writing / reading the same records as Parquet",
         "store": "local", "measured": [ratios["produce_vs_pyarrow_write"],
                                        ratios["poll_vs_pyarrow_read"]],
         "target": None, "pass": None},
        {"name": f"(info) Python data source tasks reading the partition compacted into "
                 f"segments of up to {last['source_read']['largest_object_bytes'] >> 20} MiB, "
                 "peak RSS (MB)", "store": "local", "measured": med["source_read"],
         "target": None, "pass": None},
        {"name": "(info) interpreter with txlog and pyarrow imported (MB)", "store": "local",
         "measured": floor, "target": None, "pass": None},
    ]
    return C.emit_json("memory", args.mode, mb=mb, rounds=rounds, goals=goals,
                       ratios=C.clean(ratios), peaks_mb=C.clean(peaks),
                       median_peak_mb=C.clean(med),
                       largest_poll_bytes=largest,
                       source_read={k: last["source_read"][k] for k in (
                           "tasks", "objects", "largest_object_bytes",
                           "largest_batch_bytes", "seconds")},
                       worst_buffered_bytes=last["produce"]["worst_buffered_bytes"],
                       with_pandas=args.with_pandas)


if __name__ == "__main__":
    main()
