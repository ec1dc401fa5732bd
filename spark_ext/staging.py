"""Task side of the Spark writer: route rows to topic partitions and stage Parquet files.

A Spark task never touches a partition log or the transaction coordinator.  It writes
its rows, split per target partition, as Parquet objects under the job's staging prefix
(``layout.staging_prefix(topic, txn)``) and returns a commit message listing them.  Only
the driver appends, from the messages of the attempts that succeeded
(:mod:`spark_ext.writer`), so a retried or speculative attempt can never duplicate data:
its files are simply never referenced, and are swept.

Object names carry the Spark partition id, the task attempt id (unique within a Spark
application) and the attempt number, so attempts never overwrite each other.

Everything here is plain data and picklable: Spark ships it to worker processes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txlog import checksums, layout
from txlog.batch_codec import encode_parquet
from txlog.errors import ConfigError, SchemaMismatchError, UnknownTopicError
from txlog.records import HEADER_TYPE, KAFKA_SCHEMA, conform, ts_range

#: Columns a Kafka-shaped write takes (besides routing columns ``topic``/``partition``).
KAFKA_DATA_COLUMNS = ("key", "value", "headers", "timestamp")
#: Columns the txlog reader adds; accepted on input and dropped, so a DataFrame read from a
#: topic can be written back unchanged.
READER_ONLY_COLUMNS = ("offset", "timestampType")
ROUTING_COLUMNS = ("topic", "partition")

PARTITIONERS = ("default", "murmur2", "roundrobin")

DEFAULT_FILE_BYTES = 128 * 1024 * 1024
ROUTE_ROWS = 128 * 1024
ROUTE_BYTES = 32 * 1024 * 1024
DEFAULT_BUFFER_BYTES = 256 * 1024 * 1024
#: Threads that encode and store a task's last files.
FINISH_THREADS = 3


@dataclass(frozen=True)
class TopicTarget:
    """What a task needs to know about one topic it may write."""

    name: str
    partitions: int
    kafka_shaped: bool
    schema: pa.Schema


@dataclass(frozen=True)
class StagedFile:
    """One staged Parquet object: becomes one batch of ``topic``-``partition`` on commit."""

    topic: str
    partition: int
    key: str
    rows: int
    nbytes: int
    ts_min: int | None  # the records' own timestamps (None: no record has one)
    ts_max: int | None
    task: int = 0  # Spark partition id of the task that wrote it (for a stable order)
    seq: int = 0
    untimed: bool = False  # some records have no timestamp (their time: the append time)


@dataclass
class StageSpec:
    """The write, as tasks see it.  Built on the driver, pickled to every task."""

    url: str
    storage_options: dict[str, Any]
    txn: str  # staging id: names the staging folder of this job (or micro-batch)
    topic: str | None  # the `topic` option: wins over a `topic` column (as in Kafka)
    targets: dict[str, TopicTarget]  # topics resolved on the driver
    columns: list[str]  # the DataFrame's columns, in order
    partitioner: str = "default"
    file_bytes: int = DEFAULT_FILE_BYTES
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def topic_from_column(self) -> bool:
        return self.topic is None


# -- schema checks (driver side, before anything is staged) ---------------------------------


def check_columns(columns: list[str], arrow_schema: pa.Schema, target: TopicTarget) -> None:
    """Raise SchemaMismatchError unless a DataFrame with these columns can be written to
    ``target``.  Checks names, and types by casting an empty column (no data needed);
    nulls in non-nullable columns can only be found in the data (the task fails)."""
    names = set(columns)
    if "partition" in names:
        t = arrow_schema.field("partition").type
        if not pa.types.is_integer(t):
            raise SchemaMismatchError(
                f"the 'partition' column must be an integer type, not {t}")
    if "topic" in names:
        t = arrow_schema.field("topic").type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise SchemaMismatchError(f"the 'topic' column must be a string, not {t}")
    data = [c for c in columns if c not in ROUTING_COLUMNS and c not in READER_ONLY_COLUMNS]
    if target.kafka_shaped:
        extra = sorted(set(data) - set(KAFKA_DATA_COLUMNS))
        if "value" not in data or extra:
            raise SchemaMismatchError(
                f"topic {target.name!r} holds Kafka-shaped records: write columns value "
                f"(required), key, headers, timestamp, and optionally topic and partition; "
                + (f"unknown columns {extra}" if extra else f"the DataFrame has {columns} "
                   "and no 'value' column")
            )
        if "timestamp" in data:
            t = arrow_schema.field("timestamp").type
            if not pa.types.is_timestamp(t):
                raise SchemaMismatchError(
                    f"the 'timestamp' column must be a timestamp, not {t}")
        data = [c for c in data if c != "timestamp"]
        empty = pa.table({c: pa.array([], arrow_schema.field(c).type) for c in data})
        conform(empty, KAFKA_SCHEMA, target.name, kafka_shaped=True)
        return
    # Typed topics cannot have a 'timestamp' column (readers add it): drop it on input.
    data = [c for c in data if c != "timestamp"]
    empty = pa.table({c: pa.array([], arrow_schema.field(c).type) for c in data})
    conform(empty, target.schema, target.name, kafka_shaped=False)


# -- Kafka's partitioner, vectorised -------------------------------------------------------

_M = 0x5BD1E995
_U32 = pa.uint32()


def _mul(a: pa.Array, b: int) -> pa.Array:
    return pc.multiply(a, pa.scalar(b, _U32))  # wraps modulo 2**32 (unchecked kernel)


def _xor(a: pa.Array, b: Any) -> pa.Array:
    return pc.bit_wise_xor(a, b)


def _shr(a: pa.Array, n: int) -> pa.Array:
    return pc.shift_right(a, pa.scalar(n, _U32))


def _fixed(arr: pa.Array, width: int) -> pa.Array:
    """View a binary array whose values all have ``width`` bytes as fixed_size_binary."""
    arr = arr.cast(pa.binary()) if not pa.types.is_binary(arr.type) else arr
    n = len(arr)
    bufs = arr.buffers()
    start = pa.Array.from_buffers(pa.int32(), n + 1, [None, bufs[1]], offset=arr.offset)[0]
    start = start.as_py()
    data = bufs[2]
    if data is None:
        data = pa.py_buffer(b"")
    return pa.Array.from_buffers(pa.binary(width), n, [None, data.slice(start, n * width)])


def _as_uint(fsb: pa.Array, lo: int, width: int) -> pa.Array:
    """Bytes [lo, lo+width) of each fixed-size value, little-endian, as uint32 (width 1 or 4)."""
    piece = pc.binary_slice(fsb, lo, lo + width)
    if not pa.types.is_fixed_size_binary(piece.type):
        piece = _fixed(piece, width)
    buf = piece.buffers()[1]
    typ = pa.uint32() if width == 4 else pa.uint8()
    out = pa.Array.from_buffers(typ, len(piece), [None, buf], offset=piece.offset)
    return out.cast(_U32)


def _hash_fixed(fsb: pa.Array, length: int) -> pa.Array:
    """murmur2 of equal-length keys (a fixed_size_binary array), as uint32."""
    h = pc.add(pa.nulls(len(fsb), _U32).fill_null(0),
               pa.scalar((0x9747B28C ^ length) & 0xFFFFFFFF, _U32))
    for i in range(length // 4):
        k = _as_uint(fsb, 4 * i, 4)
        k = _mul(k, _M)
        k = _xor(k, _shr(k, 24))
        k = _mul(k, _M)
        h = _xor(_mul(h, _M), k)
    rest = length & 3
    tail = 4 * (length // 4)
    if rest == 3:
        h = _xor(h, pc.shift_left(_as_uint(fsb, tail + 2, 1), pa.scalar(16, _U32)))
    if rest >= 2:
        h = _xor(h, pc.shift_left(_as_uint(fsb, tail + 1, 1), pa.scalar(8, _U32)))
    if rest >= 1:
        h = _mul(_xor(h, _as_uint(fsb, tail, 1)), _M)
    h = _xor(h, _shr(h, 13))
    h = _mul(h, _M)
    return _xor(h, _shr(h, 15))


def murmur2_array(keys: pa.Array) -> pa.Array:
    """Kafka's murmur2 of each key (non-null, non-empty), as uint32: equal to
    ``txlog.partitioner.murmur2(k) & 0xFFFFFFFF``; null for null or empty keys.

    Keys are sorted by length (one stable sort) and each run of equal-length keys is
    hashed with Arrow kernels, so no Python code runs per row."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    keys = keys.cast(pa.binary()) if not pa.types.is_binary(keys.type) else keys
    n = len(keys)
    if n == 0:
        return pa.array([], _U32)
    lengths = pc.binary_length(keys).fill_null(0)
    order = pc.sort_indices(lengths)
    ree = pc.run_end_encode(lengths.take(order))
    runs = list(zip(ree.run_ends.to_pylist(), ree.values.to_pylist(), strict=True))
    if len(runs) == 1 and runs[0][1] == 0:
        return pa.nulls(n, _U32)
    by_length = keys.take(order)
    pieces = []
    start = 0
    for end, length in runs:
        count = end - start
        if length == 0:
            pieces.append(pa.nulls(count, _U32))
        else:
            pieces.append(_hash_fixed(_fixed(by_length.slice(start, count), length), length))
        start = end
    hashed = pa.concat_arrays(pieces)
    if len(runs) == 1:
        return hashed
    return hashed.take(pc.sort_indices(order))  # back to input order


