"""txlog for PySpark: the ``txlog`` data source (batch and Structured Streaming).

    import spark_ext
    spark_ext.register(spark)                        # format "txlog"
    df = (spark.read.format("txlog").option("path", "s3://bucket/lake")
          .option("subscribe", "orders").load())     # read_committed by default
    df = spark_ext.read(spark, "s3://bucket/lake", subscribe="orders")  # native Parquet scan
    q = (spark.readStream.format("txlog").option("path", "s3://bucket/lake")
         .option("subscribe", "orders").option("maxOffsetsPerTrigger", 100000).load()
         .writeStream.option("checkpointLocation", "...").trigger(availableNow=True)...)

Read options (Spark's Kafka source names where the meaning is the same; names are
case-insensitive; an unknown option or a bad value fails at ``load()``/``start()`` with a
``txlog.errors.ConfigError`` naming it):

``path``                     the txlog root URL (required; also ``.load(path)``)
``topic`` | ``subscribe`` | ``subscribePattern`` | ``assign``
                             one topic | comma list | regex | JSON ``{"orders": [0, 1]}``
``startingOffsets``          ``earliest`` (batch default), ``latest`` (streaming default) or
                             JSON ``{"orders": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest)
``endingOffsets``            batch only: ``latest`` (default) or JSON as above
``startingTimestamp`` / ``endingTimestamp``  ms since the epoch, all partitions
``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp``  JSON ``{"orders": {"0": ms}}``
``startingOffsetsByTimestampStrategy``  ``error`` (default) or ``latest`` when no record is
                             at or after the timestamp
``isolation.level``          ``read_committed`` (default) or ``read_uncommitted``
                             (``kafka.isolation.level`` is accepted as a synonym)
``storage_options``          JSON object passed to fsspec (credentials, endpoint, ...)
``maxOffsetsPerTrigger``     streaming admission control (offsets per micro-batch)
``failOnDataLoss``           ``true`` (default): fail when planned data is gone (retention,
                             compaction, a recreated topic); ``false``: skip it
``includeHeaders``           ``true`` (default) adds Kafka's ``headers`` column
``minPartitions`` / ``maxPartitionBytes``  Spark input partitions: at least this many
                             (default one per topic-partition with data), at most this big

Columns: Kafka-shaped topics give Spark's Kafka schema (``key``, ``value``, ``topic``,
``partition``, ``offset``, ``timestamp``, ``timestampType``, ``headers``; timestampType 0 is
the record's own time, 1 the append time used when the record has none).  Typed topics
give their own columns plus ``topic``, ``partition``, ``offset`` and ``timestamp`` (the
batch's append time).

Fast path.  ``format("txlog")`` is a Python data source: rows travel from Python workers
to the JVM as Arrow.  ``spark_ext.read(spark, path, **options)`` takes the same options
(dotted names with underscores, e.g. ``isolation_level=``; ``storage_options`` may be a
dict), makes the same plan on the driver and hands it to txlog's JVM source
(:mod:`spark_ext.jvm_scan`, Java built on first use with the JDK's ``javac``), which
reads the planned rows with Spark's vectorized Parquet reader, so column pruning and
Parquet speed apply.  Without a JDK it uses Spark's Parquet source and SQL expressions
instead (``engine="sql"``, :mod:`spark_ext.native`).  A Python data source cannot hand
Spark a native plan, so ``format("txlog")`` cannot route to it: use ``spark_ext.read``
for large batch reads.  Spark opens the files itself on that path, so it needs the
store's Hadoop filesystem (``s3a://`` + hadoop-aws, ``abfss://``, ``gs://``) configured
in Spark as well.

Without ``register``: pyspark discovers Python data sources by importing top-level modules
named ``pyspark_*`` that define ``DefaultSource`` (there is no entry-point group); the
``pyspark_txlog`` package shipped with txlog is one, so an installed txlog (wheel, cluster
library) makes ``format("txlog")`` available in every new session.

Databricks.  PySpark data sources need Databricks Runtime 15.4 LTS+ (or serverless);
this reader also uses the Spark 4.2 streaming API (``latestOffset(start, limit)``, read
limits, ``SupportsTriggerAvailableNow``), so it needs a runtime whose pyspark is 4.2 or
newer, as ``pip install txlog[spark]`` does.  Install ``txlog`` as a cluster library (then
``format("txlog")`` is discovered in every notebook), or ``%pip install txlog`` in the
notebook and call ``spark_ext.register(spark)`` (notebook-scoped installs are not seen by
discovery).  Credentials go in ``storage_options`` (e.g. from a secret scope:
``json.dumps({"key": dbutils.secrets.get(...), "secret": ...})``); nothing is read from the
cluster's Spark conf.  ``CREATE TABLE ... USING txlog`` drops OPTIONS: read with
``spark.read.format("txlog")`` in code, not through a catalog table.
Errors raised by txlog inside Spark carry their class and message
(``txlog.errors.ConfigError: unknown option 'startingofsets' ...``) in the Spark exception.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_ext.writer import CommitResult

__all__ = ["read", "register", "write"]


def register(spark: SparkSession) -> None:
    """Register the ``txlog`` data source with ``spark`` (format name ``"txlog"``)."""
    from spark_ext.source import TxlogDataSource

    spark.dataSource.register(TxlogDataSource)


def local_session(app_name: str, **conf: str) -> SparkSession:
    """A local[2] session with txlog registered, for scripts and tests on one machine.

    Its Python workers run this interpreter (``PYSPARK_PYTHON``): otherwise they start
    whatever ``python3`` is on the PATH and fail with a bare Py4JJavaError.  ``conf``
    adds or overrides Spark settings."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    settings = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.session.timeZone": "UTC", **conf}
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def read(spark: SparkSession, path: str | None = None, /,
         options: dict[str, Any] | None = None, *, engine: str = "auto",
         **kwargs: Any) -> DataFrame:
    """A batch read planned on the driver and scanned in the JVM.

    Takes the same options as ``spark.read.format("txlog")`` (as keywords; dotted names
    with underscores: ``isolation_level="read_uncommitted"``; ``storage_options`` may be a
    dict) and returns the same columns.  ``engine``: ``jvm`` (txlog's JVM source; fails
    with a ConfigError saying why when it cannot be built or loaded), ``sql`` (Spark's
    Parquet source and SQL expressions) or ``auto`` (``jvm``, else ``sql`` with a warning).
    """
    from spark_ext.native import read as _read

    return _read(spark, path, options, engine=engine, **kwargs)


def write(df: DataFrame, path: str | None = None, /,
          options: dict[str, Any] | None = None, *, engine: str = "auto",
          **kwargs: Any) -> CommitResult | None:
    """Append ``df`` to a topic in one transaction, as ``df.write.format("txlog")`` does,
    with the same options (as keywords, like :func:`read`), in the JVM.

    ``engine``: ``jvm`` (txlog's JVM writer: rows are routed and encoded by Spark's own
    Parquet writer, never crossing to Python; a ConfigError says why when it cannot take
    the write), ``python`` (``format("txlog")``) or ``auto`` (``jvm`` where it can,
    else ``python``). Returns what was committed, or None from the ``python`` engine.
    The JVM writer takes Kafka-shaped topics named by the ``topic`` option, with key and
    value as strings or binary, an optional timestamp and an optional partition column;
    rows with headers, typed topics and a ``topic`` column go through ``python``.
    """
    from spark_ext.jvm_write import write as _write

    return _write(df, path, options, engine=engine, **kwargs)
