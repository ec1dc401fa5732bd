"""Size limits with Kafka's names and defaults: a record larger than max.request.size (or
message.max.bytes, or buffer.memory) fails its send() with RecordTooLargeError; a batch
object whose footer declares a decompression bomb is refused before it is decoded; a poll
returns at most max.partition.fetch.bytes per partition and fetch.max.bytes in all (one
batch at least).  A checkpoint (Arrow IPC) declaring a bomb is refused the same way."""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import txlog
from txlog import checksums
from txlog.batch_codec import decode_parquet
from txlog.checkpoint import decode_checkpoint
from txlog.declared_size import ipc_declared_size, parquet_declared_size
from txlog.errors import ConfigError, CorruptObjectError, RecordTooLargeError
from txlog.model import decode_entry
from txlog.records import TopicPartition, kafka_table, largest_record
from txlog.testing.bombs import dictionary_bomb

TP = TopicPartition("t", 0)


def new_log(**config: Any) -> txlog.Log:
    log = txlog.connect(f"memory://limits/{uuid.uuid4().hex}", **config)
    log.create_topic("t")
    return log


def values(log: txlog.Log) -> list[bytes]:
    c = log.consumer()
    c.assign([TP])
    c.seek_to_beginning()
    out = []
    while batch := c.poll(max_records=10_000):
        out += [r.value for r in batch]
    return out


def test_defaults_are_kafkas() -> None:
    cfg = txlog.connect("memory://limits/defaults").config
    assert cfg["max.request.size"] == 1_048_576
    assert cfg["message.max.bytes"] == 1_048_588
    assert cfg["fetch.max.bytes"] == 52_428_800
    assert cfg["max.partition.fetch.bytes"] == 1_048_576


@pytest.mark.parametrize("transactional", [False, True])
def test_a_record_over_max_request_size_fails_its_send_only(transactional: bool) -> None:
    log = new_log()
    p = log.producer(transactional_id="tx" if transactional else None)
    if transactional:
        p.init_transactions()
        p.begin_transaction()
    p.send("t", b"before")
    with pytest.raises(RecordTooLargeError, match=r"max\.request\.size"):
        p.send("t", b"x" * (1_048_576 + 1))
    # Headers count: a value under the limit with large headers is too large too.
    with pytest.raises(RecordTooLargeError):
        p.send("t", b"v" * 1_000_000, headers={"h": b"y" * 100_000})
    p.send("t", b"x" * 1_048_576)  # exactly the limit: accepted
    p.send("t", b"after")
    if transactional:
        p.commit_transaction()
    p.flush()
    p.close()
    assert values(log) == [b"before", b"x" * 1_048_576, b"after"]


def test_message_max_bytes_and_buffer_memory_bound_a_record_too() -> None:
    log = new_log(**{"message.max.bytes": 1000})
    p = log.producer(max_request_size=10_000_000)
    with pytest.raises(RecordTooLargeError, match=r"message\.max\.bytes"):
        p.send("t", b"x" * 1001)
    p.close()
    log = new_log(**{"message.max.bytes": 100_000_000})
    p = log.producer(max_request_size=100_000_000, buffer_memory=4_000_000, batch_size=1000)
    with pytest.raises(RecordTooLargeError, match=r"buffer\.memory"):
        p.send("t", b"x" * 4_000_001)
    p.close()


def test_send_batch_checks_each_record() -> None:
    log = new_log(**{"max.request.size": 1000})
    p = log.producer()
    small = kafka_table([(None, b"a" * 100, None, None)] * 50)  # 5,000 bytes in all
    p.send_batch("t", small)
    big = kafka_table([(None, b"a", None, None), (b"k", b"b" * 999, None, None)])
    with pytest.raises(RecordTooLargeError, match="1008 bytes"):  # key, value, time
        p.send_batch("t", big)
    p.flush()
    p.close()
    assert len(values(log)) == 50


def test_largest_record_counts_nested_values() -> None:
    table = kafka_table([(b"k", b"v" * 100, {"h": b"x" * 50}, None),
                         (None, b"a", None, 5)])
    assert largest_record(table) == 1 + 100 + 1 + 50 + 8
    assert largest_record(table.slice(1)) == 1 + 8
    assert largest_record(pa.table({"l": pa.array([[1, 2], [3], [4, 5, 6]]).slice(1)})) == 24


