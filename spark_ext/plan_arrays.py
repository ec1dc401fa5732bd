"""A read plan as arrays: the batch objects a Spark read returns, chosen and grouped with
array operations over each partition's batch index as its checkpoint holds it (Arrow).

A plan of millions of batch objects is never a Python object per object: this module
decides exactly what :meth:`txlog.partition_state.PartitionState.read_indices` and
:func:`spark_ext.read_plan.plan_slices` decide for each batch (the visible batches of a
range, trimmed to it) and :func:`spark_ext.read_plan.group_slices` for the input
partitions, over whole columns at once.  :class:`Slices` turns into
:class:`~spark_ext.read_plan.FileSlice` tuples only where one is needed (the Python data
source's tasks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlog.partition_state import ISOLATION_LEVELS, READ_COMMITTED, VISIBLE
from txlog.records import TopicPartition

if TYPE_CHECKING:
    from spark_ext.pushdown import Bounds
    from spark_ext.read_plan import FileSlice
    from txlog.partition_state import PartitionState

_INTS = ("base_offset", "skip", "take", "append_ms", "nbytes", "object_bytes", "ts_min",
         "ts_max")
_VISIBLE = np.array(sorted(VISIBLE), dtype=np.int8)
#: The batch index columns a plan takes for each chosen batch.
_PICKED = ("base_offset", "count", "row", "append_ms", "ts_min", "ts_max", "nbytes",
           "object_rows")


@dataclass
class Slices:
    """Slices of batch objects in partition and offset order, column by column: rows
    ``[skip, skip + take)`` of object ``key`` (relative to the txlog root) of partition
    ``tps[tp]``; offset of file row i is ``base_offset + i``.  ``nbytes`` is the slice's
    estimated size, ``object_bytes`` the whole object's as its log declares it,
    ``ts_min``/``ts_max`` the batch's recorded record times."""

    tps: list[TopicPartition] = field(default_factory=list)
    tp: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    key: pa.ChunkedArray = field(default_factory=lambda: pa.chunked_array([], pa.string()))
    base_offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    skip: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    take: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    append_ms: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    nbytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    whole: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    object_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ts_min: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ts_max: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    shared: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    #: For each of ``tps``, whether no two batches of its log name one object (then its
    #: slices' objects are counted without comparing names); None: not known.
    distinct: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.tp)

    def filter(self, keep: np.ndarray) -> Slices:
        """The slices where ``keep`` (booleans) is true."""
        out = Slices(self.tps, self.tp[keep], self.key.filter(pa.array(keep)),
                     distinct=self.distinct)
        out.whole, out.shared = self.whole[keep], self.shared[keep]
        for name in _INTS:
            setattr(out, name, getattr(self, name)[keep])
        return out

    def reorder(self, order: np.ndarray) -> Slices:
        """The slices at positions ``order``, in that order."""
        out = Slices(self.tps, self.tp[order], self.key.take(pa.array(order)),
                     distinct=self.distinct)
        out.whole, out.shared = self.whole[order], self.shared[order]
        for name in _INTS:
            setattr(out, name, getattr(self, name)[order])
        return out

    def glued(self) -> np.ndarray:
        """For each slice, whether it must stay in its predecessor's input partition: both
        are slices of one shared object, which a task then reads once."""
        out = np.zeros(len(self), bool)
        if len(self) > 1 and self.shared.any():
            same = pc.equal(self.key[1:], self.key[:-1]).to_numpy(zero_copy_only=False)
            out[1:] = same & self.shared[1:] & self.shared[:-1]
        return out

    def objects(self) -> int:
        """How many distinct batch objects the slices read: an object belongs to the one
        partition whose log names it (counted per partition), except a shared object,
        which several partitions' logs name (counted once)."""
        own = self.filter(~self.shared) if self.shared.any() else self
        starts = np.flatnonzero(np.diff(own.tp)) + 1 if len(own) else np.zeros(0, np.int64)
        runs = np.concatenate([[0], starts, [len(own)]]).astype(np.int64)
        # A run of a partition whose log names each object once holds distinct objects.
        known = (self.distinct[own.tp[runs[:-1]]] if self.distinct is not None and len(own)
                 else np.zeros(len(runs) - 1, bool))
        n = int(np.diff(runs)[known].sum())
        n += sum(_count_distinct(own.key[int(a):int(b)]) for a, b, k in
                 zip(runs[:-1], runs[1:], known, strict=True) if b > a and not k)
        if len(own) < len(self):
            n += _count_distinct(self.key.filter(pa.array(self.shared)))
        return n

    def file_slices(self, lo: int = 0, hi: int | None = None) -> list[FileSlice]:
        """Slices ``[lo, hi)`` as FileSlice tuples."""
        from spark_ext.read_plan import FileSlice

        hi = len(self) if hi is None else hi
        tps = self.tps
        return [FileSlice(key, tps[t].topic, tps[t].partition, *rest) for key, t, *rest in zip(
            self.key[lo:hi].to_pylist(), self.tp[lo:hi].tolist(),
            self.base_offset[lo:hi].tolist(), self.skip[lo:hi].tolist(),
            self.take[lo:hi].tolist(), self.append_ms[lo:hi].tolist(),
            self.nbytes[lo:hi].tolist(), self.whole[lo:hi].tolist(),
            self.object_bytes[lo:hi].tolist(), self.shared[lo:hi].tolist(), strict=True)]


