"""Driver-side planning of Spark reads, built only on txlog's own planning functions.

Which offsets are visible is decided by :meth:`txlog.partition_state.PartitionState.plan_read`
(after :func:`txlog.resolve.resolve_lso` under read_committed), timestamps are looked up
with :meth:`txlog.consumer.Consumer.offsets_for_times`.  Nothing here decides visibility on
its own: this module turns the read spans into picklable file slices and groups them into
Spark input partitions.  The Python data source (:mod:`spark_ext.reader`) and the native
Parquet path (:mod:`spark_ext.native`) share it.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from spark_ext import plan_arrays
from spark_ext.options import (
    EARLIEST,
    LATEST,
    PLAN_LOCK,
    ConfigError,
    OffsetSpec,
    ReadOptions,
    cached_log_for,
)
from spark_ext.plan_arrays import Slices
from txlog.errors import OffsetOutOfRangeError, UnknownTopicError
from txlog.partition_state import READ_COMMITTED, PartitionState
from txlog.records import TopicPartition
from txlog.resolve import resolve_or_read

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from spark_ext.pushdown import Bounds
    from txlog.log import Log, TopicInfo

#: Columns a reader adds to every topic's own columns.
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                 "headers")
TYPED_EXTRA = ("topic", "partition", "offset", "timestamp")

#: Below this many bytes per input partition, small partitions are packed together.
MIN_SPLIT_BYTES = 4 * 1024 * 1024


class FileSlice(NamedTuple):
    """Rows [skip, skip + take) of one batch object; offset of row i is base_offset + i."""

    key: str          # object key relative to the txlog root
    topic: str
    partition: int
    base_offset: int
    skip: int
    take: int
    append_ms: int
    nbytes: int       # estimated bytes of the slice (for splitting)
    whole: bool = False  # the slice is every row of its object (nothing to trim)
    object_bytes: int = 0  # the whole object's size as its log entry declares it (0: unknown)
    shared: bool = False  # the object is a shared object of the topic (other partitions' rows)

    @property
    def start(self) -> int:
        return self.base_offset + self.skip

    @property
    def stop(self) -> int:
        return self.base_offset + self.skip + self.take


# --- output shape ---------------------------------------------------------------------


@dataclass(frozen=True)
class OutputShape:
    """What a read returns: Spark's Kafka schema, or a typed topic's columns plus
    topic/partition/offset/timestamp."""

    kafka_shaped: bool
    include_headers: bool
    stored_schema: pa.Schema   # the schema of the batch objects (Parquet files)
    schema_json: str           # the Spark StructType as JSON (picklable, no pyspark needed)

    @property
    def data_columns(self) -> list[str]:
        """Columns to read from the batch objects."""
        if self.kafka_shaped:
            cols = ["key", "value", "timestamp"]
            return [*cols, "headers"] if self.include_headers else cols
        return list(self.stored_schema.names)

    def spark_schema(self) -> StructType:
        import json

        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.schema_json))


def kafka_spark_schema(include_headers: bool = True) -> StructType:
    """Spark's Kafka source schema (every field nullable, as Spark's Kafka source has it)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType([
            StructField("key", StringType()), StructField("value", BinaryType())]))))
    return StructType(fields)


