"""A producer process SIGKILLed at every step of the transaction protocol.

After recovery (a new instance's init_transactions, or only a reader resolving the LSO
once the transaction times out) each transaction is visible on all its partitions or on
none, and no LSO stays stuck.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

import txlog
from txlog import TopicPartition

#: Kills processes (or runs many): outside the fast lane.
pytestmark = pytest.mark.slow

CHILD = str(Path(__file__).with_name("crash_child.py"))
# (crash point, which hit): every step of one transaction, in the second transaction.
# Per transaction: 2 AddPartitions calls (offsets partition, then the 5 data partitions
# at commit), 1 append (the offsets), 1 PrepareCommit, and beside it (after it, on a local
# store) 5 BEGIN entries (the data partitions: their batches are left to the COMMIT
# markers), then 6 markers, 1 Complete.
POINTS = [
    ("after_add_partitions", 3), ("after_data_append", 2), ("after_add_partitions", 4),
    ("after_decision", 2),
    ("after_begin", 6), ("after_begin", 8), ("after_begin", 10), ("after_prepare", 2),
    ("after_marker", 7), ("after_marker", 9), ("after_marker", 12), ("before_complete", 2),
]
# The same with commit.appends.batches=false (format version 2): 6 appends, no BEGIN.
OLD_POINTS = [("after_data_append", 7), ("after_data_append", 10), ("after_data_append", 12),
              ("after_prepare", 2), ("after_marker", 9)]
# A commit decided beside its uploads (commit.inline.bytes), an object per partition: per
# transaction 1 AddPartitions (the offsets partition; the 5 data partitions are registered
# by the PrepareCommit itself), 1 append (the offsets), 1 PrepareCommit, no BEGIN entry, 5
# uploads (armed, they wait for the decision: after_inline_decision is hit before each),
# 6 markers, 1 Complete.  With shared objects, 2 uploads (one per topic).
INLINE_POINTS = [
    ("after_add_partitions", 2), ("after_data_append", 2), ("after_decision", 2),
    ("after_inline_decision", 6), ("after_inline_decision", 8),
    ("after_inline_decision", 10), ("after_prepare", 2), ("after_marker", 8),
    ("before_complete", 2)]
#: Those where the second transaction is decided (it must end visible once recovered).
INLINE_DECIDED = [p for p in INLINE_POINTS if p[0] not in (
    "after_add_partitions", "after_data_append")]
TOPICS = {"a": 3, "b": 2}


def run_child(root: str, crash: str | None, timeout_ms: int, count: int = 3,
              old: bool = False, mode: str = "plain", shared: bool = True) -> int:
    """Run crash_child.py; ``mode`` "plain" (the default here: the decision waits for
    the uploads, as the points above count) or "new" (a commit decided beside its
    uploads, INLINE_POINTS); ``shared``: a topic's batches of a step in one shared
    object (the default), else an object per partition."""
    env = dict(os.environ)
    env.pop("TXLOG_CRASH_AT", None)
    if crash:
        env["TXLOG_CRASH_AT"] = crash
    proc = subprocess.run([sys.executable, CHILD, root, "tx", str(count), str(timeout_ms),
                           "old" if old else mode, "shared" if shared else "own"],
                          env=env, capture_output=True, timeout=120)
    return proc.returncode


def visible_by_txn(log: txlog.Log) -> dict[int, set[str]]:
    seen: dict[int, set[str]] = defaultdict(set)
    c = log.consumer(auto_offset_reset="earliest")
    c.subscribe(list(TOPICS))
    values: list[bytes] = []
    while batch := c.poll(10_000):
        values.extend(r.value for r in batch)
    assert len(values) == len(set(values)), "duplicate records"
    for v in values:
        n, topic, part = v.decode().split(":")
        seen[int(n)].add(f"{topic}:{part}")
    return seen


def assert_atomic_and_unstuck(log: txlog.Log) -> dict[int, set[str]]:
    seen = visible_by_txn(log)
    every = {f"{t}:{p}" for t, n in TOPICS.items() for p in range(n)}
    for n, parts in seen.items():
        assert parts == every, f"transaction {n} is torn: visible only on {sorted(parts)}"
    c = log.consumer()
    for t, n in TOPICS.items():
        for p in range(n):
            tp = TopicPartition(t, p)
            st = log.partition_log(tp).refresh()
            assert c.last_stable_offset(tp) == st.high_watermark, f"LSO of {tp} stuck"
    return seen


@pytest.mark.parametrize("point,hit,old", [(p, h, False) for p, h in POINTS]
                         + [(p, h, True) for p, h in OLD_POINTS],
                         ids=[f"{p}:{h}" for p, h in POINTS]
                         + [f"v2-{p}:{h}" for p, h in OLD_POINTS])
def test_crash_then_new_instance_recovers(tmp_path: Path, point: str, hit: int,
                                          old: bool) -> None:
    root = str(tmp_path)
    log = txlog.connect(root)
    for t, n in TOPICS.items():
        log.create_topic(t, partitions=n)
    rc = run_child(root, f"{point}:{hit}", timeout_ms=60_000, old=old)
    assert rc == -9, f"child was not killed at {point}:{hit} (rc={rc})"
    # Recovery by a new instance of the same transactional.id.
    p = txlog.connect(root).producer(transactional_id="tx")
    p.init_transactions()
    seen = assert_atomic_and_unstuck(txlog.connect(root))
    assert 0 in seen  # the first transaction committed before the crash
    committed = txlog.connect(root).consumer(group_id="g").committed([TopicPartition("a", 0)])
    assert committed[TopicPartition("a", 0)] == max(seen) + 1  # offsets moved with the data


@pytest.mark.parametrize("point,hit,old", [
    ("after_decision", 2, False), ("after_begin", 8, False), ("after_prepare", 2, False),
    ("after_marker", 9, False),
    ("after_data_append", 10, True), ("after_prepare", 2, True)])
def test_crash_then_reader_alone_recovers(tmp_path: Path, point: str, hit: int,
                                          old: bool) -> None:
    """Also where the transaction's batches are left to its COMMIT markers: a reader
    meets the transaction at its BEGIN entries and rolls the commit forward."""
    root = str(tmp_path)
    log = txlog.connect(root)
    for t, n in TOPICS.items():
        log.create_topic(t, partitions=n)
    # The timeout must outlast the child's own (healthy) transactions on a loaded machine.
    assert run_child(root, f"{point}:{hit}", timeout_ms=3000, old=old) == -9
    # No producer comes back: readers alone must move every LSO past the wreck.
    deadline = time.monotonic() + 90
    reader = txlog.connect(root).consumer()
    tps = [TopicPartition(t, p) for t, n in TOPICS.items() for p in range(n)]
    while time.monotonic() < deadline:
        if all(reader.last_stable_offset(tp) ==
               log.partition_log(tp).refresh().high_watermark for tp in tps):
            break
    assert_atomic_and_unstuck(txlog.connect(root))


def test_maintenance_sweep_finishes_abandoned_transactions(tmp_path: Path) -> None:
    root = str(tmp_path)
    log = txlog.connect(root)
    for t, n in TOPICS.items():
        log.create_topic(t, partitions=n)
    assert run_child(root, "after_prepare:2", timeout_ms=60_000) == -9
    swept = txlog.connect(root).coordinator.sweep()  # Prepare* needs no timeout
    assert swept == ["tx"]
    seen = assert_atomic_and_unstuck(txlog.connect(root))
    assert set(seen) == {0, 1}  # the prepared commit was rolled forward


def test_describe_shows_the_lso_a_reader_gets_after_a_crash_in_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer killed after PrepareCommit leaves the LSO held until someone rolls the
    commit forward; ``describe_topic`` (``txlog topics describe``) does so, as a reader
    would, instead of showing the stale LSO.  Without write access it still answers,
    with the LSO as last written."""
    root = str(tmp_path)
    log = txlog.connect(root)
    for t, n in TOPICS.items():
        log.create_topic(t, partitions=n)
    assert run_child(root, "after_prepare:2", timeout_ms=60_000) == -9
    fresh = txlog.connect(root)
    held = [p for t in TOPICS for p in range(TOPICS[t])
            if fresh.partition_log(TopicPartition(t, p)).refresh().open_txns]
    assert held, "the crash should leave a prepared transaction holding some LSO"
    read_only = txlog.connect(root)

    def refuse(key: str, data: bytes) -> bool:
        raise PermissionError(13, "read-only credentials", key)

    monkeypatch.setattr(read_only.store, "put_if_absent", refuse)
    stale = [p for t in TOPICS for p in read_only.describe_topic(t)["partition_info"]
             if p["open_transactions"]]
    # (the transaction holds them by BEGIN entries: the LSO is the high watermark, as its
    # batches there come with the COMMIT markers, but the open transaction shows)
    assert stale and all(p["last_stable_offset"] <= p["high_watermark"] for p in stale)
    for t in TOPICS:
        for part in fresh.describe_topic(t)["partition_info"]:
            assert part["last_stable_offset"] == part["high_watermark"], (t, part)
            assert part["open_transactions"] == 0
    assert set(assert_atomic_and_unstuck(txlog.connect(root))) == {0, 1}


