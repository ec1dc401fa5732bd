"""Spark transactional write (``df.write.format("txlog")``) vs ``df.write.parquet`` of the
same rows.

One cached DataFrame of N Kafka-shaped records (string keys, 100-byte values), written in
one Spark session (local[2]), interleaved over several rounds, as

* ``df.write.format("txlog")`` (txlog's JVM connector) to an 8-partition topic: tasks
  route rows by Kafka's murmur2 of the key and write one Parquet object per partition
  with Spark's own Parquet writer; txlog's planner on the driver appends and commits one
  transaction;
* ``df.write.format("txlog_python")`` (txlog's Python data source, what
  ``format("txlog")`` is without the jar): the same, with the rows routed and encoded in
  Python workers (rows cross from the JVM as Arrow);
* ``df.write.parquet`` of the same DataFrame (snappy, as txlog writes);

and reports rows/s and the throughput ratio (goal: txlog >= 1.0 of Parquet).

Durability differs on the local disk: txlog syncs every object it writes before the log
names it (the JVM writer forces each staged file, the commit syncs its own), while
``df.write.parquet`` syncs nothing (strace counts no fsync or fdatasync in its write). So
the goal rows compare at equal durability: ``format("txlog")`` to a root opened with the
storage option ``{"fsync": false}`` (creates stay atomic, a killed job loses nothing; a
power loss may lose the newest commit, as it may lose Parquet's output). txlog's fsynced
default is measured in the same rounds and reported beside them, as small_txn.py does.

It also counts the object-store requests of one commit (``log.store.counter``) as a
function of the number of partitions written: files are staged outside Spark (exactly as
a task stages them) and ``spark_ext.writer.commit_staged`` runs on a fresh ``Log``, as the
commit worker does.

``--store s3`` writes on SeaweedFS (started on 127.0.0.1 for the run) instead:
``format("txlog")`` to an ``s3://`` root, given its ``storage_options`` once (the
connector's tasks stage through Spark's S3A filesystem), against ``df.write.parquet`` to
an ``s3a://`` folder on the same server with the same settings (Spark's default
committer).  No fsync applies there, so only those two are timed.

    .venv/bin/python scripts/bench/spark_write.py --store local   # 1,000,000 records (--small)
    .venv/bin/python scripts/bench/spark_write.py --store s3 --rounds 3
    .venv/bin/python scripts/bench/spark_write.py --full     # 5,000,000 records
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

PARTITIONS = 8
VALUE_SIZE = 100
COMMIT_PARTITIONS = (1, 2, 4, 8, 16, 32)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def commit_requests(work: Path, partitions: int) -> dict[str, Any]:
    """Object-store requests of one commit that appends one staged file per partition."""
    import pyarrow as pa

    import txlog
    from spark_ext import staging
    from spark_ext.write_options import parse_write_options
    from spark_ext.writer import commit_staged, new_staging_id

    url = str(work / f"commit-{partitions}")
    setup = txlog.connect(url)
    setup.create_topic("t", partitions=partitions)
    wo = parse_write_options({"path": url, "topic": "t"}, streaming=False)
    results = []
    for _ in range(2):  # the second commit sees partitions that already have a log
        txn = new_staging_id()
        info = setup.topic("t")
        spec = staging.StageSpec(url=url, storage_options={}, txn=txn, topic="t",
                                 targets={"t": staging.TopicTarget("t", partitions, True,
                                                                   info.schema)},
                                 columns=["key", "value"], partitioner="default")
        stager = staging.Stager(spec, task=0, attempt_id=0, attempt=0)
        for p in range(partitions):
            stager.add(pa.record_batch({"value": pa.array([b"v"] * 10),
                                        "partition": pa.array([p] * 10, pa.int32())}))
        files = stager.finish()
        lg = txlog.connect(url)  # fresh caches, as in Spark's commit worker
        lg.store.counter.reset()
        res = commit_staged(wo, files, [txn], ["t"], lg=lg)
        assert res.files == partitions and res.skipped is None
        results.append(dict(lg.store.counter.snapshot()["requests"]))
    first, steady = results
    return {"partitions": partitions, "first_commit": sum(first.values()),
            "requests": sum(steady.values()), "by_kind": steady}


#: Rounds of every writer before the measured ones: a single one left the JIT still
#: speeding both Parquet writers up through the first measured rounds.
WARMUP = 3


def main() -> None:
    # Fifteen rounds in --small too: with fewer, the paired ratio of the same code moved
    # by a tenth between runs (docs/benchmarks.md).
    C.records_main(__doc__.splitlines()[0], records=(50_000, 1_000_000, 5_000_000),
                   rounds=(1, 15, 9), prefix="txlog-spark-write-", run=run, stores=True)


def run(mode: str, records: int, rounds: int, work: Path, *, store: str) -> None:
    with C.targets(store) as targets:
        spark = C.start_spark("txlog-spark-write", s3a=any(t.name == "s3" for t in targets))
        df = C.kafka_shaped_frame(spark, records, VALUE_SIZE).cache()
        assert df.count() == records
        out: dict[str, dict[str, Any]] = {}
        for t in targets:
            if t.name == "local":
                out["local"] = measure_local(spark, df, records, rounds, work)
            else:
                out[t.name] = measure_remote(spark, df, t, records, rounds)
        spark.stop()
    fields = dict(out.get("local", {}).get("fields", {}))
    for name, o in out.items():
        if name != "local":
            fields[name] = o["fields"]
    fields["ratio"] = min(o["ratio"] for o in out.values())
    ratios = {k: v for o in out.values() for k, v in o["ratios"].items()}
    C.emit_json("spark_write", mode, records=records, rounds=rounds, partitions=PARTITIONS,
                ratios=C.clean(ratios), **fields, load_average=C.clean(os.getloadavg()[0]),
                goals=C.clean([g for o in out.values() for g in o["goals"]]))


def measure_remote(spark: Any, df: Any, target: C.Target, records: int,
                   rounds: int) -> dict[str, Any]:
    """``format("txlog")`` and ``df.write.parquet`` on a remote store, interleaved."""
    url = target.url("lake")
    target.connect(url).create_topic("bench", partitions=PARTITIONS)
    where = C.spark_target(spark, target)
    options = json.dumps(target.storage_options)

    def write_jvm(i: int) -> None:
        (df.write.format("txlog").option("path", url).option("topic", "bench")
         .option("storage_options", options).mode("append").save())

    def write_parquet(i: int) -> None:
        df.write.parquet(where.path(f"parquet-{i}-{uuid.uuid4().hex[:8]}"))

    variants = {"jvm": write_jvm, "parquet": write_parquet}
    times, cpus = C.spark_rounds(variants, rounds=rounds, warmup=WARMUP)
    check = target.connect(url)
    hw = sum(check.partition_log(tp).refresh().high_watermark
             for tp in check.partitions_for("bench"))
    assert hw >= records * (rounds + WARMUP), (hw, records, rounds)
    ratio = C.paired_ratio(times["parquet"], times["jvm"])
    cpu_ratio = C.paired_ratio(cpus["parquet"], cpus["jvm"])
    rate = {n: records / C.median(times[n]) for n in variants}
    vs = {"jvm": (ratio, cpu_ratio), "parquet": (1.0, 1.0)}
    C.print_table(f"Spark write on {target.name} ({target.note}), {records:,} records, "
                  f"{VALUE_SIZE}-byte values, topic of {PARTITIONS} partitions, local[2], "
                  f"median of {rounds} (ratios: medians of per-round ratios)",
                  ["writer", "seconds", "rows/s", "vs parquet", "CPU s", "CPU vs parquet"],
                  [[n, C.median(times[n]), rate[n], vs[n][0], C.median(cpus[n]), vs[n][1]]
                   for n in variants])
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    s = target.name
    goals = [{"name": "df.write.format('txlog') (JVM connector, through s3a) transactional "
                      "write vs df.write.parquet through s3a to the same server "
                      "throughput", "store": s, "measured": ratio, "target": 1.0,
              "cmp": ">=", "pass": bool(ratio >= 1.0)},
             {"name": "(info) the same, CPU efficiency (CPU s ratio)", "store": s,
              "measured": cpu_ratio, "target": None, "cmp": "info", "pass": None}]
    return {"ratio": ratio, "ratios": {f"jvm_vs_parquet_{s}": ratio,
                                       f"jvm_cpu_vs_parquet_{s}": cpu_ratio},
            "goals": goals,
            "fields": {"ratio": ratio, "cpu_ratio": cpu_ratio, "rows_per_s": C.clean(rate),
                       "seconds": C.clean(times), "cpu_seconds": C.clean(cpus)}}


def measure_local(spark: Any, df: Any, records: int, rounds: int,
                  work: Path) -> dict[str, Any]:
    import txlog

    C.progress("object-store requests per commit")
    per_commit = [commit_requests(work, n) for n in COMMIT_PARTITIONS]

    # The goal side's root does not fsync, as df.write.parquet does not (module docstring).
    urls = {"synced": str(work / "lake"), "unsynced": str(work / "lake-nofsync")}
    nosync = {"fsync": False}
    txlog.connect(urls["synced"]).create_topic("bench", partitions=PARTITIONS)
    txlog.connect(urls["unsynced"], nosync).create_topic("bench", partitions=PARTITIONS)

    import spark_ext

    assert spark_ext.jvm_connector_loaded(spark), "format('txlog') is not the JVM connector"

    def write_jvm(i: int) -> Path:
        (df.write.format("txlog").option("path", urls["unsynced"]).option("topic", "bench")
         .option("storage_options", json.dumps(nosync)).mode("append").save())
        return Path(urls["unsynced"]) / "topics" / "bench"

    def write_jvm_fsync(i: int) -> Path:
        (df.write.format("txlog").option("path", urls["synced"]).option("topic", "bench")
         .mode("append").save())
        return Path(urls["synced"]) / "topics" / "bench"

    def write_python(i: int) -> Path:
        (df.write.format("txlog_python").option("path", urls["synced"])
         .option("topic", "bench").mode("append").save())
        return Path(urls["synced"]) / "topics" / "bench"

    def write_parquet(i: int) -> Path:
        out = work / f"parquet-{i}"
        df.write.parquet(str(out))
        return out

    # Parquet between the two JVM writes, in both orders: each ratio to it is of writes made
    # back to back, so the drift over a run (this machine's speed moves by tens of percent
    # within minutes) cancels in each round's ratio.
    variants = {"jvm": write_jvm, "parquet": write_parquet, "jvm_fsync": write_jvm_fsync,
                "python": write_python}
    out_dir = {"jvm": urls["unsynced"], "jvm_fsync": urls["synced"], "python": urls["synced"]}
    sizes: dict[str, int] = {}
    bytes_before: dict[str, int] = {}

    def before(name: str) -> None:
        bytes_before[name] = dir_bytes(Path(out_dir[name])) if name in out_dir else 0

    def after(name: str, out: Path) -> None:
        sizes[name] = dir_bytes(out) - bytes_before[name]

    times, cpus = C.spark_rounds(variants, rounds=rounds, warmup=WARMUP, before=before,
                                 after=after)

    for url, writers in ((urls["unsynced"], 1), (urls["synced"], 2)):
        check = txlog.connect(url)
        hw = sum(check.partition_log(tp).refresh().high_watermark
                 for tp in check.partitions_for("bench"))
        written = records * (rounds + WARMUP) * writers
        assert hw >= written, (url, hw, written)

    rate = {n: records / C.median(times[n]) for n in variants}
    cpu = {n: C.median(cpus[n]) for n in variants}

    def per_round(name: str, of: dict[str, list[float]]) -> float:
        return C.paired_ratio(of["parquet"], of[name])

    # The JVM writers' ratios per round (written next to parquet's); the Python writer's
    # runs two writes away, so its ratio is of the medians.
    ratio, cpu_ratio = per_round("jvm", times), per_round("jvm", cpus)
    fsync_ratio, fsync_cpu_ratio = per_round("jvm_fsync", times), per_round("jvm_fsync", cpus)
    py_ratio = C.ratio(rate["python"], rate["parquet"])
    vs = {"jvm": (ratio, cpu_ratio), "jvm_fsync": (fsync_ratio, fsync_cpu_ratio),
          "python": (py_ratio, C.ratio(cpu["parquet"], cpu["python"])), "parquet": (1.0, 1.0)}
    rows = [[n, C.median(times[n]), rate[n], vs[n][0], cpu[n], vs[n][1], sizes[n] / 1e6]
            for n in variants]
    C.print_table(f"Spark write, {records:,} records, {VALUE_SIZE}-byte values, topic of "
                  f"{PARTITIONS} partitions, local[2], median of {rounds} (jvm: fsync off, "
                  "as parquet; jvm_fsync and python: txlog's default fsync; the JVM "
                  "writers' ratios are medians of per-round ratios)",
                  ["writer", "seconds", "rows/s", "vs parquet", "CPU s", "CPU vs parquet",
                   "MB"], rows)
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
          "(wall-time ratios are only meaningful on an idle machine; CPU ratios much more)")
    C.print_table("Object-store requests of one commit (one staged file per partition; "
                  "steady state, and the very first commit to a fresh topic)",
                  ["partitions", "requests", "per partition", "first commit", "by kind"],
                  [[c["partitions"], c["requests"], c["requests"] / c["partitions"],
                    c["first_commit"],
                    ", ".join(f"{k}={v}" for k, v in sorted(c["by_kind"].items()))]
                   for c in per_commit])
    a, b = per_commit[0], per_commit[-1]
    slope = (b["requests"] - a["requests"]) / (b["partitions"] - a["partitions"])
    goals = [{"name": "df.write.format('txlog') (JVM connector) transactional write vs "
                      "df.write.parquet throughput (both without fsync)", "store": "local",
              "measured": ratio, "target": 1.0, "cmp": ">=", "pass": bool(ratio >= 1.0)},
             {"name": "(info) df.write.format('txlog') write CPU efficiency vs "
                      "df.write.parquet (CPU s ratio, both without fsync)", "store": "local",
              "measured": cpu_ratio, "target": None, "cmp": "info", "pass": None},
             {"name": "(info) df.write.format('txlog_python') (the Python data source) vs "
                      "df.write.parquet throughput", "store": "local", "measured": py_ratio,
              "target": None, "cmp": "info", "pass": None},
             {"name": "(info) the same throughput with txlog's default fsync "
                      "(df.write.parquet does not fsync)", "store": "local",
              "measured": fsync_ratio, "target": None, "cmp": "info", "pass": None},
             {"name": "(info) the same CPU efficiency with txlog's default fsync",
              "store": "local", "measured": fsync_cpu_ratio, "target": None, "cmp": "info",
              "pass": None}]
    ratios = {"jvm_vs_parquet": ratio, "jvm_cpu_vs_parquet": cpu_ratio,
              "python_vs_parquet": py_ratio, "jvm_fsync_vs_parquet": fsync_ratio,
              "jvm_fsync_cpu_vs_parquet": fsync_cpu_ratio}
    return {"ratio": ratio, "ratios": ratios, "goals": goals, "fields": dict(
        ratio=ratio, cpu_ratio=cpu_ratio, python_ratio=py_ratio,
        per_round_ratio=C.clean([C.ratio(p, w) for p, w in
                                 zip(times["parquet"], times["jvm"], strict=True)]),
        fsync_ratio=fsync_ratio, fsync_cpu_ratio=fsync_cpu_ratio,
        rows_per_s=C.clean(rate),
        seconds=C.clean({n: times[n] for n in variants}),
        cpu_seconds=C.clean({n: cpus[n] for n in variants}),
        requests_per_commit=C.clean({str(c["partitions"]): c["requests"]
                                     for c in per_commit}),
        requests_per_extra_partition=C.clean(slope),
        commit_detail=C.clean(per_commit))}

if __name__ == "__main__":
    main()
