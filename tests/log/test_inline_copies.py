"""Small batch objects carried inline in the log entries that append them (entry format
version 4): a reader following the log gets a fresh commit's records from its COMMIT
marker, without fetching the object; the copy is checked like the object, a damaged one
is ignored, malformed ones are refused, and the producer writes the older formats when
told to."""

from __future__ import annotations

import base64
import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog import TopicPartition, inline_copies
from txlog.errors import CorruptObjectError
from txlog.model import COMMIT, DATA, INLINE_MAX_BYTES, PARTS, Entry, decode_entry
from txlog.testing.timeline import TimelineStore

TP = TopicPartition("t", 0)
SEED = 4242


@pytest.fixture(autouse=True)
def _no_kept_copies() -> None:
    inline_copies.clear()


@pytest.fixture
def writer(tmp_path: Path) -> txlog.Log:
    lg = txlog.connect(str(tmp_path))
    lg.create_topic("t", partitions=1)
    return lg


def _follower(writer: txlog.Log) -> tuple[Any, TimelineStore]:
    """A consumer of another Log, loaded and polling the tail (as one that keeps up)."""
    reader = txlog.connect(writer.url)
    timeline = TimelineStore(reader.store)
    reader.store = timeline
    c = reader.consumer(auto_offset_reset="earliest")
    c.assign([TP])
    assert c.poll(timeout_ms=0) == []
    return c, timeline


def _commit(writer: txlog.Log, values: list[bytes], **config: object) -> None:
    p = writer.producer(transactional_id="tx", **config)
    p.init_transactions()
    p.begin_transaction()
    for v in values:
        p.send("t", v, partition=0)
    p.commit_transaction()
    p.close()  # the markers are written


def _entries(writer: txlog.Log) -> list[dict[str, Any]]:
    return [json.loads(writer.store.get(k)) for k in writer.store.list("topics/t/0/log/")]


def _object_gets(timeline: TimelineStore, since: float) -> list[str]:
    return [r.key for r in timeline.requests(since) if r.kind == "get" and "/data/" in r.key]


def test_a_follower_reads_a_fresh_commit_from_its_marker_without_fetching_the_object(
        writer: txlog.Log) -> None:
    c, timeline = _follower(writer)
    _commit(writer, [b"a", b"b"])
    marker = _entries(writer)[-1]
    assert marker["kind"] == COMMIT and marker["v"] == 4
    assert isinstance(marker["inline"], dict) and list(marker["inline"]) == [marker["data"]]
    start = timeline.requests()[-1].end
    assert [r.value for r in c.poll(timeout_ms=0)] == [b"a", b"b"]
    assert _object_gets(timeline, start) == []
    assert inline_copies.kept_bytes() == 0  # taken by the read


def test_a_data_entry_carries_its_copy_too(writer: txlog.Log) -> None:
    c, timeline = _follower(writer)
    p = writer.producer()  # idempotent, no transaction: DATA entries
    p.send("t", b"plain", partition=0)
    p.flush()
    p.close()
    (entry,) = _entries(writer)
    assert entry["kind"] == DATA and entry["v"] == 4 and list(entry["inline"]) == [entry["data"]]
    start = timeline.requests()[-1].end
    assert [r.value for r in c.poll(timeout_ms=0)] == [b"plain"]
    assert _object_gets(timeline, start) == []


def test_a_batch_over_the_bound_is_fetched_not_carried(writer: txlog.Log) -> None:
    c, timeline = _follower(writer)
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    big = rng.randbytes(4096)  # incompressible: the object is over 1024 bytes
    _commit(writer, [big], **{"inline.batch.bytes": 1024})
    marker = _entries(writer)[-1]
    assert marker["kind"] == COMMIT and marker["v"] == 3 and "inline" not in marker
    start = timeline.requests()[-1].end
    assert [r.value for r in c.poll(timeout_ms=0)] == [big]
    assert len(_object_gets(timeline, start)) == 1


@pytest.mark.parametrize("config", [{"inline.batch.bytes": 0},
                                    {"commit.appends.batches": False}])
def test_holding_back_the_format_writes_no_copies(writer: txlog.Log,
                                                  config: dict[str, object]) -> None:
    _commit(writer, [b"x"], **config)
    assert all(e["v"] < 4 and "inline" not in e for e in _entries(writer))


