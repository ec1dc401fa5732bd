"""Retention, compaction and purges of topics whose batches live in shared objects: an
object goes only once every partition holding it released it (txlog.shared_deletion)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import txlog
from txlog import checksums, layout
from txlog.maintenance import apply_retention, compact_partition, maintain, purge
from txlog.model import COMMIT, DATA
from txlog.partition_log import AppendSpec
from txlog.records import TopicPartition, now_ms
from txlog.shared_objects import SharedSlice, encode_shared
from txlog.shared_objects import write_shared as write_shared_object

BACKENDS = ["local", pytest.param("s3", marks=pytest.mark.s3)]
DAY = 86_400_000
NOW = now_ms()


@pytest.fixture(autouse=True)
def _now_is_this_tests_start() -> None:
    """Entries are appended at the real time, so each test's NOW is taken as it starts: a
    module-level time goes stale when the suite runs long before reaching these tests."""
    global NOW
    NOW = now_ms()


@pytest.fixture(params=BACKENDS)
def root(request: pytest.FixtureRequest, store_factory: Any) -> tuple[str, dict[str, Any]]:
    url, options = store_factory.url(request.param)
    return url, options


def connect(root: tuple[str, dict[str, Any]]) -> txlog.Log:
    return txlog.connect(root[0], root[1] or None)


def write_shared(log: txlog.Log, topic: str, batches: dict[int, list[bytes]], *,
                 footer: bool = True) -> tuple[str, dict[int, SharedSlice]]:
    """A shared object of ``topic`` holding ``batches`` (partition -> values), as the
    producer writes one (``footer=False``: the same without its ``txlog.shared``
    footer): its key and each partition's slice."""
    tables = [(p, pa.table({"key": pa.array([None] * len(v), pa.binary()),
                            "value": pa.array(v, pa.binary())})) for p, v in batches.items()]
    if footer:
        slices = write_shared_object(log.store, topic, tables)
        return slices[0].key, {s.partition: s for s in slices}
    _, buf, slices = encode_shared(topic, tables)
    stripped = io.BytesIO()
    pf = pq.ParquetFile(pa.BufferReader(buf))
    with pq.ParquetWriter(stripped, pf.schema_arrow.remove_metadata()) as w:
        for i in range(pf.metadata.num_row_groups):
            w.write_table(pf.read_row_group(i))
    body = stripped.getvalue()
    key = layout.shared_key(topic, uuid.uuid4().hex + checksums.tag(body))
    log.store.put(key, body)
    return key, {s.partition: replace(s, key=key, nbytes=len(body)) for s in slices}


def append_plain(log: txlog.Log, tp: TopicPartition, s: SharedSlice, ts: int) -> None:
    log.partition_log(tp).append(AppendSpec(kind=DATA, count=0, parts=[
        (s.key, s.count, s.nbytes, ts, ts, False, s.row, s.object_rows)]))


def values(log: txlog.Log, tp: TopicPartition) -> list[bytes]:
    c = log.consumer(auto_offset_reset="earliest")
    c.assign([tp])
    out: list[bytes] = []
    while recs := c.poll(max_records=1000):
        out += [r.value for r in recs]
    return out


def markers(log: txlog.Log, topic: str, key: str) -> list[str]:
    name = key.rsplit("/", 1)[1]
    prefix = layout.release_markers_prefix(topic, name)
    return [k[len(prefix):] for k in log.store.list(prefix)]


def two_steps(log: txlog.Log, topic: str, *, p1_ts: int) -> tuple[str, str]:
    """Two producer steps of partitions 0 and 1, each one shared object: the first
    step's batch of partition 0 is old, of partition 1 at ``p1_ts``; the second step's
    are far in the future (no retention here reaches them)."""
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    s1, parts1 = write_shared(log, topic, {0: [b"a0", b"a1"], 1: [b"b0", b"b1", b"b2"]})
    append_plain(log, tp0, parts1[0], NOW - 3_600_000)
    append_plain(log, tp1, parts1[1], p1_ts)
    s2, parts2 = write_shared(log, topic, {0: [b"a2"], 1: [b"b3"]})
    append_plain(log, tp0, parts2[0], NOW + 100 * DAY)
    append_plain(log, tp1, parts2[1], NOW + 100 * DAY)
    return s1, s2


