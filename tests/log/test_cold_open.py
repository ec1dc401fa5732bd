"""A process that opens a partition for the first time (a Spark commit worker, a new
consumer) pays for the entries since the last checkpoint; that cost stays bounded by
recent work, not by history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

import txlog
from txlog import TopicPartition, layout
from txlog.partition_log import TAIL_CHECKPOINT
from txlog.records import kafka_table


def test_a_long_tail_is_replayed_once_then_checkpointed(tmp_path: Path) -> None:
    root = str(tmp_path)
    log = txlog.connect(root)
    log.create_topic("t", partitions=1)
    p = log.producer()
    for i in range(TAIL_CHECKPOINT + 5):  # one entry each, far below the interval
        p.send("t", b"%d" % i, partition=0)
        p.flush()
    tp = TopicPartition("t", 0)
    first = txlog.connect(root)
    first.store.counter.reset()
    st = first.partition_log(tp).refresh()
    assert st.next_slot == TAIL_CHECKPOINT + 5
    assert first.store.counter.snapshot()["requests"]["get"] >= TAIL_CHECKPOINT + 5
    second = txlog.connect(root)
    second.store.counter.reset()
    assert second.partition_log(tp).refresh().next_slot == st.next_slot
    # The first cold open left a checkpoint: the second reads it (and the topic's
    # metadata), no entry.
    assert second.store.counter.snapshot()["requests"]["get"] <= 2
    c = second.consumer(auto_offset_reset="earliest")
    c.assign([tp])
    assert [r.value for r in c.poll(1000)] == [b"%d" % i for i in range(TAIL_CHECKPOINT + 5)]


def test_spark_commits_in_one_worker_read_only_new_entries(tmp_path: Path,
                                                           monkeypatch: Any) -> None:
    """commit() runs in a Python worker that Spark reuses: later commits there must not
    replay every partition's tail again (the requests of a 32-partition commit on S3 grew
    by 60 per commit before)."""
    from spark_ext import staging
    from spark_ext.write_options import parse_write_options
    from spark_ext.writer import commit_staged, new_staging_id
    from txlog.storage.local import LocalStore

    calls = {"get": 0}
    real_get = LocalStore.get

    def counting_get(self: LocalStore, key: str) -> bytes:
        calls["get"] += 1
        return real_get(self, key)

    monkeypatch.setattr(LocalStore, "get", counting_get)

    url = str(tmp_path)
    setup = txlog.connect(url)
    setup.create_topic("t", partitions=4)
    info = setup.topic("t")
    wo = parse_write_options({"path": url, "topic": "t"}, streaming=False)
    gets = []
    for _ in range(12):
        txn = new_staging_id()
        spec = staging.StageSpec(url=url, storage_options={}, txn=txn, topic="t",
                                 targets={"t": staging.TopicTarget("t", 4, True, info.schema)},
                                 columns=["value", "partition"])
        stager = staging.Stager(spec, task=0, attempt_id=0, attempt=0)
        for part in range(4):
            stager.add(pa.record_batch({"value": pa.array([b"v"] * 3),
                                        "partition": pa.array([part] * 3, pa.int32())}))
        files = stager.finish()
        before = calls["get"]
        res = commit_staged(wo, files, [txn], ["t"])  # every store the commit opens
        assert res.files == 4 and res.skipped is None
        gets.append(calls["get"] - before)
    assert max(gets[1:]) <= gets[1] + 2, gets  # flat, not growing with each commit
    c = txlog.connect(url).consumer(auto_offset_reset="earliest")
    c.assign([TopicPartition("t", p) for p in range(4)])
    got = []
    while batch := c.poll(1000):
        got.extend(batch)
    assert len(got) == 12 * 4 * 3


def test_a_checkpoint_with_a_batch_open_outside_any_transaction_is_replayed(
        tmp_path: Path) -> None:
    """txlog 0.1 wrote a DATA entry of no records for an empty send_batch(); its commit
    then marked only that one and left the next batch (same offset) open with no open
    transaction, and checkpoints kept it so: read_committed never returned those
    records.  Such a checkpoint is refused, and the log replayed, which commits them."""
    from txlog.checkpoint import encode_checkpoint
    from txlog.model import COMMIT, DATA
    from txlog.partition_log import AppendSpec
    from txlog.partition_state import COMMITTED, OPEN

    lg = txlog.connect(str(tmp_path))
    lg.create_topic("t", partitions=1)
    tp = TopicPartition("t", 0)
    plog = lg.partition_log(tp)
    key, nbytes = plog.write_data(kafka_table([(None, f"v{i}".encode(), None, 5)
                                               for i in range(3)]))
    empty, _ = plog.write_data(kafka_table([]))
    for spec in (AppendSpec(kind=DATA, count=0, producer_id=7, epoch=0, transactional=True,
                            txn_id="x", data=empty),
                 AppendSpec(kind=DATA, count=3, producer_id=7, epoch=0, transactional=True,
                            txn_id="x", data=key, nbytes=nbytes),
                 AppendSpec(kind=COMMIT, count=1, producer_id=7, epoch=0,
                            transactional=True)):
        plog.append(spec)
    stranded = plog.refresh()
    assert stranded.batches.status == [COMMITTED, COMMITTED]
    stranded.batches.status[1] = OPEN  # as 0.1's commit left it
    lg.store.put(layout.checkpoint_key("t", 0, stranded.next_slot),
                 encode_checkpoint(stranded))
    fresh = txlog.connect(str(tmp_path))
    c = fresh.consumer(auto_offset_reset="earliest")
    c.assign([tp])
    assert [r.value for r in c.poll(10_000)] == [b"v0", b"v1", b"v2"]
    assert fresh.partition_log(tp).current().batches.status == [COMMITTED, COMMITTED]
