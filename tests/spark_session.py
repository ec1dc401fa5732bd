"""The shared local Spark session for tests (one per test run; see conftest's ``spark``).

Workers must run this interpreter (DESIGN.md, known traps), and the machine is small:
local[2], two shuffle partitions, no UI.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest


def start_spark(app: str = "txlog-tests", **conf: str) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master("local[2]").appName(app)
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.default.parallelism", "2")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.driver.memory", "1g")
         .config("spark.sql.streaming.stopTimeout", "30s")
         # Python workers start slowly on a loaded 2-core machine.
         .config("spark.python.authenticate.socketTimeout", "120s"))
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    import spark_ext

    spark_ext.register(spark)
    return spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession for the whole run, with format("txlog") registered."""
    pytest.importorskip("pyspark")
    session = start_spark()
    try:
        yield session
    finally:
        session.stop()
