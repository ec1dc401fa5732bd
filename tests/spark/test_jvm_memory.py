"""A Spark task's memory does not grow with the size of the batch object it reads or
writes: txlog's writers (the JVM writer and the Python data source's stager) cap an
object's row groups, and the JVM scan holds a row group's columns at a time.

The job runs in a driver of its own with a small fixed heap (bounded_memory_job.py):
objects of 16 MiB and of 192 MiB, the larger as large as the heap itself, are written
and read back whole.  An object of one row group of that size does not fit.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import spark_procs

from txlog.model import ROW_GROUP_BYTES

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HEAP_MIB = 192


class Job(spark_procs.Child):
    script = Path(__file__).resolve().parent / "bounded_memory_job.py"


def test_objects_as_large_as_the_heap_are_written_and_read_in_bounded_memory(
        tmp_path: Path) -> None:
    writes = ["jvm:16", "jvm:192", "python:192"]
    lake = tmp_path / "lake"
    job = Job(tmp_path, str(lake), f"{HEAP_MIB}m", *writes)
    try:
        got: list[dict[str, Any]] = job.result()["writes"]
    finally:
        shutil.rmtree(lake, ignore_errors=True)  # 400 MB, not kept for later runs
    assert [f"{w['writer']}:{w['mib']}" for w in got] == writes
    for w in got:
        print(w)
        assert w["objects"] == 1, w  # one batch object, as large as the write
        assert w["object_bytes"] >= w["mib"] << 20, w
        assert (w["read_rows"], w["read_hash"]) == (w["rows"], w["hash"]), w
        # (the JVM writer's Parquet library checks its row group's size every few rows)
        assert w["largest_row_group"] <= ROW_GROUP_BYTES * 5 // 4, w
    assert max(w["object_bytes"] for w in got) >= HEAP_MIB << 20
