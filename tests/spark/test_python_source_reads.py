"""What a task of the Python data source holds while it reads: objects fetched ahead
within a byte budget, and each object decoded a row group (or a piece of one) at a time,
only the row groups its slices need, once for the consecutive runs of a segment.

These drive ``spark_ext.reader.read_slices`` (what a Spark task runs) over a store that
counts the stored bytes alive at once, with fetches made as they are submitted so that
what a test sees does not depend on thread timing; no Spark session is needed.
"""

from __future__ import annotations

import json
import random
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, cast

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_ext import object_fetch, reader
from spark_ext.object_fetch import ObjectRead, admits, object_reads
from spark_ext.read_plan import FileSlice, OutputShape, kafka_spark_schema
from txlog import batch_codec, checksums
from txlog.batch_codec import decode_parquet, encode_parquet
from txlog.batch_rows import BatchRows
from txlog.errors import CorruptObjectError, OffsetOutOfRangeError, RecordTooLargeError
from txlog.records import KAFKA_SCHEMA
from txlog.testing.bombs import dictionary_bomb

SHAPE = OutputShape(True, True, KAFKA_SCHEMA, json.dumps(kafka_spark_schema(True).jsonValue()))


class Stored(bytearray):
    """An object's bytes as the store hands them out (a bytes-like object that, unlike
    bytes, can be weakly referenced)."""


class CountingStore:
    """A remote-looking store that records the stored bytes alive at once."""

    local_requests = False

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.gets: Counter[str] = Counter()
        self.live = self.peak = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes:
        if key not in self.objects:
            raise KeyError(key)
        raw = Stored(self.objects[key])
        with self._lock:
            self.gets[key] += 1
            self.live += len(raw)
            self.peak = max(self.peak, self.live)
        weakref.finalize(raw, self._release, len(raw))
        return raw  # type: ignore[return-value]  # (bytes-like, as readers use it)

    def _release(self, n: int) -> None:
        with self._lock:
            self.live -= n


class SubmitRuns:
    """An executor that runs each task as it is submitted: what was submitted was fetched."""

    def __init__(self, max_workers: int | None = None, **_: Any) -> None:
        pass

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # handed over at result(), as a pool does
            fut.set_exception(exc)
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass

    def __enter__(self) -> SubmitRuns:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class Decodes:
    """Counts what pyarrow decodes from Parquet: rows, and the largest single result."""

    def __init__(self) -> None:
        self.rows = 0
        self.largest = 0

    def note(self, result: Any) -> Any:
        self.rows += result.num_rows
        self.largest = max(self.largest, result.nbytes)
        return result


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Decodes:
    counts = Decodes()
    base = pq.ParquetFile

    class Counting(base):  # type: ignore[misc,valid-type]
        def read(self, *a: Any, **k: Any) -> Any:
            return counts.note(super().read(*a, **k))

        def read_row_group(self, *a: Any, **k: Any) -> Any:
            return counts.note(super().read_row_group(*a, **k))

        def read_row_groups(self, *a: Any, **k: Any) -> Any:
            return counts.note(super().read_row_groups(*a, **k))

        def iter_batches(self, *a: Any, **k: Any) -> Iterator[Any]:
            for b in super().iter_batches(*a, **k):
                yield counts.note(b)

    monkeypatch.setattr(pq, "ParquetFile", Counting)
    return counts


@pytest.fixture
def submitted_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(object_fetch, "ThreadPoolExecutor", SubmitRuns)


