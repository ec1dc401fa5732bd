"""Batch objects as Parquet: how txlog encodes a batch, and how a reader decodes one
without trusting its declared sizes (a decompression bomb or a dictionary that expands
past the reader's budget is refused before it is decoded)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from txlog import arrow_memory
from txlog.declared_size import (
    DEFAULT_FETCH_MAX_BYTES,
    MAX_DECODED_RATIO,
    ExpansionBound,
    check_declared_size,
    decoded_limit,
    decoded_size,
    parquet_expansion_bound,
)
from txlog.errors import CorruptObjectError, RecordTooLargeError
from txlog.model import ROW_GROUP_BYTES
from txlog.records import has_kafka_fields


def encode_parquet(table: pa.Table) -> bytes:
    """A batch object's bytes (see :func:`encode_parquet_buffer`)."""
    return encode_parquet_buffer(table).to_pybytes()  # type: ignore[no-any-return]


def encode_parquet_buffer(table: pa.Table) -> pa.Buffer:
    """A batch object: snappy, no statistics (planning never reads them).  Kafka record
    values are not dictionary-encoded: they are rarely repeated, and trying costs as much
    CPU as the rest of the encoding.  Kafka-shaped objects carry no Arrow schema in their
    footer: their Parquet types read back as exactly the Kafka schema, and every reader
    (Spark's above all, per object) would otherwise decode that base64 schema for nothing;
    other topics' objects keep it, since their Arrow types may not survive without it.
    The buffer is txlog's pool's: a store that writes from any buffer writes it without a
    copy into Python bytes."""
    # Arrow's own buffer, not io.BytesIO: writing through a Python file object was
    # several times slower (docs/benchmarks.md).
    mem = arrow_memory.pool()
    buf = pa.BufferOutputStream(memory_pool=mem)
    pq.write_table(table, buf, row_group_size=row_group_rows(table),
                   **writer_options(table.schema))
    return buf.getvalue()


def writer_options(schema: pa.Schema) -> dict[str, Any]:
    """How every batch object of ``schema`` is written (see :func:`encode_parquet_buffer`),
    as keyword arguments of pyarrow's Parquet writers."""
    dictionary: bool | list[str] = True
    kafka = has_kafka_fields(schema)
    if "value" in schema.names and kafka:
        dictionary = [c for c in schema.names if c != "value"]
    return {"compression": "snappy", "write_statistics": False,
            "use_dictionary": dictionary, "store_schema": not kafka,
            "memory_pool": arrow_memory.pool()}