def partitions_for_keys(keys: pa.Array, num_partitions: int) -> pa.Array:
    """``txlog.partitioner.partition_for_key`` for every key; null for null/empty keys."""
    h = pc.bit_wise_and(murmur2_array(keys), pa.scalar(0x7FFFFFFF, _U32))
    q = pc.divide(h, pa.scalar(num_partitions, _U32))
    return pc.subtract(h, pc.multiply(q, pa.scalar(num_partitions, _U32))).cast(pa.int32())


# -- staging ---------------------------------------------------------------------------------


class _Buffer:
    __slots__ = ("nbytes", "tables")

    def __init__(self) -> None:
        self.tables: list[pa.Table] = []
        self.nbytes = 0


class Stager:
    """Routes a task's Arrow batches to (topic, partition) buffers and writes them as
    Parquet objects under the staging prefix; :meth:`finish` returns what it staged."""

    def __init__(self, spec: StageSpec, *, task: int, attempt_id: int, attempt: int) -> None:
        from txlog.storage import open_store

        self.spec = spec
        self.store = open_store(spec.url, spec.storage_options)
        self.task = task
        self.tag = f"{task:05d}-{attempt_id}-{attempt}"
        self.targets = dict(spec.targets)
        self._buffers: dict[tuple[str, int], _Buffer] = {}
        self._buffered = 0
        self._seq = itertools.count()
        self._sticky = itertools.count(task)  # keyless rows: next partition per batch
        self.files: list[StagedFile] = []
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._pending_bytes = 0

    # -- routing ---------------------------------------------------------------------------

    def _target(self, topic: str) -> TopicTarget:
        t = self.targets.get(topic)
        if t is None:
            from txlog.log import connect

            try:
                info = connect(self.spec.url, self.spec.storage_options).topic(topic)
            except UnknownTopicError:
                raise
            t = TopicTarget(info.name, info.partitions, info.kafka_shaped, info.schema)
            self.targets[topic] = t
        return t

    def add(self, batch: pa.RecordBatch) -> None:
        """Take one batch; rows are routed in chunks of about ROUTE_ROWS (Spark hands
        Python 10,000-row batches: routing bigger chunks costs a third less CPU)."""
        if batch.num_rows == 0:
            return
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        self._pending_bytes += batch.nbytes
        if self._pending_rows >= ROUTE_ROWS or self._pending_bytes >= ROUTE_BYTES:
            self._route_pending()

    def _route_pending(self) -> None:
        if not self._pending:
            return
        chunk = pa.Table.from_batches(self._pending)
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        if self.spec.topic_from_column:
            col = chunk.column("topic")
            if col.null_count:
                raise SchemaMismatchError(
                    "the 'topic' column has nulls: every row needs a topic (or set the "
                    "'topic' option)")
            topics = pc.unique(col).to_pylist()
            if len(topics) == 1:
                self._add_topic(str(topics[0]), chunk)
            else:
                for t in topics:
                    self._add_topic(str(t), chunk.filter(pc.equal(col, t)))
        else:
            assert self.spec.topic is not None
            self._add_topic(self.spec.topic, chunk)

    def _add_topic(self, topic: str, batch: pa.Table) -> None:
        target = self._target(topic)
        n = target.partitions
        names = batch.schema.names
        parts: pa.Array | None = None
        if "partition" in names:
            parts = _combined(batch.column(names.index("partition"))).cast(pa.int32())
            bad = pc.or_(pc.less(parts, 0), pc.greater_equal(parts, n)).fill_null(False)
            if pc.any(bad).as_py():
                v = parts.filter(bad)[0].as_py()
                raise UnknownTopicError(
                    f"topic {topic!r} has partitions 0..{n - 1}, not {v} (from the "
                    "'partition' column)")
            if parts.null_count == 0:
                self._route(target, batch, parts)
                return
        chosen: pa.Array | None = None
        if self.spec.partitioner != "roundrobin" and "key" in names and n > 1:
            chosen = partitions_for_keys(_combined(batch.column(names.index("key"))), n)
        sticky = next(self._sticky) % n
        if chosen is None:
            chosen = pa.repeat(pa.scalar(sticky, pa.int32()), batch.num_rows)
        elif chosen.null_count:
            chosen = chosen.fill_null(sticky)
        if parts is not None:
            chosen = pc.coalesce(parts, chosen)
        self._route(target, batch, chosen)

    def _route(self, target: TopicTarget, batch: pa.Table, parts: pa.Array) -> None:
        table = self._data_table(target, batch)
        uniq = pc.unique(parts)
        if len(uniq) == 1:
            self._buffer(target, int(uniq[0].as_py()), table)
            return
        order = pc.sort_indices(parts)  # stable: rows keep their order within a partition
        table = table.take(order)
        ree = pc.run_end_encode(parts.take(order))
        start = 0
        for end, p in zip(ree.run_ends.to_pylist(), ree.values.to_pylist(), strict=True):
            self._buffer(target, int(p), table.slice(start, end - start))
            start = end

    def _data_table(self, target: TopicTarget, batch: pa.Table) -> pa.Table:
        names = batch.schema.names
        if target.kafka_shaped:
            cols = {c: batch.column(names.index(c)) for c in KAFKA_DATA_COLUMNS if c in names}
            ts = cols.get("timestamp")
            if ts is not None:
                # Spark timestamps are microseconds; Kafka's are milliseconds: truncate.
                cols["timestamp"] = ts.cast(pa.timestamp("ms", tz="UTC"), safe=False)
            if "headers" in cols and cols["headers"].type != HEADER_TYPE:
                cols["headers"] = _headers(cols["headers"], target.name)
            table = pa.table(cols)
            # Rows without headers or timestamps are stored without those columns: the
            # records have none, and readers give them the append time (records.py).
            return conform(table, KAFKA_SCHEMA, target.name, kafka_shaped=True,
                           omit_absent=True)
        keep = [c for c in names if c in target.schema.names]
        table = pa.table({c: batch.column(names.index(c)) for c in keep})
        for f in target.schema:
            if pa.types.is_timestamp(f.type) and f.name in keep:
                col = table.column(f.name)
                if col.type != f.type:
                    table = table.set_column(table.schema.get_field_index(f.name), f.name,
                                             col.cast(f.type, safe=False))
        return conform(table, target.schema, target.name, kafka_shaped=False)

    # -- buffering and writing ---------------------------------------------------------------

    def _buffer(self, target: TopicTarget, partition: int, table: pa.Table) -> None:
        key = (target.name, partition)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = _Buffer()
        buf.tables.append(table)
        buf.nbytes += table.nbytes
        self._buffered += table.nbytes
        if buf.nbytes >= self.spec.file_bytes:
            self._write(key)
        while self._buffered > self.spec.buffer_bytes and self._buffers:
            biggest = max(self._buffers, key=lambda k: self._buffers[k].nbytes)
            self._write(biggest)

    def _write(self, key: tuple[str, int]) -> None:
        self.files.append(self._put(*self._take(key)))

    def _take(self, key: tuple[str, int]) -> tuple[str, int, pa.Table, int]:
        """Remove a buffer and give its rows a file sequence number (in this thread)."""
        buf = self._buffers.pop(key)
        self._buffered -= buf.nbytes
        table = pa.concat_tables(buf.tables) if len(buf.tables) > 1 else buf.tables[0]
        return key[0], key[1], table, next(self._seq)

    def _put(self, topic: str, partition: int, table: pa.Table, seq: int) -> StagedFile:
        """Encode and store one file (safe to run in several threads at once)."""
        # Unique across jobs too (readers may match files by name): the staging id's uuid.
        data = encode_staged(table)
        name = (f"p{partition:05d}-t{self.tag}-{seq:04d}-{self.spec.txn[-12:]}"
                f"{checksums.tag(data)}.parquet")
        obj = layout.staging_prefix(topic, self.spec.txn) + name
        self.store.put(obj, data)
        ts_min, ts_max, untimed = ts_range(table)
        return StagedFile(topic, partition, obj, table.num_rows, len(data), ts_min, ts_max,
                          self.task, seq, untimed)

    def finish(self) -> list[StagedFile]:
        self._route_pending()
        work = [self._take(key) for key in sorted(self._buffers)]
        if len(work) > 1:
            # Parquet encoding and the store's write + fsync release the GIL: one file's
            # fsync (or upload) overlaps the next one's encoding.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=FINISH_THREADS) as ex:
                self.files.extend(ex.map(lambda w: self._put(*w), work))
        else:
            self.files.extend(self._put(*w) for w in work)
        return self.files