def make_object(rng: random.Random, n: int, *, value_bytes: int, group_bytes: int,
                monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes, pa.Table]:
    """A Kafka-shaped batch object of ``n`` records, row groups of about ``group_bytes``,
    under a key that names its checksum."""
    table = pa.table({
        "key": pa.array([f"k{i}".encode() if i % 3 else None for i in range(n)], pa.binary()),
        "value": pa.array([rng.randbytes(value_bytes) for _ in range(n)], pa.binary()),
        "headers": pa.array([[{"key": "h", "value": b"x"}] if i % 2 else None
                             for i in range(n)], KAFKA_SCHEMA.field("headers").type),
        "timestamp": pa.array([1_000 + i if i % 5 else None for i in range(n)],
                              pa.timestamp("ms", tz="UTC")),
    }, schema=KAFKA_SCHEMA)
    with monkeypatch.context() as m:
        m.setattr(batch_codec, "ROW_GROUP_BYTES", group_bytes)
        raw = encode_parquet(table)
    key = f"topics/t/0/data/{rng.getrandbits(64):016x}{checksums.tag(raw)}.parquet"
    return key, raw, table


def row_groups(raw: bytes) -> list[int]:
    meta = pq.ParquetFile(pa.BufferReader(raw)).metadata
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def file_slice(key: str, raw: bytes, base: int, skip: int, take: int) -> tuple[Any, ...]:
    return tuple(FileSlice(key, "t", 0, base, skip, take, 500, take, False, len(raw)))


def read(store: CountingStore, slices: list[tuple[Any, ...]], *,
         fail_on_data_loss: bool = True) -> list[pa.RecordBatch]:
    return list(reader.read_slices(cast(Any, store), slices, SHAPE,
                                   reader.arrow_target(SHAPE.schema_json), fail_on_data_loss))


def records(batches: list[pa.RecordBatch]) -> list[tuple[Any, ...]]:
    t = pa.Table.from_batches(batches) if batches else None
    if t is None:
        return []
    return list(zip(t.column("offset").to_pylist(), t.column("key").to_pylist(),
                    t.column("value").to_pylist(), t.column("timestampType").to_pylist(),
                    strict=True))


def expected(table: pa.Table, base: int, skip: int, take: int) -> list[tuple[Any, ...]]:
    part = table.slice(skip, take)
    ts = part.column("timestamp").to_pylist()
    return list(zip(range(base + skip, base + skip + take), part.column("key").to_pylist(),
                    part.column("value").to_pylist(), [int(t is None) for t in ts],
                    strict=True))


def test_prefetch_holds_at_most_its_byte_budget_ahead(
        monkeypatch: pytest.MonkeyPatch, submitted_runs: None) -> None:
    """Twelve objects of ~400 KB with a budget of 1 MiB: the stored bytes alive at once
    are the object being decoded plus at most the budget (eight objects ahead were
    fetched regardless of their size)."""
    seed = 4410
    print(f"seed={seed}")
    rng = random.Random(seed)
    budget = 1 << 20
    monkeypatch.setattr(reader, "PREFETCH_BYTES", budget)
    objects, slices, want = {}, [], []
    for i in range(12):
        key, raw, table = make_object(rng, 400, value_bytes=1000, group_bytes=1 << 20,
                                      monkeypatch=monkeypatch)
        objects[key] = raw
        slices.append(file_slice(key, raw, i * 400, 0, 400))
        want += expected(table, i * 400, 0, 400)
    store = CountingStore(objects)
    assert records(read(store, slices)) == want
    largest = max(len(r) for r in objects.values())
    print(f"peak {store.peak} bytes alive, objects of {largest}, budget {budget}")
    assert store.peak <= largest + budget
    assert store.gets == dict.fromkeys(objects, 1)
    assert store.live == 0


def test_an_object_larger_than_the_budget_is_fetched_alone() -> None:
    """The admission rule, as the JVM scan's: the first object ahead whatever its size,
    more only while they fit the budget; an unknown size counts as the whole budget."""
    assert admits(0, 0, 10 << 20, max_objects=8, max_bytes=1 << 20)
    assert not admits(1, 10 << 20, 1, max_objects=8, max_bytes=1 << 20)
    assert admits(1, 300, 700, max_objects=8, max_bytes=1000)
    assert not admits(1, 300, 701, max_objects=8, max_bytes=1000)
    assert not admits(8, 8, 1, max_objects=8, max_bytes=1000)
    assert not admits(1, 1, 0, max_objects=8, max_bytes=1000)
    assert admits(0, 0, 0, max_objects=8, max_bytes=1000)