def test_retention_frees_a_shared_object_only_after_every_partition_dropped_it(
        root: tuple[str, dict[str, Any]]) -> None:
    log = connect(root)
    log.create_topic("r", partitions=2, config={"retention.ms": 60_000,
                                                "file.delete.delay.ms": 0})
    tp0, tp1 = TopicPartition("r", 0), TopicPartition("r", 1)
    s1, s2 = two_steps(log, "r", p1_ts=NOW + 10 * DAY)
    # Partition 0's retention passes the first step, partition 1's does not.
    rep = maintain(log, ["r"], compact=False, now=NOW + 120_000)
    assert [p.retained_from for p in rep.partitions] == [2, None]
    assert rep.failures == [] and rep.warnings == []
    assert log.store.exists(s1)
    assert markers(log, "r", s1) == ["0"]
    assert values(connect(root), tp1) == [b"b0", b"b1", b"b2", b"b3"]
    assert values(connect(root), tp0) == [b"a2"]
    # Partition 1's passes too: the object goes, then its markers.
    rep = maintain(log, ["r"], compact=False, now=NOW + 20 * DAY)
    assert [p.retained_from for p in rep.partitions] == [None, 3]
    assert [p.shared_objects_deleted for p in rep.partitions] == [0, 1]
    assert rep.shared_objects_deleted == 1
    assert not log.store.exists(s1) and markers(log, "r", s1) == []
    assert log.store.exists(s2) and markers(log, "r", s2) == []
    assert values(connect(root), tp1) == [b"b3"]
    assert values(connect(root), tp0) == [b"a2"]


def test_compaction_frees_a_shared_object_only_after_every_partition_compacted_it(
        root: tuple[str, dict[str, Any]]) -> None:
    log = connect(root)
    log.create_topic("c", partitions=2, config={"file.delete.delay.ms": 0})
    tp0, tp1 = TopicPartition("c", 0), TopicPartition("c", 1)
    s1, s2 = two_steps(log, "c", p1_ts=NOW)
    later = NOW + DAY
    assert compact_partition(log, tp0).compacted_batches == 2
    assert purge(log, tp0, now=later) == 2
    assert log.store.exists(s1) and log.store.exists(s2)
    assert markers(log, "c", s1) == ["0"] and markers(log, "c", s2) == ["0"]
    assert values(connect(root), tp1) == [b"b0", b"b1", b"b2", b"b3"]
    assert values(connect(root), tp0) == [b"a0", b"a1", b"a2"]
    assert compact_partition(log, tp1).compacted_batches == 2
    assert purge(log, tp1, now=later) == 2
    assert not log.store.exists(s1) and not log.store.exists(s2)
    assert markers(log, "c", s1) == [] and markers(log, "c", s2) == []
    assert log.store.list(layout.shared_prefix("c")) == []
    assert values(connect(root), tp1) == [b"b0", b"b1", b"b2", b"b3"]
    assert values(connect(root), tp0) == [b"a0", b"a1", b"a2"]


