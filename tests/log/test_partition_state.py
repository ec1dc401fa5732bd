"""Pure visibility planning (no I/O), checked against a simple reference model.

The reference decides each record's fate straight from the definition (docs/design.md):
a transactional record of (pid, epoch) at offset o is committed/aborted by the first
marker of (pid, epoch) after it, unless an entry of pid with a newer epoch comes first
(then it is fenced), or a marker of pid with epoch >= its own precedes it (a zombie's late
write: fenced).  The LSO is the first offset of the earliest transaction still open,
where a BEGIN entry opens one at the offset after it.  A COMMIT marker that carries
batches is, to the reference, those records followed by the marker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txlog.checkpoint import decode_checkpoint, encode_checkpoint
from txlog.errors import CorruptObjectError
from txlog.model import ABORT, BEGIN, COMMIT, DATA, PARTS, Entry, decode_entry
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
        elif op in ("begin", "zombie_begin"):
            epoch = epochs[pid] - 1 if op == "zombie_begin" else epochs[pid]
            if epoch < 0:
                continue
            entries.append(Entry(slot=len(entries), kind=BEGIN, base_offset=offset, count=0,
                                 producer_id=pid, epoch=epoch, transactional=True,
                                 txn_id=f"t{pid}"))
            recs.append(Rec(offset, BEGIN, pid, epoch, True))  # (holds no offset)
        elif op == "commit_parts":  # the transaction's last n records, then its marker
            key = f"obj-{len(entries)}"
            entries.append(Entry(slot=len(entries), kind=COMMIT, base_offset=offset,
                                 count=n + 1, producer_id=pid, epoch=epochs[pid],
                                 transactional=True, data=key, txn_id=f"t{pid}",
                                 extra={PARTS: [[key, n, 0, 0, 0]]}))
            recs.extend(Rec(offset + i, "data", pid, epochs[pid], True) for i in range(n))
            recs.append(Rec(offset + n, COMMIT, pid, epochs[pid], True))
            offset += n + 1
            epochs[pid] += 1
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


def reference_lso(recs: list[Rec], status: dict[int, int]) -> int:
    """The first offset of the earliest open transaction: an open batch, or a BEGIN that
    no prior marker of its producer at its epoch or later ignores, and no later marker of
    its transaction closes, nor a later entry of its producer at a newer epoch fences."""
    held = [o for o, st_ in status.items() if st_ == OPEN]
    for i, r in enumerate(recs):
        if r.kind != BEGIN or any(p.kind in (COMMIT, ABORT) and p.pid == r.pid
                                  and p.epoch >= r.epoch for p in recs[:i]):
            continue
        if not any(q.pid == r.pid and ((q.epoch > r.epoch and (q.txn or q.kind != "data"))
                                       or (q.epoch == r.epoch and q.kind in (COMMIT, ABORT)))
                   for q in recs[i + 1:]):
            held.append(r.offset)
    return min(held) if held else len([r for r in recs if r.kind != BEGIN])


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
                     "bump", "begin", "zombie_begin", "commit_parts"]),
    st.integers(0, 2), st.integers(1, 3)), max_size=40)


@settings(max_examples=400, deadline=None)
@given(OPS, st.integers(0, 60), st.integers(0, 80))
def test_plan_matches_reference(ops: list[tuple[str, int, int]], start: int, length: int,
                                ) -> None:
    entries, recs = build(ops)
    s = replay(entries)
    status = {r.offset: reference_status(recs, i) for i, r in enumerate(recs)
              if r.kind == "data"}
    lso = reference_lso(recs, status)
    assert s.high_watermark == len([r for r in recs if r.kind != BEGIN])
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


def test_begin_holds_the_lso_until_the_commit_that_carries_its_batches() -> None:
    """A BEGIN opens its transaction at the next offset (holding the LSO there, with no
    offset of its own); the COMMIT marker that carries the batches appends them and
    commits them with any appended before it.  A BEGIN of a newer epoch fences an older
    open one; a zombie's BEGIN (an epoch already decided) holds nothing."""
    entries, _ = build([("plain", 1, 2), ("begin", 0, 0), ("plain", 1, 1), ("data", 0, 1),
                        ("commit_parts", 0, 2)])
    s = replay(entries[:4])
    assert s.last_stable_offset == 2 and s.high_watermark == 4
    s = replay(entries)
    assert s.batches.status == [PLAIN, PLAIN, COMMITTED, COMMITTED]
    assert [s.batches.base_offset[i] for i in range(4)] == [0, 2, 3, 4]
    assert s.high_watermark == 7 and s.last_stable_offset == 7 and not s.open_txns
    assert read_offsets(s, 0, None, READ_COMMITTED) == [0, 1, 2, 3, 4, 5]
    entries, _ = build([("data", 0, 1), ("bump", 0, 0), ("begin", 0, 0), ("plain", 1, 1)])
    s = replay(entries)
    assert s.batches.status == [FENCED, PLAIN]
    assert s.last_stable_offset == 1  # held by the newer epoch's BEGIN only
    entries, _ = build([("data", 0, 1), ("abort", 0, 1), ("zombie_begin", 0, 0),
                        ("plain", 1, 1)])
    s = replay(entries)
    assert not s.open_txns and s.last_stable_offset == s.high_watermark == 3


def test_sequence_checks() -> None:

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


