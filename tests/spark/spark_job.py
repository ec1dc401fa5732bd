"""A txlog job for ``spark-submit``, run by the cluster and s3a tests in its own driver.

    spark-submit [--master ...] tests/spark/spark_job.py copy URL SOURCE TARGET APP_ID [OPTIONS]
    spark-submit --jars ... tests/spark/spark_job.py jvm URL OUT_URL SOURCE TARGET [OPTIONS]

``copy`` reads topic SOURCE with ``format("txlog")`` and writes its key, value and
partition to topic TARGET with ``format("txlog")``, exactly once (``txnAppId`` APP_ID,
``txnVersion`` 0), twice: the second write is the retry a restarted job would make;
then it reads TARGET back with ``format("txlog")``. Run with the connector's jar
(``--jars``), both are the JVM connector, and its log lines say so on the driver's stderr.
``jvm`` reads SOURCE with the JVM scan at URL and writes it to TARGET at OUT_URL with
the JVM writer, then reads SOURCE with the SQL scan (all open the objects with Spark's
own Hadoop filesystems).
``format`` does the same with ``format("txlog")`` alone (storage options as its
``storage_options`` option, nothing set in Spark's Hadoop configuration by the job), then
streams SOURCE at URL into STREAM_TARGET at OUT_URL with readStream/writeStream:

    spark-submit --jars ... tests/spark/spark_job.py format URL OUT_URL SOURCE TARGET \
        STREAM_TARGET OPTIONS

``gets`` reads SOURCE at URL with ``format("txlog")`` with signed GETs (the default),
then again (the objects kept in memory), again with nothing kept
(``txlog.scan.cache.bytes=0``), and twice with S3A (``txlog.scan.s3a.signed.get=false``),
and reports each read's rows and the GETs each client sent:

    spark-submit --jars ... tests/spark/spark_job.py gets URL SOURCE OPTIONS

OPTIONS is the storage options as JSON. The last line printed is ``RESULT <json>``.

    python tests/spark/spark_job.py connect sc://HOST:PORT URL SOURCE TARGET APP_ID

is a Spark Connect client (its own process: a Connect session changes how pyspark
behaves in the whole process) that asks the server for the plan of a ``format("txlog")``
read, registers txlog (``spark_ext.register``), asks again, then reads and writes
``format("txlog")``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _copy(spark: Any, url: str, source: str, target: str, app_id: str,
          options: str) -> dict[str, Any]:
    sc = spark.sparkContext
    # The connector's "which path" lines, at INFO in the driver's log (its stderr).
    log4j = sc._jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel("io.txlog.spark", log4j.Level.INFO)
    df = (spark.read.format("txlog").option("path", url).option("topic", source)
          .option("storage_options", options).load())
    read_plan = df._jdf.queryExecution().executedPlan().toString()
    out = df.select("key", "value", "partition")
    for _ in range(2):
        (out.write.format("txlog").mode("append").option("path", url).option("topic", target)
         .option("storage_options", options).option("txnAppId", app_id)
         .option("txnVersion", "0").save())
    # Which processes ran Python: the executors' workers, not this driver.
    pids = sc.parallelize(range(8), 8).map(lambda _: os.getpid()).distinct().collect()
    back = (spark.read.format("txlog").option("path", url).option("topic", target)
            .option("storage_options", options).load())
    return {"executors": sc._jsc.sc().getExecutorIds().size(), "master": sc.master,
            "python_pids": sorted(pids), "driver_pid": os.getpid(), "read_plan": read_plan,
            "back_plan": back._jdf.queryExecution().executedPlan().toString(),
            "back_rows": sorted([r.partition, r.offset, r.key.decode(), r.value.decode()]
                                for r in back.collect())}


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


def _format(spark: Any, url: str, out_url: str, source: str, target: str, streamed: str,
            options: str) -> dict[str, Any]:
    import tempfile

    df = (spark.read.format("txlog").option("path", url).option("topic", source)
          .option("storage_options", options).load())
    plan = df._jdf.queryExecution().executedPlan().toString()
    rows = [[r.partition, r.offset, r.value.decode()] for r in
            df.select("partition", "offset", "value").collect()]
    (df.select("key", "value", "partition").write.format("txlog").mode("append")
     .option("path", out_url).option("topic", target).option("storage_options", options)
     .save())
    q = (spark.readStream.format("txlog").option("path", url).option("topic", source)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "10")
         .option("storage_options", options).load().select("key", "value")
         .writeStream.format("txlog").option("path", out_url).option("topic", streamed)
         .option("storage_options", options)
         .option("checkpointLocation", tempfile.mkdtemp(prefix="txlog-ckpt-"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return {"rows": sorted(rows), "plan": plan,
            "stream_sources": sorted({s["description"] for p in q.recentProgress
                                      for s in p["sources"]}),
            "stream_plan": q._jsq.explainInternal(False),
            "stream_batches": sum(1 for p in q.recentProgress if p["numInputRows"]),
            "endpoint": conf.get(f"fs.s3a.bucket.{url.split('/')[2]}.endpoint")}


def _gets(spark: Any, url: str, source: str, options: str) -> dict[str, Any]:
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    # The connector's classes are in the loader of the jars Spark was given.
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    signed = loader.loadClass("io.txlog.spark.SignedGet").getDeclaredMethod("requests", None)
    signed.setAccessible(True)

    def s3a_gets() -> int:
        stats = jvm.org.apache.hadoop.fs.FileSystem.getGlobalStorageStatistics().get(
            "S3AStorageStatistics")
        return 0 if stats is None else int(stats.getLong("action_http_get_request") or 0)

    def bytes_read() -> int:  # what Spark's input metrics sum, per thread, for s3a
        return sum(int(s.getBytesRead()) for s in
                   jvm.org.apache.hadoop.fs.FileSystem.getAllStatistics()
                   if s.getScheme() == "s3a")

    out = {}
    # Kept for ten minutes, so that a slow machine's reads still find them.
    conf.set("txlog.scan.cache.idle.ms", "600000")
    for name, setting, keep in (("signed", "true", None), ("signed_again", "true", None),
                                ("signed_unkept", "true", "0"), ("s3a", "false", None),
                                ("s3a_again", "false", None)):
        conf.set("txlog.scan.s3a.signed.get", setting)
        if keep is None:
            conf.unset("txlog.scan.cache.bytes")
        else:
            conf.set("txlog.scan.cache.bytes", keep)
        before = (int(signed.invoke(None, None)), s3a_gets(), bytes_read())
        df = (spark.read.format("txlog").option("path", url).option("topic", source)
              .option("storage_options", options).load())
        rows = sorted([r.partition, r.offset, r.value.decode()]
                      for r in df.select("partition", "offset", "value").collect())
        out[name] = {"rows": rows, "signed_gets": int(signed.invoke(None, None)) - before[0],
                     "s3a_gets": s3a_gets() - before[1], "bytes_read": bytes_read() - before[2]}
    return out


def _connect(spark: Any, url: str, source: str, target: str, app_id: str) -> dict[str, Any]:
    import spark_ext

    # No JVM on a Connect client: the server decides what format("txlog") is (its JVM
    # connector where it has the jar, else the Python data source in its Python workers).
    jvm_free = not hasattr(spark, "_jsparkSession")

    def reader() -> Any:
        return spark.read.format("txlog").option("path", url).option("topic", source).load()

    def plan() -> str:  # the server's physical plan, as the client sees it
        try:
            return str(reader()._explain_string())
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    plan_before = plan()
    spark_ext.register(spark)
    plan_after = plan()
    df = reader()
    rows = sorted([r.partition, r.offset, r.value.decode(), r.headers[0]["value"].decode()]
                  for r in df.collect())
    (df.select("key", "value", "partition").write.format("txlog").mode("append")
     .option("path", url).option("topic", target).option("txnAppId", app_id)
     .option("txnVersion", "0").save())
    try:
        spark_ext.read(spark, url, topic=source, engine="jvm")
        jvm_error = ""
    except Exception as exc:
        jvm_error = f"{type(exc).__name__}: {exc}"
    # The default API: format("txlog"), whatever the server has.
    auto = spark_ext.read(spark, url, topic=source)
    auto_rows = sorted([r.partition, r.offset, r.value.decode(),
                        r.headers[0]["value"].decode()] for r in auto.collect())
    return {"jvm_free": jvm_free, "rows": rows, "jvm_error": jvm_error, "auto_rows": auto_rows,
            "plan_before": plan_before, "plan_after": plan_after}


def main(argv: list[str]) -> None:
    from pyspark.sql import SparkSession

    import spark_ext

    builder = SparkSession.builder
    if argv[0] == "connect":  # a remote client, run with plain python
        builder = builder.remote(argv.pop(1))
    else:
        builder = builder.appName(f"txlog-{argv[0]}").config("spark.sql.session.timeZone",
                                                            "UTC")
    spark = builder.getOrCreate()
    if argv[0] != "connect":  # (a Connect client registers in its job)
        spark.sparkContext.setLogLevel("ERROR")
        spark_ext.register(spark)
    try:
        if argv[0] == "copy":
            result = _copy(spark, argv[1], argv[2], argv[3], argv[4],
                           options=argv[5] if len(argv) > 5 else "{}")
        elif argv[0] == "format":
            result = _format(spark, *argv[1:7])
        elif argv[0] == "gets":
            result = _gets(spark, *argv[1:4])
        elif argv[0] == "connect":
            result = _connect(spark, *argv[1:5])
        elif argv[0] == "jvm":
            result = _jvm(spark, argv[1], argv[2], argv[3], argv[4],
                          options=argv[5] if len(argv) > 5 else "{}")
        else:
            raise SystemExit(f"unknown job {argv[0]!r}")
    finally:
        spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
