"""The array planner (spark_ext.plan_arrays) and the binary plan (spark_ext.plan_file)
return exactly the slices, groups and pruning of the per-object planner
(read_plan.plan_slices, group_slices, pushdown.prune_by_timestamp), on random logs of
several partitions: transactions committed, aborted, open, fenced (zombie batches and late
markers), plain batches, entries of several objects, shared objects holding batches of
several partitions, compacted segments, retention,
checkpoints at any slot with the tail replayed after them (open transactions decided
after the checkpoint), and random offset and timestamp bounds."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_ext import plan_arrays, plan_file, pushdown
from spark_ext.hadoop_conf import HadoopLocation
from spark_ext.read_plan import group_slices, plan_slices, split_groups
from txlog import layout
from txlog.checkpoint import decode_checkpoint, encode_checkpoint
from txlog.errors import ConfigError
from txlog.model import ABORT, BEGIN, COMMIT, COMPACT, DATA, PARTS, RETENTION, Entry
from txlog.partition_state import (
    ABORTED,
    COMMITTED,
    FENCED,
    PLAIN,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    PartitionState,
)
from txlog.records import TopicPartition

SEED = 3232
TOPIC = "t"


class LogMaker:
    """Random log entries of one partition, as producers, markers and maintenance write
    them."""

    def __init__(self, rng: random.Random, partition: int) -> None:
        self.rng = rng
        self.partition = partition
        self.entries: list[Entry] = []
        self.state = PartitionState()  # replayed as we go (for compaction's ranges)
        self.offset = 0
        self.epochs = {1: 0, 2: 0, 3: 0}
        self.objects = 0

    def key(self) -> str:
        self.objects += 1
        return layout.data_key(TOPIC, self.partition, f"o{self.objects:05d}")

    def add(self, kind: str, count: int, pid: int = -1, epoch: int = 0, *,
            txn: bool = False, data: str | None = None, extra: dict[str, Any] | None = None,
            log_start: int | None = None) -> None:
        r = self.rng
        lo = r.randrange(1_000, 2_000)
        e = Entry(slot=len(self.entries), kind=kind, base_offset=self.offset, count=count,
                  producer_id=pid, epoch=epoch, transactional=txn, txn_id=f"x{pid}",
                  data=data, nbytes=r.randrange(1, 5_000) if data else 0, ts_min=lo,
                  ts_max=lo + r.randrange(0, 50), append_ms=2_000 + len(self.entries),
                  log_start_offset=log_start, extra=extra)
        self.entries.append(e)
        self.state.apply(e)
        self.offset += count

    def shared(self, key: str, count: int, nbytes: int, row: int, object_rows: int) -> None:
        """A batch of a step that wrote several partitions' batches into one object."""
        pid = self.rng.choice(list(self.epochs))
        self.add(DATA, count, pid, self.epochs[pid], txn=True, data=key, extra={
            PARTS: [[key, count, nbytes, 1_500, 1_600, row, object_rows]]})

    def step(self) -> None:
        r = self.rng
        pid = r.choice(list(self.epochs))
        ep = self.epochs[pid]
        op = r.choices(["data", "plain", "zombie", "parts", "begin", "commit", "abort",
                        "late", "bump", "compact", "retain", "empty"],
                       weights=[30, 8, 3, 5, 3, 10, 6, 2, 2, 3, 1, 1])[0]
        n = r.randrange(1, 6)
        if op == "data":
            self.add(DATA, n, pid, ep, txn=True, data=self.key())
        elif op == "plain":
            self.add(DATA, n, pid, 0, data=self.key())
        elif op == "zombie" and ep > 0:
            self.add(DATA, n, pid, ep - 1, txn=True, data=self.key())
        elif op == "empty":  # a batch of no records (older producers), then one at its offset
            self.add(DATA, 0, pid, ep, txn=True, data=self.key())
            self.add(DATA, n, pid, ep, txn=True, data=self.key())
        elif op == "parts":
            parts: list[list[Any]] = [
                [self.key(), r.randrange(1, 4), r.randrange(1, 900), 1_500, 1_600]
                for _ in range(r.randrange(2, 4))]
            self.add(DATA, sum(p[1] for p in parts), pid, ep, txn=True, data=parts[0][0],
                     extra={PARTS: parts})
        elif op == "begin":
            self.add(BEGIN, 0, pid, ep, txn=True)
        elif op in ("commit", "abort"):
            self.add(COMMIT if op == "commit" else ABORT, 1, pid, ep, txn=True)
            self.epochs[pid] += 1
        elif op == "late" and ep > 0:
            self.add(COMMIT, 1, pid, ep - 1, txn=True)
        elif op == "bump":
            self.epochs[pid] += 1
        elif op == "compact":
            self.compact()
        elif op == "retain" and self.offset:
            self.add(RETENTION, 0, log_start=r.randrange(0, self.offset))

    def compact(self) -> None:
        """Merge a run of decided batches below the LSO into one segment object."""
        b = self.state.batches
        lso = self.state.last_stable_offset
        settled = [i for i in range(len(b)) if b.base_offset[i] + b.count[i] <= lso
                   and b.status[i] in (PLAIN, COMMITTED, ABORTED, FENCED)]
        if len(settled) < 2:
            return
        i = self.rng.choice(settled[:-1])
        j = i
        while j + 1 < len(b) and j + 1 in settled and j - i < 4:
            j += 1
        if j == i:
            return
        rows = []
        row = 0
        for k in range(i, j + 1):
            rows.append([b.base_offset[k], b.count[k], row, b.append_ms[k], b.producer_id[k],
                         b.status[k], b.epoch[k], b.ts_min[k], b.ts_max[k]])
            row += b.count[k]
        end = b.base_offset[j] + b.count[j]
        self.add(COMPACT, 0, extra={
            "start": b.base_offset[i], "end": end, "segment": self.key(),
            "replaces": list(dict.fromkeys(b.data[i:j + 1])), "nbytes": 7_777, "runs": rows})


