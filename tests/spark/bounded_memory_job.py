"""A Spark driver with a small heap that writes large batch objects and reads them back
with the JVM scan, run in its own process by test_jvm_memory.py:

    python tests/spark/bounded_memory_job.py ROOT HEAP WRITER:MIB [WRITER:MIB ...]

Each WRITER:MIB writes MIB MiB of 1 KiB values that do not compress, as one batch object
(WRITER ``jvm``: the JVM writer; ``python``: txlog's Python stager), into a topic of its own,
then counts and hashes them through the JVM scan.  The last line printed is the JSON
result: per write, the rows and hash written and read back, the object's stored size
and its largest row group's stored bytes.
"""

from __future__ import annotations

import json
import sys
from typing import Any

RECORD = 1024


def _values(spark: Any, mib: int) -> Any:
    """``mib`` MiB of 1 KiB values, each the digests of its row's id (no two alike, so
    that snappy finds nothing to compress)."""
    rows = mib * 1024 * 1024 // RECORD
    digests = ", ".join(f"sha2(concat(CAST(id AS STRING), '/{k}'), 512)" for k in range(16))
    return spark.range(0, rows, numPartitions=1).selectExpr(
        "CAST(id AS STRING) AS key", f"unhex(concat({digests})) AS value")


def main() -> None:
    root, heap, *writes = sys.argv[1:]
    import pyarrow.parquet as pq

    import spark_ext
    import txlog
    from txlog import TopicPartition

    spark = spark_ext.local_session(
        "txlog-bounded-memory", **{
            "spark.driver.memory": heap,
            # Spark refuses a heap under 450 MiB unless told how much it may plan for.
            "spark.testing.memory": str(512 << 20),
            "spark.sql.adaptive.enabled": "false"})
    lg = txlog.connect(root)
    out: list[dict[str, Any]] = []
    for i, w in enumerate(writes):
        writer, mib = w.split(":")
        topic = f"t{i}"
        lg.create_topic(topic, partitions=1)
        df = _values(spark, int(mib))
        expect = df.selectExpr("count(*) AS n", "bit_xor(xxhash64(key, value)) AS h").first()
        if writer == "jvm":
            spark_ext.write(df, root, topic=topic, engine="jvm", maxFileBytes=str(1 << 30))
        else:  # txlog's Python data source, which format("txlog") hands some writes to
            (df.write.format("txlog_python").mode("append").option("path", root)
             .option("topic", topic).option("maxFileBytes", str(1 << 30)).save())
        st = lg.partition_log(TopicPartition(topic, 0)).refresh()
        objects = sorted(set(st.batches.data))
        meta = [pq.ParquetFile(lg.store.full_path(k)).metadata for k in objects]
        largest = max(sum(m.row_group(g).column(c).total_compressed_size
                          for c in range(m.num_columns))
                      for m in meta for g in range(m.num_row_groups))
        got = (spark_ext.read(spark, root, topic=topic, engine="jvm")
               .selectExpr("count(*) AS n", "bit_xor(xxhash64(key, value)) AS h").first())
        assert expect is not None and got is not None
        out.append({"writer": writer, "mib": int(mib), "objects": len(objects),
                    "object_bytes": max(lg.store.size(k) for k in objects),
                    "largest_row_group": largest, "rows": expect["n"], "hash": expect["h"],
                    "read_rows": got["n"], "read_hash": got["h"]})
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    spark.stop()
    print(json.dumps({"writes": out}), flush=True)


if __name__ == "__main__":
    main()