def read_indices(st: PartitionState, start: int, end: int | None, isolation: str,
                 ) -> tuple[np.ndarray, int, int]:
    """:meth:`PartitionState.read_indices`, as an array of batch positions."""
    if isolation not in ISOLATION_LEVELS:
        raise ValueError(f"unknown isolation level {isolation!r}")
    none = np.zeros(0, np.int64)
    limit = st.end_offset(isolation)
    if end is not None:
        limit = min(limit, end)
    start = max(start, st.log_start_offset)
    if start >= limit:
        return none, start, start
    return _positions(st.batches.arrow(), start, limit, isolation)


def _positions(t: pa.Table, start: int, limit: int, isolation: str,
               ) -> tuple[np.ndarray, int, int]:
    bases = t.column("base_offset").to_numpy()
    counts = t.column("count").to_numpy()
    # The first batch whose end is above start (batch_index_at), then every batch
    # starting below limit.
    i = int(np.searchsorted(bases, start, "right")) - 1
    first = 0 if i < 0 else (i + 1 if bases[i] + counts[i] <= start else i)
    stop = first + int(np.searchsorted(bases[first:], limit, "left"))
    keep = counts[first:stop] != 0
    if isolation == READ_COMMITTED:
        keep &= np.isin(t.column("status").to_numpy()[first:stop], _VISIBLE)
    picked = np.flatnonzero(keep) + first
    # Only the first and last batch can be cut by [start, limit); drop one left empty.
    lo_i, hi_i = 0, len(picked)
    while lo_i < hi_i and _empty(bases, counts, int(picked[lo_i]), start, limit):
        lo_i += 1
    while lo_i < hi_i and _empty(bases, counts, int(picked[hi_i - 1]), start, limit):
        hi_i -= 1
    return picked[lo_i:hi_i], start, limit


def _bounds_and_positions(st: PartitionState, t: pa.Table, start: int, end: int,
                          isolation: str) -> tuple[np.ndarray, int, int]:
    limit = min(st.end_offset(isolation), end)
    start = max(start, st.log_start_offset)
    if start >= limit:
        return np.zeros(0, np.int64), start, start
    return _positions(t, start, limit, isolation)


def _empty(bases: np.ndarray, counts: np.ndarray, i: int, start: int, limit: int) -> bool:
    return max(int(bases[i]), start) >= min(int(bases[i] + counts[i]), limit)