def row_group_rows(table: pa.Table) -> int:
    """Rows per row group so that each holds at most ROW_GROUP_BYTES of ``table``."""
    per_row = table.nbytes / max(1, table.num_rows)
    return max(1, min(1 << 20, int(ROW_GROUP_BYTES // max(1.0, per_row))))


def decode_parquet(raw: bytes, where: str, columns: Sequence[str] | None = None, *,
                   fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES) -> pa.Table:
    pf, bound, limit = open_parquet(raw, where, fetch_max_bytes=fetch_max_bytes)
    return decode_row_groups(raw, pf, bound, limit, where, columns)


def decode_row_groups(raw: bytes, pf: pq.ParquetFile, bound: ExpansionBound, limit: int,
                      where: str, columns: Sequence[str] | None,
                      row_groups: Sequence[int] | None = None) -> pa.Table:
    """Row groups ``row_groups`` (default: all) of ``raw`` opened as ``pf``, decoded within
    ``limit``, where ``bound`` is what :func:`checked_bound` says of those row groups."""
    cols = list(columns) if columns else None
    try:
        # One thread: the columns of one object are small, and decoding them on Arrow's
        # thread pool left each of its threads' allocator caches holding freed memory.
        if bound.potential <= limit:
            if row_groups is None:
                return pf.read(columns=cols, use_threads=False)
            return pf.read_row_groups(list(row_groups), columns=cols, use_threads=False)
        return _read_expanding(raw, pf, bound.dictionary_columns, cols, where, limit,
                               row_groups)
    except RecordTooLargeError:
        raise
    except Exception as exc:  # pyarrow raises several types for damaged input
        raise corrupt(where, exc) from None


def corrupt(where: str, exc: Exception) -> CorruptObjectError:
    """The error for a batch object pyarrow could not parse or decode."""
    return CorruptObjectError(
        f"batch object {where} cannot be read as Parquet ({type(exc).__name__}: {exc}); "
        "it is truncated or corrupt")


def open_parquet(raw: bytes, where: str, *, fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                 ) -> tuple[pq.ParquetFile, ExpansionBound, int]:
    """``raw`` opened as Parquet (its footer parsed, nothing decoded), what its metadata
    bounds its decoded size by, and the most it may decode into; an object whose pages or
    values declare more than that is refused here."""
    pf = parse_parquet(raw, where)
    bound = checked_bound(raw, pf, where, fetch_max_bytes=fetch_max_bytes)
    return pf, bound, decoded_limit(len(raw), fetch_max_bytes)


def parse_parquet(raw: bytes, where: str) -> pq.ParquetFile:
    """``raw`` opened as Parquet: its footer parsed, nothing decoded or checked."""
    # ParquetFile, not read_table: read_table builds a dataset per call, which doubled
    # the time to decode a batch object.
    try:
        # The object is in memory already: nothing to read ahead.
        return pq.ParquetFile(pa.BufferReader(raw), pre_buffer=False)
    except Exception as exc:  # pyarrow raises several types for damaged input
        raise corrupt(where, exc) from None


def checked_bound(raw: bytes, pf: pq.ParquetFile, where: str, *,
                  fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                  row_groups: Sequence[int] | None = None) -> ExpansionBound:
    """What decoding row groups ``row_groups`` (default: all) of ``raw`` is bounded by,
    refused if their pages or values declare more than the object may decode into."""
    try:
        bound = parquet_expansion_bound(raw, pf.metadata, pf.schema, row_groups)
    except Exception as exc:  # pyarrow raises several types for damaged input
        raise corrupt(where, exc) from None
    # Before decoding: the footer's and pages' sizes say what decompression would allocate.
    check_declared_size(bound.declared, len(raw), where, fetch_max_bytes=fetch_max_bytes)
    # Run-length and dictionary encoding expand past what the pages declare: the values
    # alone, or (while decoding) the dictionaries' entries, must fit the same limit.
    check_declared_size(bound.fixed, len(raw), where, fetch_max_bytes=fetch_max_bytes,
                        what="batch object (its values)")
    return bound


def too_large(where: str, size: int, stored: int) -> RecordTooLargeError:
    """The error for an object whose dictionaries expand past what it may decode into."""
    return RecordTooLargeError(
        f"batch object {where} expands into more than {size} bytes decoded from "
        f"{stored} stored (its dictionary entries repeated), more than "
        f"fetch.max.bytes and {MAX_DECODED_RATIO} times its size; txlog does not "
        "decode it (raise fetch.max.bytes if it is genuine)")


def _read_expanding(raw: bytes, pf: pq.ParquetFile, dictionary_columns: Sequence[str],
                    columns: list[str] | None, where: str, limit: int,
                    row_groups: Sequence[int] | None) -> pa.Table:
    """Read ``raw`` (row groups ``row_groups``, default all) whose dictionaries could
    expand past ``limit``: decoded as dictionaries first (no bigger than its pages),
    measured, and expanded only if that fits."""
    compact = pq.ParquetFile(pa.BufferReader(raw), metadata=pf.metadata, pre_buffer=False,
                             read_dictionary=list(dictionary_columns))
    whole = row_groups is None and compact.metadata.num_row_groups == 1
    groups = range(compact.metadata.num_row_groups) if row_groups is None else row_groups
    # Row group by row group: a nested column read as dictionaries cannot span several.
    parts = []
    size = 0
    for i in groups:
        part = compact.read(columns=columns, use_threads=False) if whole else \
            compact.read_row_group(i, columns=columns, use_threads=False)
        size += decoded_size(part)
        if size > limit:
            raise too_large(where, size, len(raw))
        parts.append(part)
    plain = pf.schema_arrow
    if not parts:
        return pf.read_row_groups(list(groups), columns=columns, use_threads=False)
    schema = pa.schema([plain.field(n) for n in parts[0].column_names])
    if len(parts) == 1:
        return parts[0].cast(schema)
    return pa.concat_tables([p.cast(schema) for p in parts])
