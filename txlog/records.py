"""Record shapes: the Kafka-shaped schema, typed topics, and Arrow <-> Record conversion."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from txlog import arrow_memory
from txlog.errors import SchemaMismatchError

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False),
                                  pa.field("value", pa.binary())]))
KAFKA_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", HEADER_TYPE),
    pa.field("timestamp", pa.timestamp("ms", tz="UTC")),
])


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: Any
    value: Any
    headers: list[tuple[str, bytes | None]]
    timestamp: int  # milliseconds since the epoch
    #: Kafka's timestampType: 0 CreateTime (the record's own), 1 LogAppendTime (the time
    #: its batch was appended: records without a timestamp, and typed topics' rows).
    timestamp_type: int = 0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _as_bytes(x: Any, what: str) -> bytes | None:
    if x is None or isinstance(x, bytes):
        return x
    if isinstance(x, (bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, str):
        try:
            return x.encode()
        except UnicodeEncodeError:
            raise SchemaMismatchError(f"{what} {x!r} is not valid UTF-8 text") from None
    raise SchemaMismatchError(f"{what} must be bytes, str or None, not {type(x).__name__}")


#: One Kafka-shaped record, checked: key and value bytes or None, headers as
#: HEADER_TYPE's dicts or None, the timestamp an int or None (the batch's time).
CheckedRow = tuple[bytes | None, bytes | None, list[dict[str, Any]] | None, int | None]


def checked_row(key: Any, value: Any, headers: Any, timestamp_ms: Any) -> CheckedRow:
    """A record as :func:`checked_kafka_batch` takes it.  Bad input fails here, in the
    call that gave it, instead of failing the batch it would have joined."""
    if key is not None and key.__class__ is not bytes:
        key = _as_bytes(key, "key")
    if value.__class__ is not bytes:
        value = _as_bytes(value, "value")
    if headers is not None:
        try:
            pairs = list(_header_items(headers))
        except (TypeError, ValueError):
            raise SchemaMismatchError(
                f"headers must be a dict or a list of (key, value) pairs, not "
                f"{headers!r}") from None
        headers = [{"key": _header_key(k), "value": _as_bytes(v, "header value")}
                   for k, v in pairs]
    if timestamp_ms is not None:
        ts = timestamp_ms
        try:
            if ts.__class__ is not int:
                ts = int(ts)
            if not _MIN_MS <= ts <= _MAX_MS:  # Arrow's timestamp is an int64
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise SchemaMismatchError(
                f"timestamp_ms must be milliseconds since the epoch (a 64-bit int) or None, "
                f"not {timestamp_ms!r}") from None
        timestamp_ms = ts
    return key, value, headers, timestamp_ms


def _header_key(k: Any) -> str:
    key = str(k)
    try:
        key.encode()
    except UnicodeEncodeError:
        raise SchemaMismatchError(f"header key {key!r} is not valid UTF-8") from None
    return key


_MIN_MS, _MAX_MS = -(1 << 63), (1 << 63) - 1


def checked_kafka_batch(rows: Sequence[CheckedRow]) -> tuple[pa.Table, int, int]:
    """A Kafka-shaped table of :func:`checked_row` rows (records without a timestamp get
    the time of this call), with the (min, max) of its timestamps."""
    if not rows:
        raise ValueError("no rows")
    keys, values, headers, ts = zip(*rows, strict=True)
    if None in ts:
        now = now_ms()
        ts = tuple(now if t is None else t for t in ts)
    mem = arrow_memory.pool()
    table = pa.table([pa.array(keys, pa.binary(), memory_pool=mem),
                      pa.array(values, pa.binary(), memory_pool=mem),
                      pa.array(headers, HEADER_TYPE, memory_pool=mem),
                      pa.array(ts, pa.timestamp("ms", tz="UTC"), memory_pool=mem)],
                     schema=KAFKA_SCHEMA)
    return table, min(ts), max(ts)


def kafka_table(rows: Sequence[tuple[Any, Any, Any, Any]]) -> pa.Table:
    """Build a Kafka-shaped table from (key, value, headers, timestamp_ms) tuples."""
    if not rows:
        return KAFKA_SCHEMA.empty_table()
    return checked_kafka_batch([checked_row(*r) for r in rows])[0]


def _header_items(h: Any) -> Iterable[tuple[str, Any]]:
    if isinstance(h, dict):
        return h.items()
    return [(k, v) for k, v in h]


def conform(table: pa.Table, schema: pa.Schema, topic: str, *, kafka_shaped: bool,
            omit_absent: bool = False) -> pa.Table:
    """Check ``table`` against a topic's schema and return it in the topic's exact types.

    Column order and safe casts (e.g. string -> binary for Kafka keys) are fixed up;
    missing required columns, unknown columns and unsafe casts are errors.  With
    ``omit_absent``, Kafka's optional columns the table lacks stay out (see
    OPTIONAL_KAFKA_COLUMNS) instead of being filled in.
    """
    names = set(table.column_names)
    if kafka_shaped:
        if "value" not in names:
            raise SchemaMismatchError(
                f"topic {topic!r} holds Kafka-shaped records: the table needs a 'value' column "
                f"(and optionally key, headers, timestamp); it has {sorted(names)}"
            )
        n = table.num_rows
        cols, fields = [], []
        for f in KAFKA_SCHEMA:
            if f.name not in names and omit_absent and f.name in OPTIONAL_KAFKA_COLUMNS:
                continue
            fields.append(f)
            if f.name in names:
                cols.append(_cast(table.column(f.name), f, topic))
            elif f.name == "timestamp":
                cols.append(pa.repeat(pa.scalar(now_ms(), pa.timestamp("ms", tz="UTC")), n))
            else:
                cols.append(pa.nulls(n, f.type))
        extra = names - set(KAFKA_SCHEMA.names)
        if extra:
            raise SchemaMismatchError(
                f"topic {topic!r} (Kafka-shaped) does not take columns {sorted(extra)}"
            )
        return pa.table(cols, schema=pa.schema(fields))
    missing = [f.name for f in schema if f.name not in names and not f.nullable]
    extra = names - set(schema.names)
    if missing or extra:
        raise SchemaMismatchError(
            f"data does not match topic {topic!r}: missing columns {missing}, unknown columns "
            f"{sorted(extra)}; the topic's schema is {schema}"
        )
    cols = []
    for f in schema:
        if f.name in names:
            cols.append(_cast(table.column(f.name), f, topic))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.table(cols, schema=schema)


def _cast(col: pa.ChunkedArray, f: pa.Field, topic: str) -> pa.ChunkedArray:
    if col.type != f.type:
        try:
            col = col.cast(f.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaMismatchError(
                f"column {f.name!r} of type {col.type} cannot be written to topic {topic!r} "
                f"whose column is {f.type}: {exc}"
            ) from None
    if not f.nullable and col.null_count:
        raise SchemaMismatchError(
            f"column {f.name!r} of topic {topic!r} is not nullable but has {col.null_count} nulls"
        )
    return col


#: Columns a Kafka-shaped batch object may leave out: a Spark write without them stores
#: neither, and Parquet encodes two columns where it would encode four.  No headers
#: column: no record has headers; no timestamp column: no record has a CreateTime, and
#: readers give the batch's append time (Kafka's LogAppendTime), as for a null timestamp.
OPTIONAL_KAFKA_COLUMNS = ("headers", "timestamp")
_KAFKA_FIELDS = {f.name: f for f in KAFKA_SCHEMA}


def has_kafka_fields(schema: pa.Schema) -> bool:
    """Whether every field of ``schema`` is KAFKA_SCHEMA's field of that name."""
    return all(f.name in _KAFKA_FIELDS and _KAFKA_FIELDS[f.name] == f for f in schema)


