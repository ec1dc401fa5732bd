"""The JVM connector's scan request costs array work over whole columns, and that work
decides exactly what the per-partition planner it replaced decided: the slices, their
grouping, the object count and the plan file's bytes are those of the reference below (the
earlier implementation, kept here), on random logs of several partitions with compacted
segments, shared objects, objects outside the data folder and keys of several lengths."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_plan_arrays import TOPIC, LogMaker, loaded, shared_step

from spark_ext import plan_arrays, plan_file, pushdown
from spark_ext.hadoop_conf import HadoopLocation
from spark_ext.plan_arrays import Slices, _bounds_and_positions, together
from txlog import layout
from txlog.partition_state import (
    COMMITTED,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    BatchColumns,
    PartitionState,
)
from txlog.records import TopicPartition

SEED = 4747


# --- the reference: the per-partition planner as it was ---------------------------------


def ref_partition_slices(states: dict[TopicPartition, PartitionState],
                         ranges: dict[TopicPartition, tuple[int, int]], isolation: str,
                         ) -> Slices:
    tps: list[TopicPartition] = []
    parts: list[dict[str, np.ndarray]] = []
    keys: list[pa.Array] = []
    for tp, (start, end) in ranges.items():
        if end <= start:
            continue
        st = states[tp]
        t = st.batches.arrow()
        picked, lo, limit = _bounds_and_positions(st, t, start, end, isolation)
        if not len(picked):
            continue
        a, b = int(picked[0]), int(picked[-1]) + 1
        pick: slice | np.ndarray = slice(a, b) if b - a == len(picked) else picked
        col = {n: t.column(n).to_numpy()[pick] for n in
               ("base_offset", "count", "row", "append_ms", "ts_min", "ts_max")}
        data = t.column("data")
        size, runs, held = ref_object_sizes(data, t.column("nbytes"), t.column("count"),
                                            t.column("row"), pick)
        base, count, row = col["base_offset"], col["count"], col["row"]
        object_rows = t.column("object_rows").to_numpy()[pick]
        shared = object_rows > 0
        if shared.any():
            held = np.where(shared, object_rows, held)
        first = np.maximum(base, lo)
        take = np.minimum(base + count, limit) - first
        parts.append({
            "tp": np.full(len(picked), len(tps), np.int32), "base_offset": base - row,
            "skip": row + first - base, "take": take, "append_ms": col["append_ms"],
            "nbytes": np.maximum(1, size * take // np.maximum(1, held)),
            "whole": (runs == 1) & (row == 0) & (take == count) & (count == held),
            "object_bytes": size, "ts_min": col["ts_min"], "ts_max": col["ts_max"],
            "shared": shared})
        keys.extend((data[a:b] if isinstance(pick, slice) else data.take(pick)).chunks)
        tps.append(tp)
    if not parts:
        return Slices(tps)
    out = Slices(tps, np.concatenate([p["tp"] for p in parts]),
                 pa.chunked_array(keys, pa.string()))
    out.whole = np.concatenate([p["whole"] for p in parts])
    out.shared = np.concatenate([p["shared"] for p in parts])
    for name in plan_arrays._INTS:
        setattr(out, name, np.concatenate([p[name] for p in parts]).astype(np.int64,
                                                                              copy=False))
    return together(out)


def ref_distinct(keys: pa.ChunkedArray) -> bool:
    return bool(pc.count_distinct(keys).as_py() == len(keys))


def ref_object_sizes(data: pa.ChunkedArray, nbytes: pa.ChunkedArray, count: pa.ChunkedArray,
                     row: pa.ChunkedArray, pick: slice | np.ndarray,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    own = nbytes.to_numpy()[pick]
    if ref_distinct(data):
        return own, np.ones(len(own), np.int64), count.to_numpy()[pick]
    idx = pa.array(np.arange(len(data))[pick])
    end = pc.add(row, count)
    by = pa.table({"data": data, "nbytes": nbytes, "end": end}).group_by("data").aggregate(
        [("nbytes", "max"), ("nbytes", "count"), ("end", "max")])
    at = pc.index_in(data.take(idx), value_set=by.column("data")).to_numpy()
    return (by.column("nbytes_max").to_numpy()[at],
            by.column("nbytes_count").to_numpy()[at], by.column("end_max").to_numpy()[at])


def ref_objects(s: Slices) -> int:
    own = s.filter(~s.shared) if s.shared.any() else s
    runs = [0, *(np.flatnonzero(np.diff(own.tp)) + 1).tolist(), len(own)]
    n = sum(int(pc.count_distinct(own.key[a:b]).as_py())
            for a, b in itertools.pairwise(runs) if b > a)
    if len(own) < len(s):
        n += int(pc.count_distinct(s.key.filter(pa.array(s.shared))).as_py())
    return n


def ref_under(keys: pa.ChunkedArray, tp: np.ndarray, s: Slices, where: HadoopLocation,
              dirs: dict[str, int]) -> tuple[np.ndarray, pa.ChunkedArray]:
    dir_col = np.zeros(len(keys), np.int32)
    names: list[pa.Array] = []
    runs = [0, *(np.flatnonzero(np.diff(tp)) + 1).tolist(), len(keys)] if len(keys) else [0]
    for a, b in itertools.pairwise(runs):
        part = s.tps[int(tp[a])]
        run = keys[a:b]
        prefix = layout.data_prefix(part.topic, part.partition)
        if pc.all(pc.starts_with(run, prefix)).as_py():
            dir_col[a:b] = dirs.setdefault(where.path(prefix), len(dirs))
            names.extend(pc.utf8_slice_codeunits(run, len(prefix)).chunks)
            continue
        d, n = plan_file._own_folders(run, where, dirs)
        dir_col[a:b] = d
        names.append(n)
    return dir_col, pa.chunked_array(names, pa.string())


# --- random logs ---------------------------------------------------------------------------


class VariedMaker(LogMaker):
    """LogMaker whose object names vary: several lengths, non-ASCII characters, or a
    write's staging folder instead of the partition's data folder."""

    def __init__(self, rng: random.Random, partition: int, style: str) -> None:
        super().__init__(rng, partition)
        self.style = style

    def key(self) -> str:
        self.objects += 1
        r = self.rng
        if self.style == "lengths":
            return layout.data_key(TOPIC, self.partition, f"o{self.objects}")
        if self.style == "accents":
            return layout.data_key(TOPIC, self.partition, f"é{self.objects:05d}ü")
        if self.style == "staging" and r.random() < 0.5:
            return f"{layout.staging_prefix(TOPIC, 'w1')}{self.partition}-{self.objects:05d}"
        return layout.data_key(TOPIC, self.partition, f"o{self.objects:05d}")


def random_states(rng: random.Random) -> dict[TopicPartition, PartitionState]:
    makers: list[LogMaker] = [
        VariedMaker(rng, p, rng.choice(["plain", "lengths", "accents", "staging"]))
        for p in range(rng.randrange(1, 5))]
    for _ in range(rng.randrange(0, 80)):
        if len(makers) > 1 and rng.random() < 0.2:
            shared_step(rng, makers)
        for m in makers:
            if rng.random() < 0.7:
                m.step()
    return {TopicPartition(TOPIC, m.partition): loaded(m.entries,
                                                       rng.randrange(len(m.entries) + 1))
            for m in makers}


def many_states(rng: random.Random, partitions: int, batches: int,
                ) -> dict[TopicPartition, PartitionState]:
    """Long logs of committed batches each naming its own object, as the benchmark's."""
    out = {}
    for p in range(partitions):
        b = BatchColumns()
        b.base_offset = list(range(0, batches * 3, 3))
        b.count = [3] * batches
        b.producer_id = [9] * batches
        b.epoch = [0] * batches
        b.status = [COMMITTED] * batches
        b.data = [layout.data_key("big", p, f"{rng.getrandbits(132):033x}")
                  for _ in range(batches)]
        b.nbytes = [rng.randrange(2_000, 4_000) for _ in range(batches)]
        b.ts_min = b.ts_max = b.append_ms = list(range(batches))
        b.txn_id = [None] * batches
        b.row = [0] * batches
        b.object_rows = [0] * batches
        st = PartitionState(next_slot=batches, high_watermark=batches * 3)
        st.batches = b
        out[TopicPartition("big", p)] = st
    return out


