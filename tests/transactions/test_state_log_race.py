"""What a lost race on the state log costs: a client whose conditional create of the next
slot fails (another transactional.id of the same state-log partition took it) reads the
slot it lost by name while it claims the two after; it lists the partition only behind a
backlog, and everything it reads is validated as a listed entry is."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from txlog.errors import CorruptObjectError, StorageError, UnsupportedFormatError
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
    # The next two slots are claimed with the read of the lost one (and of the first
    # claimed slot, and a probe of the one after the claims), not after it; both are
    # won here, and the second is void.
    assert sorted(got[1:]) == [("get", mine.entry_key(s)) for s in (1, 2, 4)] + [
        ("put_if_absent", mine.entry_key(s)) for s in (2, 3)], got
    assert mine.get("b") == record("b", 1) and mine.next_slot == 4
    if timeline.local_requests:  # one after another: the claims first
        assert got[1:3] == [("put_if_absent", mine.entry_key(s)) for s in (2, 3)]
    fresh = StateLogPartition(timeline.inner, 0)
    fresh.refresh()
    assert fresh.records == {"a": record("a"), "b": record("b", 1)}


def test_a_remote_store_reads_the_next_slots_side_by_side(store_factory: Any) -> None:
    store = store_factory("memory")
    store.local_requests = False
    mine, other, timeline = two_clients(store)
    assert other.compare_and_set("b", record("b"), record("b", 1))
    # After the lost slot, the claims of the next two and the reads (the lost slot, the
    # first claimed one, and a probe of the one after the claims) each wait until all
    # five are in flight: one after another, the first would wait alone until the
    # barrier times out and breaks.
    barrier = threading.Barrier(5, timeout=60)
    real_get, real_put = store.get, store.put_if_absent

    def get(key: str) -> bytes:
        barrier.wait()
        return real_get(key)

    def put_if_absent(key: str, data: bytes) -> bool:
        if key in (mine.entry_key(2), mine.entry_key(3)):
            barrier.wait()
        return real_put(key, data)

    store.get = get  # type: ignore[method-assign]
    store.put_if_absent = put_if_absent  # type: ignore[method-assign]
    assert mine.compare_and_set("a", None, record("a"))
    got = kinds(timeline)
    assert sorted(k for k in got if k[0] == "get") == [
        ("get", mine.entry_key(s)) for s in (1, 2, 4)]
    assert not [k for k in got if k[0] == "list"], got
    assert mine.get("b") == record("b", 1) and mine.next_slot == 4


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
    body = {"garbage": b"{\x00", "newer": json.dumps({"v": 3}).encode(),
            "no-record": json.dumps({"v": 1, "slot": 1}).encode()}[damage]
    assert store.put_if_absent(mine.entry_key(1), body)
    expected = UnsupportedFormatError if damage == "newer" else CorruptObjectError
    # The claims of slots 2-3, made beside the read of slot 1, landed: whether they count is
    # unknown, so the error is not one that says nothing was written.
    with pytest.raises(StorageError, match="whether it takes effect is unknown") as got:
        mine.compare_and_set("a", None, record("a"))
    assert not isinstance(got.value, CorruptObjectError)
    assert isinstance(got.value.__cause__, expected)
    assert mine.get("a") is None and mine.next_slot == 1
    with pytest.raises(expected):  # as every reader of the partition is refused
        StateLogPartition(store, 0).refresh()


def test_a_backlog_on_a_remote_store_is_read_side_by_side(store_factory: Any) -> None:
    store = store_factory("memory")
    store.local_requests = False
    mine, other, timeline = two_clients(store)
    for epoch in range(1, 8):  # slots 1-7: the claims of slots 2-3 read 1 (and 2) and
        # probe 4, which is taken too: the probe reads 2-4, the listing finds 5-7
        assert other.compare_and_set("b", record("b", epoch - 1), record("b", epoch))
    listed = {mine.entry_key(s) for s in range(5, 8)}
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
