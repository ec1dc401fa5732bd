"""txlog for PySpark: ``format("txlog")``, batch and Structured Streaming, and SQL tables.

    df = (spark.read.format("txlog").option("path", "s3a://bucket/lake")
          .option("subscribe", "orders").load())     # read_committed by default
    df.write.format("txlog").mode("append").option("path", root).option("topic", "out").save()

With txlog's jar on the classpath (:func:`connector_jar`; ``local_session`` adds it),
``format("txlog")`` is txlog's JVM connector (``spark_ext/java``), planned by txlog's
Python planner on the driver (:mod:`spark_ext.jvm_plan`); without it, the Python data
source (:mod:`spark_ext.source`).  docs/spark.md has the options, the columns, which path a
query takes and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession

    from spark_ext.writer import CommitResult

__all__ = ["read", "register", "write"]


def register(spark: SparkSession) -> None:
    """Register txlog's Python data source with ``spark``: as ``txlog_python``, which
    the JVM connector hands what it does not take (some writes, roots Spark cannot open),
    and as ``txlog`` itself where the JVM connector is not on the classpath (Spark refuses
    a second ``txlog``).

    A Spark Connect client cannot see the server's classpath: where the server has
    txlog's jar it refuses the Python ``txlog`` (``DATA_SOURCE_ALREADY_EXISTS``), and its
    JVM connector stays ``format("txlog")``."""
    from pyspark.errors import PySparkException

    from spark_ext.source import TxlogDataSource, TxlogPythonDataSource

    spark.dataSource.register(TxlogPythonDataSource)
    if jvm_connector_loaded(spark):
        return
    try:
        spark.dataSource.register(TxlogDataSource)
    except PySparkException as exc:
        if exc.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise


def jvm_connector_loaded(spark: SparkSession) -> bool:
    """Whether ``format("txlog")`` in ``spark`` is txlog's JVM connector (its jar is on
    the session's classpath) rather than the Python data source."""
    try:
        jvm = spark.sparkContext._jvm
        loader = spark._jsparkSession.sharedState().jarClassLoader()
    except Exception:  # Spark Connect: no JVM on this side; the server decides
        return False
    if jvm is None:
        return False
    try:
        jvm.java.lang.Class.forName("txlog.DefaultSource", False, loader)
    except Exception:
        return False
    return True


def connector_jar() -> Path | None:
    """The jar of txlog's JVM connector (``format("txlog")`` in the JVM): the one the
    wheel ships, else built now with the JDK's ``javac``; None (with a warning) when
    neither is possible, and ``format("txlog")`` is then txlog's Python data source."""
    from spark_ext import jvm_scan

    try:
        return jvm_scan.jar()
    except jvm_scan.JvmScanUnavailable as exc:
        import warnings

        warnings.warn(f"txlog: no JVM connector ({exc}); format('txlog') is the Python "
                      "data source", RuntimeWarning, stacklevel=2)
        return None


def local_session(app_name: str, **conf: str) -> SparkSession:
    """A local[2] session with txlog registered, for scripts and tests on one machine.

    Its Python workers run this interpreter (``PYSPARK_PYTHON``): otherwise they start
    whatever ``python3`` is on the PATH and fail with a bare Py4JJavaError.  ``conf``
    adds or overrides Spark settings; txlog's connector jar joins any ``spark.jars``
    given (``spark.jars=""``: a session without it)."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    settings = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.session.timeZone": "UTC", **conf}
    connector = connector_jar()
    given = conf.get("spark.jars")
    # Jars of the caller's own (Delta's) come with the connector; an empty list is a
    # session without it.
    if connector is not None and given is None:
        settings["spark.jars"] = str(connector)
    elif connector is not None and given and str(connector) not in given.split(","):
        settings["spark.jars"] = f"{given},{connector}"
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def read(spark: SparkSession, path: str | None = None, /,
         options: dict[str, Any] | None = None, *, engine: str | None = None,
         **kwargs: Any) -> DataFrame:
    """``spark.read.format("txlog")`` with the options as keywords (dotted names with
    underscores: ``isolation_level="read_uncommitted"``; ``storage_options`` may be a
    dict): the same DataFrame, planned when each query runs.

    ``engine`` names a side path for comparisons (benchmarks, tests): ``jvm`` (the
    planned scan of :mod:`spark_ext.jvm_scan`, planned once at the call), ``sql``
    (Spark's Parquet source and SQL expressions) or ``auto`` (``jvm``, else ``sql``).
    """
    if engine is not None:
        from spark_ext.native import read as _read

        return _read(spark, path, options, engine=engine, **kwargs)
    from spark_ext.options import options_from_kwargs

    reader = spark.read.format("txlog").options(**options_from_kwargs(options, **kwargs))
    return reader.load(path) if path is not None else reader.load()


def write(df: DataFrame, path: str | None = None, /,
          options: dict[str, Any] | None = None, *, engine: str | None = None,
          **kwargs: Any) -> CommitResult | None:
    """``df.write.format("txlog").mode("append")`` with the options as keywords (as
    :func:`read`): one transaction, committed when this returns (None).

    ``engine`` names a side path that reports what it committed (a
    :class:`~spark_ext.writer.CommitResult`): ``jvm`` (the JVM writer started from
    Python; a ConfigError says why when it cannot take the write), ``python``
    (``format("txlog")``, returns None) or ``auto`` (``jvm`` where it can, else
    ``python``).
    """
    if engine is not None:
        from spark_ext.jvm_write import write as _write

        return _write(df, path, options, engine=engine, **kwargs)
    from spark_ext.options import options_from_kwargs
    from spark_ext.write_options import WRITE_OPTIONS

    writer = df.write.format("txlog").mode("append").options(
        **options_from_kwargs(options, known=WRITE_OPTIONS, **kwargs))
    if path is not None:
        writer.save(path)
    else:
        writer.save()
    return None