def _bomb(rows: int, codec: str = "zstd") -> bytes:
    # One value of zeros repeated: Parquet declares the decoded size in its footer.
    table = pa.table({"value": pa.array([b"\0" * 10_000] * rows, pa.binary())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=codec, use_dictionary=False)
    return bytes(sink.getvalue().to_pybytes())


def test_a_decompression_bomb_is_refused_before_decoding() -> None:
    raw = _bomb(2_000)  # 20 MB of zeros
    assert len(raw) < 20_000_000 // 1000
    with pytest.raises(RecordTooLargeError, match=r"declares \d+ bytes decoded .*fetch\.max"):
        decode_parquet(raw, "data/bomb.parquet", fetch_max_bytes=1_000_000)
    # Under fetch.max.bytes it decodes; and txlog's own objects are far below the ratio.
    assert decode_parquet(raw, "data/bomb.parquet").num_rows == 2_000


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "in-a-list"])
def test_a_dictionary_expansion_bomb_is_refused_with_bounded_memory(nested: bool) -> None:
    """Its pages declare what they decompress into, which passes the declared-size check;
    expanding the dictionary is what would allocate (here 400 MB): refused, with the
    memory used staying near the limit, not the expansion."""
    raw = dictionary_bomb(4_000, 100_000, nested=nested)
    assert len(raw) < 20_000 and parquet_declared_size(
        raw, pq.ParquetFile(pa.BufferReader(raw)).metadata) < 1_000_000
    pool = pa.default_memory_pool()
    before = pool.max_memory() or 0
    with pytest.raises(RecordTooLargeError, match=r"data/dict\.parquet .*fetch\.max\.bytes"):
        decode_parquet(raw, "data/dict.parquet", fetch_max_bytes=10_000_000)
    # (the pool's high-water mark: the whole expansion would have raised it by 400 MB)
    assert (pool.max_memory() or 0) - before < 100_000_000
    # Within the limit the same shape decodes, to its plain values.
    small = decode_parquet(dictionary_bomb(50, 100_000, nested=nested), "data/ok.parquet",
                           fetch_max_bytes=10_000_000)
    assert small.num_rows == (1 if nested else 50)


def test_a_consumer_refuses_a_bomb_in_the_log() -> None:
    log = new_log(**{"fetch.max.bytes": 1_000_000})
    p = log.producer()
    p.send("t", b"v")
    p.flush()
    p.close()
    store = log.store
    entry_key = store.list("topics/t/0/log/")[-1]
    data = decode_entry(store.get(entry_key), entry_key).data
    assert data
    # A writer of the root replaces the batch object with a bomb of the same shape.
    table = kafka_table([(None, b"\0" * 10_000, None, None)] * 2_000)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", use_dictionary=False)
    bomb = bytes(sink.getvalue().to_pybytes())
    # ...under a name that carries the bomb's own checksum, and an entry naming it: the
    # size check, not the checksum, is what stops it.
    bomb_key = re.sub(r"\.crc32-[0-9a-f]{8}\.parquet$", checksums.tag(bomb) + ".parquet", data)
    assert bomb_key != data
    store.put(bomb_key, bomb)
    entry = decode_entry(store.get(entry_key), entry_key)
    store.put(entry_key, dataclasses.replace(entry, data=bomb_key, inline=None).encode())
    data = bomb_key
    conf: dict[str, Any] = {"fetch.max.bytes": 1_000_000}
    c = txlog.connect(log.url, **conf).consumer()
    c.assign([TP])
    c.seek_to_beginning()
    with pytest.raises(RecordTooLargeError, match=data):
        c.poll()


