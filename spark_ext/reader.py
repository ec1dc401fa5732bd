"""The Python data source readers: batch (``spark.read``) and Structured Streaming.

Planning (which batch objects, trimmed how) happens in ``partitions()`` on the driver side
(:mod:`spark_ext.read_plan`); each Spark task gets a list of :class:`FileSlice` tuples and
reads them with pyarrow straight from the store, yielding Arrow record batches in exactly
the declared schema.  Every method may run in a different Python worker process: readers
carry only options and the output shape, and rebuild the store from the options.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from spark_ext import plan_arrays
from spark_ext.object_fetch import PREFETCH_BYTES, PREFETCH_OBJECTS, fetch_objects, object_reads
from spark_ext.options import ReadOptions, check_query_kind
from spark_ext.read_plan import (
    INITIAL_MARK,
    FileSlice,
    OutputShape,
    check_range,
    load_states,
    offsets_for_spec,
    offsets_from_json,
    offsets_to_json,
    plan_batch,
    rate_limit,
    split_groups,
    subscribed_partitions,
    subscribed_topics,
)
from txlog import checksums
from txlog.batch_rows import BatchRows
from txlog.errors import CorruptObjectError
from txlog.partition_state import READ_UNCOMMITTED, PartitionState
from txlog.records import TopicPartition, offset_range, with_kafka_columns

if TYPE_CHECKING:
    from txlog.log import Log
    from txlog.storage import ObjectStore

#: Output batches smaller than this many rows are merged before they go to the JVM.
TARGET_BATCH_ROWS = 64 * 1024
#: Output batches are cut before they pass this many bytes (merging small pieces
#: copies them: this bounds the copy as well as the batch).
TARGET_BATCH_BYTES = 8 * 1024 * 1024
#: Decoded bytes of a piece of an object (a row group, or part of a large one).
PIECE_BYTES = TARGET_BATCH_BYTES


class TxlogInputPartition(InputPartition):
    """One Spark task's share of a read: file slices as plain tuples (cheap to pickle)."""

    def __init__(self, index: int, slices: Sequence[tuple[Any, ...]]) -> None:
        super().__init__(index)
        self.slices = list(slices)

    def __repr__(self) -> str:
        return f"TxlogInputPartition({self.value}, {len(self.slices)} slices)"


def make_partitions(groups: list[list[FileSlice]]) -> list[InputPartition]:
    return [TxlogInputPartition(i, [tuple(s) for s in g]) for i, g in enumerate(groups)]


# --- reading slices --------------------------------------------------------------------------


def _fit(col: Any, field: pa.Field) -> Any:
    return col if col.type == field.type else col.cast(field.type)


def open_rows(raw: bytes, key: str, shape: OutputShape) -> BatchRows:
    """A fetched object, its checksum verified, ready to be read a range at a time."""
    return BatchRows(checksums.verify(key, raw), key, shape.data_columns,
                     piece_bytes=PIECE_BYTES)


def slice_pieces(rows: BatchRows, s: FileSlice, shape: OutputShape, target: pa.Schema,
                 ) -> Iterator[pa.Table]:
    """One slice's rows in the declared output schema, a decoded piece at a time."""
    if s.skip + s.take > rows.num_rows:
        raise CorruptObjectError(
            f"batch object {s.key} holds {rows.num_rows} rows but the log says offsets "
            f"{s.start}..{s.stop - 1} are in it")
    at = s.start
    for piece in rows.rows(s.skip, s.take):
        yield output_table(piece, s, at, shape, target)
        at += piece.num_rows


def output_table(table: pa.Table, s: FileSlice, first_offset: int, shape: OutputShape,
                 target: pa.Schema) -> pa.Table:
    """Rows of slice ``s`` (the first at ``first_offset``) in the declared output schema."""
    n = table.num_rows
    cols: dict[str, Any] = {
        "topic": pa.repeat(pa.scalar(s.topic, pa.string()), n),
        "partition": pa.repeat(pa.scalar(s.partition, pa.int32()), n),
        "offset": offset_range(first_offset, n),
    }
    if shape.kafka_shaped:
        table = with_kafka_columns(table, shape.data_columns)
        ts = table.column("timestamp")
        if ts.null_count:
            cols["timestampType"] = pc.if_else(pc.is_null(ts), pa.scalar(1, pa.int32()),
                                               pa.scalar(0, pa.int32()))
            ts = pc.coalesce(ts, pa.scalar(s.append_ms, ts.type))
        else:
            cols["timestampType"] = pa.repeat(pa.scalar(0, pa.int32()), n)
        cols["timestamp"] = ts
        for name in ("key", "value", "headers"):
            if name in table.column_names:
                cols[name] = table.column(name)
    else:
        cols["timestamp"] = pa.repeat(pa.scalar(s.append_ms * 1000, pa.timestamp("us", "UTC")),
                                      n)
        for name in table.column_names:
            cols[name] = table.column(name)
    arrays = [_fit(cols[f.name], f) for f in target]
    return pa.Table.from_arrays(arrays, schema=target)


