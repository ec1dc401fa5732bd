"""What a commit waits for on a remote store, where every request costs a round trip:
the batch objects of one step upload side by side, and the BEGIN entries go beside
PrepareCommit."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import read_all

import txlog
from txlog import layout
from txlog.coordinator import Coordinator
from txlog.errors import StorageError
from txlog.model import BEGIN
from txlog.partition_log import AppendSpec, PartitionLog

PARTITIONS = 8


def _remote_like(tmp_path: Path) -> txlog.Log:
    """A local store that the producer treats as remote (requests cost a round trip)."""
    lg = txlog.connect(str(tmp_path))
    lg.store.local_requests = False
    lg.create_topic("t", partitions=PARTITIONS)
    return lg


def test_a_commits_batch_objects_upload_side_by_side(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lg = _remote_like(tmp_path)
    # Every put waits until all eight are in flight: one after another, the first would
    # wait alone until the barrier times out and breaks, failing the commit.
    barrier = threading.Barrier(PARTITIONS, timeout=60)
    real = PartitionLog.write_object

    def write_object(plog: PartitionLog, table: Any, **kw: Any) -> Any:
        barrier.wait()
        return real(plog, table, **kw)

    monkeypatch.setattr(PartitionLog, "write_object", write_object)
    # (one object per partition: shared, the eight batches would be one object)
    p = lg.producer(transactional_id="tx", **{"linger.ms": 600_000,
                                              "batch.objects.shared": False})
    p.init_transactions()
    p.begin_transaction()
    for i in range(PARTITIONS):
        p.send("t", f"v{i}".encode(), partition=i)
    p.commit_transaction()
    p.close()
    assert sorted(read_all(lg, "t")) == [f"v{i}".encode() for i in range(PARTITIONS)]


def test_begin_entries_are_written_beside_prepare_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit whose batches are unsent: the BEGIN entries and PrepareCommit are in
    flight together (one round trip after the uploads), not one after the other."""
    lg = _remote_like(tmp_path)
    # The PrepareCommit write and both BEGIN entries wait for each other.
    barrier = threading.Barrier(3, timeout=60)
    real_append = PartitionLog.append
    real_prepare = Coordinator.prepare_end

    def append(plog: PartitionLog, spec: AppendSpec) -> Any:
        if spec.kind == BEGIN:
            barrier.wait()
        return real_append(plog, spec)

    def prepare_end(coord: Coordinator, *args: Any, **kwargs: Any) -> Any:
        if args[3]:  # a commit
            barrier.wait()
        return real_prepare(coord, *args, **kwargs)

    monkeypatch.setattr(PartitionLog, "append", append)
    monkeypatch.setattr(Coordinator, "prepare_end", prepare_end)
    # (decided after the uploads: a commit decided beside them writes no BEGIN entry)
    p = lg.producer(transactional_id="tx", **{"linger.ms": 600_000, "commit.inline.bytes": 0})
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"a", partition=0)
    p.send("t", b"b", partition=1)
    p.commit_transaction()
    p.close()
    assert sorted(read_all(lg, "t")) == [b"a", b"b"]


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "own-objects"])
def test_a_small_commit_is_decided_beside_its_uploads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: bool) -> None:
    """A commit whose small batches are unsent (commit.inline.bytes, the default): its
    PrepareCommit and its objects' puts (one shared object, or one per partition) are in
    flight together, one round trip, and no AddPartitions precedes it."""
    lg = _remote_like(tmp_path)
    barrier = threading.Barrier(2 if shared else 3, timeout=60)
    store_type = type(lg.store)
    real_put = store_type.put_new
    real_prepare = Coordinator.prepare_end
    added: list[Any] = []

    def put_new(store: Any, key: str, data: Any) -> None:
        if "/data/" in key or "/_shared/" in key:
            barrier.wait()
        real_put(store, key, data)

    def prepare_end(coord: Coordinator, *args: Any, **kwargs: Any) -> Any:
        if args[3]:  # a commit
            barrier.wait()
        return real_prepare(coord, *args, **kwargs)

    monkeypatch.setattr(store_type, "put_new", put_new)
    monkeypatch.setattr(Coordinator, "prepare_end", prepare_end)
    monkeypatch.setattr(Coordinator, "add_partitions",
                        lambda *a, **k: added.append(a))  # (must not be called)
    p = lg.producer(transactional_id="tx", **{"linger.ms": 600_000,
                                              "batch.objects.shared": shared})
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"a", partition=0)
    p.send("t", b"b", partition=1)
    p.commit_transaction()
    p.close()
    assert added == []
    assert sorted(read_all(lg, "t")) == [b"a", b"b"]
    assert len(lg.store.list("topics/t/_shared/")) == (1 if shared else 0)


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_a_failed_begin_entry_beside_a_landed_decision_still_commits_everywhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remote: bool) -> None:
    lg = _remote_like(tmp_path)
    lg.store.local_requests = not remote
    real_append = PartitionLog.append

    def append(plog: PartitionLog, spec: AppendSpec) -> Any:
        if spec.kind == BEGIN and plog.partition == 1:
            raise StorageError("injected: the BEGIN entry was not written")
        return real_append(plog, spec)

    monkeypatch.setattr(PartitionLog, "append", append)
    p = lg.producer(transactional_id="tx", retries=0, **{"linger.ms": 600_000})
    p.init_transactions()
    p.begin_transaction()
    futs = [p.send("t", f"v{i}".encode(), partition=i) for i in range(3)]
    p.commit_transaction()
    assert sorted(f.get(timeout=60).partition for f in futs) == [0, 1, 2]
    p.close()
    assert sorted(read_all(lg, "t")) == [b"v0", b"v1", b"v2"]