def test_poll_returns_at_most_the_fetch_byte_limits() -> None:
    log = new_log()
    p = log.producer()
    for i in range(6):
        p.send("t", bytes([i]) * 1000)
        p.flush()  # one batch object each
    p.close()
    # Kafka counts batches as stored: room for two of them (and not three) per poll.
    stored = log.partition_log(TP).refresh().batches.nbytes
    assert len(stored) == 6 and 2 * max(stored) < 3 * min(stored)
    c = log.consumer(max_partition_fetch_bytes=2 * max(stored))
    c.assign([TP])
    c.seek_to_beginning()
    sizes = []
    while batch := c.poll():
        sizes.append(len(batch))
    assert sizes == [2, 2, 2]
    c = log.consumer(fetch_max_bytes=1)  # below one batch: still one per poll
    c.assign([TP])
    c.seek_to_beginning()
    got = []
    while batch := c.poll():
        assert len(batch) == 1
        got += [r.value[0] for r in batch]
    assert got == list(range(6))
    with pytest.raises(ConfigError, match=r"fetch\.max\.bytes"):
        log.consumer(fetch_max_bytes=-1)


def _ipc(table: pa.Table, compression: str | None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema,
                           options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_ipc_declared_size_reads_what_a_stream_decodes_into(compression: str | None) -> None:
    table = pa.table({"a": pa.array(range(10_000), pa.int64()),
                      "s": pa.array(["x" * 10] * 10_000),
                      "d": pa.array(["p", "q"] * 5_000).dictionary_encode()})
    declared = ipc_declared_size(_ipc(table, compression))
    assert table.nbytes <= declared <= table.nbytes + 1024


def test_a_checkpoint_bomb_is_refused_before_decoding() -> None:
    zeros = pa.table({"a": pa.repeat(pa.scalar(0, pa.int64()), 7_000_000)})  # 56 MB
    raw = _ipc(zeros, "zstd")
    del zeros
    assert len(raw) < 100_000
    with pytest.raises(CorruptObjectError, match=r"checkpoint c\.arrow declares 56000000 "
                                                 r"bytes decoded"):
        decode_checkpoint(raw, "c.arrow")
    # A forged length prefix (a few bytes that claim a terabyte) is refused the same way.
    small = bytearray(_ipc(pa.table({"a": pa.array(range(1000), pa.int64())}), "zstd"))
    prefix = (8000).to_bytes(8, "little")
    at = small.index(prefix)
    small[at:at + 8] = (1 << 40).to_bytes(8, "little")
    with pytest.raises(CorruptObjectError, match="declares"):
        decode_checkpoint(bytes(small), "c.arrow")


class _LyingFooter:
    """A file's footer as a hand-made file could write it: row groups declaring 0 bytes."""

    def __init__(self, meta: Any) -> None:
        self._meta = meta
        self.num_row_groups = meta.num_row_groups

    def row_group(self, i: int) -> Any:
        rg = self._meta.row_group(i)

        class RowGroup:
            total_byte_size = 0
            num_columns = rg.num_columns
            column = rg.column

        return RowGroup()


def test_page_headers_count_when_the_footer_lies() -> None:
    raw = _bomb(2_000)
    meta = pq.ParquetFile(pa.BufferReader(raw)).metadata
    assert parquet_declared_size(raw, meta) >= 20_000_000
    assert parquet_declared_size(raw, _LyingFooter(meta)) >= 20_000_000


@pytest.mark.parametrize("options", [
    {"compression": "snappy"}, {"compression": "zstd", "write_statistics": True},
    {"compression": "gzip", "data_page_version": "2.0", "row_group_size": 700},
    {"compression": "none", "use_dictionary": True, "data_page_size": 2048},
    {"compression": "lz4", "write_page_index": True, "write_statistics": True},
])
def test_declared_sizes_of_files_from_other_writer_settings(options: dict[str, Any]) -> None:
    n = 3_000
    table = pa.table({
        "key": pa.array([f"k{i % 17}".encode() for i in range(n)]),
        "value": pa.array([bytes([i % 251]) * (i % 300) for i in range(n)]),
        "headers": pa.array([[{"key": "h", "value": b"x" * (i % 5)}] if i % 3 else None
                             for i in range(n)],
                            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        "n": pa.array(range(n), pa.int64()),
        "m": pa.array([{"a": i, "b": None} for i in range(n)]),
    })
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **options)
    raw = bytes(sink.getvalue().to_pybytes())
    meta = pq.ParquetFile(pa.BufferReader(raw)).metadata
    footer = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    pages = parquet_declared_size(raw, _LyingFooter(meta))
    assert 0 < pages <= footer == parquet_declared_size(raw, meta)
    assert decode_parquet(raw, "x").num_rows == n