def encode_staged(table: pa.Table) -> bytes:
    """A staged file is appended as it is: encoded exactly as the producer's batches."""
    return encode_parquet(table)


def stage(spec: StageSpec, batches: Iterable[pa.RecordBatch], *, task: int, attempt_id: int,
          attempt: int) -> list[StagedFile]:
    """Stage every row of ``batches``; returns the staged files (nothing is appended)."""
    stager = Stager(spec, task=task, attempt_id=attempt_id, attempt=attempt)
    for b in batches:
        stager.add(b)
    return stager.finish()


def _combined(col: Any) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _headers(col: pa.Array, topic: str) -> pa.Array:
    try:
        return col.cast(HEADER_TYPE)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatchError(
            f"the 'headers' column cannot be written to topic {topic!r} as "
            f"array<struct<key: string not null, value: binary>>: {exc}") from None


def task_identity() -> tuple[int, int, int]:
    """(partition id, task attempt id, attempt number) of the running Spark task."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return 0, 0, 0
    return tc.partitionId(), tc.taskAttemptId(), tc.attemptNumber()


def validate_partitioner(name: str) -> str:
    p = name.strip().lower().replace("_", "").replace("-", "")
    p = {"murmur2": "murmur2", "default": "default", "roundrobin": "roundrobin"}.get(p, p)
    if p not in PARTITIONERS:
        raise ConfigError(
            f"unknown partitioner {name!r}: use 'default' (Kafka's murmur2 of the key, "
            "round robin without a key), 'murmur2' or 'roundrobin'; or write a "
            "'partition' column")
    return p


def iter_files(messages: Iterable[Any]) -> Iterator[StagedFile]:
    for m in messages:
        if m is not None:
            yield from m.files
