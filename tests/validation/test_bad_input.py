"""Bad input: damaged stored objects, objects from a newer format, wrong-schema writes,
malformed options and configuration, names with path tricks, a store without atomic
create, and a fuzz test of every decoder of stored objects.

Each case gets a clear error, a :class:`txlog.errors.TxlogError` subclass naming the
object or option, and nothing already committed becomes unreadable.  The behaviour, per
kind of damaged object:

* **data batch (Parquet)**: reading it raises CorruptObjectError naming the object; every
  other batch, before and after it, stays readable (a consumer's positions do not move
  past records it never returned, so it can poll up to the bad batch).
* **partition checkpoint**: ignored with a warning; the partition loads from an older
  checkpoint or from the log itself (entries are never deleted), so nothing is lost.
* **log entry**: loading the partition raises CorruptObjectError naming the entry; the
  entries before it stay applied (``log.partition_log(tp).state`` is the valid prefix),
  so committed data below it is still readable with ``plan_read`` on that state.  A
  writer gets the same error instead of looping on the slot it can never claim.
* **state-log entry**: operations on transactional.ids of that state-log partition raise
  CorruptObjectError naming it; other partitions, and committed data, are unaffected.
* **topic metadata**: CorruptObjectError naming ``_meta/topics/<name>.json``.
* **newer format version** (entries, checkpoints, state-log objects, transaction records,
  topic metadata): UnsupportedFormatError (a CorruptObjectError) saying to upgrade;
  a newer checkpoint is skipped like a damaged one.
"""

from __future__ import annotations

import functools
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers import data_entries, entry_keys
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import txlog
from txlog import layout
from txlog.batch_codec import decode_parquet, encode_parquet
from txlog.checkpoint import decode_checkpoint, encode_checkpoint, with_checksum
from txlog.config import load_config
from txlog.errors import (
    AtomicCreateUnsupportedError,
    ConfigError,
    CorruptObjectError,
    InvalidNameError,
    InvalidTxnStateError,
    SchemaMismatchError,
    TxlogError,
    UnknownTopicError,
    UnsupportedFormatError,
)
from txlog.log import TopicInfo
from txlog.model import FORMAT_VERSION, Entry, decode_entry
from txlog.partition_state import READ_COMMITTED, PartitionState
from txlog.records import KAFKA_SCHEMA, TopicPartition, kafka_table
from txlog.state_log import VERSION as STATE_LOG_VERSION
from txlog.state_log import StateLogPartition, state_partition_for
from txlog.storage import open_store
from txlog.storage.base import check_key
from txlog.storage.memory import MemoryStore
from txlog.txn_state import RECORD_VERSION, PendingAppend, TxnRecord

# -- helpers ----------------------------------------------------------------------------------


def new_log(**config: Any) -> txlog.Log:
    return txlog.connect(f"memory://bad-input/{uuid.uuid4().hex}", **config)


def commit(log: txlog.Log, txn_id: str, values: list[tuple[str, int, bytes]]) -> None:
    p = log.producer(transactional_id=txn_id)
    p.init_transactions()
    p.begin_transaction()
    for topic, partition, value in values:
        p.send(topic, value=value, partition=partition)
        p.flush()  # one batch per value
    p.commit_transaction()
    p.close()


def read_values(log: txlog.Log, tps: list[TopicPartition], max_records: int = 1000,
                ) -> list[bytes]:
    c = log.consumer()
    c.assign(tps)
    c.seek_to_beginning()
    return [r.value for r in c.poll(max_records=max_records)]


def fresh(log: txlog.Log) -> txlog.Log:
    """Another client of the same root (no caches)."""
    return txlog.connect(log.url)


# -- valid objects of every stored kind -------------------------------------------------------


def valid_entry() -> bytes:
    return Entry(slot=3, kind="data", base_offset=7, count=2, producer_id=5, epoch=1,
                 base_sequence=0, transactional=True, txn_id="t", data="topics/a/0/data/x",
                 nbytes=100, ts_min=1, ts_max=2, append_ms=3).encode()


def _two_part_entry(kind: str, count: int) -> bytes:
    return Entry(slot=3, kind=kind, base_offset=7, count=count, producer_id=5, epoch=1,
                 base_sequence=0, transactional=True, txn_id="t", data="topics/a/0/data/x",
                 nbytes=300, ts_min=1, ts_max=4, append_ms=3,
                 extra={"parts": [["topics/a/0/data/x", 2, 100, 1, 2],
                                  ["topics/a/0/data/y", 3, 200, 2, 4]]}).encode()