def test_a_damaged_copy_is_ignored_and_the_object_read(
        writer: txlog.Log, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    c, timeline = _follower(writer)
    _commit(writer, [b"intact"])
    key = writer.store.list("topics/t/0/log/")[-1]
    marker = json.loads(writer.store.get(key))
    (obj, text), = marker["inline"].items()
    raw = bytearray(base64.b64decode(text))
    raw[len(raw) // 2] ^= 0xFF  # the same length: only the checksum can tell
    marker["inline"][obj] = base64.b64encode(bytes(raw)).decode()
    path = tmp_path / key
    os.chmod(path, 0o644)
    path.write_text(json.dumps(marker))
    start = timeline.requests()[-1].end
    with caplog.at_level(logging.WARNING, logger="txlog.inline_copies"):
        assert [r.value for r in c.poll(timeout_ms=0)] == [b"intact"]
    assert _object_gets(timeline, start) == [obj]
    assert "fails its checksum" in caplog.text


def _entry_with_copy(data: bytes, key: str = "topics/t/0/data/k.crc32-00000000.parquet",
                     kind: str = DATA) -> dict[str, object]:
    import zlib

    key = key.replace("00000000", f"{zlib.crc32(data):08x}")
    e = Entry(slot=0, kind=kind, base_offset=0, count=1 if kind == DATA else 2,
              producer_id=7, epoch=1, transactional=kind == COMMIT, data=key,
              nbytes=len(data), inline={key: base64.b64encode(data).decode()})
    if kind == COMMIT:
        e.extra = {PARTS: [[key, 1, len(data), 0, 0]]}
    d: dict[str, object] = json.loads(e.encode())
    return d


@pytest.mark.parametrize("kind", [DATA, COMMIT])
def test_entries_with_copies_decode(kind: str) -> None:
    d = _entry_with_copy(b"parquet bytes", kind=kind)
    assert d["v"] == 4
    e = decode_entry(json.dumps(d).encode(), "x")
    assert e.inline == d["inline"]


@pytest.mark.parametrize("damage", [
    "older version", "not an object", "not text", "empty", "object not appended",
    "key without checksum", "wrong length", "over the limit", "on a begin entry",
])
def test_malformed_copies_are_refused(damage: str) -> None:
    data = b"p" * 30
    d = _entry_with_copy(data)
    key = str(d["data"])
    copies = d["inline"]
    assert isinstance(copies, dict)
    if damage == "older version":
        d["v"] = 3
    elif damage == "not an object":
        d["inline"] = [copies[key]]
    elif damage == "not text":
        copies[key] = 12
    elif damage == "empty":
        d["inline"] = {}
    elif damage == "object not appended":
        copies["topics/t/0/data/other.crc32-00000000.parquet"] = copies.pop(key)
    elif damage == "key without checksum":
        d["data"] = "topics/t/0/data/plain.parquet"
        d["inline"] = {"topics/t/0/data/plain.parquet": copies[key]}
    elif damage == "wrong length":
        copies[key] = str(copies[key]) + "AAAA"
    elif damage == "over the limit":
        size = INLINE_MAX_BYTES + 3
        d["nbytes"] = size
        copies[key] = "A" * (4 * ((size + 2) // 3))
    elif damage == "on a begin entry":
        d.update(kind="begin", count=0, transactional=True, data=None)
    with pytest.raises(CorruptObjectError):
        decode_entry(json.dumps(d).encode(), "x")


def test_kept_copies_are_bounded_newest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    import zlib

    monkeypatch.setattr(inline_copies, "MAX_KEPT_BYTES", 100)
    blobs = {f"topics/t/0/data/{i}.crc32-{zlib.crc32(b):08x}.parquet": b
             for i, b in enumerate([b"a" * 30, b"b" * 30, b"c" * 30])}
    for k, b in blobs.items():  # 40 bytes of base64 each: the first is dropped
        inline_copies.keep("root", {k: base64.b64encode(b).decode()})
    assert inline_copies.kept_bytes() == 80
    first, second, third = blobs
    assert inline_copies.take("root", first) is None
    assert inline_copies.take("other root", second) is None
    assert inline_copies.take("root", second) == blobs[second]
    assert inline_copies.take("root", second) is None  # taken once
    assert inline_copies.take("root", third) == blobs[third]
    assert inline_copies.kept_bytes() == 0