def test_a_commit_marker_rolled_forward_after_the_other_partition_released_still_reads(
        root: tuple[str, dict[str, Any]]) -> None:
    log = connect(root)
    log.create_topic("m", partitions=2, config={"retention.ms": 60_000,
                                                "file.delete.delay.ms": 0})
    tp0, tp1 = TopicPartition("m", 0), TopicPartition("m", 1)
    s1, parts = write_shared(log, "m", {0: [b"a0"], 1: [b"b0", b"b1"]})
    append_plain(log, tp0, parts[0], NOW - 3_600_000)
    # Partition 0 drops the object and releases it; partition 1 names it nowhere yet.
    maintain(log, ["m"], compact=False, now=NOW + 120_000)
    assert markers(log, "m", s1) == ["0"] and log.store.exists(s1)
    assert log.partition_log(tp1).refresh().high_watermark == 0
    # Long after, a roll-forward's COMMIT marker carries partition 1's part of it.
    s = parts[1]
    log.partition_log(tp1).append(AppendSpec(
        kind=COMMIT, count=0, producer_id=7, epoch=0, transactional=True, txn_id="late",
        parts=[(s.key, s.count, s.nbytes, NOW + 10 * DAY, NOW + 10 * DAY, False, s.row,
                s.object_rows)]))
    rep = maintain(log, ["m"], compact=False, now=NOW + 180_000)
    assert rep.failures == [] and log.store.exists(s1)
    c = connect(root).consumer(auto_offset_reset="earliest", isolation_level="read_committed")
    c.assign([tp1])
    assert [r.value for r in c.poll(max_records=100)] == [b"b0", b"b1"]
    # Once partition 1 drops it too, it goes.
    maintain(log, ["m"], compact=False, now=NOW + 20 * DAY)
    assert not log.store.exists(s1) and markers(log, "m", s1) == []


