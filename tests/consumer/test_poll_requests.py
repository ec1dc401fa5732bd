"""What a read_committed poll of a partition costs in requests: a reader that keeps up
reads the new entries by name (no LIST) and lists only behind a backlog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog import TopicPartition
from txlog.partition_log import PROBE_SLOTS

TP = TopicPartition("t", 0)


@pytest.fixture(params=[False, True], ids=["local", "remote"])
def log(request: Any, tmp_path: Path) -> txlog.Log:
    lg = txlog.connect(str(tmp_path))
    lg.store.local_requests = not request.param
    lg.create_topic("t", partitions=1)
    return lg


class Counting:
    def __init__(self, log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lists: list[str] = []
        real = log.store.list

        def listing(prefix: str, start_after: str | None = None) -> list[str]:
            self.lists.append(prefix)
            return real(prefix, start_after)

        monkeypatch.setattr(log.store, "list", listing)


def _commit(log: txlog.Log, values: list[bytes]) -> None:
    p = log.producer(transactional_id="tx")
    p.init_transactions()
    for v in values:
        p.begin_transaction()
        p.send("t", v, partition=0)
        p.commit_transaction()
    p.close()


def test_polls_that_keep_up_read_new_entries_without_listing(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = txlog.connect(log.url)
    reader.store.local_requests = log.store.local_requests
    c = reader.consumer(auto_offset_reset="earliest")
    c.assign([TP])
    assert c.poll(timeout_ms=0) == []  # loads the partition (a listing)
    counting = Counting(reader, monkeypatch)
    assert c.poll(timeout_ms=0) == []  # idle
    _commit(log, [b"a"])
    assert [r.value for r in c.poll(timeout_ms=0)] == [b"a"]
    assert counting.lists == []


def test_a_backlog_past_the_probed_slots_is_read_whole(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = txlog.connect(log.url)
    reader.store.local_requests = log.store.local_requests
    c = reader.consumer(auto_offset_reset="earliest")
    c.assign([TP])
    assert c.poll(timeout_ms=0) == []
    counting = Counting(reader, monkeypatch)
    values = [f"v{i}".encode() for i in range(PROBE_SLOTS + 3)]
    _commit(log, values)
    got: list[bytes] = []
    while batch := c.poll(timeout_ms=0):
        got.extend(r.value for r in batch)
    assert got == values
    assert counting.lists  # behind a backlog it lists the rest


def test_a_waiting_poll_looks_again_soon_once_a_transaction_opens(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """poll(timeout_ms) backs off while the log is idle; once a transaction opens in the
    partition (its records are not readable yet, its marker is due), it looks again
    after the shortest pause, not after the backoff the idle log built up."""
    import time as real_time
    import types

    import txlog.consumer as consumer_module

    reader = txlog.connect(log.url)
    c = reader.consumer(auto_offset_reset="earliest")
    c.assign([TP])
    assert c.poll(timeout_ms=0) == []
    p = log.producer(transactional_id="slow")
    p.init_transactions()
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 5:  # idle so far: the backoff has grown
            p.begin_transaction()
            p.send("t", b"x", partition=0)
            p.flush()  # a DATA entry: the transaction is open there
        elif len(pauses) == 7:
            p.commit_transaction()
            p.close()

    fake = types.SimpleNamespace(monotonic=real_time.monotonic, sleep=sleep)
    monkeypatch.setattr(consumer_module, "time", fake)
    assert [r.value for r in c.poll(timeout_ms=60_000)] == [b"x"]
    assert pauses[:5] == [0.01, 0.02, 0.04, 0.08, 0.16]
    assert pauses[5] == 0.01  # the open transaction was seen: no 0.2 s pause