def valid_parts_entry() -> bytes:
    """A DATA entry of several batch objects (format version 2)."""
    return _two_part_entry("data", 5)


def valid_marker_parts_entry() -> bytes:
    """A COMMIT marker that appends its transaction's last batch objects (version 3)."""
    return _two_part_entry("commit", 6)


def valid_begin_entry() -> bytes:
    """A BEGIN entry (version 3)."""
    return Entry(slot=3, kind="begin", base_offset=7, count=0, producer_id=5, epoch=1,
                 transactional=True, txn_id="t", append_ms=3).encode()


def valid_pending_state_log_object() -> bytes:
    """A PrepareCommit record that names batch objects to append (record version 2)."""
    rec = TxnRecord("t", 5, 2, "PrepareCommit", 60000, (("a", 0), ("b", 1)), 10, 11, 5, 1,
                    "", pending=(PendingAppend("a", 0, 3, (
                        ("topics/a/0/data/x", 2, 100, 1, 2, False),
                        ("topics/a/0/data/y", 1, 50, None, None, True))),))
    return json.dumps({"v": 1, "slot": 0, "token": "ab", "record": rec.to_json()}).encode()


def valid_marker() -> bytes:
    return Entry(slot=4, kind="commit", base_offset=9, count=1, producer_id=5, epoch=1,
                 transactional=True).encode()


def valid_checkpoint() -> bytes:
    st = PartitionState()
    st.apply(decode_entry(Entry(slot=0, kind="data", base_offset=0, count=2, producer_id=5,
                                epoch=0, base_sequence=0, transactional=True, txn_id="t",
                                data="d0").encode(), "e0"))
    st.apply(decode_entry(Entry(slot=1, kind="abort", base_offset=2, count=1, producer_id=5,
                                epoch=0, transactional=True).encode(), "e1"))
    st.apply(decode_entry(Entry(slot=2, kind="data", base_offset=3, count=1, producer_id=5,
                                epoch=1, base_sequence=0, transactional=True, txn_id="t",
                                data="d1").encode(), "e2"))
    return encode_checkpoint(st)


def valid_record() -> dict[str, Any]:
    return TxnRecord("t", 5, 2, "Ongoing", 60000, (("a", 0), ("b", 1)), 10, 11, 5, 1,
                     "client").to_json()


def valid_state_log_object() -> bytes:
    return json.dumps({"v": 1, "slot": 0, "token": "ab", "record": valid_record()}).encode()


def valid_state_log_checkpoint() -> bytes:
    return json.dumps({"v": 1, "next_slot": 1, "records": {"t": valid_record()}}).encode()


def valid_topic_meta(typed: bool = False) -> bytes:
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())]) if typed else KAFKA_SCHEMA
    info = TopicInfo("orders", 3, schema, not typed, {"retention.ms": -1}, 5, "abc")
    return json.dumps(dict(info.to_json(), token="t")).encode()


def valid_parquet() -> bytes:
    return encode_parquet(kafka_table([(b"k", b"v", None, 1), (None, b"w", [("h", b"x")], 2)]))


# -- the decoders under test -------------------------------------------------------------------


def _decode_state_log_object(raw: bytes) -> Any:
    part = StateLogPartition(MemoryStore("memory://fuzz", "fuzz"), 0)
    part._apply(part._decode(raw, "_txn/state/000/log/000000/000000000000.json"), 0)
    return part.records


def _decode_state_log_checkpoint(raw: bytes) -> Any:
    store = MemoryStore("memory://fuzz", uuid.uuid4().hex)
    store.put("_txn/state/000/checkpoints/000000000001.json", raw)
    part = StateLogPartition(store, 0)
    part.refresh()  # an unreadable checkpoint is skipped: the log is replayed instead
    return part.records


def _checkpoint_with_meta(meta: bytes) -> bytes:
    """A valid checkpoint's batch table under the given (JSON) metadata (checksummed,
    so that what is checked is the metadata)."""
    table = pa.ipc.open_stream(pa.py_buffer(valid_checkpoint())).read_all()
    schema = table.schema.with_metadata({"txlog": meta})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        w.write_table(table.replace_schema_metadata(schema.metadata))
    return with_checksum(bytes(sink.getvalue().to_pybytes()))


def valid_checkpoint_meta() -> bytes:
    table = pa.ipc.open_stream(pa.py_buffer(valid_checkpoint())).read_all()
    return bytes(table.schema.metadata[b"txlog"])


