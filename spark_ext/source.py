"""``TxlogDataSource``: the PySpark data source registered as format ``txlog``.

Spark creates it (and calls ``schema()``) in a Python worker, pickles it, and calls
``reader()``/``streamReader()``/``writer()`` in other workers: everything here is rebuilt
from the options.  ``schema()`` validates the read options, so a bad option fails at
``load()``, before any job runs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource

from spark_ext.options import ReadOptions, parse_read_options
from spark_ext.read_plan import OutputShape, check_declared_schema, plan_shape

if TYPE_CHECKING:
    from pyspark.sql.datasource import (
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        DataSourceWriter,
    )
    from pyspark.sql.types import StructType


class TxlogDataSource(DataSource):
    """Kafka-style transactional topics on object storage (txlog), for Spark.

    Read options follow Spark's Kafka source (see ``spark_ext.options.READ_OPTIONS``):
    ``path``, ``topic``/``subscribe``/``subscribePattern``/``assign``,
    ``startingOffsets``/``endingOffsets``, ``startingTimestamp``, ``isolation.level``,
    ``storage_options``, ``maxOffsetsPerTrigger``, ``failOnDataLoss``, ...
    """

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self._ro: ReadOptions | None = None
        self._shape: OutputShape | None = None

    @classmethod
    def name(cls) -> str:
        return "txlog"

    def _read_plan(self) -> tuple[ReadOptions, OutputShape]:
        if self._ro is None or self._shape is None:
            ro = parse_read_options(self.options)
            self._shape = plan_shape(ro.connect(), ro)
            self._ro = ro
        return self._ro, self._shape

    def schema(self) -> StructType:
        return self._read_plan()[1].spark_schema()

    def _declared(self, schema: StructType) -> str:
        _, shape = self._read_plan()
        check_declared_schema(schema, shape)
        return json.dumps(schema.jsonValue())

    def reader(self, schema: StructType) -> DataSourceReader:
        from spark_ext.reader import TxlogBatchReader

        ro, shape = self._read_plan()
        return TxlogBatchReader(ro, shape, self._declared(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from spark_ext.reader import TxlogStreamReader

        ro, shape = self._read_plan()
        return TxlogStreamReader(ro, shape, self._declared(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_ext.writer import TxlogBatchWriter  # type: ignore[import-not-found,unused-ignore]

        return TxlogBatchWriter(dict(self.options), schema, overwrite)  # type: ignore[no-any-return,unused-ignore]

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from spark_ext.writer import TxlogStreamWriter  # type: ignore[import-not-found,unused-ignore]

        return TxlogStreamWriter(dict(self.options), schema)  # type: ignore[no-any-return,unused-ignore]


class TxlogPythonDataSource(TxlogDataSource):
    """The same source under the name txlog's JVM connector hands what it does not take
    to (writes of rows its writer does not take, overwrites, roots Spark cannot open; see
    :mod:`pyspark_txlog_python`); ``format("txlog")`` is the connector's own name."""

    @classmethod
    def name(cls) -> str:
        return "txlog_python"