def test_a_decided_commit_without_begin_entries_is_rolled_forward_by_a_sweep(
        tmp_path: Path) -> None:
    """Killed once PrepareCommit landed, before any BEGIN entry beside it: no reader meets
    the transaction, so it is invisible everywhere (never torn) and holds no LSO, until
    the producer's next instance or `txlog maintain` rolls it forward, everywhere."""
    root = str(tmp_path)
    log = txlog.connect(root)
    for t, n in TOPICS.items():
        log.create_topic(t, partitions=n)
    assert run_child(root, "after_decision:2", timeout_ms=60_000) == -9
    assert set(assert_atomic_and_unstuck(txlog.connect(root))) == {0}
    assert txlog.connect(root).coordinator.sweep() == ["tx"]
    assert set(assert_atomic_and_unstuck(txlog.connect(root))) == {0, 1}


READER = """
import sys, txlog
c = txlog.connect(sys.argv[1]).consumer(auto_offset_reset="earliest")
c.subscribe(["a", "b"])
while c.poll(2_000):
    pass
"""


def test_a_roll_forward_killed_between_markers_leaves_no_partition_unheld(
        tmp_path: Path) -> None:
    """PrepareCommit landed with BEGIN entries in topic a only (the producer was killed
    after its third BEGIN); a reader rolling the commit forward is killed after four of
    its six markers.  The partitions with no BEGIN get their markers first, so every
    partition still unmarked holds its LSO at the transaction and the next reader
    finishes it: the transaction ends visible on all partitions."""
    root = str(tmp_path)
    log = txlog.connect(root)
    for t, n in TOPICS.items():
        log.create_topic(t, partitions=n)
    assert run_child(root, "after_begin:8", timeout_ms=60_000) == -9
    env = dict(os.environ, TXLOG_CRASH_AT="after_marker:4")
    reader = subprocess.run([sys.executable, "-c", READER, root], env=env,
                            capture_output=True, timeout=120)
    assert reader.returncode == -9, reader.stderr.decode()[-2000:]
    assert set(assert_atomic_and_unstuck(txlog.connect(root))) == {0, 1}