def plan_bytes(s: Slices, ids: np.ndarray, where: HadoopLocation) -> bytes:
    path = plan_file.write(s, ids, where)
    try:
        with open(path, "rb") as f:
            return f.read()
    finally:
        plan_file.discard(path)


def check_same(states: dict[TopicPartition, PartitionState],
               ranges: dict[TopicPartition, tuple[int, int]], iso: str, rng: random.Random,
               monkeypatch: pytest.MonkeyPatch, what: object) -> None:
    want = ref_partition_slices(states, ranges, iso)
    got = plan_arrays.partition_slices(states, ranges, iso)
    assert got.tps == want.tps, what
    assert got.key.equals(want.key), what
    assert [len(c) for c in got.key.chunks] == [len(c) for c in want.key.chunks], what
    for name in ("tp", "whole", "shared", *plan_arrays._INTS):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), (what, name)
    assert got.objects() == ref_objects(want), what
    cut = plan_arrays.prune_by_timestamp  # a filtered plan keeps what it knows
    lo = rng.randrange(900, 2_100)
    bounds = pushdown.Bounds(ts_lo=lo, ts_hi=lo + rng.randrange(0, 300))
    assert cut(got, bounds, kafka_shaped=True).objects() == ref_objects(
        cut(want, bounds, kafka_shaped=True)), what

    min_parts = rng.choice([None, 1, 2, 5])
    max_bytes = rng.choice([1, 500, 5_000, 10**9])
    parallelism = rng.choice([None, 1, 3])
    ids, want_ids = (plan_arrays.group_ids(s.nbytes, s.tp, glued=s.glued(),
                                           min_partitions=min_parts,
                                           max_partition_bytes=max_bytes,
                                           parallelism=parallelism) for s in (got, want))
    assert np.array_equal(ids, want_ids), what
    where = HadoopLocation("file:/lake")
    new = plan_bytes(got, ids, where)
    with monkeypatch.context() as m:
        m.setattr(plan_file, "_under", ref_under)
        old = plan_bytes(want, want_ids, where)
    assert new == old, what


def test_the_request_plans_exactly_what_the_per_partition_planner_did(
        monkeypatch: pytest.MonkeyPatch) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    for case in range(120):
        states = random_states(rng)
        for _ in range(3):
            iso = rng.choice([READ_COMMITTED, READ_UNCOMMITTED])
            ranges = {}
            for tp, st in states.items():
                start = rng.randrange(0, st.high_watermark + 3)
                ranges[tp] = (start, start + rng.randrange(0, 60))
            check_same(states, ranges, iso, rng, monkeypatch, (case, ranges, iso))
    for case in range(3):  # long logs: whole ranges, and ranges cut at both ends
        states = many_states(rng, rng.randrange(2, 12), rng.randrange(500, 3_000))
        for whole in (True, False):
            ranges = {tp: (0, st.high_watermark) if whole else
                      (rng.randrange(0, 50), st.high_watermark - rng.randrange(0, 50))
                      for tp, st in states.items()}
            check_same(states, ranges, READ_COMMITTED, rng, monkeypatch, ("long", case))
