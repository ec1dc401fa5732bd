"""Registers txlog's Python data source as ``txlog_python`` in every session (pyspark's
discovery of ``pyspark_*`` modules): txlog's JVM connector, which serves
``format("txlog")`` where its jar is on the classpath, hands streaming queries and the
writes it does not take to it.
"""

from spark_ext.source import TxlogPythonDataSource as DefaultSource

__all__ = ["DefaultSource"]