def test_a_shared_object_without_its_footer_is_never_deleted_and_warned_about(
        root: tuple[str, dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    log = connect(root)
    log.create_topic("d", partitions=2, config={"retention.ms": 60_000,
                                                "file.delete.delay.ms": 0})
    s1, parts = write_shared(log, "d", {0: [b"a0"], 1: [b"b0"]}, footer=False)
    for p in (0, 1):
        append_plain(log, TopicPartition("d", p), parts[p], NOW - 3_600_000)
    with caplog.at_level(logging.WARNING, logger="txlog.shared_deletion"):
        rep = maintain(log, ["d"], compact=False, now=NOW + 120_000)
    assert [p.retained_from for p in rep.partitions] == [1, 1]
    assert log.store.exists(s1) and markers(log, "d", s1) == ["0", "1"]
    assert rep.failures == [] and len(rep.warnings) == 1 and s1 in rep.warnings[0]
    assert any(s1 in r.getMessage() for r in caplog.records)


CHILD = """
import json, sys
import txlog
from txlog.maintenance import maintain
url, options, now = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
maintain(txlog.connect(url, options or None), ["k"], compact=False, now=now)
"""


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["after_shared_release:1", "after_shared_release:2",
                                   "after_shared_delete:1"])
def test_a_purge_killed_between_release_and_delete_is_finished_by_the_next_maintain(
        root: tuple[str, dict[str, Any]], crash: str) -> None:
    log = connect(root)
    log.create_topic("k", partitions=2, config={"retention.ms": 60_000,
                                                "file.delete.delay.ms": 0})
    tp0, tp1 = TopicPartition("k", 0), TopicPartition("k", 1)
    s1, s2 = two_steps(log, "k", p1_ts=NOW - 3_600_000)
    env = dict(os.environ, TXLOG_CRASH_AT=crash)
    proc = subprocess.run([sys.executable, "-c", CHILD, root[0], json.dumps(root[1]),
                           str(NOW + 120_000)], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    # Killed after partition 0's release, after partition 1's (before it deleted), or
    # after the deletion (before the markers'): the object or its markers are left.
    assert log.store.exists(s1) or markers(log, "k", s1) != []
    rep = maintain(connect(root), ["k"], compact=False, now=NOW + 120_000)
    assert rep.failures == []
    assert not log.store.exists(s1) and markers(log, "k", s1) == []
    assert log.store.exists(s2)
    assert values(connect(root), tp0) == [b"a2"] and values(connect(root), tp1) == [b"b3"]


def test_concurrent_purges_of_every_partition_delete_the_object_once_all_released(
        root: tuple[str, dict[str, Any]]) -> None:
    log = connect(root)
    n = 4
    log.create_topic("q", partitions=n, config={"retention.ms": 60_000,
                                                "file.delete.delay.ms": 0})
    s1, parts = write_shared(log, "q", {p: [b"v%d" % p] for p in range(n)})
    for p in range(n):
        append_plain(log, TopicPartition("q", p), parts[p], NOW - 3_600_000)
        assert apply_retention(log, TopicPartition("q", p), now=NOW + 120_000) == 1
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def purge_one(p: int) -> None:
        try:
            mine = connect(root)  # a client of its own, as separate maintainers are
            barrier.wait()
            purge(mine, TopicPartition("q", p), now=NOW + 120_000)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=purge_one, args=(p,)) for p in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert not log.store.exists(s1) and markers(log, "q", s1) == []


def test_deleting_a_topic_deletes_its_shared_objects_and_markers(
        root: tuple[str, dict[str, Any]]) -> None:
    log = connect(root)
    log.create_topic("x", partitions=2, config={"retention.ms": 60_000,
                                                "file.delete.delay.ms": 0})
    two_steps(log, "x", p1_ts=NOW + 10 * DAY)
    maintain(log, ["x"], compact=False, now=NOW + 120_000)
    assert log.store.list(layout.released_prefix("x")) != []
    log.delete_topic("x")
    assert log.store.list(layout.topic_root("x")) == []


def test_txlog_maintain_warns_about_a_damaged_shared_object_and_reports_deletions(
        root: tuple[str, dict[str, Any]]) -> None:
    log = connect(root)
    log.create_topic("w", partitions=2, config={"file.delete.delay.ms": 0})
    bad, bad_parts = write_shared(log, "w", {0: [b"a0"], 1: [b"b0"]}, footer=False)
    good, good_parts = write_shared(log, "w", {0: [b"a1"], 1: [b"b1"]})
    for p in (0, 1):
        append_plain(log, TopicPartition("w", p), bad_parts[p], NOW)
        append_plain(log, TopicPartition("w", p), good_parts[p], NOW)
    env = {k: v for k, v in os.environ.items()
           if k not in ("TXLOG_CONF", "TXLOG_CRASH_AT", "TXLOG_STORAGE_OPTIONS")}
    env.update(TXLOG_ROOT=root[0], TXLOG_STORAGE_OPTIONS=json.dumps(root[1]))
    # Each partition compacts both objects into a segment of its own and releases them.
    proc = subprocess.run([sys.executable, "-m", "txlog.cli", "maintain", "--topic", "w",
                           "--no-progress"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("txlog: warning: ")]
    assert len(warnings) == 1 and bad in warnings[0], proc.stderr
    assert "Deleted 1 shared object(s)" in proc.stdout, proc.stdout
    assert log.store.exists(bad) and not log.store.exists(good)
    assert markers(log, "w", bad) == ["0", "1"] and markers(log, "w", good) == []
    assert values(connect(root), TopicPartition("w", 1)) == [b"b0", b"b1"]


def test_shared_objects_a_producer_wrote_go_once_every_partition_compacted_them(
        root: tuple[str, dict[str, Any]]) -> None:
    log = connect(root)
    log.create_topic("pw", partitions=3, config={"file.delete.delay.ms": 0})
    prod = log.producer(transactional_id="w")
    prod.init_transactions()
    want: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    for n in range(5):
        prod.begin_transaction()
        for p in (0, 1, 2):
            prod.send("pw", b"%d-%d" % (n, p), partition=p)
        prod.flush()  # one step: one shared object of the three batches
        prod.send("pw", b"%d-last" % n, partition=n % 3)
        if n == 2:
            prod.abort_transaction()
            continue
        prod.commit_transaction()
        for p in (0, 1, 2):
            want[p].append(b"%d-%d" % (n, p))
        want[n % 3].append(b"%d-last" % n)
    prod.close()
    shared = [k for k in log.store.list(layout.shared_prefix("pw")) if layout.is_shared(k)]
    assert len(shared) >= 5, shared
    rep = maintain(log, ["pw"])
    assert rep.failures == [] and rep.warnings == []
    left = log.store.list(layout.shared_prefix("pw"))
    assert left == [], left
    assert rep.shared_objects_deleted == len(shared)
    for p in (0, 1, 2):
        assert values(connect(root), TopicPartition("pw", p)) == want[p]
