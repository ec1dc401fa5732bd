"""Shared batch objects, the format: one object holding batches of several partitions of a
topic, named by each partition's log entry as a part of 7 (entry version 5).  Entries
round-trip and malformed ones are refused, replay and checkpoints keep each batch's rows
and count only its share of the object's bytes, and a consumer of any partition reads
exactly its own records out of the object."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import old_checkpoint

import txlog
from txlog import TopicPartition, layout, txn_state
from txlog.checkpoint import decode_checkpoint, encode_checkpoint
from txlog.errors import CorruptObjectError
from txlog.model import COMMIT, DATA, PARTS, SHARED_VERSION, Entry, decode_entry, share
from txlog.partition_log import AppendSpec, PartitionLog
from txlog.partition_state import PartitionState
from txlog.records import KAFKA_SCHEMA, conform
from txlog.shared_objects import FOOTER_KEY, encode_shared, footer_partitions, write_shared
from txlog.txn_state import PendingAppend, TxnRecord

SEED = 3232
KEY = "topics/t/_shared/" + "ab" * 16 + ".crc32-0badf00d.parquet"


def _data(parts: list[list[Any]], **kw: Any) -> Entry:
    return Entry(slot=0, kind=DATA, base_offset=0, count=sum(p[1] for p in parts),
                 data=parts[0][0], nbytes=sum(p[2] for p in parts), extra={PARTS: parts},
                 **kw)


def _roundtrip(e: Entry) -> Entry:
    return decode_entry(e.encode(), "test")


def _kafka(values: list[bytes]) -> pa.Table:
    return conform(pa.table({"value": values}), KAFKA_SCHEMA, "t", kafka_shaped=True)


# -- layout ------------------------------------------------------------------------------

def test_every_partition_of_the_topic_owns_its_shared_objects_and_nothing_else_there() -> None:
    assert layout.shared_prefix("t") == "topics/t/_shared/"
    for p in (0, 1, 7):
        assert layout.owns("t", p, KEY)
    assert not layout.owns("u", 0, KEY)  # another topic's
    assert not layout.owns("t", 0, "topics/t/_shared/_released/x.parquet/0")
    assert not layout.owns("t", 0, "topics/t/_shared/sub/x.parquet")
    assert not layout.owns("t", 0, "topics/t/_shared/../1/data/x.parquet")
    assert layout.is_shared(KEY) and not layout.is_shared("topics/t/0/data/x.parquet")


# -- entries -----------------------------------------------------------------------------

def test_shared_parts_round_trip_as_entry_version_5_and_others_keep_their_version() -> None:
    own = ["topics/t/0/data/a.parquet", 2, 100, 1, 2]
    shared = [KEY, 3, 900, 5, 6, 2, 9]
    e = _data([own, shared])
    raw = json.loads(e.encode())
    assert raw["v"] == SHARED_VERSION == 5
    assert _roundtrip(e) == e
    assert json.loads(_data([own]).encode())["v"] == 2
    alone = _data([shared])  # a shared object is always named through parts
    assert _roundtrip(alone).extra == {PARTS: [shared]}
    marker = Entry(slot=3, kind=COMMIT, base_offset=0, count=4, producer_id=1,
                   transactional=True, data=KEY, nbytes=900, extra={PARTS: [shared]})
    assert json.loads(marker.encode())["v"] == 5
    assert _roundtrip(marker) == marker


@pytest.mark.parametrize("part", [
    [KEY, 3, 900, 5, 6, -1, 9],                      # row below 0
    [KEY, 3, 900, 5, 6, 7, 9],                       # rows past the object's
    [KEY, 3, 900, 5, 6, 0, 0],                       # object of no rows
    [KEY, 3, -1, 5, 6, 0, 9],                        # negative size
    [KEY, 0, 900, 5, 6, 0, 9],                       # no records
    ["topics/t/0/data/a.parquet", 3, 900, 5, 6, 0, 9],  # rows of an object not shared
    ["topics/t/_shared/_released/a.parquet/0", 3, 900, 5, 6, 0, 9],
    [KEY, 3, 900, 5, 6],                             # a shared object's rows unnamed
    [KEY, 3, 900, 5, 6, 0],                          # 6 elements
    [KEY, 3, 900, 5, 6, 0, 9, 1],                    # 8 elements
    [KEY, 3, 900, 5, 6, 0, "9"],                     # not an int
    [KEY, 3, 900, 5, 6, True, 9],                    # a bool is no row
], ids=lambda p: repr(p[1:]) + ("" if layout.is_shared(p[0]) else " not shared"))
def test_invalid_shared_parts_are_refused_as_corrupt(part: list[Any]) -> None:
    raw = json.loads(_data([part]).encode())
    raw["v"] = 5
    with pytest.raises(CorruptObjectError, match="invalid field values"):
        decode_entry(json.dumps(raw).encode(), "test")


def test_shared_parts_in_an_entry_of_an_older_version_are_refused() -> None:
    raw = json.loads(_data([[KEY, 3, 900, 5, 6, 0, 9]]).encode())
    assert raw["v"] == 5
    raw["v"] = 4
    with pytest.raises(CorruptObjectError, match="invalid field values"):
        decode_entry(json.dumps(raw).encode(), "test")


def test_a_shared_object_named_without_parts_or_copied_inline_is_refused() -> None:
    bare = Entry(slot=0, kind=DATA, base_offset=0, count=3, data=KEY, nbytes=900)
    with pytest.raises(CorruptObjectError, match="invalid field values"):
        _roundtrip(bare)
    raw = json.loads(_data([[KEY, 3, 9, 5, 6, 0, 9]]).encode())
    raw["inline"] = {KEY: "A" * 12}
    with pytest.raises(CorruptObjectError, match="invalid field values"):
        decode_entry(json.dumps(raw).encode(), "test")


# -- replay and checkpoints ----------------------------------------------------------------

def _replayed() -> PartitionState:
    st = PartitionState()
    st.apply(_data([["topics/t/0/data/a.parquet", 2, 100, 1, 2], [KEY, 3, 900, 5, 6, 2, 9]]))
    st.apply(Entry(slot=1, kind=DATA, base_offset=5, count=1, data=KEY, nbytes=900,
                   extra={PARTS: [[KEY, 1, 900, 7, 7, 8, 9]]}))
    return st


def test_replay_gives_each_shared_batch_its_rows_and_counts_its_share_of_the_bytes() -> None:
    b = _replayed().batches
    assert b.row == [0, 2, 8]
    assert b.object_rows == [0, 9, 9]
    assert b.nbytes == [100, 900, 900]
    assert b.shares() == [100, 300, 100]
    assert _replayed().size_bytes() == 500
    spans, _ = _replayed().plan_read(0, None)
    assert [(s.data, s.file_row, s.take) for s in spans] == [
        ("topics/t/0/data/a.parquet", 0, 2), (KEY, 2, 3), (KEY, 8, 1)]


def test_a_share_is_by_rows_and_at_least_one_byte() -> None:
    assert share(900, 3, 9) == 300
    assert share(10, 1, 1000) == 1
    assert share(0, 1, 9) == 0
    assert share(123, 5, 0) == 123  # not shared: the object is the batch's own


def test_checkpoints_keep_rows_and_shares_and_old_checkpoints_still_read() -> None:
    st = decode_checkpoint(encode_checkpoint(_replayed()), "cp")
    assert st.batches.row == [0, 2, 8] and st.batches.object_rows == [0, 9, 9]
    assert st.size_bytes() == 500
    # Versions 1 and 2 (before shared objects): no object_rows column.
    old = PartitionState()
    old.apply(_data([["topics/t/0/data/a.parquet", 2, 100, 1, 2]]))
    for version in (1, 2):
        st2 = decode_checkpoint(old_checkpoint(old, version), f"v{version}")
        assert st2.batches.object_rows == [0] and st2.size_bytes() == 100


def test_a_checkpoint_whose_shared_rows_overrun_the_object_is_refused() -> None:
    st = _replayed()
    st.batches.object_rows = [0, 4, 9]  # rows 2..4 of an object of 4
    with pytest.raises(CorruptObjectError, match="rows or sizes are out of range"):
        decode_checkpoint(encode_checkpoint(st), "cp")


# -- the object --------------------------------------------------------------------------

def test_a_shared_object_holds_batches_in_partition_order_each_in_its_row_groups() -> None:
    batches = [(3, _kafka([b"c0", b"c1"])), (1, _kafka([b"a0"])), (3, _kafka([b"c2"])),
               (2, _kafka([b"b0", b"b1", b"b2"]))]
    key, buf, slices = encode_shared("t", batches)
    assert key.startswith("topics/t/_shared/") and layout.is_shared(key)
    assert [(s.partition, s.row, s.count, s.object_rows, s.nbytes) for s in slices] == [
        (3, 4, 2, 7, buf.size), (1, 0, 1, 7, buf.size), (3, 6, 1, 7, buf.size),
        (2, 1, 3, 7, buf.size)]
    pf = pq.ParquetFile(pa.BufferReader(buf))
    assert [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)] \
        == [1, 3, 2, 1]
    assert footer_partitions(pf.metadata, key) == [(1, 0, 1), (2, 1, 3), (3, 4, 3)]
    assert pf.read().column("value").to_pylist() == [b"a0", b"b0", b"b1", b"b2", b"c0",
                                                     b"c1", b"c2"]
    assert slices[0].part(10, 11) == [key, 2, buf.size, 10, 11, 4, 7]


def _footer(runs: Any, rows: int) -> pq.FileMetaData:
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, KAFKA_SCHEMA) as w:
        w.write_table(_kafka([b"x"] * rows))
        w.add_key_value_metadata({FOOTER_KEY: runs if isinstance(runs, str)
                                  else json.dumps(runs)})
    return pq.ParquetFile(pa.BufferReader(sink.getvalue())).metadata


@pytest.mark.parametrize("footer", [
    {"v": 2, "partitions": [[0, 0, 3]]},
    {"v": 1, "partitions": []},
    {"v": 1, "partitions": [[0, 0, 2]]},              # rows do not add up
    {"v": 1, "partitions": [[1, 0, 1], [0, 1, 2]]},   # partitions descend
    {"v": 1, "partitions": [[0, 0, 1], [0, 1, 2]]},   # a partition twice
    {"v": 1, "partitions": [[0, 0, 1], [1, 2, 2]]},   # rows not contiguous
    {"v": 1, "partitions": [[0, 0, 1], [1, 1, "2"]]},
    [[0, 0, 3]],
    {"v": True, "partitions": [[0, 0, 3]]},
    "[" * 100_000 + "]" * 100_000,  # past the JSON parser's nesting depth
])
def test_invalid_footers_are_refused_as_corrupt(footer: Any) -> None:
    assert footer_partitions(_footer({"v": 1, "partitions": [[0, 0, 1], [4, 1, 2]]}, 3),
                             "ok") == [(0, 0, 1), (4, 1, 2)]
    with pytest.raises(CorruptObjectError, match=r"invalid txlog\.shared footer"):
        footer_partitions(_footer(footer, 3), "bad")


def test_an_object_without_the_footer_is_refused_as_corrupt() -> None:
    buf = pa.BufferOutputStream()
    pq.write_table(_kafka([b"x"]), buf)
    with pytest.raises(CorruptObjectError, match=r"no txlog\.shared footer"):
        footer_partitions(pq.ParquetFile(pa.BufferReader(buf.getvalue())).metadata, "k")


# -- reading -------------------------------------------------------------------------------

def _hand_written(tmp_path: Path, partitions: int, rounds: int,
                  ) -> tuple[txlog.Log, dict[int, list[bytes]]]:
    """A topic whose batches all live in shared objects, written and appended by hand:
    each round writes one object holding a batch of every partition."""
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    lg = txlog.connect(str(tmp_path), checkpoint_interval_batches=4)
    lg.create_topic("t", partitions=partitions)
    want: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for r in range(rounds):
        batches = []
        for p in rng.sample(range(partitions), partitions):
            values = [b"%d-%d-%d" % (r, p, i) for i in range(rng.randint(1, 5))]
            want[p] += values
            batches.append((p, _kafka(values)))
        for s in write_shared(lg.store, "t", batches):
            lg.partition_log(TopicPartition("t", s.partition)).append(AppendSpec(
                kind=DATA, count=0,
                parts=[(s.key, s.count, s.nbytes, None, None, False, s.row, s.object_rows)]))
    return lg, want


def test_a_consumer_reads_exactly_each_partitions_records_out_of_shared_objects(
        tmp_path: Path) -> None:
    lg, want = _hand_written(tmp_path, partitions=4, rounds=6)
    assert len(lg.store.list("topics/t/_shared/")) == 6
    assert all(not lg.store.list(layout.data_prefix("t", p)) for p in range(4))
    fresh = txlog.connect(str(tmp_path))  # a cold open: checkpoints, then the tail
    for p in range(4):
        c = fresh.consumer(auto_offset_reset="earliest")
        c.assign([TopicPartition("t", p)])
        got = []
        while batch := c.poll(timeout_ms=0):
            got += batch
        assert [r.value for r in got] == want[p]
        assert [r.offset for r in got] == list(range(len(want[p])))
        st = PartitionLog(fresh.store, "t", p).load()
        assert all(layout.is_shared(k) for k in st.batches.data)
        assert 0 < st.size_bytes() < sum(st.batches.nbytes)
    c = fresh.consumer(auto_offset_reset="earliest")
    c.assign([TopicPartition("t", p) for p in range(4)])
    got = []
    while batch := c.poll(timeout_ms=0):
        got += batch
    assert sorted(r.value for r in got) == sorted(v for vs in want.values() for v in vs)


def test_a_checkpoint_naming_shared_objects_loads_and_another_topics_is_refused(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lg, _ = _hand_written(tmp_path, partitions=2, rounds=4)
    st = lg.partition_log(TopicPartition("t", 0)).refresh()
    (cp,) = lg.store.list(layout.checkpoint_prefix("t", 0))
    assert cp.endswith(f"{st.next_slot:012d}.arrow")  # the whole log is checkpointed
    with caplog.at_level("WARNING"):
        assert PartitionLog(lg.store, "t", 0).load().batches.data == st.batches.data
    assert "checkpoint" not in caplog.text
    st.batches.data = [k.replace("topics/t/", "topics/u/") for k in st.batches.data]
    lg.store.put(cp, encode_checkpoint(st))
    with caplog.at_level("WARNING"):
        again = PartitionLog(lg.store, "t", 0).load()  # from the log instead
    assert "outside t-0's own data" in caplog.text
    assert all(k.startswith("topics/t/_shared/") for k in again.batches.data)


def test_a_checkpoint_whose_shared_batches_lost_their_object_rows_is_refused(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """object_rows 0 would make a reader take the whole shared object, every partition's
    rows, as this batch's own."""
    lg, want = _hand_written(tmp_path, partitions=2, rounds=4)
    st = lg.partition_log(TopicPartition("t", 0)).refresh()
    (cp,) = lg.store.list(layout.checkpoint_prefix("t", 0))
    st.batches.object_rows = [0] * len(st.batches.object_rows)
    st.batches.row = [0] * len(st.batches.row)
    lg.store.put(cp, encode_checkpoint(st))
    with caplog.at_level("WARNING"):
        again = PartitionLog(lg.store, "t", 0).load()  # from the log instead
    assert "object_rows disagree" in caplog.text
    assert all(n > 0 for n in again.batches.object_rows)
    c = txlog.connect(str(tmp_path)).consumer(auto_offset_reset="earliest")
    c.assign([TopicPartition("t", 0)])
    got = []
    while batch := c.poll(timeout_ms=0):
        got += batch
    assert [r.value for r in got] == want[0]