def _decode_and_apply_entry(raw: bytes) -> PartitionState:
    """Decode an entry and replay it where it claims to be (a decoded entry must apply)."""
    e = decode_entry(raw, "topics/a/0/log/000000/000000000003.json")
    st = PartitionState(next_slot=e.slot, high_watermark=e.base_offset)
    st.apply(e)
    return st


DECODERS: dict[str, Any] = {
    "entry": _decode_and_apply_entry,
    "entry_parts": _decode_and_apply_entry,
    "entry_marker_parts": _decode_and_apply_entry,
    "entry_begin": _decode_and_apply_entry,
    "state_log_pending": lambda raw: _decode_state_log_object(raw),
    "checkpoint": lambda raw: decode_checkpoint(raw, "topics/a/0/checkpoints/x.arrow"),
    "checkpoint_meta": lambda raw: decode_checkpoint(_checkpoint_with_meta(raw),
                                                     "topics/a/0/checkpoints/x.arrow"),
    "state_log": _decode_state_log_object,
    "state_log_checkpoint": _decode_state_log_checkpoint,
    "topic": lambda raw: TopicInfo.from_json(raw, "_meta/topics/orders.json"),
    "parquet": lambda raw: decode_parquet(raw, "topics/a/0/data/x.parquet"),
}
# Each made once: the fuzzers mutate the same bytes in every example (an entry's token
# grows a digit now and then, and hypothesis rejects examples that draw differently).
VALID: dict[str, Any] = {k: functools.cache(f) for k, f in {
    "entry": valid_entry, "entry_parts": valid_parts_entry, "checkpoint": valid_checkpoint,
    "entry_marker_parts": valid_marker_parts_entry, "entry_begin": valid_begin_entry,
    "state_log_pending": valid_pending_state_log_object,
    "checkpoint_meta": valid_checkpoint_meta, "state_log": valid_state_log_object,
    "state_log_checkpoint": valid_state_log_checkpoint, "topic": valid_topic_meta,
    "parquet": valid_parquet,
}.items()}
JSON_KINDS = ("entry", "entry_parts", "entry_marker_parts", "entry_begin", "checkpoint_meta",
              "state_log", "state_log_pending", "state_log_checkpoint", "topic")


def only_txlog_errors(kind: str, raw: bytes) -> None:
    try:
        DECODERS[kind](raw)
    except TxlogError:
        pass
    except Exception as exc:  # pragma: no cover - the failure this test exists to find
        raise AssertionError(
            f"{kind} decoder raised {type(exc).__name__}: {exc} for {raw[:200]!r}") from exc


@pytest.mark.parametrize("kind", sorted(DECODERS))
def test_valid_objects_decode(kind: str) -> None:
    DECODERS[kind](VALID[kind]())


# Arbitrary JSON values, to put where a field's value should be.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=8)


@st.composite
def mutated_bytes(draw: st.DrawFn, valid: bytes) -> bytes:
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "zero"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[i:]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 16))]
        else:
            data[i:i + 8] = bytes(min(8, len(data) - i))
    return bytes(data)


def _paths(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*path, i))
    return out


@st.composite
def mutated_json(draw: st.DrawFn, valid: bytes) -> bytes:
    """Replace, delete or add one value somewhere in a valid JSON object."""
    doc = json.loads(valid)
    paths = _paths(doc)[1:]
    path = draw(st.sampled_from(paths))
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    op = draw(st.sampled_from(["replace", "delete", "add"]))
    if op == "replace" or (op == "delete" and isinstance(parent, list)):
        parent[path[-1]] = draw(json_values)
    elif op == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(max_size=6))] = draw(json_values)
    else:
        parent.append(draw(json_values))
    return json.dumps(doc).encode()


