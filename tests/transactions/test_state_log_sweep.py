"""A sweep of the state log (admin listings, metrics, the coordinator's maintenance) reads
only the partitions that hold objects, found with one listing of the names below the state log,
so a root's many partitions cost nothing while empty; and partition numbers of four
digits or more are laid out, listed, parsed and checkpointed like the first thousand."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog import layout, root_settings
from txlog.config import DEFAULTS
from txlog.state_log import CHECKPOINT_INTERVAL, StateLog, state_partition_for
from txlog.storage.base import Names, ObjectStore
from txlog.testing.delegating import DelegatingStore
from txlog.testing.timeline import TimelineStore
from txlog.txn_state import TxnRecord

PARTITIONS = 4096


def record(txn_id: str, epoch: int = 0) -> TxnRecord:
    return TxnRecord(txn_id, 1, epoch, "Empty", 60_000, ())


def id_in(partition: int, partitions: int = PARTITIONS) -> str:
    """A transactional id that hashes to ``partition``."""
    return next(f"id-{i}" for i in itertools.count()
                if state_partition_for(f"id-{i}", partitions) == partition)


def write(store: ObjectStore, ids: list[str], times: int = 1) -> None:
    log = StateLog(store, PARTITIONS)
    for txn_id in ids:
        part = log.partition_for(txn_id)
        for epoch in range(times):
            part.refresh()
            assert part.compare_and_set(txn_id, part.get(txn_id), record(txn_id, epoch))


@pytest.mark.parametrize("backend", ["memory", "local"])
def test_a_sweep_of_4096_partitions_reads_only_the_3_in_use(
        backend: str, store_factory: Any) -> None:
    store = store_factory(backend)
    ids = [id_in(p) for p in (7, 1234, 4095)]
    write(store, ids)
    timeline = TimelineStore(store, sites=False)
    got = StateLog(timeline, PARTITIONS).all_records()
    assert sorted(r.txn_id for r in got) == sorted(ids)
    requests = [(r.kind, r.key) for r in timeline.requests()]
    # One listing of the names below the state log; every other request is on a partition
    # in use.
    assert [q for q in requests if q[1] == layout.STATE_LOG_PREFIX] == [
        ("list", layout.STATE_LOG_PREFIX)], requests
    read = {layout.state_partition_of(key) for _, key in requests
            if key != layout.STATE_LOG_PREFIX}
    assert read == {7, 1234, 4095}, requests


def test_objects_that_are_not_a_partition_of_the_root_are_not_read(
        store_factory: Any) -> None:
    store = store_factory("memory")
    write(store, [id_in(12)])
    store.put(f"{layout.STATE_LOG_PREFIX}README", b"x")
    store.put(f"{layout.STATE_LOG_PREFIX}0012/log/000000/000000000000.json", b"x")
    store.put(f"{layout.STATE_LOG_PREFIX}abc/log/000000/000000000000.json", b"x")
    store.put(layout.state_log_entry_key(PARTITIONS, 0), b"x")  # past the root's count
    timeline = TimelineStore(store, sites=False)
    assert [r.txn_id for r in StateLog(timeline, PARTITIONS).all_records()] == [id_in(12)]
    assert {layout.state_partition_of(r.key) for r in timeline.requests()} == {None, 12}


def test_partition_numbers_from_1000_on_parse_and_list_apart_from_shorter_ones() -> None:
    assert layout.state_log_prefix(7) == "_txn/state/007/"
    assert layout.state_log_prefix(1000) == "_txn/state/1000/"
    for p in (0, 7, 99, 100, 999, 1000, 1001, 4095, 99_999):
        assert layout.state_partition_of(layout.state_log_entry_key(p, 12)) == p
        assert layout.state_partition_of(layout.state_log_checkpoint_key(p, 200)) == p
    for key in ("_txn/state/7/log/x.json", "_txn/state/0100/log/x.json",
                "_txn/state/\uff11\uff12\uff13/log/x.json", "_txn/state/100", "_txn/clock/100/x",
                "_txn/state/-10/log/x.json"):
        assert layout.state_partition_of(key) is None, key


@pytest.mark.parametrize("backend", ["memory", "local"])
def test_partitions_100_and_1000_keep_their_records_and_checkpoints_apart(
        backend: str, store_factory: Any) -> None:
    store = store_factory(backend)
    short, long = id_in(100), id_in(1000)
    write(store, [short])
    write(store, [long], times=CHECKPOINT_INTERVAL + 1)  # a checkpoint, then one more
    assert store.list(layout.state_log_checkpoint_prefix(1000))
    assert not store.list(layout.state_log_checkpoint_prefix(100))
    assert len(store.list(layout.state_log_entries_prefix(100))) == 1
    log = StateLog(store, PARTITIONS)
    assert log.used_partitions() == [100, 1000]
    assert {r.txn_id: r.epoch for r in log.all_records()} == {
        short: 0, long: CHECKPOINT_INTERVAL}
    assert log.partition_for(long).next_slot == CHECKPOINT_INTERVAL + 1


def test_new_roots_get_4096_partitions_and_a_root_made_with_50_keeps_50(
        tmp_path: Path) -> None:
    assert DEFAULTS["transaction.state.log.num.partitions"][0] == PARTITIONS
    new = txlog.connect(str(tmp_path / "new"))
    assert new.root_settings()["transaction.state.log.num.partitions"] == PARTITIONS
    root = str(tmp_path / "old")
    store = txlog.connect(root).store
    assert store.put_if_absent(root_settings.KEY, root_settings.encode({
        "transaction.state.log.num.partitions": 50, "offsets.topic.num.partitions": 10,
        "transaction.max.timeout.ms": 900_000}))
    upgraded = txlog.connect(root)
    assert upgraded.root_settings()["transaction.state.log.num.partitions"] == 50
    assert upgraded.coordinator.state_log.num_partitions == 50


def test_a_root_made_before_stored_settings_keeps_the_old_default_of_50(
        tmp_path: Path) -> None:
    """Its older clients hashed ids over 50 partitions by default: a client that sets
    nothing must find (and fence) their records there, not over the new default."""
    root = str(tmp_path / "root")
    old = txlog.connect(root, transaction_state_log_num_partitions=50)
    old.create_topic("t")
    old.store.delete(root_settings.KEY)  # as a root written before settings were stored
    zombie = old.producer(transactional_id="app")
    zombie.init_transactions()
    upgraded = txlog.connect(root)
    assert upgraded.root_settings()["transaction.state.log.num.partitions"] == 50
    assert not upgraded.store.exists(root_settings.KEY)  # nothing guessed and written
    with upgraded.producer(transactional_id="app") as p:
        p.init_transactions()
        assert p.epoch > zombie.epoch  # found the older client's record
    chosen = txlog.connect(root, transaction_state_log_num_partitions=64)
    assert chosen.root_settings()["transaction.state.log.num.partitions"] == 64


class _ListingKinds(DelegatingStore):
    """Records each listing's prefix, full listings and one-level listings apart."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.full: list[str] = []
        self.children: list[str] = []

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        self.full.append(prefix)
        return super().list(prefix, start_after)

    def list_children(self, prefix: str) -> Names:
        self.children.append(prefix)
        return super().list_children(prefix)


@pytest.mark.parametrize("backend", ["memory", "local"])
def test_a_sweep_finds_the_partitions_in_use_without_listing_their_history(
        backend: str, store_factory: Any) -> None:
    """Entries are never deleted, so a listing of the whole state log grows with every
    transaction ever written; the partitions in use are found by their names alone."""
    store = store_factory(backend)
    ids = [id_in(p) for p in (3, 2048)]
    write(store, ids, times=30)
    kinds = _ListingKinds(store)
    got = StateLog(kinds, PARTITIONS).all_records()
    assert sorted(r.txn_id for r in got) == sorted(ids)
    assert kinds.children == [layout.STATE_LOG_PREFIX]
    assert layout.STATE_LOG_PREFIX not in kinds.full, kinds.full