def shared_step(rng: random.Random, makers: list[LogMaker]) -> None:
    """One object holding batches of several partitions, in ascending partition order."""
    chosen = sorted(rng.sample(makers, rng.randrange(2, len(makers) + 1)),
                    key=lambda m: m.partition)
    counts = [rng.randrange(1, 5) for _ in chosen]
    key = layout.shared_key(TOPIC, f"{rng.getrandbits(128):032x}.crc32-00000000")
    nbytes, row = rng.randrange(100, 9_000), 0
    for m, n in zip(chosen, counts, strict=True):
        m.shared(key, n, nbytes, row, sum(counts))
        row += n


def loaded(entries: list[Entry], cut: int) -> PartitionState:
    """The state a reader builds: a checkpoint written after ``cut`` entries, decoded, then
    the tail replayed on it."""
    s = PartitionState()
    for e in entries[:cut]:
        s.apply(e)
    st = decode_checkpoint(encode_checkpoint(s), "checkpoint")
    for e in entries[cut:]:
        st.apply(e)
    return st


def test_array_plans_equal_per_object_plans() -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    where = HadoopLocation("file:/lake")
    shared_read = 0
    for case in range(150):
        makers = [LogMaker(rng, p) for p in range(rng.randrange(1, 4))]
        for _ in range(rng.randrange(0, 60)):
            if len(makers) > 1 and rng.random() < 0.2:
                shared_step(rng, makers)
            for m in makers:
                if rng.random() < 0.7:
                    m.step()
        tps = [TopicPartition(TOPIC, m.partition) for m in makers]
        full = {tp: m.state for tp, m in zip(tps, makers, strict=True)}
        read = {tp: loaded(m.entries, rng.randrange(len(m.entries) + 1))
                for tp, m in zip(tps, makers, strict=True)}
        for tp in tps:  # the checkpoint and its tail hold what the whole replay holds
            assert read[tp].batches.arrow().equals(full[tp].batches.arrow()), case
        for _ in range(4):
            iso = rng.choice([READ_COMMITTED, READ_UNCOMMITTED])
            ranges = {}
            for tp in tps:
                start = rng.randrange(0, full[tp].high_watermark + 3)
                ranges[tp] = (start, start + rng.randrange(0, 40))
            want = plan_slices(None, full, ranges, iso)  # type: ignore[arg-type]
            got = plan_arrays.partition_slices(read, ranges, iso)
            assert got.file_slices() == want, (case, ranges, iso)
            shared_read += sum(s.shared for s in want)
            assert got.objects() == len({s.key for s in want})

            min_parts = rng.choice([None, 1, 2, 5])
            max_bytes = rng.choice([1, 500, 5_000, 10**9])
            parallelism = rng.choice([None, 1, 3])
            ids = plan_arrays.group_ids(got.nbytes, got.tp, min_partitions=min_parts,
                                        max_partition_bytes=max_bytes, glued=got.glued(),
                                        parallelism=parallelism)
            groups = group_slices(want, min_partitions=min_parts,
                                  max_partition_bytes=max_bytes, parallelism=parallelism)
            assert split_groups(got, ids) == groups, (case, min_parts, max_bytes, parallelism)
            _check_plan_table(plan_file.encode(got, ids, where), groups, where)

            lo = rng.randrange(900, 2_100)
            bounds = pushdown.Bounds(ts_lo=lo, ts_hi=lo + rng.randrange(0, 300))
            for kafka in (True, False):
                assert plan_arrays.prune_by_timestamp(got, bounds, kafka_shaped=kafka) \
                    .file_slices() == pushdown.prune_by_timestamp(want, full, bounds,
                                                                  kafka_shaped=kafka)
    assert shared_read > 300, shared_read