def partition_slices(states: Mapping[TopicPartition, PartitionState],
                     ranges: Mapping[TopicPartition, tuple[int, int]], isolation: str,
                     ) -> Slices:
    """:func:`spark_ext.read_plan.plan_slices`, as columns."""
    tps: list[TopicPartition] = []
    cols: dict[str, list[np.ndarray]] = {n: [] for n in _PICKED}
    # Where some batches of a partition's log name one object: (its position among the
    # partitions, sizes, rows held, whether several batches name it).
    grouped: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    keys: list[pa.Array] = []
    bounds: list[tuple[int, int, int]] = []
    distinct: list[bool] = []
    # Each partition's batch index is its own table: only choosing its batches and
    # viewing its columns is done per partition; the arithmetic is done once, below.
    for tp, (start, end) in ranges.items():
        if end <= start:
            continue
        st = states[tp]
        t = st.batches.arrow()
        picked, lo, limit = _bounds_and_positions(st, t, start, end, isolation)
        if not len(picked):
            continue
        # A run of consecutive batches (nothing aborted in it) is a slice of each column,
        # which copies nothing.
        a, b = int(picked[0]), int(picked[-1]) + 1
        pick: slice | np.ndarray = slice(a, b) if b - a == len(picked) else picked
        for n in _PICKED:
            cols[n].append(t.column(n).to_numpy()[pick])
        data = t.column("data")
        one = _distinct(data)
        if not one:
            size, runs, held = _object_sizes(data, t.column("nbytes"), t.column("count"),
                                             t.column("row"), pick)
            grouped.append((len(tps), size, held, runs != 1))
        keys.extend((data[a:b] if isinstance(pick, slice) else data.take(pick)).chunks)
        bounds.append((len(picked), lo, limit))
        distinct.append(one)
        tps.append(tp)
    if not tps:
        return Slices(tps)
    c = {n: np.concatenate(v) for n, v in cols.items()}
    n_of, lo_of, limit_of = (np.array(v, np.int64) for v in zip(*bounds, strict=True))
    base, count, row = c["base_offset"], c["count"], c["row"]
    # A batch naming its own object: the object's size and rows are the batch's.
    size, held, multi = c["nbytes"], count, np.zeros(len(base), bool)
    if grouped:
        size, held = size.copy(), held.copy()
        at = np.concatenate([[0], np.cumsum(n_of)])
        for i, g_size, g_held, g_multi in grouped:
            size[at[i]:at[i + 1]] = g_size
            held[at[i]:at[i + 1]] = g_held
            multi[at[i]:at[i + 1]] = g_multi
    # A shared object (one holding other partitions' batches too) declares its rows: a
    # batch's share of it is by those.
    shared = c["object_rows"] > 0
    if shared.any():
        held = np.where(shared, c["object_rows"], held)
    first = np.maximum(base, np.repeat(lo_of, n_of))
    take = np.minimum(base + count, np.repeat(limit_of, n_of)) - first
    out = Slices(tps, np.repeat(np.arange(len(tps), dtype=np.int32), n_of),
                 pa.chunked_array(keys, pa.string()), distinct=np.array(distinct, bool))
    # Inside a compacted segment or a shared object a batch starts at file row ``row``:
    # shifting the base keeps "offset of file row i = base_offset + i" true for its rows.
    out.base_offset = base - row
    out.skip = row + first - base
    out.take = take
    out.append_ms = c["append_ms"]
    # A share of the object's bytes as of its rows (a segment holds many runs).
    out.nbytes = np.maximum(1, size * take // np.maximum(1, held))
    # An object named by one batch and holding no other rows is the batch's rows.
    out.whole = ~multi & (row == 0) & (take == count) & (count == held)
    out.object_bytes = size
    out.ts_min, out.ts_max = c["ts_min"], c["ts_max"]
    out.shared = shared
    for name in _INTS:
        setattr(out, name, getattr(out, name).astype(np.int64, copy=False))
    return together(out)


def together(s: Slices) -> Slices:
    """The slices with those of each shared object moved together, in the object's row
    order, to where its first slice is: one input partition can then read it once.
    Everything else keeps its partition and offset order."""
    if not s.shared.any():
        return s
    at = np.flatnonzero(s.shared)
    # Dictionary codes number the objects in the order they first appear.
    codes = pc.dictionary_encode(s.key.take(pa.array(at))).combine_chunks().indices
    codes = codes.to_numpy(zero_copy_only=False)
    _, first = np.unique(codes, return_index=True)
    anchor = np.arange(len(s), dtype=np.int64)
    anchor[at] = at[first][codes]
    row = np.zeros(len(s), np.int64)
    row[at] = s.skip[at]
    order = np.lexsort((row, anchor))
    return s.reorder(order)


def _object_sizes(data: pa.ChunkedArray, nbytes: pa.ChunkedArray, count: pa.ChunkedArray,
                  row: pa.ChunkedArray, pick: slice | np.ndarray,
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the batches at ``pick``, of a log where some batches name one object: their
    object's size, how many batches name it and the rows it holds (a compacted segment's
    runs all name it; its size is recorded on one run, its rows end with its last run's)."""
    idx = pa.array(np.arange(len(data))[pick])
    end = pc.add(row, count)
    by = pa.table({"data": data, "nbytes": nbytes, "end": end}).group_by("data").aggregate(
        [("nbytes", "max"), ("nbytes", "count"), ("end", "max")])
    at = pc.index_in(data.take(idx), value_set=by.column("data")).to_numpy()
    return (by.column("nbytes_max").to_numpy()[at],
            by.column("nbytes_count").to_numpy()[at], by.column("end_max").to_numpy()[at])


#: Odd multipliers of a hash of keys' bytes (fixed: plans do not depend on a run).
_MIX = np.random.default_rng(32).integers(1, 2**63, 64, dtype=np.uint64) | np.uint64(1)


def _count_distinct(keys: pa.ChunkedArray) -> int:
    return len(keys) if _distinct(keys) else int(pc.count_distinct(keys).as_py())


def _distinct(data: pa.ChunkedArray) -> bool:
    """Whether no two batches name one object.  Keys of one length (txlog names its
    objects so) are hashed 8 bytes at a time, which costs far less than a hash table of
    strings; only equal hashes, or keys of several lengths, take the exact count."""
    arr = data.combine_chunks() if data.num_chunks != 1 else data.chunk(0)
    n = len(arr)
    if n < 2:
        return True
    _, offset_buf, value_buf = arr.buffers()
    if pa.types.is_string(arr.type) and value_buf is not None:
        offsets = np.frombuffer(offset_buf, np.int32, n + 1, arr.offset * 4)
        width = int(offsets[1] - offsets[0])
        if 8 <= width <= 8 * len(_MIX) and (np.diff(offsets) == width).all():
            h = np.zeros(n, np.uint64)
            word = np.empty(n, np.uint64)
            # The words of each key at byte 0, 8, ... and a last one ending with the key
            # (overlapping the one before it): read in place, nothing copied.
            for j in range(-(-width // 8)):
                at = int(offsets[0]) + min(8 * j, width - 8)
                col = np.ndarray((n,), "<u8", buffer=value_buf, offset=at, strides=(width,))
                np.multiply(col, _MIX[j], out=word)
                h += word
            h.sort()
            if not (h[1:] == h[:-1]).any():
                return True
    return bool(pc.count_distinct(data).as_py() == n)


def split_target(total: int, n_tps: int, *, min_partitions: int | None,
                 max_partition_bytes: int, parallelism: int | None = None) -> int:
    """The most bytes of slices an input partition takes: ``total`` bytes in at least
    ``min_partitions`` input partitions where that is given; else as Spark splits files for a
    scan, in ``parallelism`` (Spark's default parallelism, where the query says it) of at
    least MIN_SPLIT_BYTES (Spark's file open cost); else one per topic-partition (Kafka's
    default); never above ``max_partition_bytes``."""
    from spark_ext.read_plan import MIN_SPLIT_BYTES

    if min_partitions is not None:
        wanted, floor = min_partitions, 1
    else:
        wanted, floor = (parallelism if parallelism is not None else n_tps), MIN_SPLIT_BYTES
    return min(max_partition_bytes, max(floor, math.ceil(total / max(1, wanted))))


def group_ids(nbytes: np.ndarray, tp: np.ndarray, *, min_partitions: int | None,
              max_partition_bytes: int, glued: np.ndarray | None = None,
              parallelism: int | None = None) -> np.ndarray:
    """:func:`spark_ext.read_plan.group_slices` as each slice's group number: slices in
    order, a group closed before the slice that would take it above the target size,
    never before a slice ``glued`` to its predecessor (:meth:`Slices.glued`)."""
    n = len(nbytes)
    if not n:
        return np.zeros(0, np.int32)
    target = split_target(int(nbytes.sum(dtype=np.int64)), len(np.unique(tp)),
                          min_partitions=min_partitions,
                          max_partition_bytes=max_partition_bytes, parallelism=parallelism)
    if glued is None or not glued.any():
        return _cut(nbytes, target)
    # Slices glued together are one unit: cut between units, then number the slices.
    starts = np.flatnonzero(~glued)
    units = _cut(np.add.reduceat(nbytes, starts), target)
    return np.repeat(units, np.diff(np.append(starts, n)))


def _cut(nbytes: np.ndarray, target: int) -> np.ndarray:
    """Each unit's group: units in order, at most ``target`` bytes a group (at least one)."""
    n = len(nbytes)
    out = np.zeros(n, np.int32)
    ends = np.cumsum(nbytes, dtype=np.int64)
    pos, g = 0, 0
    while pos < n:
        before = int(ends[pos - 1]) if pos else 0
        # Every slice whose running total stays within the target joins; at least one.
        nxt = max(pos + 1, int(np.searchsorted(ends, before + target, "right")))
        out[pos:nxt] = g
        pos, g = nxt, g + 1
    return out


def prune_by_timestamp(s: Slices, b: Bounds, *, kafka_shaped: bool) -> Slices:
    """:func:`spark_ext.pushdown.prune_by_timestamp` over columns: a slice lies in one
    batch, whose recorded times (a typed topic's: its append time) must meet the bounds."""
    from spark_ext.pushdown import _NONE

    if b.ts_lo == -_NONE and b.ts_hi == _NONE:
        return s
    if kafka_shaped:
        lo, hi = s.ts_min, s.ts_max
        unknown = (lo > hi) | ((lo == 0) & (hi == 0))
    else:
        lo = hi = s.append_ms
        unknown = np.zeros(len(s), bool)
    return s.filter(unknown | ((hi >= b.ts_lo) & (lo <= b.ts_hi)))