def with_kafka_columns(table: pa.Table, columns: Sequence[str] | None = None) -> pa.Table:
    """A Kafka-shaped batch object's rows with the optional columns it left out (of
    ``columns``, default all) added as nulls, in KAFKA_SCHEMA's order."""
    names = table.column_names
    wanted = KAFKA_SCHEMA.names if columns is None else columns
    complete = all(c in names for c in wanted if c in OPTIONAL_KAFKA_COLUMNS)
    if complete and has_kafka_fields(table.schema):
        return table
    n = table.num_rows
    cols, fields = [], []
    for f in KAFKA_SCHEMA:
        if f.name in names:
            # Spark's writer may have stored a column as required or named a list's item
            # differently: the types are KAFKA_SCHEMA's, so tables of one partition concat.
            col = table.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
            fields.append(f)
        elif f.name in OPTIONAL_KAFKA_COLUMNS and f.name in wanted:
            cols.append(pa.nulls(n, f.type))
            fields.append(f)
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def ts_range(table: pa.Table) -> tuple[int | None, int | None, bool]:
    """(min, max) of the records' own timestamps in ms (None, None when none has one),
    and whether some record has none (its time is its batch's append time)."""
    if "timestamp" not in table.column_names or not table.num_rows:
        return None, None, True
    import pyarrow.compute as pc

    col = table.column("timestamp")
    mm = pc.min_max(col.cast(pa.timestamp("ms", tz="UTC"), safe=False).cast(pa.int64()))
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if lo is None or hi is None:
        return None, None, True
    return int(lo), int(hi), col.null_count > 0


class _Iota:
    """0, 1, 2, ... as a cached Arrow array, grown on demand up to _IOTA_MAX."""

    arr: pa.Array = pa.array([], pa.int64())


_IOTA_MAX = 1 << 20  # 8 MiB kept for the process's life at most