def _check_plan_table(table: Any, groups: list[list[Any]], where: HadoopLocation) -> None:
    header = json.loads(table.schema.metadata[plan_file.HEADER])
    assert header["version"] == plan_file.PLAN_VERSION
    assert header["groups"] == [len(g) for g in groups]
    rows = table.to_pylist()
    flat = [s for g in groups for s in g]
    assert len(rows) == len(flat)
    for r, s in zip(rows, flat, strict=True):
        topic, partition = header["partitions"][r["tp"]]
        assert (header["dirs"][r["dir"]] + r["name"], topic, partition) == \
            (where.path(s.key), s.topic, s.partition)
        assert (r["base_offset"], r["skip"], r["take"], r["append_ms"], r["nbytes"],
                r["object_bytes"]) == (s.base_offset, s.skip, s.take, s.append_ms, s.nbytes,
                                       s.object_bytes)


def test_objects_outside_the_data_folder_are_named_from_their_own() -> None:
    """A committed Spark write's objects stay in its staging folder: the plan names them
    from there, not from the partition's data folder."""
    s = plan_arrays.Slices([TopicPartition(TOPIC, 0)], np.zeros(2, np.int32), pa.chunked_array(
        [["topics/t/0/data/a.parquet", "topics/t/_staging/x/b.parquet"]]))
    for name in ("base_offset", "skip", "take", "append_ms", "nbytes", "object_bytes"):
        setattr(s, name, np.arange(2, dtype=np.int64))
    table = plan_file.encode(s, np.zeros(2, np.int32), HadoopLocation("s3a://b/r"))
    rows = table.to_pylist()
    header = json.loads(table.schema.metadata[plan_file.HEADER])
    assert [header["dirs"][r["dir"]] + r["name"] for r in rows] == [
        "s3a://b/r/topics/t/0/data/a.parquet", "s3a://b/r/topics/t/_staging/x/b.parquet"]


def test_a_jvm_connector_of_another_plan_format_is_refused() -> None:
    with pytest.raises(ConfigError, match="another txlog version"):
        plan_file.check_format({"planFormat": plan_file.PLAN_VERSION + 1})
    with pytest.raises(ConfigError, match="another txlog version"):
        plan_file.check_format({})  # a jar from before binary plans
    plan_file.check_format({"planFormat": plan_file.PLAN_VERSION})
