"""txlog.admin: find-hanging (hanging, orphaned, stuck-prepare), abort, producers, groups."""

from __future__ import annotations

import uuid

import pytest

import txlog
from txlog import admin
from txlog.errors import (
    GroupIdNotFoundError,
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionalIdNotFoundError,
)
from txlog.model import DATA
from txlog.partition_log import AppendSpec
from txlog.records import TopicPartition, kafka_table, now_ms
from txlog.txn_state import PREPARE_COMMIT

T0 = TopicPartition("o", 0)
T1 = TopicPartition("o", 1)


@pytest.fixture
def log() -> txlog.Log:
    lg = txlog.connect(f"memory://admin-tests/{uuid.uuid4().hex}")
    lg.create_topic("o", partitions=2)
    return lg


def _values(lg: txlog.Log, topic: str = "o") -> list[bytes]:
    c = lg.consumer(auto_offset_reset="earliest")
    c.subscribe([topic])
    return sorted(r.value for r in c.poll(max_records=10_000))


def _stray_write(lg: txlog.Log, tp: TopicPartition, pid: int, epoch: int, txn_id: str) -> int:
    """A transactional batch on ``tp`` that its transaction never registered (a zombie's
    or a buggy client's write): the coordinator will never send a marker there."""
    plog = lg.partition_log(tp)
    key, nbytes = plog.write_data(kafka_table([(None, b"stray", None, None)]))
    return plog.append(AppendSpec(kind=DATA, count=1, producer_id=pid, epoch=epoch,
                                  transactional=True, txn_id=txn_id, data=key,
                                  nbytes=nbytes)).base_offset


def test_orphaned_after_the_transaction_moved_on(log: txlog.Log) -> None:
    p = log.producer(transactional_id="z")
    p.init_transactions()
    p.begin_transaction()
    p.send("o", b"good", partition=0)
    p.flush()
    stray_at = _stray_write(log, T1, p.producer_id, p.epoch, "z")
    pid, epoch = p.producer_id, p.epoch
    p.commit_transaction()  # markers go to o-0 only

    found = admin.find_hanging(log)
    assert [(h["kind"], h["topic"], h["partition"], h["start_offset"]) for h in found] == [
        ("orphaned", "o", 1, stray_at)]
    assert "moved on" in found[0]["reason"]
    assert log.partition_log(T1).refresh().last_stable_offset == stray_at

    res = admin.abort_partition_txn(log, T1, producer_id=pid, producer_epoch=epoch)
    assert res["action"].startswith("aborted on this partition")
    assert res["lso_after"] == log.partition_log(T1).refresh().high_watermark
    assert admin.find_hanging(log, max_transaction_timeout_ms=0) == []
    assert _values(log) == [b"good"]


def test_orphaned_unregistered_partition_aborts_the_live_transaction(log: txlog.Log) -> None:
    p = log.producer(transactional_id="u")
    p.init_transactions()
    p.begin_transaction()
    p.send("o", b"in-flight", partition=0)
    p.flush()
    stray_at = _stray_write(log, T1, p.producer_id, p.epoch, "u")
    (h,) = admin.find_hanging(log)
    assert (h["kind"], h["partition"], h["state"]) == ("orphaned", 1, "Ongoing")
    assert "never registered" in h["reason"]

    res = admin.abort_partition_txn(log, T1, start_offset=stray_at)
    assert "'u' aborted (producer fenced)" in res["action"]
    for tp in (T0, T1):
        st = log.partition_log(tp).refresh()
        assert st.last_stable_offset == st.high_watermark and not st.open_txns
    assert admin.describe_transaction(log, "u")["state"] == "CompleteAbort"
    with pytest.raises(ProducerFencedError):
        p.commit_transaction()  # the live producer learns it was fenced
    assert _values(log) == []


def test_stuck_prepare_is_found_and_rolled_forward(log: txlog.Log) -> None:
    p = log.producer(transactional_id="s")
    p.init_transactions()
    p.begin_transaction()
    p.send("o", b"decided", partition=0)
    p.flush()
    # The coordinator persisted PrepareCommit and died before the markers.
    part = log.coordinator.state_log.partition_for("s")
    part.refresh()
    cur = part.get("s")
    assert cur is not None
    assert part.compare_and_set("s", cur, cur.transition(
        PREPARE_COMMIT, last_update_ms=now_ms() - 120_000))
    assert admin.find_hanging(log, prepare_grace_ms=10 ** 9) == []
    found = admin.find_hanging(log)
    assert [(h["kind"], h["partition"], h["state"]) for h in found] == [
        ("stuck-prepare", 0, "PrepareCommit")]
    res = admin.abort_transaction(log, "s")
    assert res["action"].startswith("committed")  # a commit decision is never undone
    assert _values(log) == [b"decided"]
    with pytest.raises(InvalidTxnStateError, match="nothing to abort"):
        admin.abort_transaction(log, "s")


def test_ongoing_without_data_and_list_describe(log: txlog.Log) -> None:
    p = log.producer(transactional_id="idle", transaction_timeout_ms=900_000)
    p.init_transactions()
    p.begin_transaction()
    log.coordinator.add_partitions("idle", p.producer_id, p.epoch, [T1])  # nothing written
    assert admin.find_hanging(log) == []
    (h,) = admin.find_hanging(log, max_transaction_timeout_ms=-1)
    assert (h["kind"], h["topic"], h["partitions"]) == ("hanging", None, ["o-1"])
    assert admin.find_hanging(log, topics=["o"], partition=0,
                              max_transaction_timeout_ms=-1) == []  # other partition
    rows = admin.list_transactions(log)
    assert [(r["transactional_id"], r["state"]) for r in rows] == [("idle", "Ongoing")]
    assert admin.list_transactions(log, states=["CompleteCommit"]) == []
    d = admin.describe_transaction(log, "idle")
    assert d["partitions"] == ["o-1"] and d["duration_ms"] is not None
    with pytest.raises(TransactionalIdNotFoundError):
        admin.describe_transaction(log, "nope")


