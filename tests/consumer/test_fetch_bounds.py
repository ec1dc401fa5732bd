"""What one poll decodes: at most fetch.max.bytes of decoded tables plus one batch object,
whatever the records compress to (the byte limits are on stored sizes, as Kafka's are)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pyarrow as pa
import pytest

import txlog
from txlog import (
    TopicPartition,
    batch_codec,
    batch_rows,
    fetch_windows,
    inline_copies,
    layout,
)

SEED = 3535
FETCH_MAX = 256 * 1024
BATCH = 64 * 1024
RECORD = 1024


def _values(kind: str, n: int) -> list[bytes]:
    rng = random.Random(SEED)
    if kind == "random":  # stored about as large as decoded
        return [rng.randbytes(RECORD) for _ in range(n)]
    # Compressible: decoded many times their stored size.
    return [(b"%06d" % i) + bytes([rng.randrange(4)]) * (RECORD - 6) for i in range(n)]


@pytest.mark.parametrize(("backend", "kind", "call"), [
    ("local", "compressible", "poll"), ("local", "compressible", "poll_arrow"),
    ("local", "random", "poll"), ("local", "random", "poll_arrow"),
    # (a remote store fetches a poll's objects side by side, then decodes them in turn)
    ("s3", "compressible", "poll_arrow")])
def test_a_poll_decodes_at_most_fetch_max_bytes_and_one_object(
        store_factory: Any, monkeypatch: pytest.MonkeyPatch, backend: str, kind: str,
        call: str) -> None:
    print(f"seed={SEED}")
    url, options = store_factory.url(backend)
    log = txlog.connect(url, {**options, "fsync": False} if backend == "local" else options)
    log.create_topic("t", 2)
    values = {p: _values(kind, 600) for p in (0, 1)}
    prod = log.producer(batch_size=BATCH, linger_ms=60_000)
    for i in range(600):
        for p in (0, 1):
            prod.send("t", values[p][i], partition=p)
    prod.flush()
    prod.close()

    decoded: list[int] = []  # the decoded size of every object this poll read
    real = batch_codec.decode_row_groups

    def counting(*args: Any, **kwargs: Any) -> pa.Table:
        table = real(*args, **kwargs)
        decoded.append(table.nbytes)
        return table

    monkeypatch.setattr(batch_rows, "decode_row_groups", counting)
    c = log.consumer(fetch_max_bytes=FETCH_MAX, max_partition_fetch_bytes=FETCH_MAX)
    c.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
    c.seek_to_beginning()
    got: dict[int, list[bytes]] = {0: [], 1: []}
    largest_object = 0
    polls = 0
    while True:
        decoded.clear()
        if call == "poll":
            recs = c.poll(max_records=100_000)
            if not recs:
                break
            for r in recs:
                got[r.partition].append(r.value or b"")
        else:
            t = c.poll_arrow(max_records=100_000)
            if not t.num_rows:
                break
            for p, v in zip(t.column("partition").to_pylist(), t.column("value").to_pylist(),
                            strict=True):
                got[p].append(v)
        polls += 1
        largest_object = max(largest_object, *decoded)
        assert sum(decoded) <= FETCH_MAX + max(decoded), (
            f"poll {polls} decoded {sum(decoded)} bytes in {len(decoded)} objects "
            f"(largest {max(decoded)}), fetch.max.bytes {FETCH_MAX}")
    # Every record once, in order: a poll cut short by the limit leaves the rest for the next.
    assert got == values
    assert largest_object < FETCH_MAX
    assert polls > 1


@pytest.mark.parametrize("layout_kind", ["uniform", "mixed"])
@pytest.mark.parametrize("backend", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_poll_cut_short_by_its_budget_fetches_only_what_it_decodes(
        store_factory: Any, monkeypatch: pytest.MonkeyPatch, backend: str,
        layout_kind: str) -> None:
    """Objects past a poll's decoded budget are neither fetched nor held: with objects
    alike every data GET of a poll is an object it decodes; with objects of 1 to 3
    batches (a larger one decodes into more per stored byte than the last seen) a poll
    fetches at most one object it does not decode.  It holds at most fetch.max.bytes
    plus one object."""
    print(f"seed={SEED}")
    url, options = store_factory.url(backend)
    log = txlog.connect(url, {**options, "fsync": False} if backend == "local" else options)
    log.create_topic("t", 1)
    values = _values("compressible", 2000)  # stored at a small part of their decoded size
    # One object per flush, of a set number of 64-record batches: how many batches join
    # one upload otherwise depends on timing, and with it each object's expansion.
    batches = itertools.cycle([1] if layout_kind == "uniform" else [1, 1, 2, 3])
    prod = log.producer(batch_size=64 * BATCH, linger_ms=60_000)
    sent = 0
    while sent < len(values):
        n = 64 * next(batches)
        for v in values[sent:sent + n]:
            prod.send("t", v, partition=0)
        prod.flush()
        sent += n
    prod.close()

    reader = txlog.connect(url, {**options, "fsync": False} if backend == "local" else options)
    # Objects fetched side by side, as from a remote store (the path with windows to size).
    reader.store.local_requests = False
    inline_copies.clear()
    data_prefix = layout.data_prefix("t", 0)
    gets: list[int] = []  # the stored size of each object fetched in this poll
    real_get = reader.store.get

    def counting_get(key: str) -> bytes:
        raw = real_get(key)
        if key.startswith(data_prefix):
            gets.append(len(raw))
        return raw

    monkeypatch.setattr(reader.store, "get", counting_get)
    decoded: list[int] = []
    real = batch_codec.decode_row_groups

    def counting(*args: Any, **kwargs: Any) -> pa.Table:
        table = real(*args, **kwargs)
        decoded.append(table.nbytes)
        return table

    monkeypatch.setattr(batch_rows, "decode_row_groups", counting)
    c = reader.consumer(fetch_max_bytes=FETCH_MAX, max_partition_fetch_bytes=FETCH_MAX)
    c.assign([TopicPartition("t", 0)])
    c.seek_to_beginning()
    got: list[bytes] = []
    polls = 0
    undecoded = 0
    while True:
        gets.clear()
        decoded.clear()
        recs = c.poll(max_records=100_000)
        if not recs:
            break
        got.extend(r.value or b"" for r in recs)
        polls += 1
        extra = 0 if layout_kind == "uniform" else 1
        assert len(decoded) <= len(gets) <= len(decoded) + extra, (
            f"poll {polls} fetched {len(gets)} objects ({sum(gets)} bytes) and decoded "
            f"{len(decoded)} of them")
        undecoded += len(gets) - len(decoded)
        largest = max(decoded) + max(gets)
        held = sum(decoded) + sum(gets)
        assert held <= FETCH_MAX + largest, (
            f"poll {polls} held {sum(decoded)} decoded and {sum(gets)} stored bytes, "
            f"fetch.max.bytes {FETCH_MAX}")
    print(f"polls={polls} fetched and not decoded={undecoded}")
    assert got == values
    assert polls > 2
    if layout_kind == "mixed":
        assert undecoded > 0  # (the layout does reach the case it bounds)


def test_a_window_holds_the_objects_decoded_until_the_budget_is_passed() -> None:
    assert fetch_windows.window([10, 10, 10, 10], 25, None) == 1  # expansion not known
    assert fetch_windows.window([10, 10, 10, 10], 25, 1.0) == 3  # the third passes 25
    assert fetch_windows.window([10, 10, 10, 10], 25, 3.0) == 1
    assert fetch_windows.window([10, 10, 10, 10], 1000, 1.0) == 4
    assert fetch_windows.window([10, 0, 10], 1000, 1.0) == 1  # not past an unknown size
    assert fetch_windows.window([0, 10], 1000, 1.0) == 1
