"""Filters a query puts on ``topic``, ``partition``, ``offset`` and ``timestamp``, turned
into bounds that prune a batch read's plan before any batch object is opened.

The JVM connector hands the filters Spark pushed (``io.txlog.spark.Pushdown``) as JSON:
``{"column": "offset", "op": "ge", "values": [100]}`` (ops ``eq``, ``lt``, ``le``, ``gt``,
``ge``, ``in``; timestamps in microseconds since the epoch).  Pruning only drops what
cannot hold a matching row: Spark applies every filter to the rows read, so a bound here
may be loose but never tight.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txlog.errors import ConfigError
from txlog.records import TopicPartition

if TYPE_CHECKING:
    from spark_ext.read_plan import FileSlice
    from txlog.partition_state import PartitionState

_NONE = (1 << 63) - 1
OPS = ("eq", "lt", "le", "gt", "ge", "in")
COLUMNS = ("topic", "partition", "offset", "timestamp")


@dataclass(frozen=True)
class Bounds:
    """What the filters allow: listed topics and partitions (None: any), offsets in
    [offset_lo, offset_hi) and record timestamps (ms) in [ts_lo, ts_hi]."""

    topics: frozenset[str] | None = None
    partitions: frozenset[int] | None = None
    offset_lo: int = 0
    offset_hi: int = _NONE
    ts_lo: int = -_NONE
    ts_hi: int = _NONE

    @property
    def empty(self) -> bool:
        return (self.topics == frozenset() or self.partitions == frozenset()
                or self.offset_lo >= self.offset_hi or self.ts_lo > self.ts_hi)

    def allows(self, tp: TopicPartition) -> bool:
        return ((self.topics is None or tp.topic in self.topics)
                and (self.partitions is None or tp.partition in self.partitions))


def _ints(values: list[Any], column: str) -> list[int]:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"a pushed filter on {column!r} has non-integer values {values!r}")
    return [int(v) for v in values]


def bounds_from_filters(filters: Iterable[Mapping[str, Any]]) -> Bounds:
    """The bounds every filter (ANDed) allows."""
    topics: frozenset[str] | None = None
    parts: frozenset[int] | None = None
    off_lo, off_hi, ts_lo, ts_hi = 0, _NONE, -_NONE, _NONE
    for f in filters:
        column, op, values = f.get("column"), f.get("op"), list(f.get("values") or [])
        if column not in COLUMNS or op not in OPS or not values:
            raise ConfigError(f"a pushed filter is not one txlog prunes with: {dict(f)!r}")
        if op != "in" and len(values) != 1:
            raise ConfigError(f"a pushed filter has {len(values)} values: {dict(f)!r}")
        if column == "topic":
            if op not in ("eq", "in"):
                continue
            names = frozenset(str(v) for v in values)
            topics = names if topics is None else topics & names
            continue
        nums = _ints(values, column)
        if column == "partition":
            if op in ("eq", "in"):
                ps = frozenset(nums)
                parts = ps if parts is None else parts & ps
            continue  # ranges of partition numbers are rare: not pruned by
        if column == "offset":
            lo, hi = _range(op, nums, exclusive_hi=True)
            off_lo, off_hi = max(off_lo, lo), min(off_hi, hi)
        else:  # timestamp, microseconds: widen to whole milliseconds
            lo_us, hi_us = _range(op, nums, exclusive_hi=False)
            ts_lo = max(ts_lo, lo_us // 1000 if lo_us != -_NONE else lo_us)
            ts_hi = min(ts_hi, -(-hi_us // 1000) if hi_us != _NONE else hi_us)
    return Bounds(topics, parts, off_lo, off_hi, ts_lo, ts_hi)


def _range(op: str, values: list[int], *, exclusive_hi: bool) -> tuple[int, int]:
    """[lo, hi) (exclusive_hi) or [lo, hi] of the values the comparison allows."""
    top = _NONE
    bottom = 0 if exclusive_hi else -_NONE
    if op in ("eq", "in"):
        return min(values), max(values) + (1 if exclusive_hi else 0)
    v = values[0]
    if op == "gt":
        return v + 1, top
    if op == "ge":
        return v, top
    if op == "lt":
        return bottom, v if exclusive_hi else v - 1
    return bottom, v + 1 if exclusive_hi else v  # le


def restrict_ranges(ranges: Mapping[TopicPartition, tuple[int, int]], b: Bounds,
                    ) -> dict[TopicPartition, tuple[int, int]]:
    """The planned offset ranges cut to the bounds (an excluded partition reads nothing)."""
    out = {}
    for tp, (start, end) in ranges.items():
        if b.empty or not b.allows(tp):
            out[tp] = (start, start)
            continue
        lo, hi = max(start, b.offset_lo), min(end, b.offset_hi)
        out[tp] = (lo, hi) if lo < hi else (start, start)
    return out


def prune_by_timestamp(slices: list[FileSlice], states: Mapping[TopicPartition, PartitionState],
                       b: Bounds, *, kafka_shaped: bool) -> list[FileSlice]:
    """The slices that may hold a record whose timestamp is within the bounds: a typed
    topic's timestamp is its batch's append time; a Kafka-shaped record's is its own (or
    the append time), which its batches' recorded min and max enclose."""
    if b.ts_lo == -_NONE and b.ts_hi == _NONE:
        return slices
    out = []
    for s in slices:
        if not kafka_shaped:
            lo = hi = s.append_ms
        else:
            found = _ts_range(states.get(TopicPartition(s.topic, s.partition)), s.start, s.stop)
            if found is None:  # nothing recorded: keep it
                out.append(s)
                continue
            lo, hi = found
        if hi >= b.ts_lo and lo <= b.ts_hi:
            out.append(s)
    return out


def _ts_range(st: PartitionState | None, start: int, stop: int) -> tuple[int, int] | None:
    """The min and max timestamp of the batches holding offsets [start, stop)."""
    if st is None:
        return None
    bs = st.batches
    i = max(0, bisect.bisect_right(bs.base_offset, start) - 1)
    lo, hi, seen = _NONE, -_NONE, False
    while i < len(bs) and bs.base_offset[i] < stop:
        if bs.base_offset[i] + bs.count[i] > start:
            if bs.ts_min[i] > bs.ts_max[i] or bs.ts_min[i] == bs.ts_max[i] == 0:
                return None  # not recorded for this batch: it may hold any time
            lo, hi, seen = min(lo, bs.ts_min[i]), max(hi, bs.ts_max[i]), True
        i += 1
    return (lo, hi) if seen else None
