"""txlog for PySpark: the ``txlog`` data source (batch and Structured Streaming).

    import spark_ext
    spark_ext.register(spark)                        # format "txlog"
    df = (spark.read.format("txlog").option("path", "s3://bucket/lake")
          .option("subscribe", "orders").load())     # read_committed by default
    df = spark_ext.read(spark, path="s3://bucket/lake", subscribe="orders")  # native Parquet scan

``spark_ext.read`` plans on the driver exactly as ``format("txlog")`` does and then scans
the chosen batch objects with Spark's own Parquet reader: the fast path for large batch
reads.  A package named ``pyspark_txlog`` on the workers' Python path also makes
``format("txlog")`` available without ``register`` (pyspark's data source discovery).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["read", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``txlog`` data source with ``spark`` (format name ``"txlog"``)."""
    from spark_ext.source import TxlogDataSource

    spark.dataSource.register(TxlogDataSource)


def read(spark: SparkSession, path: str | None = None, /,
         options: dict[str, Any] | None = None, **kwargs: Any) -> DataFrame:
    """A batch read planned on the driver and scanned by Spark's native Parquet reader.

    Takes the same options as ``spark.read.format("txlog")`` (as keywords; dotted names
    with underscores: ``isolation_level="read_uncommitted"``; ``storage_options`` may be a
    dict) and returns the same columns.
    """
    from spark_ext.native import read as _read

    return _read(spark, path, options, **kwargs)