def merge_runs(entries: list[Entry]) -> list[Entry]:
    """The same log with every run of consecutive DATA entries of one producer (same id,
    epoch and kind of write) written as one entry of parts, as a producer behind a slow
    committer writes them (encoded and decoded, as a reader meets them)."""
    out: list[Entry] = []
    run: list[Entry] = []

    def close() -> None:
        if not run:
            return
        first = run[0]
        parts = [[e.data, e.count, e.nbytes, e.ts_min, e.ts_max] for e in run]
        e = replace(first, slot=len(out)) if len(run) == 1 else Entry(
            slot=len(out), kind=DATA, base_offset=first.base_offset,
            count=sum(e.count for e in run), producer_id=first.producer_id,
            epoch=first.epoch, transactional=first.transactional, txn_id=first.txn_id,
            data=first.data, nbytes=sum(e.nbytes for e in run), extra={PARTS: parts})
        out.append(decode_entry(e.encode(), f"slot {e.slot}"))
        run.clear()

    for e in entries:
        if e.kind == DATA and run and (run[0].producer_id, run[0].epoch,
                                       run[0].transactional) != (e.producer_id, e.epoch,
                                                                 e.transactional):
            close()
        if e.kind == DATA:
            run.append(e)
            continue
        close()
        out.append(decode_entry(replace(e, slot=len(out)).encode(), f"slot {len(out)}"))
    close()
    return out


@settings(max_examples=300, deadline=None)
@given(OPS, st.integers(0, 60), st.integers(0, 80))
def test_an_entry_of_parts_replays_as_its_objects_appended_one_by_one(
        ops: list[tuple[str, int, int]], start: int, length: int) -> None:
    entries, _ = build(ops)
    for e in entries:
        e.nbytes, e.ts_min, e.ts_max = 10 * e.count, e.base_offset, e.base_offset + 1
    one_by_one, grouped = replay(entries), replay(merge_runs(entries))
    for col in ("base_offset", "count", "producer_id", "epoch", "status", "data", "nbytes",
                "ts_min", "ts_max", "row"):
        assert getattr(grouped.batches, col) == getattr(one_by_one.batches, col), col
    assert grouped.high_watermark == one_by_one.high_watermark
    assert grouped.last_stable_offset == one_by_one.last_stable_offset
    assert grouped.aborted == one_by_one.aborted
    end = start + length
    for iso in (READ_COMMITTED, READ_UNCOMMITTED):
        assert read_offsets(grouped, start, end, iso) == read_offsets(one_by_one, start,
                                                                       end, iso)
    again = decode_checkpoint(encode_checkpoint(grouped), "test")
    assert read_offsets(again, start, end, READ_COMMITTED) == read_offsets(
        one_by_one, start, end, READ_COMMITTED)


def test_an_entry_of_parts_is_refused_by_readers_of_format_1_only() -> None:
    e = Entry(slot=0, kind=DATA, base_offset=0, count=3, data="a", nbytes=2,
              extra={PARTS: [["a", 1, 1, 5, 5], ["b", 2, 1, 6, 7]]})
    assert json.loads(e.encode())["v"] == 2  # an older txlog says "upgrade"
    plain = Entry(slot=0, kind=DATA, base_offset=0, count=3, data="a")
    assert json.loads(plain.encode())["v"] == 1  # still readable by one
    s = PartitionState()
    s.apply(decode_entry(e.encode(), "x"))
    assert (s.batches.base_offset, s.batches.data, s.batches.ts_max) == (
        [0, 1], ["a", "b"], [5, 7])


@pytest.mark.parametrize("parts", [
    [["a", 1, 1, 5, 5], ["b", 1, 1, 6, 7]],  # counts add up to 2, not 3
    [["b", 1, 1, 5, 5], ["a", 2, 1, 6, 7]],  # the first is not the entry's data
    [["a", 0, 1, 5, 5], ["b", 3, 1, 6, 7]],  # an empty part
    [["a", 1, 1, 5], ["b", 2, 1, 6, 7]],  # a field short
    [],
])
def test_an_entry_of_parts_that_does_not_add_up_is_corrupt(parts: list[Any]) -> None:
    e = Entry(slot=0, kind=DATA, base_offset=0, count=3, data="a", extra={PARTS: parts})
    with pytest.raises(CorruptObjectError, match="invalid field values"):
        decode_entry(e.encode(), "x")


def test_a_commit_marks_every_batch_of_its_transaction_also_after_an_empty_one() -> None:
    """Older producers wrote a DATA entry of no records for an empty send_batch(): it
    starts where the next batch does, and the commit used to mark only the first batch
    at that offset, so the records after it stayed open, never readable."""
    entries = [
        Entry(slot=0, kind=DATA, base_offset=0, count=0, producer_id=1, epoch=0,
              transactional=True, data="empty", txn_id="t"),
        Entry(slot=1, kind=DATA, base_offset=0, count=2, producer_id=2, epoch=0,
              transactional=True, data="other", txn_id="u"),
        Entry(slot=2, kind=DATA, base_offset=2, count=0, producer_id=2, epoch=0,
              transactional=True, data="empty2", txn_id="u"),
        Entry(slot=3, kind=DATA, base_offset=2, count=3, producer_id=2, epoch=0,
              transactional=True, data="real", txn_id="u"),
        Entry(slot=4, kind=COMMIT, base_offset=5, count=1, producer_id=2, epoch=0,
              transactional=True),
        Entry(slot=5, kind=ABORT, base_offset=6, count=1, producer_id=1, epoch=0,
              transactional=True),
    ]
    s = replay(entries)
    assert s.batches.status == [ABORTED, COMMITTED, COMMITTED, COMMITTED]
    assert read_offsets(s, 0, None, READ_COMMITTED) == [0, 1, 2, 3, 4]
