"""Plans of topics whose batches live in shared objects (one object holding one
transaction step's batches of several partitions): the slices of each shared object are
consecutive, in the object's row order, in ONE input partition, with the array planner,
the per-object planner and the binary plan agreeing."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pyarrow as pa

from spark_ext import plan_arrays, plan_file
from spark_ext.hadoop_conf import HadoopLocation
from spark_ext.read_plan import FileSlice, group_slices, split_groups, together
from txlog import layout
from txlog.records import TopicPartition

SEED = 3233


def as_arrays(slices: list[FileSlice], tps: list[TopicPartition]) -> plan_arrays.Slices:
    index = {tp: i for i, tp in enumerate(tps)}
    out = plan_arrays.Slices(
        tps, np.array([index[TopicPartition(s.topic, s.partition)] for s in slices], np.int32),
        pa.chunked_array([[s.key for s in slices]], pa.string()))
    for name in ("base_offset", "skip", "take", "append_ms", "nbytes", "object_bytes"):
        setattr(out, name, np.array([getattr(s, name) for s in slices], np.int64))
    out.ts_min = out.ts_max = np.zeros(len(slices), np.int64)
    out.whole = np.array([s.whole for s in slices], bool)
    out.shared = np.array([s.shared for s in slices], bool)
    return out


def random_plan(rng: random.Random) -> tuple[list[FileSlice], list[TopicPartition]]:
    """Slices in partition and offset order, as a planner finds them in each partition's
    log: objects of its own, and shared objects of its topic (a step's batches of several
    partitions, rows in ascending partition order), some partitions' batches in them
    missing (not read, or cut by the range)."""
    topics = {"a": rng.randrange(1, 5), "b": rng.randrange(1, 4)}
    tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
    rng.shuffle(tps)  # 'assign' may list partitions in any order
    per_tp: dict[TopicPartition, list[FileSlice]] = {tp: [] for tp in tps}
    offsets = dict.fromkeys(tps, 0)
    for step in range(rng.randrange(0, 30)):
        topic = rng.choice(sorted(topics))
        parts = sorted(rng.sample(range(topics[topic]), rng.randrange(1, topics[topic] + 1)))
        if len(parts) > 1 and rng.random() < 0.7:
            key = f"{layout.shared_prefix(topic)}{step:032x}.crc32-00000000.parquet"
            counts = [rng.randrange(1, 6) for _ in parts]
            total, size, row = sum(counts), rng.randrange(100, 9_000), 0
            for p, n in zip(parts, counts, strict=True):
                tp = TopicPartition(topic, p)
                if rng.random() < 0.85:
                    skip = rng.randrange(n) if rng.random() < 0.2 else 0
                    per_tp[tp].append(FileSlice(
                        key, topic, p, offsets[tp] - row, row + skip, n - skip, 7,
                        max(1, size * (n - skip) // total), False, size, True))
                offsets[tp] += n
                row += n
        else:
            for p in parts:
                tp = TopicPartition(topic, p)
                n = rng.randrange(1, 6)
                key = layout.data_key(topic, p, f"o{step:05d}")
                per_tp[tp].append(FileSlice(key, topic, p, offsets[tp], 0, n, 7,
                                            rng.randrange(1, 3_000), True, 0, False))
                offsets[tp] += n
    return [s for tp in tps for s in per_tp[tp]], tps


def check_together(before: list[FileSlice], after: list[FileSlice]) -> None:
    assert sorted(before) == sorted(after)
    # Each shared object's slices are consecutive, in row order.
    seen: set[str] = set()
    for i, s in enumerate(after):
        if not s.shared:
            continue
        if i and after[i - 1].key == s.key:
            assert after[i - 1].skip < s.skip
        else:
            assert s.key not in seen, s.key
            seen.add(s.key)
    # Everything else keeps its order, and each shared object is where its first slice
    # was: after what came before that slice.
    assert [s for s in after if not s.shared] == [s for s in before if not s.shared]
    for key in seen:
        first = next(i for i, s in enumerate(before) if s.key == key)
        at = next(i for i, s in enumerate(after) if s.key == key)
        assert {s for s in before[:first] if not s.shared} == \
            {s for s in after[:at] if not s.shared}, key


def test_a_shared_objects_slices_come_together_and_stay_in_one_input_partition() -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    where = HadoopLocation("s3a://bucket/lake")
    shared_seen = 0
    for case in range(300):
        slices, tps = random_plan(rng)
        want = together(slices)
        check_together(slices, want)
        got = plan_arrays.together(as_arrays(slices, tps))
        assert got.file_slices() == want, case
        shared_seen += sum(s.shared for s in want)
        distinct = len({s.key for s in want if s.shared}) + len(
            {(s.topic, s.partition, s.key) for s in want if not s.shared})
        assert got.objects() == distinct, case
        for min_parts in (None, 1, 3, 40):
            for max_bytes in (1, 2_000, 10**9):
                ids = plan_arrays.group_ids(got.nbytes, got.tp, min_partitions=min_parts,
                                            max_partition_bytes=max_bytes, glued=got.glued())
                groups = group_slices(want, min_partitions=min_parts,
                                      max_partition_bytes=max_bytes)
                assert split_groups(got, ids) == groups, (case, min_parts, max_bytes)
                # A shared object is read by one input partition.
                owner: dict[str, int] = {}
                for g, group in enumerate(groups):
                    for s in group:
                        if s.shared:
                            assert owner.setdefault(s.key, g) == g, (case, s.key)
                check_plan_table(plan_file.encode(got, ids, where), groups, where)
    assert shared_seen > 1_000


def check_plan_table(table: Any, groups: list[list[FileSlice]], where: HadoopLocation,
                     ) -> None:
    header = json.loads(table.schema.metadata[plan_file.HEADER])
    assert header["groups"] == [len(g) for g in groups]
    flat = [s for g in groups for s in g]
    rows = table.to_pylist()
    assert len(rows) == len(flat)
    for r, s in zip(rows, flat, strict=True):
        topic, partition = header["partitions"][r["tp"]]
        assert (header["dirs"][r["dir"]] + r["name"], topic, partition) == \
            (where.path(s.key), s.topic, s.partition)
        assert (r["base_offset"], r["skip"], r["take"], r["object_bytes"]) == \
            (s.base_offset, s.skip, s.take, s.object_bytes)
    # A topic's shared objects are named from one folder.
    shared_dirs = {header["dirs"][r["dir"]] for r, s in zip(rows, flat, strict=True)
                   if s.shared}
    assert len(shared_dirs) <= len({s.topic for s in flat if s.shared})


def test_without_shared_objects_the_plan_is_unchanged() -> None:
    """No shared object: slices keep their partition and offset order, and the groups
    are those of the byte cut alone."""
    rng = random.Random(SEED + 1)
    tps = [TopicPartition("a", p) for p in range(4)]
    slices = [FileSlice(layout.data_key("a", p, f"o{i}"), "a", p, i * 3, 0, 3, 7,
                        rng.randrange(1, 5_000), True, 0) for p in range(4) for i in range(9)]
    s = as_arrays(slices, tps)
    assert plan_arrays.together(s) is s
    assert not s.glued().any()
    ids = plan_arrays.group_ids(s.nbytes, s.tp, min_partitions=5, max_partition_bytes=10**9,
                                glued=s.glued())
    assert (ids == plan_arrays.group_ids(s.nbytes, s.tp, min_partitions=5,
                                         max_partition_bytes=10**9)).all()


def test_the_sql_engine_never_merges_two_partitions_slices_of_a_shared_object() -> None:
    """Adjacent slices of one object whose offsets line up are merged into one (a
    segment's runs); a shared object's slices of two partitions can line up too (p0's
    rows 0-4 at offsets 5-9, p1's rows 5-9 at offsets 10-14) and must not be merged,
    or p1's rows would be returned as p0's."""
    from spark_ext.native import one_slice_per_file

    key = f"{layout.shared_prefix('a')}{1:032x}.crc32-00000000.parquet"
    p0 = FileSlice(key, "a", 0, 5, 0, 5, 7, 50, False, 100, True)
    p1 = FileSlice(key, "a", 1, 5, 5, 5, 7, 50, False, 100, True)
    assert one_slice_per_file([p0, p1]) is None
    # A segment's runs of one partition still merge.
    run = p1._replace(partition=0)
    assert one_slice_per_file([p0, run]) == {key: p0._replace(take=10, nbytes=100)}


def test_a_batch_in_a_shared_object_is_its_share_and_never_the_whole_object() -> None:
    """A partition's batch at row 0 of a shared object is not every row of its object
    (the SQL engine would read the other partitions' rows as its own), and counts its
    share of the object's bytes; a shared object holding one batch alone is whole."""
    from spark_ext.read_plan import plan_slices
    from txlog.model import DATA, PARTS, Entry
    from txlog.partition_state import READ_COMMITTED, PartitionState

    tp = TopicPartition("a", 0)
    key = layout.shared_key("a", f"{7:032x}.crc32-00000000")
    alone = layout.shared_key("a", f"{8:032x}.crc32-00000000")
    st = PartitionState()
    for slot, (k, count, row, rows) in enumerate([(key, 3, 0, 8), (alone, 2, 0, 2)]):
        st.apply(Entry(slot=slot, kind=DATA, base_offset=slot * 3, count=count, data=k,
                       nbytes=900, extra={PARTS: [[k, count, 900, 0, 0, row, rows]]}))
    want = plan_slices(None, {tp: st}, {tp: (0, 5)}, READ_COMMITTED)  # type: ignore[arg-type]
    assert [(s.key, s.skip, s.take, s.whole, s.nbytes, s.object_bytes, s.shared)
            for s in want] == [(key, 0, 3, False, 900 * 3 // 8, 900, True),
                               (alone, 0, 2, True, 900, 900, True)]
    assert plan_arrays.partition_slices({tp: st}, {tp: (0, 5)}, READ_COMMITTED) \
        .file_slices() == want