def test_objects_larger_than_the_budget_are_read_one_ahead(
        monkeypatch: pytest.MonkeyPatch, submitted_runs: None) -> None:
    seed = 4411
    print(f"seed={seed}")
    rng = random.Random(seed)
    monkeypatch.setattr(reader, "PREFETCH_BYTES", 100_000)
    objects, slices, want = {}, [], []
    for i in range(5):
        key, raw, table = make_object(rng, 300, value_bytes=1000, group_bytes=1 << 20,
                                      monkeypatch=monkeypatch)
        objects[key] = raw
        slices.append(file_slice(key, raw, i * 300, 0, 300))
        want += expected(table, i * 300, 0, 300)
    store = CountingStore(objects)
    assert records(read(store, slices)) == want
    largest = max(len(r) for r in objects.values())
    assert largest > 100_000
    assert store.peak <= 2 * largest


def test_decoded_pieces_and_output_batches_stay_under_their_budgets(
        monkeypatch: pytest.MonkeyPatch, decodes: Decodes) -> None:
    """An object of ~800 KB in row groups of ~64 KiB, pieces of 32 KiB and output
    batches of 128 KiB: no decode returns more than about a piece, and no batch handed
    to Spark passes its budget (the whole object was decoded at once)."""
    seed = 4412
    print(f"seed={seed}")
    rng = random.Random(seed)
    monkeypatch.setattr(reader, "PIECE_BYTES", 32 << 10)
    monkeypatch.setattr(reader, "TARGET_BATCH_BYTES", 128 << 10)
    key, raw, table = make_object(rng, 4000, value_bytes=200, group_bytes=64 << 10,
                                  monkeypatch=monkeypatch)
    assert len(row_groups(raw)) >= 10
    store = CountingStore({key: raw})
    decodes.rows = decodes.largest = 0
    got = read(store, [file_slice(key, raw, 0, 0, 4000)])
    assert records(got) == expected(table, 0, 0, 4000)
    print(f"largest decode {decodes.largest} bytes, largest batch "
          f"{max(b.nbytes for b in got)}")
    assert decodes.rows == 4000
    assert decodes.largest <= 2 * (32 << 10)
    assert max(b.nbytes for b in got) <= 128 << 10


def test_a_slice_decodes_only_its_row_groups(
        monkeypatch: pytest.MonkeyPatch, decodes: Decodes) -> None:
    seed = 4413
    print(f"seed={seed}")
    rng = random.Random(seed)
    key, raw, table = make_object(rng, 2000, value_bytes=200, group_bytes=32 << 10,
                                  monkeypatch=monkeypatch)
    groups = row_groups(raw)
    assert len(groups) >= 8
    starts = [sum(groups[:i]) for i in range(len(groups) + 1)]
    # From inside the fourth row group to inside the fifth.
    skip = starts[3] + groups[3] // 2
    take = groups[3] // 2 + groups[4] // 2
    store = CountingStore({key: raw})
    decodes.rows = 0
    got = read(store, [file_slice(key, raw, 100, skip, take)])
    assert records(got) == expected(table, 100, skip, take)
    assert decodes.rows == groups[3] + groups[4]