# -- PrepareCommit records -----------------------------------------------------------------

def _prep(parts: tuple[tuple[Any, ...], ...]) -> TxnRecord:
    ongoing = TxnRecord(txn_id="x", producer_id=1, epoch=0, state="Ongoing",
                        timeout_ms=1000, partitions=(("t", 0),))
    return ongoing.transition("PrepareCommit", pending=(PendingAppend("t", 0, 0, parts),))


def test_a_prepare_commit_naming_shared_rows_is_record_version_4_and_round_trips() -> None:
    shared = _prep(((KEY, 3, 900, None, 5, False, 2, 9),))
    d = shared.to_json()
    assert d["v"] == txn_state.SHARED_VERSION == 4
    assert TxnRecord.from_json(json.loads(json.dumps(d)), "r") == shared
    own = _prep((("topics/t/0/data/a.parquet", 3, 900, None, 5, False),))
    assert own.to_json()["v"] == txn_state.PENDING_VERSION


@pytest.mark.parametrize("part", [
    [KEY, 3, 900, None, 5, False, 7, 9],          # rows past the object's
    [KEY, 3, 900, None, 5, False],                # a shared object's rows unnamed
    ["topics/t/0/data/a.parquet", 3, 900, None, 5, False, 0, 9],
    [KEY, 3, 900, None, 5, False, 0],
])
def test_invalid_shared_pending_parts_are_refused(part: list[Any]) -> None:
    d = _prep(((KEY, 3, 900, None, 5, False, 2, 9),)).to_json()
    d["pending"][0][3] = [part]
    with pytest.raises(CorruptObjectError, match="invalid"):
        TxnRecord.from_json(d, "r")


def test_shared_pending_parts_in_an_older_record_version_are_refused() -> None:
    d = _prep(((KEY, 3, 900, None, 5, False, 2, 9),)).to_json()
    d["v"] = 3
    with pytest.raises(CorruptObjectError, match="names rows of shared objects"):
        TxnRecord.from_json(d, "r")