def typed_spark_schema(topic: str, schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import (
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = []
    for f in schema:
        try:
            dt = from_arrow_type(f.type, prefer_timestamp_ntz=True)
        except Exception as exc:
            raise ConfigError(
                f"column {f.name!r} of topic {topic!r} has Arrow type {f.type}, which Spark "
                f"cannot represent ({type(exc).__name__}: {exc})") from None
        fields.append(StructField(f.name, dt, f.nullable))
    fields += [StructField("topic", StringType(), False),
               StructField("partition", IntegerType(), False),
               StructField("offset", LongType(), False),
               StructField("timestamp", TimestampType(), False)]
    return StructType(fields)


def output_shape(infos: list[TopicInfo], include_headers: bool) -> OutputShape:
    import json

    first = infos[0]
    for info in infos[1:]:
        if info.kafka_shaped != first.kafka_shaped or (
                not info.kafka_shaped and not info.schema.equals(first.schema)):
            raise ConfigError(
                f"topics {first.name!r} and {info.name!r} have different record shapes "
                f"({'Kafka-shaped' if first.kafka_shaped else 'typed: ' + str(first.schema)} vs "
                f"{'Kafka-shaped' if info.kafka_shaped else 'typed: ' + str(info.schema)}); "
                "read them in separate queries")
    if first.kafka_shaped:
        st = kafka_spark_schema(include_headers)
    else:
        st = typed_spark_schema(first.name, first.schema)
    return OutputShape(first.kafka_shaped, include_headers and first.kafka_shaped,
                       first.schema, json.dumps(st.jsonValue()))


def check_declared_schema(declared: StructType, shape: OutputShape) -> None:
    """A user-given schema must be ours (names and types in order; nullability may differ)."""
    ours = shape.spark_schema()
    same = len(declared.fields) == len(ours.fields) and all(
        a.name == b.name and _strip_nullability(a.dataType) == _strip_nullability(b.dataType)
        for a, b in zip(declared.fields, ours.fields, strict=True))
    if not same:
        raise ConfigError(
            "the txlog source has a fixed schema and cannot be read with a custom one: "
            f"expected {ours.simpleString()}, got {declared.simpleString()}. Remove "
            ".schema(...) and select/cast columns after loading.")


def _strip_nullability(dt: Any) -> Any:
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(dt, StructType):
        return StructType([StructField(f.name, _strip_nullability(f.dataType), True)
                           for f in dt.fields])
    if isinstance(dt, ArrayType):
        return ArrayType(_strip_nullability(dt.elementType), True)
    if isinstance(dt, MapType):
        return MapType(_strip_nullability(dt.keyType), _strip_nullability(dt.valueType), True)
    return dt


# --- subscriptions ---------------------------------------------------------------------


def subscribed_topics(log: Log, ro: ReadOptions) -> list[TopicInfo]:
    if ro.assign is not None:
        names = list(ro.assign)
    elif ro.pattern is not None:
        rx = re.compile(ro.pattern)
        names = [t for t in log.list_topics() if rx.fullmatch(t)]
        if not names:
            raise UnknownTopicError(
                f"option 'subscribePattern' {ro.pattern!r} matches no topic in {log.url}")
    else:
        names = list(ro.topics)
    return [log.topic(n) for n in names]


def subscribed_partitions(log: Log, ro: ReadOptions,
                          infos: list[TopicInfo]) -> list[TopicPartition]:
    tps: list[TopicPartition] = []
    for info in infos:
        if ro.assign is not None:
            for p in ro.assign[info.name]:
                if p >= info.partitions:
                    raise ConfigError(
                        f"option 'assign': topic {info.name!r} has partitions "
                        f"0..{info.partitions - 1}, not {p}")
                tps.append(TopicPartition(info.name, p))
        else:
            tps.extend(TopicPartition(info.name, p) for p in range(info.partitions))
    return tps


def load_states(log: Log, tps: Iterable[TopicPartition], isolation: str,
                ) -> dict[TopicPartition, PartitionState]:
    """Fresh partition states; under read_committed, open transactions at each LSO are
    settled first (rolled forward, timed out, or a zombie's batch aborted) as the Python
    consumer does."""
    tps = list(tps)
    states = log.refresh_partitions(tps)
    out = {}
    for tp, st in zip(tps, states, strict=True):
        if isolation == READ_COMMITTED and st.open_txns:
            st = resolve_or_read(log, tp)
        out[tp] = st
    return out


# --- offsets ------------------------------------------------------------------------------


def _check_map_topics(spec: OffsetSpec, tps: list[TopicPartition]) -> None:
    known = set(tps)
    m = spec.offsets if spec.kind == "offsets" else spec.timestamps
    for t, parts in m.items():
        for p in parts:
            if TopicPartition(t, p) not in known:
                raise ConfigError(
                    f"option {spec.describe()!r} names {t}-{p}, which this query does not "
                    "read (it is not among the subscribed/assigned partitions)")


def offsets_for_spec(log: Log, spec: OffsetSpec | None, default: str,
                     tps: list[TopicPartition], states: Mapping[TopicPartition, PartitionState],
                     isolation: str, *, starting: bool, strategy: str = "error",
                     ) -> dict[TopicPartition, int]:
    """Resolve a starting/ending spec to an offset per partition (earliest, latest, specific
    offsets with -2/-1, or timestamps looked up with the consumer's offsets_for_times)."""
    kind = spec.kind if spec is not None else default

    def special(tp: TopicPartition, which: str) -> int:
        st = states[tp]
        return st.log_start_offset if which == "earliest" else st.end_offset(isolation)

    if kind in ("earliest", "latest"):
        return {tp: special(tp, kind) for tp in tps}
    assert spec is not None
    _check_map_topics(spec, tps)
    out: dict[TopicPartition, int] = {}
    if kind == "offsets":
        for tp in tps:
            off = spec.offsets.get(tp.topic, {}).get(tp.partition)
            if off is None:
                out[tp] = special(tp, default)
            elif off == EARLIEST:
                out[tp] = special(tp, "earliest")
            elif off == LATEST:
                out[tp] = special(tp, "latest")
            else:
                out[tp] = off
        return out
    # timestamps
    wanted: dict[TopicPartition, int] = {}
    for tp in tps:
        ts = spec.timestamp if spec.timestamp is not None else \
            spec.timestamps.get(tp.topic, {}).get(tp.partition)
        if ts is None:
            out[tp] = special(tp, default)
        else:
            wanted[tp] = ts
    if wanted:
        from txlog.consumer import Consumer

        found = Consumer(log, isolation_level=isolation).offsets_for_times(wanted)
        for tp, ts in wanted.items():
            off = found.get(tp)
            if off is None:
                if starting and strategy == "error":
                    raise OffsetOutOfRangeError(
                        f"option {spec.describe()!r}: no record in {tp.topic}-{tp.partition} "
                        f"has a timestamp at or after {ts}. Set "
                        "startingOffsetsByTimestampStrategy=latest to start at the end "
                        "instead.")
                off = special(tp, "latest")
            out[tp] = off
    return out


def check_range(tp: TopicPartition, st: PartitionState, start: int, end: int,
                fail_on_data_loss: bool, *, streaming: bool = False) -> tuple[int, int]:
    """Validate [start, end) against what the partition holds; clamp when data loss is
    tolerated (failOnDataLoss=false), as Spark's Kafka source does."""
    name = f"{tp.topic}-{tp.partition}"
    if start < st.log_start_offset:
        if fail_on_data_loss:
            raise OffsetOutOfRangeError(
                f"{name}: offsets {start}..{st.log_start_offset - 1} are no longer in the "
                f"log (retention or compaction moved its start to {st.log_start_offset}); "
                "some data may have been missed. Set failOnDataLoss=false to skip it.")
        start = st.log_start_offset
    if start > st.high_watermark:
        if fail_on_data_loss:
            raise OffsetOutOfRangeError(
                f"{name}: offset {start} is past the end of the log (high watermark "
                f"{st.high_watermark})"
                + ("; the topic may have been deleted and recreated" if streaming else "")
                + ". Set failOnDataLoss=false to read from the end instead.")
        start = st.high_watermark
    if end < start:
        if not streaming:
            raise OffsetOutOfRangeError(
                f"{name}: the starting offset {start} is after the ending offset {end}")
        end = start
    return start, end


def plan_slices(log: Log, states: Mapping[TopicPartition, PartitionState],
                ranges: Mapping[TopicPartition, tuple[int, int]], isolation: str,
                ) -> list[FileSlice]:
    """The committed (or, under read_uncommitted, all data) batch objects in each range,
    trimmed to it: ``PartitionState.read_indices`` decides, this only repackages.  The
    slices of a shared object are then put together (:func:`together`).  Planners use
    :func:`spark_ext.plan_arrays.partition_slices`, which must return the same slices."""
    out: list[FileSlice] = []
    for tp, (start, end) in ranges.items():
        if end <= start:
            continue
        st = states[tp]
        picked, lo, limit = st.read_indices(start, end, isolation)
        if not picked:
            continue
        b = st.batches
        data, nbytes, bases, counts, rows = b.data, b.nbytes, b.base_offset, b.count, b.row
        segments = _segments(data, nbytes, counts, rows)
        topic, partition = tp.topic, tp.partition
        object_rows = b.object_rows
        new = FileSlice._make
        for i in picked:
            key, base, count, row = data[i], bases[i], counts[i], rows[i]
            first = base if base > lo else lo
            last = base + count
            if last > limit:
                last = limit
            take = last - first
            size, runs, held = segments.get(key, (nbytes[i], 1, count))
            # A shared object holds other partitions' batches too and declares its rows:
            # a batch's share of it is by those.
            shared = object_rows[i] > 0
            if shared:
                held = object_rows[i]
            # A share of the object's bytes as of its rows (a segment holds many runs).
            est = max(1, size * take // held) if held else 1
            # An object named by one batch and holding no other rows is the batch's rows
            # (a compacted segment is named by each of its runs).
            whole = runs == 1 and row == 0 and take == count == held
            # Inside a compacted segment or a shared object a batch starts at file row
            # ``row``: shifting the base keeps "offset of file row i = base_offset + i"
            # true for its rows.
            out.append(new((key, topic, partition, base - row, row + first - base, take,
                            b.append_ms[i], est, whole, size, shared)))
    return together(out)


def together(slices: list[FileSlice]) -> list[FileSlice]:
    """The slices with those of each shared object moved together, in the object's row
    order, to where its first slice is (so that one input partition reads it once);
    everything else keeps its partition and offset order."""
    first: dict[str, int] = {}
    for i, s in enumerate(slices):
        if s.shared:
            first.setdefault(s.key, i)
    if not first:
        return slices
    order = sorted(range(len(slices)), key=lambda i: (
        (first[slices[i].key], slices[i].skip) if slices[i].shared else (i, 0)))
    return [slices[i] for i in order]


def _segments(data: list[str], nbytes: list[int], counts: list[int], rows: list[int],
              ) -> dict[str, tuple[int, int, int]]:
    """Objects named by more than one batch (a compacted segment's runs): their size
    (recorded on one run), how many batches name them and the rows they hold (to the
    end of their last run)."""
    if len(set(data)) == len(data):
        return {}
    sizes: dict[str, int] = {}
    held: dict[str, int] = {}
    runs: Counter[str] = Counter()
    for d, n, c, r in zip(data, nbytes, counts, rows, strict=True):
        sizes[d] = max(sizes.get(d, 0), n)
        held[d] = max(held.get(d, 0), r + c)
        runs[d] += 1
    return {d: (sizes[d], n, held[d]) for d, n in runs.items() if n > 1}


def group_slices(slices: list[FileSlice], *, min_partitions: int | None,
                 max_partition_bytes: int, parallelism: int | None = None,
                 ) -> list[list[FileSlice]]:
    """Cut the slices (kept in plan order) into input partitions of about equal bytes, at
    most :func:`spark_ext.plan_arrays.split_target`'s each (but for one shared object's
    slices, never cut apart), small ones packed together."""
    if not slices:
        return []
    target = plan_arrays.split_target(sum(s.nbytes for s in slices),
                          len({(s.topic, s.partition) for s in slices}),
                          min_partitions=min_partitions,
                          max_partition_bytes=max_partition_bytes, parallelism=parallelism)
    units: list[list[FileSlice]] = []
    for s in slices:
        # One shared object's slices stay together: a task then reads it once.
        if units and s.shared and units[-1][-1].shared and units[-1][-1].key == s.key:
            units[-1].append(s)
        else:
            units.append([s])
    groups: list[list[FileSlice]] = []
    cur: list[FileSlice] = []
    size = 0
    for unit in units:
        n = sum(s.nbytes for s in unit)
        if cur and size + n > target:
            groups.append(cur)
            cur, size = [], 0
        cur.extend(unit)
        size += n
    if cur:
        groups.append(cur)
    return groups


# --- batch plan --------------------------------------------------------------------------


@dataclass
class BatchPlan:
    shape: OutputShape
    ranges: dict[TopicPartition, tuple[int, int]]
    arrays: Slices

    @functools.cached_property
    def slices(self) -> list[FileSlice]:
        """Every slice as a FileSlice (one Python object each: for small plans and tests)."""
        return self.arrays.file_slices()

    def group_ids(self, ro: ReadOptions, *, parallelism: int | None = None) -> np.ndarray:
        """Each slice's input partition (:func:`group_slices`, over arrays)."""
        return plan_arrays.group_ids(self.arrays.nbytes, self.arrays.tp,
                                     min_partitions=ro.min_partitions,
                                     max_partition_bytes=ro.max_partition_bytes,
                                     glued=self.arrays.glued(), parallelism=parallelism)

    def groups(self, ro: ReadOptions) -> list[list[FileSlice]]:
        return split_groups(self.arrays, self.group_ids(ro))


def split_groups(arrays: Slices, ids: np.ndarray) -> list[list[FileSlice]]:
    """The slices, grouped by their (ascending) group ids, as FileSlice lists."""
    cuts = [0, *(np.flatnonzero(np.diff(ids)) + 1).tolist(), len(ids)] if len(ids) else [0]
    return [arrays.file_slices(a, b) for a, b in itertools.pairwise(cuts)]


def plan_shape(log: Log, ro: ReadOptions) -> OutputShape:
    return output_shape(subscribed_topics(log, ro), ro.include_headers)


def plan_batch(ro: ReadOptions, log: Log | None = None, *, bounds: Bounds | None = None,
               ) -> BatchPlan:
    """Everything a batch read returns, decided now (on the driver); with ``bounds``
    (a query's filters, :mod:`spark_ext.pushdown`), only the batch objects that may hold
    a row the query keeps."""
    if log is None:
        log = cached_log(ro)
    with PLAN_LOCK:
        return _plan_batch(ro, log, bounds)


def cached_log(ro: ReadOptions, *, reuse_check: bool = False) -> Log:
    """This process's Log for the root (planning again reads only new log tails), replaced
    when a subscribed topic was deleted and recreated since it was cached (see
    :func:`~spark_ext.options.cached_log_for` for ``reuse_check``)."""
    names = list(ro.assign) if ro.assign is not None else list(ro.topics)
    with PLAN_LOCK:
        return cached_log_for(ro.url, ro.storage_options, names, reuse_check=reuse_check)


def _plan_batch(ro: ReadOptions, log: Log, bounds: Bounds | None = None) -> BatchPlan:
    infos = subscribed_topics(log, ro)
    shape = output_shape(infos, ro.include_headers)
    tps = subscribed_partitions(log, ro, infos)
    states = load_states(log, tps, ro.isolation)
    starts = offsets_for_spec(log, ro.starting, "earliest", tps, states, ro.isolation,
                              starting=True, strategy=ro.timestamp_strategy)
    ends = offsets_for_spec(log, ro.ending, "latest", tps, states, ro.isolation,
                            starting=False)
    ranges = {}
    for tp in tps:
        # "latest" never reads past the LSO (read_committed) or high watermark.
        end = min(ends[tp], states[tp].end_offset(ro.isolation))
        ranges[tp] = check_range(tp, states[tp], starts[tp], end, ro.fail_on_data_loss)
    if bounds is None:
        return BatchPlan(shape, ranges, plan_arrays.partition_slices(states, ranges,
                                                                     ro.isolation))
    from spark_ext import pushdown

    # Cut after the options' own ranges are checked: a filter never hides a bad option.
    cut = pushdown.restrict_ranges(ranges, bounds)
    arrays = plan_arrays.prune_by_timestamp(
        plan_arrays.partition_slices(states, cut, ro.isolation), bounds,
        kafka_shaped=shape.kafka_shaped)
    return BatchPlan(shape, ranges, arrays)


# --- streaming offsets -------------------------------------------------------------------


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Kafka's offset JSON: {"topic": {"0": 42}} (string keys, as Spark's offset log needs)."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


#: Key of the streaming start offsets that marks them as not yet checkpointed ('$' is not
#: allowed in topic names).
INITIAL_MARK = "$initial"


def offsets_from_json(d: Mapping[str, Any]) -> dict[TopicPartition, int]:
    """Accepts {"topic": {"0": 42}} and the flat {"topic/0": 42}."""
    out: dict[TopicPartition, int] = {}
    for k, v in d.items():
        if k.startswith("$"):
            continue
        if isinstance(v, Mapping):
            for p, off in v.items():
                out[TopicPartition(k, int(p))] = int(off)
        else:
            topic, _, p = str(k).rpartition("/")
            out[TopicPartition(topic, int(p))] = int(v)
    return out


def rate_limit(start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
               max_offsets: int) -> dict[TopicPartition, int]:
    """Spread ``max_offsets`` over the partitions in proportion to their backlog (as Spark's
    Kafka source does with maxOffsetsPerTrigger); every partition with a backlog moves.
    ``start`` must hold every partition of ``latest``; no offset ever moves backwards."""
    lag = {tp: max(0, end - start[tp]) for tp, end in latest.items()}
    total = sum(lag.values())
    if total <= max_offsets:
        return {tp: max(start[tp], end) for tp, end in latest.items()}
    out: dict[TopicPartition, int] = {}
    for tp, end in latest.items():
        begin = start[tp]
        if lag[tp] == 0:
            out[tp] = begin
            continue
        share = max_offsets * lag[tp] / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(end, begin + step)
    return out
