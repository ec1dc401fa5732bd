"""The shared local Spark session for tests (one per test run; see conftest's ``spark``).

Workers must run this interpreter (else they fail to start), and the machine is small:
local[2], two shuffle partitions, no UI.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def start_spark(app: str = "txlog-tests", **conf: str) -> Any:
    import spark_ext

    settings = {
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
        "spark.sql.streaming.stopTimeout": "30s",
        # Python workers start slowly on a loaded 2-core machine.
        "spark.python.authenticate.socketTimeout": "120s",
        **conf,
    }
    return spark_ext.local_session(app, **settings)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession for the whole run, with format("txlog") registered."""
    pytest.importorskip("pyspark")
    session = start_spark()
    try:
        yield session
    finally:
        session.stop()
