"""A txlog job for ``spark-submit``, run by the cluster and s3a tests in its own driver.

    spark-submit [--master ...] tests/spark_job.py copy URL SOURCE TARGET APP_ID [OPTIONS]
    spark-submit --jars ... tests/spark_job.py jvm URL OUT_URL SOURCE TARGET [OPTIONS]

``copy`` reads topic SOURCE with ``format("txlog")`` and writes its key, value and
partition to topic TARGET with ``format("txlog")``, exactly once (``txnAppId`` APP_ID,
``txnVersion`` 0), twice: the second write is the retry a restarted job would make;
then it reads TARGET back with the JVM scan.
``jvm`` reads SOURCE with the JVM scan at URL and writes it to TARGET at OUT_URL with
the JVM writer, then reads SOURCE with the SQL scan (all open the objects with Spark's
own Hadoop filesystems).
OPTIONS is the storage options as JSON. The last line printed is ``RESULT <json>``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _copy(spark: Any, url: str, source: str, target: str, app_id: str,
          options: str) -> dict[str, Any]:
    sc = spark.sparkContext
    df = (spark.read.format("txlog").option("path", url).option("topic", source)
          .option("storage_options", options).load())
    out = df.select("key", "value", "partition")
    for _ in range(2):
        (out.write.format("txlog").mode("append").option("path", url).option("topic", target)
         .option("storage_options", options).option("txnAppId", app_id)
         .option("txnVersion", "0").save())
    # Which processes ran Python: the executors' workers, not this driver.
    pids = sc.parallelize(range(8), 8).map(lambda _: os.getpid()).distinct().collect()
    # The JVM scan of what was written: its jar is added by the driver, fetched by the
    # executors.
    import spark_ext

    jvm = spark_ext.read(spark, url, topic=target, storage_options=json.loads(options),
                         engine="jvm")
    return {"executors": sc._jsc.sc().getExecutorIds().size(), "master": sc.master,
            "python_pids": sorted(pids), "driver_pid": os.getpid(),
            "jvm_plan": jvm._jdf.queryExecution().executedPlan().toString(),
            "jvm_rows": sorted([r.partition, r.offset, r.key.decode(), r.value.decode()]
                               for r in jvm.collect())}


def _jvm(spark: Any, url: str, out_url: str, source: str, target: str,
         options: str) -> dict[str, Any]:
    import spark_ext

    so = json.loads(options)
    df = spark_ext.read(spark, url, topic=source, storage_options=so, engine="jvm")
    plan = df._jdf.queryExecution().executedPlan().toString()
    rows = [[r.partition, r.offset, r.value.decode()] for r in
            df.select("partition", "offset", "value").collect()]
    done = spark_ext.write(df.select("key", "value", "partition"), out_url, topic=target,
                           storage_options=so, engine="jvm")
    assert done is not None
    sql = spark_ext.read(spark, url, topic=source, storage_options=so, engine="sql")
    sql_rows = [[r.partition, r.offset, r.value.decode()] for r in
                sql.select("partition", "offset", "value").collect()]
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return {"rows": sorted(rows), "sql_rows": sorted(sql_rows), "plan": plan,
            "written": done.rows,
            "endpoint": conf.get(f"fs.s3a.bucket.{url.split('/')[2]}.endpoint")}


def main(argv: list[str]) -> None:
    from pyspark.sql import SparkSession

    import spark_ext

    spark = (SparkSession.builder.appName(f"txlog-{argv[0]}")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_ext.register(spark)
    try:
        if argv[0] == "copy":
            result = _copy(spark, *argv[1:5], options=argv[5] if len(argv) > 5 else "{}")
        elif argv[0] == "jvm":
            result = _jvm(spark, *argv[1:5], options=argv[5] if len(argv) > 5 else "{}")
        else:
            raise SystemExit(f"unknown job {argv[0]!r}")
    finally:
        spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