def test_the_runs_of_a_segment_share_one_fetch_and_one_pass(
        monkeypatch: pytest.MonkeyPatch, decodes: Decodes) -> None:
    """Consecutive slices of one object (a compacted segment's runs, here with a gap of
    dropped rows and a run that starts in the row group the last one ended in) fetch it
    once and decode each row group they touch once."""
    seed = 4414
    print(f"seed={seed}")
    rng = random.Random(seed)
    key, raw, table = make_object(rng, 2000, value_bytes=200, group_bytes=32 << 10,
                                  monkeypatch=monkeypatch)
    groups = row_groups(raw)
    starts = [sum(groups[:i]) for i in range(len(groups) + 1)]
    assert len(groups) >= 8
    runs = [(0, starts[1] + 5), (starts[1] + 5, 10), (starts[5], starts[7] - starts[5] - 3)]
    store = CountingStore({key: raw})
    decodes.rows = 0
    slices = [file_slice(key, raw, 0, skip, take) for skip, take in runs]
    got = read(store, slices)
    assert records(got) == [r for skip, take in runs for r in expected(table, 0, skip, take)]
    assert store.gets == {key: 1}
    assert decodes.rows == starts[2] + groups[5] + groups[6]


def test_random_slices_read_as_the_whole_object_decodes(
        monkeypatch: pytest.MonkeyPatch, submitted_runs: None) -> None:
    """Random objects, row group sizes, pieces and runs (increasing within an object,
    as plans make them): the rows are the whole decoded object's, sliced."""
    seed = 4415
    print(f"seed={seed}")
    rng = random.Random(seed)
    for _ in range(20):
        monkeypatch.setattr(reader, "PIECE_BYTES", rng.choice([2_000, 20_000, 1 << 23]))
        monkeypatch.setattr(reader, "PREFETCH_BYTES", rng.choice([1, 50_000, 1 << 25]))
        objects, slices, want = {}, [], []
        base = 0
        for _ in range(rng.randint(1, 4)):
            n = rng.randint(1, 600)
            key, raw, _ = make_object(rng, n, value_bytes=rng.randint(1, 300),
                                      group_bytes=rng.choice([512, 8_000, 1 << 20]),
                                      monkeypatch=monkeypatch)
            objects[key] = raw
            whole = decode_parquet(raw, key)
            at = rng.randint(0, n - 1)
            while at < n:
                take = rng.randint(1, n - at)
                slices.append(file_slice(key, raw, base, at, take))
                want += expected(whole, base, at, take)
                at += take + rng.choice([0, 0, rng.randint(0, 40)])
            base += n + 10
        assert records(read(CountingStore(objects), slices)) == want


def test_damaged_and_missing_objects_keep_their_errors(
        monkeypatch: pytest.MonkeyPatch, submitted_runs: None) -> None:
    seed = 4416
    print(f"seed={seed}")
    rng = random.Random(seed)
    key, raw, table = make_object(rng, 50, value_bytes=20, group_bytes=1 << 20,
                                  monkeypatch=monkeypatch)
    good = [file_slice(key, raw, 0, 0, 50)]
    # One byte changed: the checksum its key names fails.
    i = raw.index(table.column("value")[7].as_py())
    bad = raw[:i] + bytes([raw[i] ^ 1]) + raw[i + 1:]
    with pytest.raises(CorruptObjectError, match=r"fails its checksum"):
        read(CountingStore({key: bad}), good)
    # Truncated under a key without a checksum: not Parquet.
    plain = key.replace(checksums.tag(raw), "")
    with pytest.raises(CorruptObjectError, match=r"cannot be read as Parquet"):
        read(CountingStore({plain: raw[:-30]}), [file_slice(plain, raw, 0, 0, 50)])
    # The log names more rows than the object holds.
    with pytest.raises(CorruptObjectError, match=r"holds 50 rows but the log says offsets "
                                                 r"45\.\.54 are in it"):
        read(CountingStore({key: raw}), [file_slice(key, raw, 0, 45, 10)])
    # Gone after planning: named with its offsets, or skipped with failOnDataLoss=false.
    key2, raw2, _ = make_object(rng, 30, value_bytes=20, group_bytes=1 << 20,
                                     monkeypatch=monkeypatch)
    slices = [*good, file_slice(key2, raw2, 50, 0, 30), file_slice(key2, raw2, 50, 40, 5)]
    store = CountingStore({key: raw})
    with pytest.raises(OffsetOutOfRangeError, match=rf"{key2} of t-0 \(offsets 50\.\.79\) is "
                                                    r"gone.*failOnDataLoss=false"):
        read(store, slices)
    assert records(read(store, slices, fail_on_data_loss=False)) == expected(table, 0, 0, 50)


