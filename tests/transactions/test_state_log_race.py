"""What a lost race on the state log costs: a client whose conditional create of the next
slot fails (another transactional.id of the same state-log partition took it) reads the
slot it lost, and the ones after it, by name; it lists the partition only behind a
backlog, and everything it reads is validated as a listed entry is."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from txlog.errors import CorruptObjectError, UnsupportedFormatError
from txlog.state_log import StateLogPartition
from txlog.storage.base import ObjectStore
from txlog.testing.timeline import TimelineStore
from txlog.txn_state import TxnRecord


def record(txn_id: str, epoch: int = 0) -> TxnRecord:
    return TxnRecord(txn_id, 1, epoch, "Empty", 60_000, ())


def two_clients(store: ObjectStore) -> tuple[StateLogPartition, StateLogPartition, TimelineStore]:
    """Two clients of partition 0 that have both read it; the first one's requests are
    recorded from here on."""
    other = StateLogPartition(store, 0)
    assert other.compare_and_set("b", None, record("b"))
    timeline = TimelineStore(store, sites=False)
    mine = StateLogPartition(timeline, 0)
    mine.refresh()
    other.refresh()
    assert mine.next_slot == other.next_slot == 1
    timeline.clear()
    return mine, other, timeline


def kinds(timeline: TimelineStore) -> list[tuple[str, str]]:
    return [(r.kind, r.key) for r in timeline.requests()]


@pytest.mark.parametrize("backend", ["memory", "local", "s3"])
def test_a_lost_create_reads_the_lost_slot_by_name_without_a_list(
        backend: str, store_factory: Any) -> None:
    mine, other, timeline = two_clients(store_factory(backend))
    assert other.compare_and_set("b", record("b"), record("b", 1))  # takes slot 1
    assert mine.compare_and_set("a", None, record("a"))
    got = kinds(timeline)
    assert got[0] == ("put_if_absent", mine.entry_key(1))
    assert got[-1] == ("put_if_absent", mine.entry_key(2))
    assert not [k for k in got if k[0] == "list"], got
    assert ("get", mine.entry_key(1)) in got
    assert mine.get("b") == record("b", 1) and mine.next_slot == 3
    # A store where requests are local stops at the first missing slot.
    if timeline.local_requests:
        assert got[1:-1] == [("get", mine.entry_key(1)), ("get", mine.entry_key(2))]
    fresh = StateLogPartition(timeline.inner, 0)
    fresh.refresh()
    assert fresh.records == {"a": record("a"), "b": record("b", 1)}


def test_a_remote_store_reads_the_next_slots_side_by_side(store_factory: Any) -> None:
    store = store_factory("memory")
    store.local_requests = False
    mine, other, timeline = two_clients(store)
    assert other.compare_and_set("b", record("b"), record("b", 1))
    # Every GET waits until three are in flight: one after another, the first would wait
    # alone until the barrier times out and breaks, failing the refresh.
    barrier = threading.Barrier(3, timeout=60)
    real_get = store.get

    def get(key: str) -> bytes:
        barrier.wait()
        return real_get(key)

    store.get = get  # type: ignore[method-assign]
    assert mine.compare_and_set("a", None, record("a"))
    got = kinds(timeline)
    assert sorted(k for k in got if k[0] == "get") == [
        ("get", mine.entry_key(s)) for s in (1, 2, 3)]
    assert not [k for k in got if k[0] == "list"], got
    assert mine.get("b") == record("b", 1) and mine.next_slot == 3


@pytest.mark.parametrize("remote", [False, True])
def test_a_backlog_is_listed_after_the_probe(store_factory: Any, remote: bool) -> None:
    store = store_factory("memory")
    store.local_requests = not remote
    mine, other, timeline = two_clients(store)
    for epoch in range(1, 8):  # slots 1-7
        assert other.compare_and_set("b", record("b", epoch - 1), record("b", epoch))
    assert mine.compare_and_set("a", None, record("a"))
    got = kinds(timeline)
    assert [k for k in got if k[0] == "list"] != []
    assert mine.get("b") == record("b", 7)
    assert mine.next_slot == 9
    assert got[-1] == ("put_if_absent", mine.entry_key(8))
    fresh = StateLogPartition(store, 0)
    fresh.refresh()
    assert fresh.records == {"a": record("a"), "b": record("b", 7)}


@pytest.mark.parametrize("remote", [False, True])
@pytest.mark.parametrize("damage", ["garbage", "newer", "no-record"])
def test_a_damaged_slot_read_by_name_is_refused(
        store_factory: Any, remote: bool, damage: str) -> None:
    store = store_factory("memory")
    store.local_requests = not remote
    mine, _, _ = two_clients(store)
    body = {"garbage": b"{\x00", "newer": json.dumps({"v": 2}).encode(),
            "no-record": json.dumps({"v": 1, "slot": 1}).encode()}[damage]
    assert store.put_if_absent(mine.entry_key(1), body)
    expected = UnsupportedFormatError if damage == "newer" else CorruptObjectError
    with pytest.raises(expected):
        mine.compare_and_set("a", None, record("a"))
    assert mine.get("a") is None and mine.next_slot == 1


def test_a_backlog_on_a_remote_store_is_read_side_by_side(store_factory: Any) -> None:
    store = store_factory("memory")
    store.local_requests = False
    mine, other, timeline = two_clients(store)
    for epoch in range(1, 8):  # slots 1-7: the probe reads 1-3, the listing finds 4-7
        assert other.compare_and_set("b", record("b", epoch - 1), record("b", epoch))
    listed = {mine.entry_key(s) for s in range(4, 8)}
    # The listed entries' GETs wait until all four are in flight.
    barrier = threading.Barrier(len(listed), timeout=60)
    real_get = store.get

    def get(key: str) -> bytes:
        if key in listed:
            barrier.wait()
        return real_get(key)

    store.get = get  # type: ignore[method-assign]
    assert mine.compare_and_set("a", None, record("a"))
    assert mine.get("b") == record("b", 7) and mine.next_slot == 9
    assert sum(k[0] == "list" for k in kinds(timeline)) == 1
