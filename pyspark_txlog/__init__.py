"""Makes ``format("txlog")`` work without ``spark_ext.register(spark)``.

pyspark (4.x) discovers Python data sources by importing every top-level module whose name
starts with ``pyspark_`` and registering its ``DefaultSource`` (see
``pyspark/sql/worker/lookup_data_sources.py``); there is no entry-point group.
"""

from spark_ext.source import TxlogDataSource as DefaultSource

__all__ = ["DefaultSource"]
