"""Pure visibility planning (no I/O), checked against a simple reference model.

The reference decides each record's fate straight from the definition in DESIGN.md:
a transactional record of (pid, epoch) at offset o is committed/aborted by the first
marker of (pid, epoch) after it, unless an entry of pid with a newer epoch comes first
(then it is fenced), or a marker of pid with epoch >= its own precedes it (a zombie's late
write: fenced).  The LSO is the first offset of the earliest transaction still open.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from txlog.checkpoint import decode_checkpoint, encode_checkpoint
from txlog.model import ABORT, COMMIT, DATA, Entry
from txlog.partition_state import (
    ABORTED,
    COMMITTED,
    FENCED,
    OPEN,
    PLAIN,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    PartitionState,
)


@dataclass
class Rec:
    offset: int
    kind: str
    pid: int
    epoch: int
    txn: bool


def build(ops: list[tuple[str, int, int]]) -> tuple[list[Entry], list[Rec]]:
    """Turn generated operations into log entries and per-offset reference records."""
    epochs = {0: 0, 1: 0, 2: 0}
    entries: list[Entry] = []
    recs: list[Rec] = []
    offset = 0
    for op, pid, n in ops:
        if op in ("data", "plain", "zombie"):
            txn = op != "plain"
            epoch = epochs[pid] - 1 if op == "zombie" else epochs[pid]
            if epoch < 0:
                continue
            entries.append(Entry(slot=len(entries), kind=DATA, base_offset=offset, count=n,
                                 producer_id=pid, epoch=epoch, transactional=txn,
                                 data=f"obj-{len(entries)}", txn_id=f"t{pid}"))
            recs.extend(Rec(offset + i, "data", pid, epoch, txn) for i in range(n))
            offset += n
        elif op in ("commit", "abort", "late_marker"):
            epoch = epochs[pid] - 1 if op == "late_marker" else epochs[pid]
            if epoch < 0:
                continue
            kind = COMMIT if op == "commit" else ABORT
            entries.append(Entry(slot=len(entries), kind=kind, base_offset=offset, count=1,
                                 producer_id=pid, epoch=epoch, transactional=True))
            recs.append(Rec(offset, kind, pid, epoch, True))
            offset += 1
            if op != "late_marker":
                epochs[pid] += 1  # every transaction end bumps the epoch
        elif op == "bump":
            epochs[pid] += 1  # a new instance fenced the old one, no marker here
    return entries, recs


def reference_status(recs: list[Rec], i: int) -> int:
    r = recs[i]
    if not r.txn:
        return PLAIN
    for p in recs[:i]:
        if p.kind in (COMMIT, ABORT) and p.pid == r.pid and p.epoch >= r.epoch:
            return FENCED
    for q in recs[i + 1:]:
        if q.pid != r.pid:
            continue
        if q.epoch > r.epoch and ((q.kind == "data" and q.txn) or q.kind != "data"):
            return FENCED
        if q.kind in (COMMIT, ABORT) and q.epoch == r.epoch:
            return COMMITTED if q.kind == COMMIT else ABORTED
    return OPEN


def replay(entries: list[Entry]) -> PartitionState:
    s = PartitionState()
    for e in entries:
        s.apply(e)
    return s


def read_offsets(s: PartitionState, start: int, end: int | None, iso: str) -> list[int]:
    spans, _ = s.plan_read(start, end, iso)
    return [o for sp in spans for o in range(sp.start, sp.stop)]


OPS = st.lists(st.tuples(
    st.sampled_from(["data", "data", "plain", "commit", "abort", "zombie", "late_marker",
                     "bump"]),
    st.integers(0, 2), st.integers(1, 3)), max_size=40)


@settings(max_examples=400, deadline=None)
@given(OPS, st.integers(0, 60), st.integers(0, 80))
def test_plan_matches_reference(ops: list[tuple[str, int, int]], start: int, length: int,
                                ) -> None:
    entries, recs = build(ops)
    s = replay(entries)
    status = {r.offset: reference_status(recs, i) for i, r in enumerate(recs)
              if r.kind == "data"}
    open_offsets = [o for o, st_ in status.items() if st_ == OPEN]
    lso = min(open_offsets) if open_offsets else len(recs)
    assert s.high_watermark == len(recs)
    assert s.last_stable_offset == lso
    end = start + length
    want = [o for o, st_ in sorted(status.items())
            if st_ in (PLAIN, COMMITTED) and start <= o < min(end, lso)]
    assert read_offsets(s, start, end, READ_COMMITTED) == want
    want_all = [o for o in sorted(status) if start <= o < end]
    assert read_offsets(s, start, end, READ_UNCOMMITTED) == want_all
    # A checkpoint round trip plans exactly the same.
    s2 = decode_checkpoint(encode_checkpoint(s), "test")
    assert read_offsets(s2, start, end, READ_COMMITTED) == want
    assert s2.last_stable_offset == lso


@settings(max_examples=200, deadline=None)
@given(OPS, st.integers(0, 40))
def test_replay_from_any_checkpoint_equals_full_replay(ops: list[tuple[str, int, int]],
                                                       cut: int) -> None:
    entries, _ = build(ops)
    full = replay(entries)
    cut = min(cut, len(entries))
    head = decode_checkpoint(encode_checkpoint(replay(entries[:cut])), "test")
    for e in entries[cut:]:
        head.apply(e)
    assert head.batches.status == full.batches.status
    assert head.last_stable_offset == full.last_stable_offset
    assert head.high_watermark == full.high_watermark


def test_markers_are_never_returned_and_position_skips_them() -> None:
    entries, _ = build([("data", 0, 2), ("commit", 0, 1), ("data", 0, 1), ("abort", 0, 1)])
    s = replay(entries)
    spans, upper = s.plan_read(0, None, READ_COMMITTED)
    assert [(sp.start, sp.stop) for sp in spans] == [(0, 2)]
    assert upper == 5  # past the commit marker, the aborted batch and its marker


def test_edge_trims() -> None:
    entries, _ = build([("plain", 0, 3), ("plain", 0, 3), ("plain", 0, 3)])
    s = replay(entries)
    spans, upper = s.plan_read(1, 8, READ_COMMITTED)
    assert [(sp.base_offset, sp.start, sp.stop, sp.skip, sp.take) for sp in spans] == [
        (0, 1, 3, 1, 2), (3, 3, 6, 0, 3), (6, 6, 8, 0, 2)]
    assert upper == 8


def test_open_transaction_holds_lso_and_late_zombie_batch_does_not() -> None:
    entries, _ = build([("data", 0, 1), ("plain", 1, 2), ("abort", 0, 1), ("zombie", 0, 1),
                        ("data", 1, 1)])
    s = replay(entries)
    assert s.batches.status == [ABORTED, PLAIN, FENCED, OPEN]
    assert s.last_stable_offset == 5  # held only by pid 1's open batch, not the zombie
    aborted = s.aborted_ranges(0, 10)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in aborted] == [(0, 0, 3)]


def test_sequence_checks() -> None:
    import pytest

    from txlog.errors import InvalidProducerEpochError, OutOfOrderSequenceError

    s = PartitionState()
    s.apply(Entry(slot=0, kind=DATA, base_offset=0, count=3, producer_id=7, epoch=0,
                  base_sequence=0, data="a"))
    assert s.check_sequence(7, 0, 0, 3, False) == 0  # a retry: its original offset
    assert s.check_sequence(7, 0, 3, 2, False) is None  # the next batch
    with pytest.raises(OutOfOrderSequenceError):
        s.check_sequence(7, 0, 5, 1, False)  # a gap
    with pytest.raises(OutOfOrderSequenceError):
        s.check_sequence(8, 0, 4, 1, False)  # a new producer must start at 0
    s.apply(Entry(slot=1, kind=DATA, base_offset=3, count=1, producer_id=7, epoch=1,
                  base_sequence=0, data="b"))
    with pytest.raises(InvalidProducerEpochError):
        s.check_sequence(7, 0, 3, 1, False)
