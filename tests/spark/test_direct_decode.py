"""The JVM scan's own decoder of Kafka-shaped batch objects (txlog.scan.decoder=txlog, the
default) against Spark's Parquet reader (txlog.scan.decoder=parquet) and the consumer, on
objects written by txlog's producer (pyarrow): nulls, keys, timestamps present and absent,
headers on some batches (those objects fall back), several row groups, slices starting and
ending inside objects and inside columnar batches."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_spark_read import consume, spark_rows

import txlog
from txlog import batch_codec
from txlog.records import HEADER_TYPE, KAFKA_SCHEMA

pytestmark = pytest.mark.spark

DECODER = "txlog.scan.decoder"


def build(url: str, seed: int) -> int:
    """Two partitions of random Kafka-shaped batches; returns how many batches carry
    headers (their objects are read by Spark's Parquet reader)."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    log = txlog.connect(url)
    log.create_topic("d", partitions=2)
    p = log.producer(transactional_id="d-tx")
    p.init_transactions()
    with_headers = 0
    for i in range(12):
        p.begin_transaction()
        for part in range(2):
            n = rng.randint(1, 400)
            keys = [None if rng.random() < 0.3 else f"k{rng.randrange(7)}".encode()
                    for _ in range(n)]
            values = [None if rng.random() < 0.05 else rng.randbytes(rng.randrange(60))
                      for _ in range(n)]
            stamped = rng.random() < 0.7
            stamps = [rng.randrange(1, 10**12) if stamped and rng.random() < 0.9 else None
                      for _ in range(n)]
            headered = rng.random() < 0.25
            # Null headers (as records without headers are stored), and in headered batches
            # some empty lists too: Spark reads those as [] and the null ones as null.
            headers = [[("h", b"x"), ("n", None)] if headered and j % 2
                       else [] if headered and j % 4 == 0 else None for j in range(n)]
            with_headers += headered
            p.send_batch("d", pa.table([pa.array(keys, pa.binary()),
                                        pa.array(values, pa.binary()),
                                        pa.array(headers, HEADER_TYPE),
                                        pa.array(stamps, pa.timestamp("ms", tz="UTC"))],
                                       schema=KAFKA_SCHEMA), partition=part)
        p.flush()
        p.abort_transaction() if i % 4 == 3 else p.commit_transaction()
    return with_headers


def header_kinds(df: Any) -> list[tuple[int, int, str]]:
    """Per row (partition, offset) whether its headers are null, an empty list or a list
    with entries (spark_rows, as the consumer, reads null as empty)."""
    rows = df.selectExpr("partition", "offset", "headers").collect()
    return sorted((r[0], r[1], "null" if r[2] is None else "empty" if len(r[2]) == 0
                   else "entries") for r in rows)


def decoded_by(df: Any) -> tuple[int, int]:
    """The scan's metrics after ``df`` ran: objects decoded by txlog, by Parquet."""
    plan = df._jdf.queryExecution().executedPlan()
    if plan.getClass().getSimpleName() == "AdaptiveSparkPlanExec":
        plan = plan.executedPlan()
    leaves = plan.collectLeaves()
    for i in range(leaves.size()):
        metrics = leaves.apply(i).metrics()
        if metrics.contains("objectsDecodedByTxlog"):
            return (int(metrics.apply("objectsDecodedByTxlog").value()),
                    int(metrics.apply("objectsDecodedByParquet").value()))
    raise AssertionError(f"no txlog scan in {plan}")


@pytest.fixture
def decoder(spark: Any) -> Iterator[Any]:
    """Sets the decoder for the next reads (None: the default); unset afterwards."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()

    def use(name: str | None) -> None:
        if name is None:
            hadoop.unset(DECODER)
        else:
            hadoop.set(DECODER, name)

    yield use
    hadoop.unset(DECODER)


def read(spark: Any, url: str, **options: str) -> Any:
    r = spark.read.format("txlog").option("path", url).option("topic", "d")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_both_decoders_read_what_the_consumer_reads(
        spark: Any, tmp_path: Path, decoder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Row groups of a few KB: objects of several row groups, as large batches are.
    monkeypatch.setattr(batch_codec, "ROW_GROUP_BYTES", 4096)
    url = str(tmp_path / "lake")
    headered = build(url, seed=3232)
    assert headered > 0
    want = consume(url, ["d"])
    objects = 9  # committed transactions: each one object holding both partitions' batches
    key = "spark.sql.parquet.columnarReaderBatchSize"
    kinds: dict[str | None, list[tuple[int, int, str]]] = {}
    try:
        for name, batch in ((None, "4096"), ("parquet", "4096"), ("txlog", "7")):
            decoder(name)
            spark.conf.set(key, batch)
            df = read(spark, url)
            assert spark_rows(df) == want, (name, batch)
            assert df.count() == len(want)  # no stored column: footers only
            df.collect()  # every column: the metrics of this query's own scan
            direct, parquet = decoded_by(df)
            if name == "parquet":
                assert (direct, parquet) == (0, objects)
            else:  # only the objects of batches with headers fall back
                assert direct + parquet == objects and 0 < parquet < objects, (direct, parquet)
            kinds[name] = header_kinds(df)
        assert {k for _, _, k in kinds["parquet"]} == {"null", "empty", "entries"}
        assert kinds[None] == kinds["parquet"] == kinds["txlog"]
        # Slices starting and ending inside objects (and their row groups).
        rng = random.Random(99)
        high = max(r[2] for r in want) + 1
        for trial in range(6):
            lo, hi = sorted(rng.sample(range(high + 1), 2))
            opts = {"startingOffsets": json.dumps({"d": {"0": lo, "1": lo // 2}}),
                    "endingOffsets": json.dumps({"d": {"0": hi, "1": -1}})}
            part = [r for r in want
                    if (r[1] == 0 and lo <= r[2] < hi) or (r[1] == 1 and r[2] >= lo // 2)]
            for name in ("txlog", "parquet"):
                decoder(name)
                assert spark_rows(read(spark, url, **opts)) == part, (trial, name, lo, hi)
    finally:
        spark.conf.unset(key)


def test_a_wrong_decoder_setting_is_refused(spark: Any, tmp_path: Path, decoder: Any) -> None:
    url = str(tmp_path / "lake")
    build(url, seed=1)
    decoder("arrow")
    with pytest.raises(Exception, match=r"txlog\.scan\.decoder is 'arrow'"):
        read(spark, url).collect()


def test_objects_of_the_jvm_writer_read_alike(spark: Any, tmp_path: Path, decoder: Any) -> None:
    """Objects written by the JVM writer (parquet-mr through Spark: no dictionaries,
    millisecond timestamps, nulls and empty keys) are decoded directly, and read as Spark's
    Parquet reader and the consumer read them."""
    import spark_ext

    url = str(tmp_path / "lake")
    txlog.connect(url).create_topic("d", partitions=3)
    df = spark.range(0, 5000, numPartitions=2).selectExpr(
        "CASE WHEN id % 10 = 3 THEN NULL WHEN id % 10 = 7 THEN '' "
        "ELSE concat('user-', id % 37) END AS key",
        "CASE WHEN id % 13 = 5 THEN NULL ELSE repeat(concat('v', id), int(id % 9)) END "
        "AS value",
        "CASE WHEN id % 4 = 0 THEN NULL "
        "ELSE timestamp_millis(1700000000000 + id * 7) END AS timestamp")
    spark_ext.write(df, url, topic="d", engine="jvm")
    want = consume(url, ["d"])
    assert len(want) == 5000
    for name in ("txlog", "parquet"):
        decoder(name)
        got = read(spark, url)
        assert spark_rows(got) == want, name
        got.collect()
        direct, parquet = decoded_by(got)
        assert direct + parquet > 0 and (parquet == 0 if name == "txlog" else direct == 0), \
            (name, direct, parquet)


def _rewritten(write_table: Any, shape: str) -> Any:
    """pyarrow's write_table as txlog's producer calls it, with the objects written in
    another of the shapes pyarrow writes (the producer's own settings otherwise kept)."""
    def write(table: pa.Table, where: Any, **kwargs: Any) -> None:
        if shape == "v2_pages":  # data pages v2, several per column chunk
            kwargs.update(data_page_version="2.0", data_page_size=1024, write_batch_size=64)
        elif shape == "dictionary_fallback":
            # The value column dictionary-encoded until its dictionary outgrows the limit,
            # then PLAIN: both encodings in one column chunk.
            kwargs.update(use_dictionary=True, dictionary_pagesize_limit=512,
                          data_page_size=1024, write_batch_size=32)
        elif shape == "micros":
            i = table.schema.get_field_index("timestamp")
            table = table.set_column(i, "timestamp",
                                     table.column(i).cast(pa.timestamp("us", tz="UTC")))
        elif shape == "local_millis":  # not adjusted to UTC
            i = table.schema.get_field_index("timestamp")
            table = table.set_column(i, "timestamp", table.column(i).cast(pa.timestamp("ms")))
        write_table(table, where, **kwargs)
    return write


def _page_kinds(path: Path, column: str) -> list[tuple[int, int, int]]:
    """(page type, encoding, values) of each page of ``column``'s chunks in the object at
    ``path``, from its page headers (Thrift compact, the fields page headers use)."""
    data = path.read_bytes()

    def varint(i: int) -> tuple[int, int]:
        shift = out = 0
        while True:
            b = data[i]
            i += 1
            out |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return out, i

    def struct(i: int) -> tuple[dict[int, Any], int]:
        fields: dict[int, Any] = {}
        last = 0
        while data[i]:
            h = data[i]
            i += 1
            kind, delta = h & 0x0F, h >> 4
            last = last + delta  # page headers use short field headers only
            if kind in (5, 6):
                v, i = varint(i)
                fields[last] = (v >> 1) ^ -(v & 1)
            elif kind == 12:
                fields[last], i = struct(i)
            elif kind in (1, 2):
                fields[last] = kind == 1
            else:
                raise AssertionError(f"page header field of kind {kind}")
        return fields, i + 1

    md = pq.ParquetFile(path).metadata
    out = []
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            chunk = md.row_group(g).column(c)
            if chunk.path_in_schema != column:
                continue
            at = chunk.dictionary_page_offset if chunk.has_dictionary_page \
                else chunk.data_page_offset
            end = at + chunk.total_compressed_size
            while at < end:
                h, body = struct(at)
                own: dict[int, Any] = h.get(5) or h.get(7) or h[8]
                out.append((h[1], own[4] if 8 in h else own[2], own[1]))
                at = body + h[3]
    return out


@pytest.mark.parametrize("shape", ["v2_pages", "dictionary_fallback", "all_null",
                                   "micros", "local_millis"])
def test_pyarrow_shapes_read_alike(spark: Any, tmp_path: Path, decoder: Any,
                                   monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    """Objects pyarrow writes in shapes the producer does not choose by default read as the
    consumer and Spark's Parquet reader read them: data pages v2; a dictionary falling back
    to PLAIN mid-column; columns null in every row (an empty dictionary page); timestamps of
    another unit or not adjusted to UTC (Spark's reader takes those objects)."""
    seed = 3200 + len(shape)
    print(f"seed={seed}")
    rng = random.Random(seed)
    monkeypatch.setattr(batch_codec, "ROW_GROUP_BYTES", 16384)  # several row groups
    # The producer encodes through pyarrow.parquet.write_table (txlog.batch_codec).
    monkeypatch.setattr(pq, "write_table", _rewritten(pq.write_table, shape))
    url = str(tmp_path / "lake")
    log = txlog.connect(url)
    log.create_topic("d", partitions=2)
    # An object per batch: the pages checked below are each object's own.
    p = log.producer(transactional_id="d-tx", **{"batch.objects.shared": False})
    p.init_transactions()
    for i in range(4):
        p.begin_transaction()
        for part in range(2):
            n = rng.randint(300, 900)
            nulls = shape == "all_null"
            keys = [None if nulls or rng.random() < 0.2 else f"k{rng.randrange(9)}".encode()
                    for _ in range(n)]
            # Repeated values, so that a dictionary has entries to refer to.
            values = [None if rng.random() < 0.05 else
                      rng.choice([b"a", b"bb", b""]) if rng.random() < 0.5
                      else rng.randbytes(rng.randrange(1, 40)) for _ in range(n)]
            stamps = [None if nulls or rng.random() < 0.1 else 1_700_000_000_000 + j * 7
                      for j in range(n)]
            p.send_batch("d", pa.table([pa.array(keys, pa.binary()),
                                        pa.array(values, pa.binary()),
                                        pa.nulls(n, HEADER_TYPE),
                                        pa.array(stamps, pa.timestamp("ms", tz="UTC"))],
                                       schema=KAFKA_SCHEMA), partition=part)
        p.flush()
        p.abort_transaction() if i == 2 else p.commit_transaction()
    monkeypatch.undo()
    # The objects are of the shape named (page type 0: v1 data page, 2: dictionary, 3: v2
    # data page; encoding 0: PLAIN, 8: RLE_DICTIONARY).
    objects = sorted((tmp_path / "lake").rglob("*.parquet"))
    kinds = {(t, e) for o in objects for t, e, _ in _page_kinds(o, "value")}
    if shape == "v2_pages":
        assert (3, 0) in kinds and 0 not in {t for t, _ in kinds}, kinds
        assert max(len(_page_kinds(o, "value")) for o in objects) > 1
    elif shape == "dictionary_fallback":
        assert {(2, 0), (0, 8), (0, 0)} <= kinds, kinds
    elif shape == "all_null":  # each chunk of keys: an empty dictionary, then its pages
        for o in objects:
            pages = _page_kinds(o, "key")
            assert pages[0] == (2, 0, 0) and len(pages) > 1, (o, pages)
    want = consume(url, ["d"])
    assert len(want) > 1000
    got: dict[str, Any] = {}
    for name in ("txlog", "parquet"):
        decoder(name)
        df = read(spark, url)
        got[name] = spark_rows(df)
        df.collect()
        direct, parquet = decoded_by(df)
        assert direct + parquet == 6, (name, direct, parquet)
        if name == "txlog":
            # Shapes the decoder reads are read by it; timestamps it does not read in
            # another unit send the object to Spark's reader, never misread.
            assert direct == (0 if shape in ("micros", "local_millis") else 6), (direct, parquet)
    assert got["txlog"] == got["parquet"] == want