def offset_range(first: int, n: int) -> pa.Array:
    """first, first + 1, ..., first + n - 1 as int64: an offset column without a Python
    int per row."""
    import pyarrow.compute as pc

    if n > _IOTA_MAX:
        return pa.concat_arrays([offset_range(first + i, min(_IOTA_MAX, n - i))
                                 for i in range(0, n, _IOTA_MAX)])
    # One read of the shared cache: another thread may swap in a shorter one meanwhile.
    arr = _Iota.arr
    if len(arr) < n:
        arr = pa.array(range(min(_IOTA_MAX, max(n, 2 * len(arr)))), pa.int64())
        _Iota.arr = arr
    return pc.add_checked(arr.slice(0, n), pa.scalar(first, pa.int64()))


def with_append_time(table: pa.Table, append_ms: int) -> pa.Table:
    """A Kafka-shaped batch's rows with every column, records without a timestamp of
    their own given the batch's append time, and a ``timestampType`` column: 0 for a
    record's own timestamp (CreateTime), 1 for the append time (Kafka's LogAppendTime)."""
    import pyarrow.compute as pc

    table = with_kafka_columns(table)
    ts = table.column("timestamp")
    if not ts.null_count:
        return table.append_column("timestampType", pa.repeat(pa.scalar(0, pa.int32()),
                                                              table.num_rows))
    kind = pc.if_else(pc.is_null(ts), pa.scalar(1, pa.int32()), pa.scalar(0, pa.int32()))
    filled = pc.coalesce(ts, pa.scalar(append_ms, ts.type))
    table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp", filled)
    return table.append_column("timestampType", kind)


def table_to_records(table: pa.Table, topic: str, partition: int, first_offset: int,
                     *, kafka_shaped: bool, append_ms: int = 0) -> list[Record]:
    """Row objects at the edge: the table stays columnar until here."""
    n = table.num_rows
    if kafka_shaped:
        if "timestampType" in table.column_names:  # with_append_time's: complete already
            kinds = table.column("timestampType").to_pylist()
        else:
            kinds = None
            table = with_kafka_columns(table)
        keys = table.column("key").to_pylist()
        values = table.column("value").to_pylist()
        headers = table.column("headers").to_pylist()
        ts = table.column("timestamp").cast(pa.int64()).to_pylist()
        if kinds is None:
            kinds = [0 if t is not None else 1 for t in ts]
        return [Record(topic, partition, first_offset + i, keys[i], values[i],
                       [(h["key"], h["value"]) for h in headers[i]] if headers[i] else [],
                       ts[i] if ts[i] is not None else append_ms, kinds[i])
                for i in range(n)]
    rows = table.to_pylist()
    return [Record(topic, partition, first_offset + i, None, rows[i], [], append_ms, 1)
            for i in range(n)]


def schema_to_json(schema: pa.Schema) -> str:
    """Serialise an Arrow schema as base64 IPC (exact, including nullability)."""
    import base64

    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_json(s: str) -> pa.Schema:
    import base64

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(s)))



def largest_record(table: pa.Table) -> int:
    """The size in bytes of the table's largest record as the size limits count it:
    the bytes of its variable-width values (binary, strings, and lists and structs of
    them, header keys and values included) plus its share of the fixed-width columns."""
    import pyarrow.compute as pc

    if not table.num_rows:
        return 0
    total = pa.repeat(pa.scalar(0, pa.int64()), table.num_rows)
    for col in table.columns:
        total = pc.add(total, _value_sizes(col.combine_chunks()))
    return int(pc.max(total).as_py() or 0)


def _value_sizes(arr: pa.Array) -> pa.Array:
    """Per value of ``arr``, its bytes as largest_record() counts them (int64)."""
    import pyarrow.compute as pc

    t = arr.type
    n = len(arr)
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) \
            or pa.types.is_large_string(t):
        return pc.fill_null(pc.binary_length(arr), 0).cast(pa.int64())
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        # Per row, the inner sizes between its offsets: differences of a running sum.
        inner = _value_sizes(arr.values)
        running = pa.concat_arrays([pa.array([0], pa.int64()),
                                    pc.cumulative_sum(inner).cast(pa.int64())])
        offsets = arr.offsets.cast(pa.int64())
        ends = pc.take(running, offsets.slice(1))
        starts = pc.take(running, offsets.slice(0, n))
        return pc.subtract(ends, starts)
    if pa.types.is_struct(t):
        out = pa.repeat(pa.scalar(0, pa.int64()), n)
        for i in range(t.num_fields):
            out = pc.add(out, _value_sizes(arr.field(i)))
        return out
    try:
        width = t.bit_width // 8
    except ValueError:  # not fixed-width
        width = 0
    if not width:
        width = -(-arr.nbytes // max(1, n))  # other types: an even share of their bytes
    return pa.repeat(pa.scalar(width, pa.int64()), n)
