"""Parquet objects that decode into far more than they store, for tests of the readers'
size limits."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq


def dictionary_bomb(rows: int, value_bytes: int, *, nested: bool = False) -> bytes:
    """One dictionary entry of ``value_bytes``, repeated ``rows`` times by a run of one
    index: the pages hold a few bytes per run, the decoded column rows x value_bytes.
    No Arrow schema is stored, so a reader decodes the column into plain values."""
    d = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()),
                                       pa.array([b"\1" * value_bytes], pa.binary()))
    table = pa.table({"value": d})
    if nested:  # the same inside a list column: one row holds every value
        table = pa.table({"value": pa.ListArray.from_arrays(pa.array([0, rows], pa.int32()),
                                                             d)})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy", store_schema=False)
    return bytes(sink.getvalue().to_pybytes())
