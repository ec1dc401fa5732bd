"""A producer's pending batches: sealed on the thread that closes them, with the
timestamp range their log entry needs worked out as records arrive (pure logic)."""

from __future__ import annotations

import random

import pyarrow as pa

from txlog.producer import Producer, _PendingBatch
from txlog.records import KAFKA_SCHEMA, checked_row, conform, ts_range

SEED = 20261123


def _random_table(rng: random.Random) -> pa.Table:
    n = rng.choice([0, 1, 3])
    cols: dict[str, pa.Array] = {"value": pa.array([b"t"] * n, pa.binary())}
    shape = rng.choice(["none", "all", "some"])
    if shape != "none":
        ts = [None if shape == "some" and rng.random() < 0.5 else rng.randrange(1, 10**6)
              for _ in range(n)]
        cols["timestamp"] = pa.array(ts, pa.timestamp("ms", tz="UTC"))
    return conform(pa.table(cols), KAFKA_SCHEMA, "t", kafka_shaped=True)


def _fill(rng: random.Random, batch: _PendingBatch) -> None:
    for _ in range(rng.randrange(1, 6)):
        if rng.random() < 0.6:
            ts = None if rng.random() < 0.3 else rng.randrange(1, 10**6)
            batch.rows.append(checked_row(None, b"r", None, ts))
        else:
            batch.seal()  # as _queue_table does: rows sent before a table come first
            table = _random_table(rng)
            batch.add_table(table, ts_range(table))
    batch.seal()


def test_batch_ts_range_matches_its_table() -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    for _ in range(500):
        batch = _PendingBatch()
        _fill(rng, batch)
        for _ in range(rng.randrange(0, 3)):  # later batches that joined it
            later = _PendingBatch()
            _fill(rng, later)
            batch.join(later)
        table = Producer._joined_table(batch)
        assert table.num_rows == batch.count()
        assert batch.ts_range() == ts_range(table), (batch, table)


def test_seal_keeps_send_order() -> None:
    batch = _PendingBatch()
    batch.rows.append(checked_row(None, b"a", None, 5))
    batch.seal()
    batch.add_table(t := kafka_like([b"b", b"c"]), ts_range(t))
    batch.rows.append(checked_row("k", "d", {"h": "v"}, None))
    batch.seal()
    table = Producer._joined_table(batch)
    assert table.column("value").to_pylist() == [b"a", b"b", b"c", b"d"]
    assert table.column("key").to_pylist() == [None, None, None, b"k"]
    assert table.column("headers").to_pylist()[3] == [{"key": "h", "value": b"v"}]
    assert batch.count() == 4 and not batch.rows


def kafka_like(values: list[bytes]) -> pa.Table:
    return conform(pa.table({"value": pa.array(values, pa.binary())}), KAFKA_SCHEMA, "t",
                   kafka_shaped=True)