def test_a_new_ids_init_claims_its_producer_id_block_while_reading_the_state_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a process that holds no producer-id block yet, init_transactions() of a new
    transactional.id lists the pid blocks (and claims one) while it reads its state-log
    partition, instead of after."""
    _remote_like(tmp_path)
    lg = txlog.connect(str(tmp_path))  # a fresh client: no block, nothing loaded
    # The pid-block listing and the state-log's first listing wait for each other.
    barrier = threading.Barrier(2, timeout=60)
    store = lg.store
    real_list = store.list

    first: set[bool] = set()

    def listing(prefix: str, start_after: str | None = None) -> list[str]:
        kind = prefix == layout.PID_BLOCK_PREFIX
        if (kind or prefix.startswith(layout.TXN_PREFIX + "state/")) and kind not in first:
            first.add(kind)  # the first listing of each kind waits for the other's
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass
        return real_list(prefix, start_after)

    monkeypatch.setattr(store, "list", listing)
    p = lg.producer(transactional_id="fresh")
    p.init_transactions()
    p.close()
    assert not barrier.broken, "the pid-block listing waited for the state log's"


def test_a_young_state_log_partition_is_read_with_one_round_of_listings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """init_transactions() of a new transactional.id in a client that has not read its
    state-log partition: the checkpoints and the first entries are listed side by side,
    and a partition with no checkpoint and few entries needs no further listing."""
    lg0 = _remote_like(tmp_path)
    for _ in range(3):  # a few records in the partition that "fresh" hashes to
        lg0.producer(transactional_id="fresh").init_transactions()
    lg = txlog.connect(str(tmp_path))
    lg.store.local_requests = False
    barrier = threading.Barrier(2, timeout=60)
    store = lg.store
    real_list = store.list
    state_lists: list[str] = []

    def listing(prefix: str, start_after: str | None = None) -> list[str]:
        if prefix.startswith(layout.TXN_PREFIX + "state/"):
            state_lists.append(prefix)
            if len(state_lists) <= 2:  # the first two wait for each other
                barrier.wait()
        return real_list(prefix, start_after)

    monkeypatch.setattr(store, "list", listing)
    p = lg.producer(transactional_id="fresh")
    p.init_transactions()
    p.close()
    assert len(state_lists) == 2, state_lists
    # It read the records the earlier instances wrote: the epoch moved on past theirs.
    assert p.epoch == 3
