"""buffer.memory bounds every batch a producer holds, the ones still filling as well as the
ones queued for writing (Kafka's pool has both): with many partitions their open batches
alone would otherwise hold up to partitions x batch.size."""

from __future__ import annotations

import uuid

import pytest

import txlog

PARTITIONS = 16
RECORD = 1000  # bytes of value per record
BATCH_SIZE = 64_000
BUFFER = 256_000  # four batch sizes: far below PARTITIONS x BATCH_SIZE


@pytest.mark.parametrize("transactional", [False, True])
def test_buffered_bytes_never_exceed_buffer_memory(transactional: bool) -> None:
    log = txlog.connect(f"memory://buffer/{uuid.uuid4().hex}")
    log.create_topic("t", PARTITIONS)
    p = log.producer(transactional_id="tx" if transactional else None,
                     batch_size=BATCH_SIZE, buffer_memory=BUFFER, linger_ms=60_000)
    if transactional:
        p.init_transactions()
        p.begin_transaction()
    value = b"v" * RECORD
    sent = 2 * PARTITIONS * BATCH_SIZE // RECORD
    worst = 0
    for i in range(sent):
        p.send("t", value, partition=i % PARTITIONS)
        m = p.metrics()
        worst = max(worst, m["buffered_bytes"])
        # (after a send returns: what it holds, filling and queued, fits buffer.memory)
        assert m["buffered_bytes"] <= BUFFER, (i, m)
    if transactional:
        p.commit_transaction()
    p.flush()
    assert p.metrics()["buffered_bytes"] == 0
    p.close()
    # Every record arrived once, in order per partition.
    c = log.consumer()
    c.assign([txlog.TopicPartition("t", i) for i in range(PARTITIONS)])
    c.seek_to_beginning()
    got: dict[int, list[int]] = {}
    while batch := c.poll(max_records=10_000):
        for r in batch:
            got.setdefault(r.partition, []).append(r.offset)
    assert sum(len(v) for v in got.values()) == sent
    assert all(v == list(range(len(v))) for v in got.values())
    assert worst > BUFFER // 2  # the bound was reached, not trivially met