def test_describe_producers(log: txlog.Log) -> None:
    plain = log.producer()
    plain.send("o", b"a", partition=0)
    plain.flush()
    p = log.producer(transactional_id="dp")
    p.init_transactions()
    p.begin_transaction()
    f = p.send("o", b"b", partition=0)
    p.flush()
    rows = {r["producer_id"]: r for r in admin.describe_producers(log, T0)}
    assert rows[plain.producer_id]["current_txn_start_offset"] == -1
    assert rows[plain.producer_id]["last_sequence"] == 0
    r = rows[p.producer_id]
    assert (r["current_txn_start_offset"], r["transactional_id"], r["producer_epoch"]) == (
        f.get().offset, "dp", p.epoch)
    p.commit_transaction()
    rows = {r["producer_id"]: r for r in admin.describe_producers(log, T0)}
    assert rows[p.producer_id]["current_txn_start_offset"] == -1


def test_describe_partitions(log: txlog.Log) -> None:
    p = log.producer(transactional_id="d")
    p.init_transactions()
    for commit in (True, False):
        p.begin_transaction()
        p.send("o", b"x", partition=0)
        p.flush()
        if commit:
            p.commit_transaction()
        else:
            p.abort_transaction()
    rows = admin.describe_partitions(log, "o")
    assert rows[0]["batches_by_status"] == {"committed": 1, "aborted": 1}
    assert rows[0]["high_watermark"] == 4 and rows[0]["lso_lag"] == 0
    assert rows[1]["batches"] == 0


def test_groups_see_only_committed_offsets(log: txlog.Log) -> None:
    pr = log.producer()
    for i in range(5):
        pr.send("o", f"m{i}".encode(), partition=0)
    pr.flush()
    c = log.consumer(group_id="g", auto_offset_reset="earliest")
    c.assign([T0])
    c.poll(max_records=2)
    c.commit()
    p = log.producer(transactional_id="offs")
    p.init_transactions()
    p.begin_transaction()
    p.send_offsets_to_transaction({T0: 4}, "g")
    p.abort_transaction()  # never visible
    (row,) = admin.describe_group(log, "g")
    assert (row["current_offset"], row["log_end_offset"], row["lag"]) == (2, 5, 3)
    p.begin_transaction()
    p.send_offsets_to_transaction({T0: 4}, "g")
    p.commit_transaction()
    assert admin.describe_group(log, "g")[0]["current_offset"] == 4
    assert admin.list_groups(log) == [{"group": "g", "topics": ["o"], "partitions": 1}]
    with pytest.raises(GroupIdNotFoundError):
        admin.describe_group(log, "other")

    spec = admin.ResetSpec(to_earliest=True)
    plan = admin.reset_offsets(log, "g", None, spec)
    assert plan[0]["new_offset"] == 0
    assert admin.describe_group(log, "g")[0]["current_offset"] == 4  # dry run
    admin.reset_offsets(log, "g", None, spec, execute=True)
    assert admin.describe_group(log, "g")[0]["current_offset"] == 0
    admin.reset_offsets(log, "g2", [T0], admin.ResetSpec(to_offset=99), execute=True)
    assert admin.describe_group(log, "g2")[0]["current_offset"] == 5  # clamped to the LSO


def test_fmt_duration() -> None:
    assert admin.fmt_duration(950) == "950ms"
    assert admin.fmt_duration(12_500) == "12.5s"
    assert admin.fmt_duration(423_000) == "7m03s"
    assert admin.fmt_duration(2 * 3_600_000 + 5 * 60_000) == "2h05m"
    assert admin.fmt_duration(3 * 86_400_000 + 4 * 3_600_000) == "3d04h"


@pytest.mark.parametrize("max_min", [30, 5])
def test_hanging_is_judged_by_the_roots_transaction_timeout_limit(max_min: int) -> None:
    """Without --max-transaction-timeout the limit is the root's
    transaction.max.timeout.ms, not a fixed 15 minutes: a transaction within a longer
    limit is not reported, and one past a shorter limit is."""
    lg = txlog.connect(f"memory://admin-tests/{uuid.uuid4().hex}",
                       transaction_max_timeout_ms=max_min * 60_000)
    lg.create_topic("o")
    p = lg.producer(transactional_id="long", transaction_timeout_ms=max_min * 60_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("o", b"open", partition=0)
    p.flush()
    (txn,) = lg.partition_log(T0).refresh().open_txns.values()
    start = txn.first_append_ms
    # 16 minutes in: past the old fixed 15, within a 30-minute limit, past a 5-minute one.
    found = admin.find_hanging(txlog.connect(lg.url), now=start + 16 * 60_000)
    if max_min == 30:
        assert found == []
    else:
        assert [h["kind"] for h in found] == ["hanging"]
    # An explicit limit still wins.
    assert [h["kind"] for h in admin.find_hanging(
        lg, now=start + 16 * 60_000, max_transaction_timeout_ms=60_000)] == ["hanging"]
    p.abort_transaction()
    p.close()