def test_object_reads_group_consecutive_slices_of_one_object() -> None:
    s = [FileSlice(k, "t", 0, 0, i, 1, 0, 1, False, 9) for i, k in enumerate("aabab")]
    assert [(r.key, [x.skip for x in r.slices]) for r in object_reads(s)] == [
        ("a", [0, 1]), ("b", [2]), ("a", [3]), ("b", [4])]
    assert all(isinstance(r, ObjectRead) and r.size == 9 for r in object_reads(s))


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "in-a-list"])
def test_pieces_keep_the_decoded_size_limits(nested: bool) -> None:
    """Read a piece at a time, an object still may not decode into more than its limit
    (dictionary entries repeated, or pages that declare too much), as decoded whole."""
    raw = dictionary_bomb(4_000, 100_000, nested=nested)
    rows = BatchRows(raw, "data/dict.parquet", None, piece_bytes=1 << 20,
                     fetch_max_bytes=10_000_000)
    with pytest.raises(RecordTooLargeError, match=r"data/dict\.parquet .*fetch\.max\.bytes"):
        list(rows.rows(0, rows.num_rows))
    small = dictionary_bomb(50, 100_000, nested=nested)
    rows = BatchRows(small, "data/ok.parquet", None, piece_bytes=1 << 20,
                     fetch_max_bytes=10_000_000)
    got = pa.concat_tables(rows.rows(0, rows.num_rows))
    assert got.equals(decode_parquet(small, "data/ok.parquet", fetch_max_bytes=10_000_000))
    zeros = pa.table({"value": pa.array([b"\0" * 10_000] * 2_000, pa.binary())})
    sink = pa.BufferOutputStream()
    pq.write_table(zeros, sink, compression="zstd", use_dictionary=False)
    with pytest.raises(RecordTooLargeError, match=r"declares \d+ bytes decoded .*fetch\.max"):
        BatchRows(sink.getvalue().to_pybytes(), "data/bomb.parquet", None, piece_bytes=1 << 20,
                  fetch_max_bytes=1_000_000)


@pytest.mark.s3
def test_objects_fetched_ahead_from_seaweedfs_read_in_order(
        monkeypatch: pytest.MonkeyPatch, store_factory: Any) -> None:
    """On a real S3 server, with the prefetch's own threads: every slice's rows in order,
    a segment's runs from one fetch, and a missing object's error at its own slices,
    after the rows before it."""
    seed = 4417
    print(f"seed={seed}")
    rng = random.Random(seed)
    monkeypatch.setattr(reader, "PREFETCH_BYTES", 150_000)
    store = store_factory("s3", "pysource")
    assert not store.local_requests
    slices, want = [], []
    base = 0
    for _ in range(10):
        n = rng.randint(50, 400)
        key, raw, table = make_object(rng, n, value_bytes=300, group_bytes=16_000,
                                      monkeypatch=monkeypatch)
        store.put(key, raw)
        at = 0
        while at < n:
            take = rng.randint(1, n - at)
            slices.append(file_slice(key, raw, base, at, take))
            want += expected(table, base, at, take)
            at += take + rng.randint(0, 5)
        base += n
    assert records(read(cast(Any, store), slices)) == want
    gone = FileSlice(*slices[len(slices) // 2]).key
    store.delete(gone)
    kept = [s for s in slices if FileSlice(*s).key != gone]
    got = records(read(cast(Any, store), slices, fail_on_data_loss=False))
    assert got == [r for r in want if any(
        FileSlice(*s).start <= r[0] < FileSlice(*s).stop for s in kept)]
    with pytest.raises(OffsetOutOfRangeError, match=rf"{gone} of t-0 .* is gone"):
        read(cast(Any, store), slices)
