"""Exactly-once into Delta (``exactly_once.run(sink_delta=...)``) vs the same Spark job
reading Parquet and appending to the same Delta table without txlog.

N Kafka-shaped records (string keys, 100-byte values) are committed once to a
txlog topic of 8 partitions and written once as Parquet (the same rows, read back from the
topic, with the same columns).  Then, in one local[2] session with delta-spark, interleaved
over several rounds (order flipped each round), the same transform runs as

* ``txlog``: ``exactly_once.run`` with a new group id (so it reads the whole topic) and
  ``sink_delta`` = the table: fencing, offsets and LSO, the read_committed scan, the Delta
  append with txnAppId/txnVersion, the table's record read back and the offset commit;
* ``parquet``: ``spark.read.parquet`` of the same rows, the same transform and a plain
  Delta append to the same table;
* ``parquet_txn`` (information): the same Parquet job appending with Delta's
  ``txnAppId``/``txnVersion``, i.e. Delta's own price for an idempotent write;

and reports rows/s and the paired throughput ratios (goal: txlog >= 0.9 of parquet).

    .venv/bin/python scripts/bench/delta_exactly_once.py            # 1,000,000 (--small)
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

PARTITIONS = 8
VALUE_SIZE = 100
WARMUP = 2


def transform(df: Any) -> Any:
    """What both jobs write: key and value as strings, the source position, a value length."""
    from pyspark.sql import functions as F

    return df.select(F.col("key").cast("string").alias("key"),
                     F.col("value").cast("string").alias("value"),
                     F.length("value").alias("value_bytes"), "partition", "offset")


def main() -> None:
    C.records_main(__doc__.splitlines()[0], records=(20_000, 1_000_000, 5_000_000),
                   rounds=(1, 7, 9), prefix="txlog-delta-eos-", run=run)


def run(mode: str, records: int, rounds: int, work: Path) -> None:
    import spark_ext
    import spark_ext.delta
    import spark_ext.exactly_once as eos
    import txlog

    spark = spark_ext.delta.local_session("txlog-delta-eos", **{"spark.driver.memory": "2g"})

    root, table, parquet = str(work / "lake"), str(work / "table"), str(work / "parquet")
    txlog.connect(root).create_topic("src", partitions=PARTITIONS)
    C.progress(f"writing {records:,} records to the topic and to Parquet")
    df = C.kafka_shaped_frame(spark, records, VALUE_SIZE)
    res = spark_ext.write(df, root, topic="src")
    assert res is None or res.rows == records
    # The baseline's input: the same rows with the same columns, as Parquet.
    spark_ext.read(spark, root, topic="src").write.parquet(parquet)

    def job_txlog(i: int) -> None:
        out = eos.run(spark, path=root, source_topic="src", group_id=f"bench-{i}",
                      sink_delta=table, transform=transform)
        assert len(out.rounds) == 1 and out.rounds[0].offsets >= records

    def job_parquet(i: int) -> None:
        transform(spark.read.parquet(parquet)).write.format("delta").mode("append").save(table)

    txn_versions = itertools.count(1)

    def job_parquet_txn(i: int) -> None:
        (transform(spark.read.parquet(parquet)).write.format("delta").mode("append")
         .option("txnAppId", "bench-parquet").option("txnVersion", str(next(txn_versions)))
         .save(table))

    sides = {"txlog": job_txlog, "parquet": job_parquet, "parquet_txn": job_parquet_txn}
    times, cpus = C.spark_rounds(sides, rounds=rounds, warmup=WARMUP)
    rows_in_table = spark.read.format("delta").load(table).count()
    spark.stop()
    assert rows_in_table == records * len(sides) * (rounds + WARMUP), rows_in_table

    ratio = C.paired_ratio(times["parquet"], times["txlog"])
    cpu_ratio = C.paired_ratio(cpus["parquet"], cpus["txlog"])
    txn_ratio = C.paired_ratio(times["parquet_txn"], times["txlog"])
    vs = {"txlog": ratio, "parquet": 1.0,
          "parquet_txn": C.paired_ratio(times["parquet"], times["parquet_txn"])}
    rate = {n: records / C.median(times[n]) for n in sides}
    load = os.getloadavg()[0]
    C.print_table(f"Into Delta, {records:,} records, {VALUE_SIZE}-byte values, {PARTITIONS} "
                  f"source partitions, local[2], median of {rounds} (ratios: medians of "
                  "per-round ratios)",
                  ["job", "seconds", "rows/s", "vs parquet", "CPU s"],
                  [[n, C.median(times[n]), rate[n],
                    vs[n], C.median(cpus[n])] for n in sides])
    print(f"load average while measuring: {load:.1f} on {os.cpu_count()} CPUs "
          "(wall-time ratios are only meaningful on an idle machine; CPU ratios much more)")
    goals = [{"name": "exactly_once.run into Delta vs Parquet -> the same Delta table "
                      "(throughput)", "store": "local", "measured": ratio, "target": 0.9,
              "cmp": ">=", "pass": bool(ratio >= 0.9)},
             {"name": "(info) the same, CPU seconds ratio", "store": "local",
              "measured": cpu_ratio, "target": None, "cmp": "info", "pass": None},
             {"name": "(info) exactly_once.run into Delta vs Parquet -> Delta with "
                      "txnAppId/txnVersion (throughput)", "store": "local",
              "measured": txn_ratio, "target": None, "cmp": "info", "pass": None}]
    C.emit_json("delta_exactly_once", mode, records=records, rounds=rounds,
                partitions=PARTITIONS, ratio=ratio, cpu_ratio=cpu_ratio, txn_ratio=txn_ratio,
                rows_per_s=C.clean(rate), seconds=C.clean(times),
                cpu_seconds=C.clean(cpus), load_average=C.clean(load), goals=C.clean(goals))


if __name__ == "__main__":
    main()
