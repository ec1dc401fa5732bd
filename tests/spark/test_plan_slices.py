"""Spark read planning turns the partition's read spans into file slices without deciding
anything itself: checked against the spans ``PartitionState.plan_read`` returns, on random
batch indexes with compacted segments (one object named by several runs), trims and every
batch status."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ext.read_plan import FileSlice, plan_slices
from txlog.partition_state import (
    ABORTED,
    COMMITTED,
    FENCED,
    PLAIN,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    BatchColumns,
    PartitionState,
)
from txlog.records import TopicPartition

TP = TopicPartition("t", 3)

# Each batch: (status, records, a new object or a further run of the previous object).
BATCHES = st.lists(st.tuples(st.sampled_from([PLAIN, COMMITTED, ABORTED, FENCED]),
                             st.integers(1, 5), st.booleans(), st.integers(1, 900)),
                   max_size=30)


def state_of(batches: list[tuple[int, int, bool, int]]) -> PartitionState:
    b = BatchColumns()
    offset = 0
    obj = 0
    row = 0
    for i, (status, count, same_object, nbytes) in enumerate(batches):
        if not (same_object and i):
            obj += 1
            row = 0
        b.base_offset.append(offset)
        b.count.append(count)
        b.producer_id.append(7)
        b.epoch.append(0)
        b.status.append(status)
        b.data.append(f"topics/t/3/data/o{obj}.parquet")
        b.nbytes.append(nbytes)
        b.ts_min.append(offset)
        b.ts_max.append(offset)
        b.append_ms.append(1000 + i)
        b.txn_id.append(None)
        b.row.append(row)
        b.object_rows.append(0)
        offset += count
        row += count
    st_ = PartitionState(next_slot=len(batches), high_watermark=offset)
    st_.batches = b
    return st_


def reference(s: PartitionState, start: int, end: int, isolation: str) -> list[FileSlice]:
    """The slices as spark_ext built them from plan_read's spans (one span per slice)."""
    spans, _ = s.plan_read(start, end, isolation)
    b = s.batches
    sizes: dict[str, int] = {}
    held: dict[str, int] = {}  # an object's rows: to the end of its last run
    runs: Counter[str] = Counter()
    for d, n, c, r in zip(b.data, b.nbytes, b.count, b.row, strict=True):
        sizes[d] = max(sizes.get(d, 0), n)
        held[d] = max(held.get(d, 0), r + c)
        runs[d] += 1
    out = []
    for sp in spans:
        est = max(1, sizes[sp.data] * sp.take // held[sp.data])
        whole = runs[sp.data] == 1 and sp.row == 0 and sp.skip == 0 and sp.take == sp.count
        out.append(FileSlice(sp.data, TP.topic, TP.partition, sp.base_offset - sp.row,
                             sp.file_row, sp.take, sp.append_ms, est, whole, sizes[sp.data]))
    return out


@settings(max_examples=300, deadline=None)
@given(BATCHES, st.integers(0, 100), st.integers(0, 100), st.integers(0, 20))
def test_slices_are_plan_reads_spans(batches: list[tuple[int, int, bool, int]], start: int,
                                     length: int, log_start: int) -> None:
    s = state_of(batches)
    s.log_start_offset = min(log_start, s.high_watermark)
    for isolation in (READ_COMMITTED, READ_UNCOMMITTED):
        got = plan_slices(None, {TP: s}, {TP: (start, start + length)}, isolation)  # type: ignore[arg-type]
        assert got == reference(s, start, start + length, isolation)