def test_only_the_committing_producers_markers_carry_copies(tmp_path: Path) -> None:
    """Killed between its markers: the COMMIT markers it wrote carry copies of their
    batch objects (entry format version 4); those a reader writes when it rolls the
    commit forward cannot (it lacks the bytes) and name the objects only; either way the
    transaction is visible on every partition."""
    import json

    root = str(tmp_path)
    log = txlog.connect(root)
    for t, n in TOPICS.items():
        log.create_topic(t, partitions=n)
    # (an object per partition: entries never carry copies of a shared object)
    assert run_child(root, "after_marker:9", timeout_ms=3000, shared=False) == -9
    deadline = time.monotonic() + 90
    reader = txlog.connect(root).consumer()
    tps = [TopicPartition(t, p) for t, n in TOPICS.items() for p in range(n)]
    while time.monotonic() < deadline:
        if all(reader.last_stable_offset(tp) ==
               log.partition_log(tp).refresh().high_watermark for tp in tps):
            break
    seen = assert_atomic_and_unstuck(txlog.connect(root))
    assert sorted(seen) == [0, 1]
    by_txn: dict[tuple[int, int], list[bool]] = defaultdict(list)
    for tp in tps:
        for key in log.store.list(f"topics/{tp.topic}/{tp.partition}/log/"):
            e = json.loads(log.store.get(key))
            if e["kind"] == "commit":
                assert (e["v"] == 4) == ("inline" in e)
                by_txn[(e["producer_id"], e["epoch"])].append("inline" in e)
    (first, second) = (by_txn[k] for k in sorted(by_txn, key=lambda k: k[1]))
    assert first == [True] * 5  # written by the producer, every one with its copy
    assert sorted(second) == [False, False, False, True, True]  # 2 before the kill


