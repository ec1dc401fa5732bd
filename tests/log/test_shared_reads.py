"""Readers decode only the rows of an object that their log entries name: a partition's
batch in a shared object, or a run of a compacted segment, decodes the row groups that
cover it and no others, each once per read, and the decoded-size limit (fetch.max.bytes,
or 64 times the stored size) applies to what is decoded, not to the whole object."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import txlog
from txlog import TopicPartition, batch_codec, inline_copies
from txlog.batch_rows import BatchRows
from txlog.errors import RecordTooLargeError
from txlog.maintenance import compact_partition
from txlog.partition_state import COMMITTED, ReadSpan
from txlog.shared_objects import encode_shared
from txlog.testing.timeline import TimelineStore

PARTITIONS = 8
SEED = 3232
NAMES = pa.schema([("name", pa.string())])
MIB = 1 << 20


@pytest.fixture(autouse=True)
def _no_kept_copies() -> None:
    inline_copies.clear()


class DecodedRows:
    """Rows pyarrow's Parquet reader decodes while it is installed (every way it reads)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows = 0
        spy = self

        def counted(name: str) -> None:
            real = getattr(pq.ParquetFile, name)

            def read(pf: pq.ParquetFile, *args: Any, **kwargs: Any) -> Any:
                out = real(pf, *args, **kwargs)
                spy.rows += out.num_rows
                return out
            monkeypatch.setattr(pq.ParquetFile, name, read)

        for name in ("read", "read_row_group", "read_row_groups"):
            counted(name)
        real_iter = pq.ParquetFile.iter_batches

        def iter_batches(pf: pq.ParquetFile, *args: Any, **kwargs: Any) -> Iterator[Any]:
            for batch in real_iter(pf, *args, **kwargs):
                spy.rows += batch.num_rows
                yield batch
        monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)


def _names_topic(tmp_path: Path, *, partitions: int, rows: int, shared: bool = True,
                 ) -> str:
    """A typed topic whose partitions each hold one batch of ``rows`` rows of one repeated
    1000-byte string (dictionary-encoded: a few KB stored, about rows KB decoded), written
    in one producer step."""
    url = str(tmp_path / "root")
    lg = txlog.connect(url)
    lg.create_topic("t", partitions=partitions, schema=NAMES)
    config: dict[str, Any] = {"linger.ms": 600_000, "batch.objects.shared": shared}
    p = lg.producer(**config)
    for q in range(partitions):
        p.send_batch("t", pa.table({"name": [f"{q}" * 1000] * rows}, schema=NAMES),
                     partition=q)
    p.flush()
    p.close()
    objects = [k for k in lg.store.list("topics/t/") if k.endswith(".parquet")]
    assert len(objects) == (1 if shared else partitions)
    return url


def _read_all(url: str, partitions: list[int], **config: Any) -> dict[int, list[str]]:
    c = txlog.connect(url, **config).consumer(auto_offset_reset="earliest", **config)
    c.assign([TopicPartition("t", q) for q in partitions])
    out: dict[int, list[str]] = {q: [] for q in partitions}
    while (t := c.poll_arrow(timeout_ms=0)) is not None and t.num_rows:
        for q, name in zip(t.column("partition").to_pylist(), t.column("name").to_pylist(),
                           strict=True):
            out[q].append(name)
    return out


@pytest.mark.parametrize("shared", [False, True], ids=["own-objects", "shared"])
def test_a_shared_object_reads_under_a_fetch_limit_its_whole_decode_exceeds(
        tmp_path: Path, shared: bool) -> None:
    """4 x 600 rows decode to about 2.4 MB, each partition's to 600 KB: under a
    fetch.max.bytes of 1 MiB each partition's batch reads, shared or not."""
    url = _names_topic(tmp_path, partitions=4, rows=600, shared=shared)
    got = _read_all(url, [0, 1, 2, 3], **{"fetch.max.bytes": MIB})
    assert {q: len(v) for q, v in got.items()} == {q: 600 for q in range(4)}
    assert all(set(v) == {f"{q}" * 1000} for q, v in got.items())


def test_a_consumer_of_one_partition_decodes_only_its_rows_of_a_shared_object(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _names_topic(tmp_path, partitions=PARTITIONS, rows=50)
    decoded = DecodedRows(monkeypatch)
    for q in (0, 5, PARTITIONS - 1):
        before = decoded.rows
        got = _read_all(url, [q])
        assert got == {q: [f"{q}" * 1000] * 50}
        assert decoded.rows - before == 50, q


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote-like"])
def test_a_poll_over_all_partitions_fetches_a_shared_object_once_and_decodes_each_row_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remote: bool) -> None:
    url = _names_topic(tmp_path, partitions=PARTITIONS, rows=50)
    reader = txlog.connect(url)
    timeline = TimelineStore(reader.store)
    timeline.local_requests = not remote  # remote: objects fetched side by side
    reader.store = timeline
    decoded = DecodedRows(monkeypatch)
    c = reader.consumer(auto_offset_reset="earliest")
    c.assign([TopicPartition("t", q) for q in range(PARTITIONS)])
    t = c.poll_arrow(timeout_ms=0)
    assert t.num_rows == 50 * PARTITIONS
    assert sorted(set(zip(t.column("partition").to_pylist(), t.column("name").to_pylist(),
                          strict=True))) == [(q, f"{q}" * 1000) for q in range(PARTITIONS)]
    assert decoded.rows == 50 * PARTITIONS
    gets = [r.key for r in timeline.requests() if r.kind == "get" and "/_shared/" in r.key]
    assert len(gets) == 1