def read_slices(store: ObjectStore, slices: Sequence[tuple[Any, ...]], shape: OutputShape,
                target: pa.Schema, fail_on_data_loss: bool) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the slices: small pieces (fewer than TARGET_BATCH_ROWS
    rows and half TARGET_BATCH_BYTES) merged, none past ~TARGET_BATCH_BYTES.  Each
    object is fetched once for the consecutive slices in it (the runs of a compacted
    segment) and decoded a row group at a time."""
    pending: list[pa.Table] = []
    rows = nbytes = 0
    reads = object_reads([FileSlice(*t) for t in slices])
    for r, raw in fetch_objects(store, reads, fail_on_data_loss=fail_on_data_loss,
                                max_objects=PREFETCH_OBJECTS, max_bytes=PREFETCH_BYTES):
        if raw is None:
            continue
        obj = open_rows(raw, r.key, shape)
        del raw
        for s in r.slices:
            for t in slice_pieces(obj, s, shape, target):
                if t.num_rows >= TARGET_BATCH_ROWS or t.nbytes >= TARGET_BATCH_BYTES // 2:
                    # Large enough alone: handed on as decoded, without a merging copy.
                    if pending:
                        yield from _flush(pending)
                        pending, rows, nbytes = [], 0, 0
                    yield from t.to_batches()
                    continue
                if pending and nbytes + t.nbytes > TARGET_BATCH_BYTES:
                    yield from _flush(pending)
                    pending, rows, nbytes = [], 0, 0
                pending.append(t)
                rows += t.num_rows
                nbytes += t.nbytes
                if rows >= TARGET_BATCH_ROWS or nbytes >= TARGET_BATCH_BYTES:
                    yield from _flush(pending)
                    pending, rows, nbytes = [], 0, 0
        del obj
    if pending:
        yield from _flush(pending)


def _flush(tables: list[pa.Table]) -> Iterator[pa.RecordBatch]:
    t = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    if len(tables) > 1 or any(c.num_chunks > 1 for c in t.columns):
        t = t.combine_chunks()
    yield from t.to_batches()


def arrow_target(schema_json: str) -> pa.Schema:
    """The Arrow schema Spark expects for the declared Spark schema (its own conversion)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    return to_arrow_schema(StructType.fromJson(json.loads(schema_json)), timezone="UTC")


class _ReaderBase:
    ro: ReadOptions
    shape: OutputShape
    declared_json: str

    def _read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TxlogInputPartition) or not partition.slices:
            return
        store = self.ro.connect(cached=True).store
        yield from read_slices(store, partition.slices, self.shape,
                               arrow_target(self.declared_json), self.ro.fail_on_data_loss)


# --- batch -------------------------------------------------------------------------------------


class TxlogBatchReader(_ReaderBase, DataSourceReader):
    """``spark.read.format("txlog")``: the plan is made once, in ``partitions()``."""

    def __init__(self, ro: ReadOptions, shape: OutputShape, declared_json: str) -> None:
        check_query_kind(ro, streaming=False)
        self.ro = ro
        self.shape = shape
        self.declared_json = declared_json

    def partitions(self) -> list[InputPartition]:
        plan = plan_batch(self.ro)
        return make_partitions(plan.groups(self.ro))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return self._read(partition)


# --- streaming ---------------------------------------------------------------------------------


