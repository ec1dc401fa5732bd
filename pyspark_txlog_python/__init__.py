"""Registers txlog's Python data source as ``txlog_python`` in every session (pyspark's
discovery of ``pyspark_*`` modules), beside txlog's JVM connector.

Where the connector's jar is on the classpath, ``format("txlog")`` is the connector: batch
and streaming reads and writes run in the JVM. It hands the Python source, under this
name, only what it does not take: writes of rows the JVM writer does not take (headers, a
``topic`` column instead of the ``topic`` option, a typed topic, other columns or column
types), overwrite writes (which the Python source refuses: topics are append-only), and
reads and writes of a root Spark's Hadoop filesystems cannot open (an ``s3://`` root
without hadoop-aws). Where the jar is absent, ``format("txlog")`` is the Python source
itself (:mod:`pyspark_txlog`).
"""

from spark_ext.source import TxlogPythonDataSource as DefaultSource

__all__ = ["DefaultSource"]