def test_compaction_of_a_partition_in_shared_objects_decodes_only_its_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two steps, so two shared objects; partition 2's compaction decodes its 2 x 600 rows
    (under the 1 MiB limit each) and its segment holds exactly them."""
    url = str(tmp_path / "root")
    limit: dict[str, Any] = {"fetch.max.bytes": MIB}
    lg = txlog.connect(url, **limit)
    lg.create_topic("t", partitions=4, schema=NAMES)
    linger: dict[str, Any] = {"linger.ms": 600_000}
    p = lg.producer(**linger)
    for step in range(2):
        for q in range(4):
            p.send_batch("t", pa.table({"name": [f"{q}{step}" * 500] * 600}, schema=NAMES),
                         partition=q)
        p.flush()
    p.close()
    decoded = DecodedRows(monkeypatch)
    report = compact_partition(lg, TopicPartition("t", 2))
    assert report.compacted_batches == 2
    assert decoded.rows == 1200
    monkeypatch.undo()
    got = _read_all(url, [0, 2])
    assert got[2] == ["20" * 500] * 600 + ["21" * 500] * 600
    assert got[0] == ["00" * 500] * 600 + ["01" * 500] * 600


def _segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[txlog.Log, str]:
    """A partition of 12 batches of 100 rows compacted into one segment of several row
    groups (a small row-group size), returned with the segment's key."""
    url = str(tmp_path / "root")
    lg = txlog.connect(url)
    lg.create_topic("t", partitions=1, schema=NAMES)
    p = lg.producer()
    for i in range(12):
        p.send_batch("t", pa.table({"name": [f"{i:03}" * 100] * 100}, schema=NAMES),
                     partition=0)
        p.flush()
    p.close()
    with monkeypatch.context() as m:
        m.setattr(batch_codec, "ROW_GROUP_BYTES", 16 * 1024)
        compact_partition(lg, TopicPartition("t", 0))
    st = lg.partition_log(TopicPartition("t", 0)).refresh()
    (segment,) = set(st.batches.data)
    return lg, segment


def _span(st: Any, k: int) -> ReadSpan:
    b = st.batches
    return ReadSpan(b.data[k], b.base_offset[k], b.count[k], b.base_offset[k],
                    b.base_offset[k] + b.count[k], COMMITTED, b.producer_id[k],
                    b.append_ms[k], b.row[k])


def test_a_segments_run_decodes_only_the_row_groups_that_cover_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lg, segment = _segment(tmp_path, monkeypatch)
    meta = pq.ParquetFile(pa.BufferReader(lg.store.get(segment))).metadata
    starts = [0]
    for i in range(meta.num_row_groups):
        starts.append(starts[-1] + meta.row_group(i).num_rows)
    assert meta.num_row_groups >= 4, starts
    plog = lg.partition_log(TopicPartition("t", 0))
    st = plog.refresh()
    decoded = DecodedRows(monkeypatch)
    for k in (0, 5, 11):
        span = _span(st, k)
        cover = sum(starts[g + 1] - starts[g] for g in range(meta.num_row_groups)
                    if starts[g] < span.row + span.count and span.row < starts[g + 1])
        before = decoded.rows
        (table,) = plog.read_spans([span])
        assert table.column("name").to_pylist() == [f"{k:03}" * 100] * 100
        assert decoded.rows - before == cover, (k, starts)
    # All runs in one read: each row group decoded once.
    before = decoded.rows
    tables = plog.read_spans([_span(st, k) for k in range(12)])
    assert [t.column("name")[0].as_py() for t in tables] == [f"{k:03}" * 100
                                                             for k in range(12)]
    assert decoded.rows - before == starts[-1]


def test_the_piecewise_reader_reads_each_partitions_batch_of_a_shared_object_under_the_limit(
        ) -> None:
    """The Python data source reads a shared object's slices from one BatchRows, a range at
    a time: each range's decode counts against the limit, not the object's so far."""
    batches = [(q, pa.table({"name": [f"{q}" * 1000] * 600}, schema=NAMES)) for q in range(4)]
    key, buf, slices = encode_shared("t", batches)
    rows = BatchRows(buf.to_pybytes(), key, None, piece_bytes=MIB, fetch_max_bytes=MIB)
    for s in slices:
        got = pa.concat_tables(rows.rows(s.row, s.count))
        assert got.column("name").to_pylist() == [f"{s.partition}" * 1000] * 600
    # A range that decodes past the limit alone is still refused.
    rows = BatchRows(buf.to_pybytes(), key, None, piece_bytes=MIB, fetch_max_bytes=MIB)
    with pytest.raises(RecordTooLargeError, match=r"fetch\.max\.bytes"):
        list(rows.rows(0, 2400))
