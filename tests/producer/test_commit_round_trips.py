"""What a commit waits for on a remote store, where every request costs a round trip:
the batch objects of one step upload side by side."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import read_all

import txlog
from txlog.partition_log import PartitionLog

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
    real = PartitionLog.write_data

    def write_data(plog: PartitionLog, table: Any) -> tuple[str, int]:
        barrier.wait()
        return real(plog, table)

    monkeypatch.setattr(PartitionLog, "write_data", write_data)
    p = lg.producer(transactional_id="tx", **{"linger.ms": 600_000})
    p.init_transactions()
    p.begin_transaction()
    for i in range(PARTITIONS):
        p.send("t", f"v{i}".encode(), partition=i)
    p.commit_transaction()
    p.close()
    assert sorted(read_all(lg, "t")) == [f"v{i}".encode() for i in range(PARTITIONS)]