class TxlogStreamReader(_ReaderBase, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("txlog")``.

    Offsets are Kafka's JSON ``{"topic": {"0": 42}}``.  Each micro-batch ends at the LSO
    (read_committed) or high watermark; ``maxOffsetsPerTrigger`` caps the offsets per
    micro-batch (admission control); ``Trigger.AvailableNow`` reads up to the offsets
    current when the query starts, then stops.
    """

    def __init__(self, ro: ReadOptions, shape: OutputShape, declared_json: str) -> None:
        check_query_kind(ro, streaming=True)
        self.ro = ro
        self.shape = shape
        self.declared_json = declared_json
        self._log: Log | None = None
        self._target: dict[TopicPartition, int] | None = None
        self._last_latest: dict[TopicPartition, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors need only what read() uses.
        return {"ro": self.ro, "shape": self.shape, "declared_json": self.declared_json,
                "_log": None, "_target": None, "_last_latest": None}

    @property
    def log(self) -> Log:
        if self._log is None:
            self._log = self.ro.connect()
        return self._log

    def _current(self, *, resolve: bool = True,
                 ) -> tuple[list[TopicPartition], dict[TopicPartition, PartitionState]]:
        infos = subscribed_topics(self.log, self.ro)
        tps = subscribed_partitions(self.log, self.ro, infos)
        iso = self.ro.isolation if resolve else READ_UNCOMMITTED
        return tps, load_states(self.log, tps, iso)

    def _latest(self, tps: list[TopicPartition], states: dict[TopicPartition, PartitionState],
                ) -> dict[TopicPartition, int]:
        return {tp: states[tp].end_offset(self.ro.isolation) for tp in tps}

    def initialOffset(self) -> dict:
        tps, states = self._current()
        starts = offsets_for_spec(self.log, self.ro.starting, "latest", tps, states,
                                  self.ro.isolation, starting=True,
                                  strategy=self.ro.timestamp_strategy)
        out = {}
        for tp in tps:
            out[tp], _ = check_range(tp, states[tp], starts[tp], starts[tp],
                                     self.ro.fail_on_data_loss, streaming=True)
        # Marked as initial, the first latestOffset() always differs from it, so Spark runs
        # a (possibly empty) first micro-batch and checkpoints the resolved positions: a
        # query stopped before any data arrived restarts where it started, not at the
        # then-latest offsets (Spark's Kafka source keeps them in its own metadata log).
        return {**offsets_to_json(out), INITIAL_MARK: True}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.ro.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.ro.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        tps, states = self._current()
        self._target = self._latest(tps, states)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        tps, states = self._current()
        latest = self._latest(tps, states)
        self._last_latest = dict(latest)
        begin = offsets_from_json(start)
        for tp in tps:
            if tp not in begin:  # a partition new to this query starts at its beginning
                begin[tp] = states[tp].log_start_offset
        if self._target is not None:
            latest = {tp: min(end, self._target.get(tp, begin[tp])) for tp, end in latest.items()}
        begin = {tp: begin[tp] for tp in tps}
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(begin, latest, limit.max_rows)
        else:
            end = {tp: max(begin[tp], latest[tp]) for tp in tps}
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self._last_latest) if self._last_latest is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return make_partitions(self.plan_groups(start, end))

    def plan_groups(self, start: dict, end: dict) -> list[list[FileSlice]]:
        """The slices from ``start`` to ``end``, grouped into Spark's input partitions."""
        return split_groups(*self.plan_arrays(start, end))

    def plan_arrays(self, start: dict, end: dict) -> tuple[plan_arrays.Slices, np.ndarray]:
        """The slices from ``start`` to ``end`` and each one's input partition."""
        s_map = offsets_from_json(start)
        e_map = offsets_from_json(end)
        # The range ends at or below an LSO already seen, and the LSO never moves back:
        # a refresh (no resolution) is enough, also after a restart.
        states = load_states(self.log, list(e_map), READ_UNCOMMITTED)
        ranges = {}
        for tp, stop in e_map.items():
            st = states[tp]
            first = s_map.get(tp, st.log_start_offset)
            ranges[tp] = check_range(tp, st, first, stop, self.ro.fail_on_data_loss,
                                     streaming=True)
        arrays = plan_arrays.partition_slices(states, ranges, self.ro.isolation)
        return arrays, plan_arrays.group_ids(
            arrays.nbytes, arrays.tp, min_partitions=self.ro.min_partitions,
            max_partition_bytes=self.ro.max_partition_bytes, glued=arrays.glued())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return self._read(partition)

    def commit(self, end: dict) -> None:
        return None
