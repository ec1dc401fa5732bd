"""Spark scan of a transactional topic (``format("txlog")``) vs ``spark.read.parquet`` of
the same committed rows.

N records of 100-byte random values (no two batches alike) in 8 partitions, once with 1%
and once with 30% of the transactions aborted, read read_committed.  The baseline is what
a user would otherwise keep: the committed rows with every column ``format("txlog")``
returns, written once by ``df.write.parquet`` with Spark's defaults and read by
``spark.read.parquet``.  In one Spark session (local[2]) and one run, interleaved over
several rounds, two queries:

* ``2col``: ``count(*), sum(length(value)), max(offset)`` (collected);
* ``all``: every column, ``df.write.format("noop")`` (materialised, nothing written);

against these readers:

* ``txlog``: ``spark.read.format("txlog")`` (txlog's JVM connector: planned by txlog's
  planner on the driver, its Kafka-shaped objects decoded by the connector's own decoder,
  pruned columns);
* ``parquet``: the baseline;
* ``batch_objects`` (diagnostic): ``spark.read.parquet`` of txlog's own committed batch
  objects, hard-linked into a plain dataset (four stored columns);
* ``txlog_python`` (``all`` only): ``format("txlog_python")``, txlog's Python data source,
  what ``format("txlog")`` is without the jar;
* ``txlog_parquet_decoder`` (diagnostic): ``format("txlog")`` with its objects decoded by
  Spark's vectorized Parquet reader (``txlog.scan.decoder=parquet``) instead of txlog's
  own decoder;
* ``txlog_per_partition_objects`` (diagnostic): ``format("txlog")`` of the same records
  written with ``batch.objects.shared=false`` (one object per partition per transaction,
  as before shared objects).

The producer writes each transaction's batches of a topic as one shared object, so a
topic is about 100 objects; the report says how many objects each read plans, and how
many the per-partition copy has.

``--compact`` then compacts the topics (``txlog maintain``: each partition's batches
merged into a segment, the aborted ones dropped; passes repeated until none compacts
more) and times ``txlog`` (and, locally on ``all``, ``txlog_python``) on them against the
same baseline, interleaved with it again: rows ``txlog (compacted)`` and ratios
``txlog_compacted_vs_parquet_*`` (``txlog_python_compacted_vs_parquet_*``), for
information (the goals are the uncompacted topics').

Goals: ``txlog`` at least 1.0 of ``parquet`` on ``2col`` and 0.9 on ``all``.  Ratios are
medians of per-round ratios (runs made back to back).  Prints rows/s, the ratios, and
one JSON line.

``--store s3`` does the same on SeaweedFS (started on 127.0.0.1 for the run): the topics
are written there by txlog's producer, ``format("txlog")`` is given the root's
``s3://`` URL and its ``storage_options`` once (the connector's scan reads each object
with one signed GET, with the endpoint and keys those options give), and the baseline is
written and read by Spark through S3A on the same server with the same settings.  There
``txlog`` and ``parquet`` are timed, and two diagnostics of ``format("txlog")``:
``txlog_s3a`` reads its batch objects through an S3A filesystem of its own
(``txlog.scan.s3a.signed.get=false``), and ``txlog_shared_s3a`` through Spark's shared
S3A filesystem with its default input stream (``txlog.scan.s3a.stream.type=shared``)
(``batch_objects`` and ``txlog_python`` are local diagnostics).  The table gives the CPU
seconds of Spark's JVM and of the SeaweedFS server apart.  On S3 both sides keep what
they read for a few seconds: hadoop-aws's default input stream keeps Parquet's blocks,
and the scan keeps the objects it read whole (``txlog.scan.cache.bytes``), so the
``all`` query that follows ``2col`` on the same topic reads both from memory.
``txlog_unkept`` is the scan with nothing kept (``txlog.scan.cache.bytes=0``), as the
diagnostics all are.

    .venv/bin/python scripts/bench/spark_scan.py --store local   # 200,000 records (--small)
    .venv/bin/python scripts/bench/spark_scan.py --store s3 --rounds 3
    .venv/bin/python scripts/bench/spark_scan.py --records 2000000   # the issue's figure
    .venv/bin/python scripts/bench/spark_scan.py --store local --small --compact --rounds 3
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

PARTITIONS = 8
VALUE_SIZE = 100
BATCHES_PER_PARTITION = 100  # transactions per topic; one batch per partition each


def build_topic(log: Any, topic: str, records: int, abort_pct: float, seed: int, *,
                shared: bool = True) -> dict[str, Any]:
    """``records`` records in transactions writing one batch to every partition; a fixed
    share of the transactions (chosen at random, seeded) aborted.  The producer writes
    each transaction's batches as one shared object (its default), or with ``shared``
    off one object per partition."""
    log.create_topic(topic, partitions=PARTITIONS)
    per_batch = max(1, records // (PARTITIONS * BATCHES_PER_PARTITION))
    txns = max(1, records // (per_batch * PARTITIONS))
    rng = random.Random(seed)
    aborted = set(rng.sample(range(txns), round(txns * abort_pct / 100)))
    # Every batch has values of its own: Kafka's records are not the same few thousand
    # values over and over, and a baseline Parquet writer would dictionary-encode such a
    # repeated set into almost nothing.
    def batch(i: int, part: int) -> Any:
        return C.kafka_records(per_batch, VALUE_SIZE, seed * 1_000_003 + i * PARTITIONS + part)

    config = {} if shared else {"batch.objects.shared": False}
    p = log.producer(transactional_id=f"bench-{topic}", **config)
    p.init_transactions()
    for i in range(txns):
        p.begin_transaction()
        for part in range(PARTITIONS):
            p.send_batch(topic, batch(i, part), partition=part)
        p.flush()
        if i in aborted:
            p.abort_transaction()
        else:
            p.commit_transaction()
        if i % 25 == 0:
            C.progress(f"  {topic}: {i}/{txns} transactions")
    total = txns * PARTITIONS * per_batch
    committed = (txns - len(aborted)) * PARTITIONS * per_batch
    return {"topic": topic, "records": total, "committed": committed, "txns": txns,
            "aborted_txns": len(aborted), "records_per_batch": per_batch}


def objects_read(info: dict[str, Any], storage_options: dict[str, Any], *,
                 topic: str | None = None) -> int:
    """How many objects a read of the topic plans (after compaction: its segments)."""
    from spark_ext.options import parse_read_options
    from spark_ext.read_plan import plan_batch

    opts = {"path": info["url"], "topic": topic or info["topic"]}
    if storage_options:
        opts["storage_options"] = json.dumps(storage_options)
    ro = parse_read_options(opts, streaming=False)
    return int(plan_batch(ro, ro.connect()).arrays.objects())


def plain_copy(url: str, topic: str, dest: Path) -> int:
    """Hard-link the committed batch objects (as planned by txlog) into a plain dataset
    (a local root's)."""
    import pyarrow.parquet as pq

    from spark_ext.options import parse_read_options
    from spark_ext.read_plan import plan_batch

    ro = parse_read_options({"path": url, "topic": topic}, streaming=False)
    log = ro.connect()
    plan = plan_batch(ro, log)
    dest.mkdir(parents=True)
    rows: dict[str, int] = {}
    for s in plan.slices:  # (a shared object's slices: one per partition it holds)
        rows[s.key] = rows.get(s.key, 0) + s.take
    for i, (key, n) in enumerate(rows.items()):
        path = log.store.fs_path(key)
        assert pq.ParquetFile(path).metadata.num_rows == n, "committed objects are read whole"
        os.link(path, dest / f"part-{i:06d}.parquet")
    return sum(rows.values())


def main() -> None:
    # Five rounds in --small: with three, the Python source's ratio of the same code
    # moved widely between runs (docs/benchmarks.md).
    C.records_main(__doc__.splitlines()[0], records=(20_000, 200_000, 5_000_000),
                   rounds=(1, 5, 3), prefix="txlog-spark-scan-", run=run, per="topic",
                   stores=True, flags={"compact": "also scan the topics after `txlog "
                                                  "maintain` compacted them"})


QUERIES = ("2col", "all")


def prepare(target: C.Target, records: int, work: Path) -> dict[int, dict[str, Any]]:
    """The two topics on ``target`` (1% and 30% aborted), and on a local root the plain
    copy of their committed batch objects."""
    url = target.url("lake")
    log = target.connect(url)
    topics = {}
    for pct in (1, 30):
        C.progress(f"{target.name}: writing {records:,} records, {pct}% of transactions "
                   "aborted")
        topics[pct] = {"url": url, **build_topic(log, f"scan{pct}", records, pct, seed=pct)}
        # Diagnostic: the same records with one object per partition per transaction.
        build_topic(log, f"scan{pct}pp", records, pct, seed=pct, shared=False)
        topics[pct]["objects"] = objects_read(topics[pct], target.storage_options)
        topics[pct]["objects_per_partition_topic"] = objects_read(
            topics[pct], target.storage_options, topic=f"scan{pct}pp")
        C.progress(f"{target.name}: scan{pct} reads {topics[pct]['objects']} objects, "
                   f"scan{pct}pp (one object per partition) "
                   f"{topics[pct]['objects_per_partition_topic']}")
        if target.name == "local":
            plain = work / f"plain{pct}-{target.name}"
            topics[pct]["plain"] = str(plain)
            topics[pct]["plain_rows"] = plain_copy(url, f"scan{pct}", plain)
            assert topics[pct]["plain_rows"] == topics[pct]["committed"]
    return topics


def compact_topics(target: C.Target, topics: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``txlog maintain`` over the topics until a pass compacts nothing more (one pass
    merges one range of each partition); returns what it did and how long it took."""
    from txlog.maintenance import maintain

    log = target.connect(topics[min(topics)]["url"])
    names = [info["topic"] for info in topics.values()]
    done: dict[str, Any] = {"passes": 0, "compacted_batches": 0,
                            "dropped_aborted_batches": 0, "segments_written": 0}

    def progress(n: int, total: int, what: str) -> None:
        if n < total:
            C.progress(f"{target.name}: maintain pass {done['passes'] + 1}: partition "
                       f"{n + 1}/{total} ({what})")

    with C.Timer() as t:
        while True:
            report = maintain(log, names, progress=progress)
            if report.failures:
                raise RuntimeError(f"txlog maintain failed: {report.failures}")
            done["passes"] += 1
            merged = sum(p.compacted_batches for p in report.partitions)
            for k in ("compacted_batches", "dropped_aborted_batches", "segments_written"):
                done[k] += sum(getattr(p, k) for p in report.partitions)
            if merged == 0:
                break
    done["seconds"] = t.elapsed
    C.progress(f"{target.name}: compacted {done['compacted_batches']:,} batches into "
               f"{done['segments_written']} segments ({done['dropped_aborted_batches']:,} "
               f"aborted dropped) in {t.elapsed:.1f}s, {done['passes']} passes")
    return done


def run(mode: str, records: int, rounds: int, work: Path, *, store: str,
        compact: bool = False) -> None:
    import spark_ext

    with C.targets(store) as targets:
        prepared = {t.name: prepare(t, records, work) for t in targets}
        spark = C.start_spark("txlog-spark-scan", s3a=any(t.name == "s3" for t in targets))
        assert spark_ext.jvm_connector_loaded(spark), "format('txlog') is not the JVM connector"
        out = {t.name: measure(spark, t, prepared[t.name], rounds, records, compact=compact)
               for t in targets}
        spark.stop()
    ratios = {k: v for o in out.values() for k, v in o["ratios"].items()}
    goals = [g for o in out.values() for g in o["goals"]]
    C.emit_json("spark_scan", mode, records=records, rounds=rounds, compact=compact,
                ratio=min(v for k, v in ratios.items() if k.startswith("txlog_vs_parquet_2col")),
                ratios=C.clean(ratios), goals=C.clean(goals),
                results=C.clean({n: o["results"] for n, o in out.items()}),
                load_average=C.clean(os.getloadavg()[0]))


def measure(spark: Any, target: C.Target, topics: dict[int, dict[str, Any]], rounds: int,
            records: int, *, compact: bool = False) -> dict[str, Any]:
    """Interleaved rounds of the readers on ``target``'s topics (then, with ``compact``,
    of ``txlog`` and the baseline on the compacted topics); prints the table and returns
    the ratios, goals and results."""
    where = C.spark_target(spark, target)
    s3 = target.name == "s3"
    suffix = "_s3" if s3 else ""
    options = json.dumps(target.storage_options) if target.storage_options else None

    def txlog_df(pct: int, fmt: str = "txlog", suffix: str = "") -> Any:
        r = spark.read.format(fmt).option("path", topics[pct]["url"])
        if options is not None:  # said once: the connector maps them to S3A's settings
            r = r.option("storage_options", options)
        return r.option("topic", f"scan{pct}{suffix}").load()

    baseline = {pct: where.path(f"baseline{pct}-{uuid.uuid4().hex[:8]}") for pct in topics}
    for pct in topics:  # the baseline: written once, Spark's defaults
        txlog_df(pct).write.parquet(baseline[pct])

    readers = {
        "txlog": txlog_df,
        "parquet": lambda pct: spark.read.parquet(baseline[pct]),
    }
    if not s3:
        readers["batch_objects"] = lambda pct: spark.read.parquet(topics[pct]["plain"])
        readers["txlog_python"] = lambda pct: txlog_df(pct, "txlog_python")
    else:
        # Diagnostics: the scan reading its objects through an S3A filesystem of its own
        # instead of its signed GETs, and through Spark's shared S3A filesystem with its
        # default input stream.
        readers["txlog_s3a"] = txlog_df
        readers["txlog_shared_s3a"] = txlog_df
        # The scan with nothing kept in memory from one query to the next.
        readers["txlog_unkept"] = txlog_df
    readers["txlog_parquet_decoder"] = txlog_df
    # Diagnostic: the same rows in one object per partition per transaction.
    readers["txlog_per_partition_objects"] = lambda pct: txlog_df(pct, suffix="pp")
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()

    # The diagnostics keep nothing in memory (on S3, where the scan keeps what it read for
    # a few seconds): each measures its own reads, not those of the reader before it.
    unkept = ("txlog.scan.cache.bytes", "0")
    diagnostic = {"txlog_s3a": [("txlog.scan.s3a.signed.get", "false"), unkept],
                  "txlog_shared_s3a": [("txlog.scan.s3a.stream.type", "shared"), unkept],
                  "txlog_parquet_decoder": [("txlog.scan.decoder", "parquet"), unkept],
                  "txlog_per_partition_objects": [unkept],
                  "txlog_unkept": [unkept]}

    @contextlib.contextmanager
    def settings_of(name: str) -> Iterator[None]:
        for key, value in diagnostic.get(name, []):
            hadoop.set(key, value)
        try:
            yield
        finally:
            for key, _ in diagnostic.get(name, []):
                hadoop.unset(key)

    def two_columns(df: Any) -> tuple[Any, ...]:
        return tuple(df.selectExpr("count(*)", "sum(length(value))", "max(offset)")
                     .collect()[0])

    def all_columns(df: Any) -> None:
        df.write.format("noop").mode("overwrite").save()

    def runs(query: str) -> list[str]:
        # txlog's batch objects have no offset column: they are timed on all columns only.
        names = ["txlog", "parquet"]
        extra = [n for n in readers if n not in names
                 and (query == "all" or (n.startswith("txlog_") and n != "txlog_python"))]
        return [*names, *extra]

    # Warm-up (JIT, Python workers) and a check that txlog and the baseline agree.
    for pct in topics:
        want = two_columns(readers["parquet"](pct))
        assert want[0] == topics[pct]["committed"], (pct, want)
        for name in readers:
            with settings_of(name):
                if name.startswith("txlog") and name != "txlog_python":
                    assert two_columns(readers[name](pct)) == want, (name, pct)
                assert readers[name](pct).count() == want[0], (name, pct)
                all_columns(readers[name](pct))

    times: dict[tuple[int, str, str], list[float]] = {}
    cpus: dict[tuple[int, str, str], list[float]] = {}
    # The same CPU seconds by process: the server's (weed) and Spark's JVM's.
    parts: dict[tuple[int, str, str], dict[str, list[float]]] = {}
    # Objects each run read from the scan's memory (whether a run found them kept depends
    # on how long the runs between took: the report shows it).
    from_memory: dict[tuple[int, str, str], list[int]] = {}
    kept = spark.sparkContext._jvm.java.lang.Thread.currentThread().getContextClassLoader() \
        .loadClass("io.txlog.spark.RecentObjects")
    shared_field = kept.getDeclaredField("SHARED")
    shared_field.setAccessible(True)
    hits_method = kept.getDeclaredMethod("hits", None)
    hits_method.setAccessible(True)

    def memory_hits() -> int:
        return int(hits_method.invoke(shared_field.get(None), None))

    def timed_rounds(runs_of: Any, phase: str = "") -> None:
        """``rounds`` rounds of ``runs_of(query)``'s readers, timed into ``times`` and
        ``cpus`` under their name with ``phase`` appended."""
        for r in range(rounds):
            for pct in topics:
                for query, fn in (("2col", two_columns), ("all", all_columns)):
                    # Parquet next to txlog in both orders (flipped every round).
                    order = runs_of(query) if r % 2 == 0 else runs_of(query)[::-1]
                    for name in order:
                        cpu0, hits0 = C.tree_cpu_parts(), memory_hits()
                        with settings_of(name), C.Timer() as t:
                            fn(readers[name](pct))
                        cpu1 = C.tree_cpu_parts()
                        key = (pct, query, name + phase)
                        from_memory.setdefault(key, []).append(memory_hits() - hits0)
                        cpus.setdefault(key, []).append(sum(cpu1.values())
                                                        - sum(cpu0.values()))
                        for part in cpu1:
                            parts.setdefault(key, {}).setdefault(part, []).append(
                                cpu1[part] - cpu0[part])
                        times.setdefault(key, []).append(t.elapsed)
                        C.progress(f"{target.name} round {r + 1}/{rounds} {pct}% {query} "
                                   f"{name}{phase}: {t.elapsed:.2f}s")

    def compacted_runs(query: str) -> list[str]:
        # The Python source reads a segment's runs from one fetch of it, a row group at a
        # time: timed on all columns, as above (local only).
        return ["txlog", "parquet", *(["txlog_python"] if query == "all" and not s3 else [])]

    timed_rounds(runs)
    compaction = None
    if compact:
        compaction = compact_topics(target, topics)
        for pct in topics:  # the compacted topics return the same rows, from segments
            want = two_columns(readers["parquet"](pct))
            assert two_columns(readers["txlog"](pct)) == want, pct
            assert objects_read(topics[pct], target.storage_options) == PARTITIONS, pct
            all_columns(readers["txlog"](pct))
            if not s3:
                assert readers["txlog_python"](pct).count() == want[0], pct
                all_columns(readers["txlog_python"](pct))
        timed_rounds(compacted_runs, "_compacted")

    rows = []
    goals = []
    ratios: dict[str, float] = {}
    results: dict[str, Any] = {}
    for pct, info in topics.items():
        res: dict[str, Any] = {"aborted_pct": pct, **{k: v for k, v in info.items()
                                                      if k not in ("url", "plain")}}
        for query in QUERIES:
            for name in runs(query):
                key = (pct, query, name)
                speed = C.paired_ratio(times[(pct, query, "parquet")], times[key])
                cpu = C.paired_ratio(cpus[(pct, query, "parquet")], cpus[key])
                sec = C.median(times[key])
                res[f"{query}_{name}"] = {"seconds": sec, "all_seconds": times[key],
                                          "cpu_seconds": C.median(cpus[key]),
                                          "cpu_seconds_by_process": {
                                              k: C.median(v) for k, v in parts[key].items()},
                                          "objects_from_memory": from_memory[key],
                                          "vs_parquet": speed, "cpu_vs_parquet": cpu}
                ratios[f"{name}_vs_parquet_{query}_{pct}pct{suffix}"] = speed
                rows.append([f"{pct}%", query, name, sec, info["committed"] / sec, speed,
                             C.median(cpus[key]), cpu, C.median(parts[key]["java"]),
                             C.median(parts[key]["weed"]),
                             "/".join(map(str, from_memory[key]))])
            target_ratio = 1.0 if query == "2col" else 0.9
            got = ratios[f"txlog_vs_parquet_{query}_{pct}pct{suffix}"]
            label = ("count(*), sum(length(value)), max(offset)" if query == "2col"
                     else "all columns")
            base = ("spark.read.parquet of the same rows through s3a on the same server"
                    if s3 else "spark.read.parquet of the same rows")
            goals.append({"name": f"spark.read.format('txlog') {label} read_committed vs "
                                  f"{base}, {pct}% aborted",
                          "store": target.name, "measured": got, "target": target_ratio,
                          "cmp": ">=", "pass": bool(got >= target_ratio)})
            for name in compacted_runs(query) if compact else []:
                if name == "parquet":
                    continue
                key = (pct, query, f"{name}_compacted")
                speed = C.paired_ratio(times[(pct, query, "parquet_compacted")], times[key])
                cpu = C.paired_ratio(cpus[(pct, query, "parquet_compacted")], cpus[key])
                sec = C.median(times[key])
                res[f"{query}_{name}_compacted"] = {
                    "seconds": sec, "all_seconds": times[key],
                    "cpu_seconds": C.median(cpus[key]),
                    "cpu_seconds_by_process": {k: C.median(v) for k, v in parts[key].items()},
                    "objects_from_memory": from_memory[key],
                    "vs_parquet": speed, "cpu_vs_parquet": cpu}
                ratios[f"{name}_compacted_vs_parquet_{query}_{pct}pct{suffix}"] = speed
                rows.append([f"{pct}%", query, f"{name} (compacted)", sec,
                             info["committed"] / sec, speed, C.median(cpus[key]), cpu,
                             C.median(parts[key]["java"]), C.median(parts[key]["weed"]),
                             "/".join(map(str, from_memory[key]))])
                goals.append({"name": f"(info) format('{name}') {label} of the topic "
                                      f"compacted by txlog maintain vs {base}, {pct}% aborted",
                              "store": target.name, "measured": speed, "target": None,
                              "cmp": "info", "pass": None})
        if not s3:
            py = ratios[f"txlog_python_vs_parquet_all_{pct}pct"]
            goals.append({"name": f"(info) format('txlog_python') (the Python data source) "
                                  f"all columns vs spark.read.parquet, {pct}% aborted",
                          "store": "local", "measured": py, "target": None, "cmp": "info",
                          "pass": None})
        results[f"{pct}pct"] = res
    if compaction is not None:
        results["compaction"] = compaction
    C.print_table(f"Spark scan on {target.name} ({target.note}), {records:,} records x 2 "
                  f"topics, {PARTITIONS} partitions, {VALUE_SIZE}-byte values, local[2], "
                  f"median of {rounds} (ratios: medians of per-round ratios to parquet)",
                  ["aborted", "query", "reader", "seconds", "rows/s", "vs parquet", "CPU s",
                   "CPU vs parquet", "JVM CPU s", "weed CPU s", "from memory"], rows)
    for pct, info in topics.items():
        print(f"{pct}% topic: {info['objects']} batch objects read (shared objects), "
              f"{info['objects_per_partition_topic']} in the same rows written one object "
              "per partition (txlog_per_partition_objects)")
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
          "(wall-time ratios are only meaningful on an idle machine; CPU ratios much more)")
    return {"ratios": ratios, "goals": goals, "results": results}


if __name__ == "__main__":
    main()