# TXLOG_TEST_FUZZ_EXAMPLES=5000 for a longer fuzz run.
FUZZ = settings(max_examples=int(os.environ.get("TXLOG_TEST_FUZZ_EXAMPLES", "150")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(kind=st.sampled_from(sorted(DECODERS)), raw=st.binary(max_size=300))
def test_fuzz_random_bytes(kind: str, raw: bytes) -> None:
    only_txlog_errors(kind, raw)


@FUZZ
@given(data=st.data(), kind=st.sampled_from(sorted(DECODERS)))
def test_fuzz_mutated_valid_objects(data: st.DataObject, kind: str) -> None:
    raw = data.draw(mutated_bytes(VALID[kind]()))
    only_txlog_errors(kind, raw)


@FUZZ
@given(data=st.data(), kind=st.sampled_from(JSON_KINDS))
def test_fuzz_mutated_json_fields(data: st.DataObject, kind: str) -> None:
    raw = data.draw(mutated_json(VALID[kind]()))
    only_txlog_errors(kind, raw)


@FUZZ
@given(data=st.data(), field=st.sampled_from(sorted(valid_record())))
def test_fuzz_transaction_records(data: st.DataObject, field: str) -> None:
    d = valid_record()
    d[field] = data.draw(json_values)
    try:
        rec = TxnRecord.from_json(d, "_txn/state/000/log/x.json")
    except TxlogError:
        return
    rec.to_json()  # a record that decodes can be written back
    assert isinstance(rec.partitions, tuple)


@FUZZ
@given(value=json_values)
def test_fuzz_transaction_record_not_an_object(value: Any) -> None:
    try:
        TxnRecord.from_json(value, "_txn/state/000/log/x.json")
    except TxlogError:
        pass


@FUZZ
@given(data=st.data())
def test_fuzz_decoded_entries_replay(data: st.DataObject) -> None:
    """An entry the decoder accepts can be replayed and planned without a crash."""
    raw = data.draw(mutated_json(data.draw(st.sampled_from([valid_entry(), valid_marker()]))))
    try:
        e = decode_entry(raw, "topics/a/0/log/x.json")
    except TxlogError:
        return
    st_ = PartitionState(next_slot=e.slot if isinstance(e.slot, int) else 0,
                         high_watermark=e.base_offset)
    try:
        st_.apply(e)
        st_.plan_read(0, None, READ_COMMITTED)
        st_.plan_read(0, None, "read_uncommitted")
        assert st_.last_stable_offset >= 0
    except TxlogError:
        pass


@pytest.mark.parametrize("kind", JSON_KINDS)
def test_deeply_nested_json(kind: str) -> None:
    only_txlog_errors(kind, b"[" * 100_000)
    only_txlog_errors(kind, b'{"v": 1, "record": ' + b"[" * 100_000)


# -- damaged objects in a live root --------------------------------------------------------------


def test_corrupt_segment_is_named_and_other_batches_stay_readable() -> None:
    log = new_log()
    log.create_topic("t", partitions=2)
    commit(log, "tx", [("t", 0, b"a0"), ("t", 0, b"a1"), ("t", 0, b"a2"), ("t", 1, b"b0")])
    bad = data_entries(log, "t", 0)[1].data
    assert bad is not None
    raw = log.store.get(bad)
    log.store.put(bad, raw[: len(raw) // 2])  # truncated
    log2 = fresh(log)
    c = log2.consumer()
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    c.assign([tp0])
    c.seek_to_beginning()
    assert [r.value for r in c.poll(max_records=1)] == [b"a0"]
    with pytest.raises(CorruptObjectError, match=bad):
        c.poll(max_records=10)
    assert c.position(tp0) == 1  # not moved past what was never returned
    # The batch after the damaged one, and the other partition, are readable.
    c.seek(tp0, 2)
    assert [r.value for r in c.poll(max_records=10)] == [b"a2"]
    assert read_values(log2, [tp1]) == [b"b0"]
    # The same for flipped bytes instead of a truncation (caught by the checksum).
    log.store.put(bad, bytes(b ^ 0x5A for b in raw))
    with pytest.raises(CorruptObjectError, match="fails its checksum"):
        read_values(fresh(log), [tp0])


def test_missing_segment_is_named() -> None:
    log = new_log()
    log.create_topic("t")
    commit(log, "tx", [("t", 0, b"a0")])
    key = data_entries(log, "t", 0)[0].data
    assert key is not None
    log.store.delete(key)
    with pytest.raises(TxlogError, match=key):
        read_values(fresh(log), [TopicPartition("t", 0)])


@pytest.mark.parametrize("damage", ["truncate", "garbage", "newer", "empty"])
def test_bad_checkpoint_falls_back_to_the_log(damage: str) -> None:
    log = new_log()
    log.create_topic("t")
    tp = TopicPartition("t", 0)
    commit(log, "tx", [("t", 0, b"a0"), ("t", 0, b"a1")])
    key = log.partition_log(tp).write_checkpoint()
    commit(log, "tx", [("t", 0, b"a2")])
    raw = log.store.get(key)
    if damage == "truncate":
        bad = raw[: len(raw) // 2]
    elif damage == "garbage":
        bad = os.urandom(len(raw))
    elif damage == "empty":
        bad = b""
    else:  # a checkpoint from a newer txlog: skipped like a damaged one
        st_ = decode_checkpoint(raw, key)
        table = pa.ipc.open_stream(pa.py_buffer(raw)).read_all()
        meta = json.loads(table.schema.metadata[b"txlog"])
        meta["v"] = 99
        sink = pa.BufferOutputStream()
        schema = table.schema.with_metadata({"txlog": json.dumps(meta)})
        with pa.ipc.new_stream(sink, schema) as w:
            w.write_table(table.replace_schema_metadata(schema.metadata))
        bad = sink.getvalue().to_pybytes()
        with pytest.raises(UnsupportedFormatError, match="upgrade"):
            decode_checkpoint(bad, key)
        del st_
    log.store.put(key, bad)
    assert read_values(fresh(log), [tp]) == [b"a0", b"a1", b"a2"]
    with pytest.raises(CorruptObjectError, match=key.replace(".", r"\.")):
        decode_checkpoint(bad, key)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "newer", "bad-field"])
def test_corrupt_log_entry_is_reported_and_the_prefix_stays_readable(damage: str) -> None:
    log = new_log()
    log.create_topic("t", partitions=2)
    tp = TopicPartition("t", 0)
    commit(log, "t1", [("t", 0, b"a0"), ("t", 0, b"a1")])  # slots 0, 1 and marker 2
    commit(log, "t2", [("t", 0, b"a2"), ("t", 1, b"b0")])  # slot 3, marker 4
    key = entry_keys(log, "t", 0)[3]
    raw = log.store.get(key)
    if damage == "truncate":
        bad = raw[: len(raw) // 2]
    elif damage == "garbage":
        bad = os.urandom(40)
    elif damage == "newer":
        bad = json.dumps(dict(json.loads(raw), v=99)).encode()
    else:
        bad = json.dumps(dict(json.loads(raw), kind=["data"])).encode()
    log.store.put(key, bad)
    log2 = fresh(log)
    expected = UnsupportedFormatError if damage == "newer" else CorruptObjectError
    with pytest.raises(expected, match=key.replace(".", r"\.")):
        read_values(log2, [tp])
    # The valid prefix stays loaded: committed data below the damaged entry is readable.
    plog = log2.partition_log(tp)
    assert plog.state is not None and plog.state.next_slot == 3
    spans, _ = plog.state.plan_read(0, None, READ_COMMITTED)
    assert [v for t in plog.read_spans(spans) for v in t.column("value").to_pylist()] == \
        [b"a0", b"a1"]
    # Writers get the error too (instead of retrying a slot they can never claim).
    p = log2.producer(transactional_id="t3")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", value=b"a3", partition=0)
    with pytest.raises(expected):
        p.flush()
    # Other partitions are unaffected.
    assert read_values(log2, [TopicPartition("t", 1)]) == [b"b0"]


@pytest.mark.parametrize("damage", ["truncate", "no-record", "record-not-object", "newer",
                                    "bad-state"])
def test_corrupt_state_log_entry(damage: str) -> None:
    log = new_log()
    log.create_topic("t")
    commit(log, "tx", [("t", 0, b"a0")])
    part = state_partition_for("tx")
    keys = log.store.list(f"_txn/state/{part:03d}/log/")
    key = keys[-1]
    d = json.loads(log.store.get(key))
    if damage == "truncate":
        bad = log.store.get(key)[:20]
    elif damage == "no-record":
        bad = json.dumps({"v": 1, "slot": d["slot"]}).encode()
    elif damage == "record-not-object":
        bad = json.dumps(dict(d, record=[1, 2])).encode()
    elif damage == "newer":
        bad = json.dumps(dict(d, v=99)).encode()
    else:
        bad = json.dumps(dict(d, record=dict(d["record"], state="Bogus"))).encode()
    log.store.put(key, bad)
    log2 = fresh(log)
    p = log2.producer(transactional_id="tx")
    with pytest.raises(CorruptObjectError, match=key.replace(".", r"\.")):
        p.init_transactions()
    # Committed data stays readable; other transactional.ids still work.
    assert read_values(log2, [TopicPartition("t", 0)]) == [b"a0"]
    other = next(f"o{i}" for i in range(1000) if state_partition_for(f"o{i}") != part)
    commit(log2, other, [("t", 0, b"a1")])
    assert read_values(fresh(log), [TopicPartition("t", 0)]) == [b"a0", b"a1"]


def test_corrupt_state_log_checkpoint_falls_back_to_the_log() -> None:
    log = new_log()
    store = log.store
    part = StateLogPartition(store, 0)
    rec = TxnRecord.from_json(valid_record(), "x")
    assert part.compare_and_set("t", None, rec)
    for body in (b"{", b'{"v": 1, "next_slot": 1, "records": [1]}',
                 b'{"v": 1, "next_slot": "x", "records": {}}', b'{"v": 99}'):
        store.put("_txn/state/000/checkpoints/000000000001.json", body)
        p2 = StateLogPartition(store, 0)
        p2.refresh()
        assert p2.get("t") == rec


@pytest.mark.parametrize("damage", ["garbage", "newer", "no-name"])
def test_corrupt_topic_metadata(damage: str) -> None:
    log = new_log()
    log.create_topic("t")
    key = layout.topic_meta("t")
    d = json.loads(log.store.get(key))
    bad = {"garbage": b"\x00\xff{", "newer": json.dumps(dict(d, v=2)).encode(),
           "no-name": json.dumps({k: v for k, v in d.items() if k != "name"}).encode()}[damage]
    log.store.put(key, bad)
    expected = UnsupportedFormatError if damage == "newer" else CorruptObjectError
    with pytest.raises(expected, match=key.replace(".", r"\.")):
        fresh(log).topic("t")


@pytest.mark.parametrize("kind", ["entry", "state_log", "record", "topic"])
def test_newer_format_versions_say_upgrade(kind: str) -> None:
    where = "some/object.json"
    with pytest.raises(UnsupportedFormatError, match="upgrade"):
        if kind == "entry":
            decode_entry(json.dumps(dict(json.loads(valid_entry()), v=FORMAT_VERSION + 1)
                                    ).encode(), where)
        elif kind == "state_log":
            StateLogPartition._decode(json.dumps({"v": STATE_LOG_VERSION + 1}).encode(), where)
        elif kind == "record":
            TxnRecord.from_json(dict(valid_record(), v=RECORD_VERSION + 1), where)
        else:
            TopicInfo.from_json(json.dumps(dict(json.loads(valid_topic_meta()), v=2)).encode(),
                                where)


# -- wrong-schema writes -------------------------------------------------------------------------


def test_wrong_schema_writes() -> None:
    log = new_log()
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())])
    log.create_topic("typed", schema=schema)
    log.create_topic("kafka")
    p = log.producer()
    with pytest.raises(SchemaMismatchError, match="'id'"):
        p.send_batch("typed", pa.table({"id": ["not a number"], "name": ["x"]}))
    with pytest.raises(SchemaMismatchError, match="missing columns"):
        p.send_batch("typed", pa.table({"name": ["x"]}))
    with pytest.raises(SchemaMismatchError, match="unknown columns"):
        p.send_batch("typed", pa.table({"id": [1], "nope": [1]}))
    with pytest.raises(SchemaMismatchError, match="not nullable"):
        p.send_batch("typed", pa.table({"id": pa.array([None], pa.int64())}))
    with pytest.raises(SchemaMismatchError, match="'value' column"):
        p.send_batch("kafka", pa.table({"id": [1]}))
    with pytest.raises(SchemaMismatchError, match="value must be bytes"):
        p.send("kafka", value=12345)
        p.flush()
    with pytest.raises(TypeError):
        p.send("typed", value=b"raw bytes")  # typed topics take dicts of columns
    with pytest.raises(SchemaMismatchError):
        log.create_topic("bad", schema="id int")  # type: ignore[arg-type]
    with pytest.raises(SchemaMismatchError, match="offset"):
        log.create_topic("bad", schema=pa.schema([("offset", pa.int64())]))
    # Nothing was written by the failed sends.
    p.send_batch("typed", pa.table({"id": [7], "name": ["ok"]}))
    p.flush()
    c = log.consumer()
    c.assign([TopicPartition("typed", 0)])
    c.seek_to_beginning()
    assert [r.value for r in c.poll()] == [{"id": 7, "name": "ok"}]


# -- malformed options and configuration -------------------------------------------------------


def test_config_unknown_and_bad_values() -> None:
    with pytest.raises(ConfigError, match=re.escape("no.such.key")):
        load_config({"no.such.key": 1}, env={})
    with pytest.raises(ConfigError, match=re.escape("transaction.timeout.ms")):
        load_config({"transaction.timeout.ms": "soon"}, env={})
    with pytest.raises(ConfigError, match=re.escape("enable.idempotence")):
        load_config({"enable.idempotence": "maybe"}, env={})
    with pytest.raises(ConfigError, match=re.escape("batch.size")):
        load_config({"batch.size": True}, env={})
    assert load_config({"transaction_timeout_ms": 5}, env={})["transaction.timeout.ms"] == 5
    unknown: dict[str, Any] = {"no.such": 1}
    with pytest.raises(ConfigError, match=re.escape("no.such")):
        txlog.connect("memory://x", **unknown)


def test_config_env_vars() -> None:
    assert load_config(env={"TXLOG_LINGER_MS": "7"})["linger.ms"] == 7
    with pytest.raises(ConfigError, match="TXLOG_NO_SUCH_THING"):
        load_config(env={"TXLOG_NO_SUCH_THING": "1"})
    with pytest.raises(ConfigError, match=re.escape("linger.ms")):
        load_config(env={"TXLOG_LINGER_MS": "later"})


def test_config_file(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('"num.partitions" = 2\n[transaction]\ntimeout.ms = 1234\n')
    # Nested tables flatten to dotted keys.
    cfg = load_config(env={"TXLOG_CONF": str(good)})
    assert cfg["transaction.timeout.ms"] == 1234 and cfg["num.partitions"] == 2
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("linger.ms = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(env={"TXLOG_CONF": str(bad_toml)})
    with pytest.raises(ConfigError, match="cannot read TXLOG_CONF"):
        load_config(env={"TXLOG_CONF": str(tmp_path / "missing.toml")})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("bogus = 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        load_config(env={"TXLOG_CONF": str(unknown)})
    wrong_type = tmp_path / "wrong.toml"
    wrong_type.write_text('"linger.ms" = [1, 2]\n')
    with pytest.raises(ConfigError, match=re.escape("linger.ms")):
        load_config(env={"TXLOG_CONF": str(wrong_type)})
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError):
        load_config(env={"TXLOG_CONF": str(binary)})


def test_client_options() -> None:
    log = new_log()
    log.create_topic("t")
    with pytest.raises(ConfigError, match="no_such_option"):
        log.producer(no_such_option=1)
    with pytest.raises(ConfigError, match=re.escape("linger.ms")):
        log.producer(linger_ms="soon")
    with pytest.raises(ConfigError, match="isolation_level"):
        log.consumer(isolation_level="read_sometimes")
    with pytest.raises(ConfigError, match="auto_offset_reset"):
        log.consumer(auto_offset_reset="middle")
    with pytest.raises(ConfigError, match="fetch_max"):
        log.consumer(fetch_max=1)
    with pytest.raises(ConfigError, match="partitions"):
        log.create_topic("u", partitions=0)
    with pytest.raises(ConfigError, match="partitions"):
        log.create_topic("u", partitions="2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="topic configuration"):
        log.create_topic("u", config={"linger.ms": 1})
    with pytest.raises(ConfigError, match=re.escape("retention.ms")):
        log.create_topic("u", config={"retention.ms": "forever"})
    c = log.consumer()
    with pytest.raises(ConfigError, match="seek offset"):
        c.seek(TopicPartition("t", 0), -1)
    p = log.producer(transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    with pytest.raises(ConfigError, match="non-negative"):
        p.send_offsets_to_transaction({TopicPartition("t", 0): -5}, "g")


# -- names with path tricks --------------------------------------------------------------------

BAD_NAMES = ["", ".", "..", "../x", "a/b", "/abs", "a\\b", "x\x00y", "a b", "a" * 250,
             "tópico", "__reserved", "a/../../etc", "~user", "a\nb"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_topic_names_with_path_tricks(name: str) -> None:
    log = new_log()
    with pytest.raises(InvalidNameError):
        log.create_topic(name)
    assert log.store.list("") == []  # nothing was written


@pytest.mark.parametrize("name", [n for n in BAD_NAMES if n != "__reserved"])
def test_ids_with_path_tricks(name: str) -> None:
    log = new_log()
    log.create_topic("t")
    with pytest.raises(InvalidNameError, match=re.escape("transactional.id")):
        log.producer(transactional_id=name)
    with pytest.raises(InvalidNameError, match=re.escape("group.id")):
        log.consumer(group_id=name)


@pytest.mark.parametrize("key", ["../x", "/x", "a/../b", ".hidden", "a//b", "a/./b", "a\\b",
                                 "", "a/.tmp-x"])
def test_object_keys_with_path_tricks(key: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidNameError):
        check_key(key)
    store = open_store(str(tmp_path / "root"))
    with pytest.raises(InvalidNameError):
        store.put_if_absent(key, b"x")
    assert not (tmp_path / "x").exists()


def test_unknown_topic_and_partition() -> None:
    log = new_log()
    log.create_topic("t", partitions=2)
    with pytest.raises(UnknownTopicError, match="'nope'"):
        log.consumer().assign([TopicPartition("nope", 0)])
    with pytest.raises(UnknownTopicError, match=re.escape("partitions 0..1")):
        log.consumer().assign([TopicPartition("t", 2)])
    with pytest.raises(UnknownTopicError):
        log.consumer().assign([TopicPartition("t", -1)])


# -- a store without atomic create ---------------------------------------------------------------


@pytest.mark.parametrize("url", ["ftp://host/root", "http://example.com/x", "hdfs://nn/x",
                                 "webdav://h/x", "zip://a.zip"])
def test_store_without_atomic_create_is_refused(url: str) -> None:
    scheme = url.split(":", 1)[0]
    with pytest.raises(AtomicCreateUnsupportedError, match=f"'{scheme}'"):
        open_store(url)
    with pytest.raises(AtomicCreateUnsupportedError, match="atomic"):
        txlog.connect(url)


# -- a bad record fails its own send(), not the batch it would have joined ---------------------


@pytest.mark.parametrize("transactional", [False, True])
def test_bad_record_fails_its_send_not_its_batch(transactional: bool) -> None:
    log = new_log()
    log.create_topic("kafka")
    log.create_topic("typed", schema=pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    p = log.producer(transactional_id="bad-rec") if transactional else log.producer()
    if transactional:
        p.init_transactions()
        p.begin_transaction()
    p.send("kafka", b"before", partition=0)
    p.send("typed", {"id": 1})
    bad: list[dict[str, Any]] = [
        {"value": 12345},
        {"value": b"v", "key": 3.5},
        {"value": b"v", "headers": [("h", 7)]},
        {"value": b"v", "timestamp_ms": "yesterday"},
        {"value": b"v", "timestamp_ms": 2**64},  # Arrow's timestamps are 64-bit
        {"value": b"v", "headers": 5},
        {"value": b"v", "headers": [("only a key",)]},
        {"value": "\ud800"},  # a str that is not UTF-8 text
        {"value": b"v", "key": "\udfff"},
    ]
    for kwargs in bad:
        with pytest.raises(SchemaMismatchError):
            p.send("kafka", partition=0, **kwargs)
    with pytest.raises(SchemaMismatchError, match="'id'"):
        p.send("typed", {"id": "not a number"})
    p.send("kafka", b"after", key="k", headers={"h": "x"}, timestamp_ms=1_700_000_000_000,
           partition=0)
    p.send("typed", {"id": 2})
    if transactional:
        p.commit_transaction()
    else:
        p.flush()
    p.close()
    c = log.consumer()
    c.assign([TopicPartition("kafka", 0), TopicPartition("typed", 0)])
    c.seek_to_beginning()
    got = c.poll()
    kafka = [r for r in got if r.topic == "kafka"]
    assert [r.value for r in kafka] == [b"before", b"after"]
    assert kafka[1].key == b"k" and kafka[1].headers == [("h", b"x")]
    assert kafka[1].timestamp == 1_700_000_000_000
    assert [r.value for r in got if r.topic == "typed"] == [{"id": 1}, {"id": 2}]


def test_a_batch_that_cannot_be_sealed_fails_and_is_not_lost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """send() checks every record, so turning a batch into Arrow should not fail; if it
    does all the same, that batch fails (its futures, an open transaction), and no other
    batch is dropped unresolved."""
    from txlog import records
    from txlog.producer import accumulator as producer_mod

    real = records.checked_kafka_batch

    def seal(rows: Any) -> Any:
        if any(r[1] == b"poison" for r in rows):
            raise MemoryError("injected: cannot build the batch")
        return real(rows)

    monkeypatch.setattr(producer_mod, "checked_kafka_batch", seal)
    log = new_log()
    log.create_topic("t", partitions=2)
    plain = log.producer(linger_ms=3_600_000)
    good = plain.send("t", b"good", partition=1)
    bad = plain.send("t", b"poison", partition=0)
    with pytest.raises(MemoryError):
        plain.flush()
    assert good.get(60).offset == 0
    with pytest.raises(MemoryError):
        bad.get(60)
    plain.close()

    txn = log.producer(transactional_id="seal-fails", linger_ms=3_600_000)
    txn.init_transactions()
    txn.begin_transaction()
    txn.send("t", b"kept?", partition=1)
    txn.send("t", b"poison", partition=0)
    with pytest.raises(MemoryError):
        txn.commit_transaction()
    with pytest.raises(InvalidTxnStateError):
        txn.commit_transaction()  # the transaction lost a batch: it can only abort
    txn.abort_transaction()
    txn.begin_transaction()
    txn.send("t", b"after", partition=1)
    txn.commit_transaction()
    txn.close()
    c = log.consumer()
    c.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
    c.seek_to_beginning()
    assert sorted(r.value for r in c.poll()) == [b"after", b"good"]