def _killed_inline(tmp_path: Path, point: str, hit: int, timeout_ms: int = 60_000,
                   shared: bool = False) -> str:
    root = str(tmp_path)
    log = txlog.connect(root)
    for t, n in TOPICS.items():
        log.create_topic(t, partitions=n)
    rc = run_child(root, f"{point}:{hit}", timeout_ms=timeout_ms, mode="new", shared=shared)
    assert rc == -9, f"child was not killed at {point}:{hit} (rc={rc})"
    return root


def _objects_missing(root: str) -> int:
    """Batch objects of the killed transaction its uploads never wrote (named by the
    PrepareCommit's copies)."""
    log = txlog.connect(root)
    rec = log.coordinator.record("tx")
    assert rec is not None
    return sum(not log.store.exists(k) for k, _ in rec.inline)


@pytest.mark.parametrize("point,hit", INLINE_POINTS, ids=[f"{p}:{h}" for p, h in INLINE_POINTS])
def test_inline_commit_crash_then_new_instance_recovers(tmp_path: Path, point: str,
                                                        hit: int) -> None:
    """A commit decided beside its uploads, killed at each step: a new instance leaves
    the second transaction visible on all its partitions once (if it was decided), or
    nowhere; never torn, never twice."""
    root = _killed_inline(tmp_path, point, hit)
    p = txlog.connect(root).producer(transactional_id="tx")
    p.init_transactions()
    seen = assert_atomic_and_unstuck(txlog.connect(root))
    assert set(seen) == ({0, 1} if (point, hit) in INLINE_DECIDED else {0})
    committed = txlog.connect(root).consumer(group_id="g").committed([TopicPartition("a", 0)])
    assert committed[TopicPartition("a", 0)] == max(seen) + 1


@pytest.mark.parametrize("hit", [6, 8, 10])
def test_inline_commit_crash_before_uploads_then_maintain_recovers(tmp_path: Path,
                                                                   hit: int) -> None:
    """Killed once its PrepareCommit (with the copies) landed and before some or all of
    its uploads: `txlog maintain` writes the missing objects from the copies, then the
    markers, and the transaction is visible on all its partitions exactly once."""
    root = _killed_inline(tmp_path, "after_inline_decision", hit)
    assert _objects_missing(root) == 5 - (hit - 6)
    assert set(assert_atomic_and_unstuck(txlog.connect(root))) == {0}  # not yet visible
    assert txlog.connect(root).coordinator.sweep() == ["tx"]
    assert set(assert_atomic_and_unstuck(txlog.connect(root))) == {0, 1}


def test_inline_commit_crash_before_uploads_then_a_reader_recovers(tmp_path: Path) -> None:
    """Killed before any upload of its decided commit: a reader that meets the
    transaction (the offsets partition holds its LSO at the transaction's offsets
    entry) rolls it forward, writing the objects from the copies, and every partition
    then shows it once."""
    root = _killed_inline(tmp_path, "after_inline_decision", 6)
    assert _objects_missing(root) == 5
    committed = txlog.connect(root).consumer(group_id="g").committed([TopicPartition("a", 0)])
    assert committed[TopicPartition("a", 0)] == 2  # the second transaction's offsets
    assert _objects_missing(root) == 0
    assert set(assert_atomic_and_unstuck(txlog.connect(root))) == {0, 1}


@pytest.mark.parametrize("which", [0, -1], ids=["first", "last"])
def test_a_damaged_copy_of_a_missing_object_stops_the_roll_forward(
        tmp_path: Path, which: int) -> None:
    """Killed before any upload of its decided commit, and the record's copy of one
    object then damaged: the roll-forward refuses (CorruptObjectError naming the object)
    before any marker, rather than append a marker that names an object that does not
    exist: the transaction is visible on none of its partitions, not torn across them."""
    import json

    from txlog.errors import CorruptObjectError

    root = _killed_inline(tmp_path, "after_inline_decision", 6)
    log = txlog.connect(root)
    before = dict(visible_by_txn(txlog.connect(root)))
    part = log.coordinator.state_log.partition_for("tx")
    part.refresh()
    slot = part.next_slot - 1
    key = part.entry_key(slot)
    body = json.loads(log.store.get(key))
    victim = sorted(body["record"]["inline"])[which]
    body["record"]["inline"][victim] = "AAAA"  # (valid base64, wrong bytes)
    log.store.put(key, json.dumps(body).encode())
    with pytest.raises(CorruptObjectError, match=victim.split("/")[-1]):
        txlog.connect(root).coordinator.sweep()
    topic, p = victim.split("/")[1], int(victim.split("/")[2])
    st = txlog.connect(root).partition_log(TopicPartition(topic, p)).refresh()
    assert all(b != victim for b in st.batches.data)
    assert not log.store.exists(victim)
    assert dict(visible_by_txn(txlog.connect(root))) == before


@pytest.mark.parametrize("hit", [3, 4])
def test_inline_commit_of_shared_objects_crash_before_uploads_then_recovers(
        tmp_path: Path, hit: int) -> None:
    """A commit decided beside the uploads of its two shared objects (topics a and b),
    killed before one or both: its PrepareCommit carries their copies, and `txlog
    maintain` writes them, then the markers naming each partition's rows; the
    transaction is visible on all five partitions exactly once."""
    root = _killed_inline(tmp_path, "after_inline_decision", hit, shared=True)
    rec = txlog.connect(root).coordinator.record("tx")
    assert rec is not None and len(rec.inline) == 2
    assert all("/_shared/" in k for k, _ in rec.inline)
    assert _objects_missing(root) == 2 - (hit - 3)
    assert set(assert_atomic_and_unstuck(txlog.connect(root))) == {0}  # not yet visible
    assert txlog.connect(root).coordinator.sweep() == ["tx"]
    assert _objects_missing(root) == 0
    assert set(assert_atomic_and_unstuck(txlog.connect(root))) == {0, 1}


def test_inline_commit_of_shared_objects_crash_then_a_reader_recovers(
        tmp_path: Path) -> None:
    root = _killed_inline(tmp_path, "after_inline_decision", 3, shared=True)
    assert _objects_missing(root) == 2
    committed = txlog.connect(root).consumer(group_id="g").committed([TopicPartition("a", 0)])
    assert committed[TopicPartition("a", 0)] == 2  # the second transaction's offsets
    assert _objects_missing(root) == 0
    assert set(assert_atomic_and_unstuck(txlog.connect(root))) == {0, 1}
