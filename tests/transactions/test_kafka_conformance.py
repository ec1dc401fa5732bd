"""The edges a Kafka user relies on: transaction timeout limits, close(), the error after a
timeout abort, out-of-range positions, unstable offsets (KIP-447), expiration of idle
transactional ids and producer state, and the smaller API calls."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

import txlog
from txlog import TopicPartition
from txlog.coordinator import Coordinator
from txlog.errors import (
    ConfigError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    OffsetOutOfRangeError,
    ProducerFencedError,
    TransactionTimeoutError,
    UnassignedPartitionError,
    UnstableOffsetCommitError,
)
from txlog.maintenance import maintain
from txlog.txn_state import COMPLETE_ABORT, ONGOING

TP0 = TopicPartition("a", 0)
TP1 = TopicPartition("a", 1)


@pytest.fixture
def log(tmp_path: Any) -> txlog.Log:
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("a", partitions=2)
    return lg


def values(lg: txlog.Log, tps: list[TopicPartition]) -> list[bytes]:
    c = lg.consumer(auto_offset_reset="earliest")
    c.assign(tps)
    out: list[bytes] = []
    while True:
        got = c.poll(max_records=1000)
        if not got:
            return out
        out.extend(r.value for r in got)


def until(cond: Any, what: str, limit_s: float = 30.0) -> None:
    """Wait for ``cond()`` (re-checked every few ms), failing after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# -- 1. transaction.timeout.ms is validated against transaction.max.timeout.ms -----------


@pytest.mark.parametrize("timeout_ms", [0, -1, 10**12])
def test_transaction_timeout_out_of_range_is_refused(log: txlog.Log, timeout_ms: int) -> None:
    with pytest.raises(ConfigError, match=r"transaction\.timeout\.ms"):
        log.producer(transactional_id="t", transaction_timeout_ms=timeout_ms)
    assert log.coordinator.record("t") is None  # nothing was written


def test_transaction_timeout_above_the_max_is_refused_at_init(log: txlog.Log) -> None:
    p = log.producer(transactional_id="t", transaction_timeout_ms=900_001)
    with pytest.raises(InvalidTransactionTimeoutError, match=r"transaction\.max\.timeout\.ms"):
        p.init_transactions()
    assert isinstance(InvalidTransactionTimeoutError("x"), ConfigError)
    assert log.coordinator.record("t") is None  # nothing was written
    assert p.state.value == "UNINITIALIZED"


def test_transaction_max_timeout_is_a_setting(tmp_path: Any) -> None:
    lg = txlog.connect(str(tmp_path / "r"), transaction_max_timeout_ms=5_000)
    with pytest.raises(InvalidTransactionTimeoutError):
        lg.producer(transactional_id="t", transaction_timeout_ms=5_001).init_transactions()
    p = lg.producer(transactional_id="t", transaction_timeout_ms=5_000)
    p.init_transactions()  # the limit itself is allowed
    p.close()


def test_stored_timeout_above_the_limit_expires_at_the_limit(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction stored with a timeout above the root's transaction.max.timeout.ms (as
    txlog before the limit wrote one) does not hold the LSO for its own timeout: maintain
    aborts it once the limit has passed."""
    import txlog.coordinator as coordinator

    lg = txlog.connect(str(tmp_path / "root"), transaction_max_timeout_ms=200)
    lg.create_topic("a", partitions=1)
    monkeypatch.setattr(coordinator, "check_timeout", lambda *a: None)  # (the old txlog)
    p = lg.producer(transactional_id="huge", transaction_timeout_ms=2_000_000_000)
    p.init_transactions()
    monkeypatch.undo()
    p.begin_transaction()
    p.send("a", b"held", partition=0)
    p.flush()
    other = txlog.connect(lg.url)
    until(lambda: "huge" in maintain(other, compact=False).swept_transactions,
          "maintain to abort the transaction")
    rec = other.coordinator.record("huge")
    assert rec is not None and rec.timeout_ms == 2_000_000_000
    assert rec.state == COMPLETE_ABORT and rec.abort_reason == "timeout"
    c = other.consumer()
    assert c.last_stable_offset(TP0) == other.partition_log(TP0).refresh().high_watermark
    p.close(timeout=0)


# -- 2. a graceful close() aborts an open transaction -------------------------------------


def test_exception_in_with_block_aborts_the_open_transaction(log: txlog.Log) -> None:
    with pytest.raises(RuntimeError), log.producer(transactional_id="w") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("a", b"lost", partition=0)
        p.flush()
        raise RuntimeError("the job failed")
    rec = log.coordinator.record("w")
    assert rec is not None and rec.state == COMPLETE_ABORT and rec.abort_reason == "client"
    # The LSO is not held: a later commit by another producer is readable at once.
    q = log.producer(transactional_id="other")
    q.init_transactions()
    q.begin_transaction()
    q.send("a", b"kept", partition=0)
    q.commit_transaction()
    q.close()
    c = log.consumer()
    assert c.last_stable_offset(TP0) == log.partition_log(TP0).refresh().high_watermark
    assert values(log, [TP0]) == [b"kept"]


def test_close_with_zero_timeout_leaves_the_transaction_to_its_timeout(log: txlog.Log,
                                                                       ) -> None:
    p = log.producer(transactional_id="forced")
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"x", partition=0)
    p.flush()
    p.close(timeout=0)  # Kafka's forced close: no abort
    rec = log.coordinator.record("forced")
    assert rec is not None and rec.state == ONGOING


def test_close_timeout_bounds_the_wait(log: txlog.Log, monkeypatch: pytest.MonkeyPatch,
                                       ) -> None:
    """close(timeout) returns once the timeout passes even though the abort it started
    cannot finish (the store hangs); the abort goes on by itself."""
    release = threading.Event()
    entered = threading.Event()
    real = Coordinator.prepare_end

    def hang(self: Coordinator, *a: Any, **kw: Any) -> Any:
        entered.set()
        assert release.wait(60)
        return real(self, *a, **kw)

    p = log.producer(transactional_id="slow-close")
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"x", partition=0)
    p.flush()
    monkeypatch.setattr(Coordinator, "prepare_end", hang)
    p.close(timeout=0.2)
    assert entered.is_set() and not release.is_set()
    release.set()
    until(lambda: (r := log.coordinator.record("slow-close")) is not None
          and r.state == COMPLETE_ABORT, "the abort close() started")


# -- 3. one abortable error after a timeout abort ------------------------------------------


def test_write_after_a_timeout_abort_raises_the_abortable_timeout_error(log: txlog.Log,
                                                                        ) -> None:
    p = log.producer(transactional_id="late", transaction_timeout_ms=100)
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"before", partition=0)
    p.flush()
    other = txlog.connect(log.url)
    until(lambda: other.coordinator.abort_if_expired("late"), "the timeout abort")
    # A write to the partition the transaction already registered meets the ABORT
    # marker's fence: the error is the timeout, abortable, not a fencing.
    p.send("a", b"after", partition=0)
    with pytest.raises(TransactionTimeoutError) as exc:
        p.flush()
    assert exc.value.abortable
    p.abort_transaction()
    p.begin_transaction()
    p.send("a", b"next", partition=0)
    p.commit_transaction()
    p.close()
    assert values(log, [TP0]) == [b"next"]


def test_commit_after_a_timeout_abort_raises_the_same_error(log: txlog.Log) -> None:
    p = log.producer(transactional_id="late2", transaction_timeout_ms=100)
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"before", partition=1)
    p.flush()
    other = txlog.connect(log.url)
    until(lambda: other.coordinator.abort_if_expired("late2"), "the timeout abort")
    with pytest.raises(TransactionTimeoutError):
        p.commit_transaction()
    p.abort_transaction()
    p.close()


# -- 4. out-of-range positions -------------------------------------------------------------


def _three(log: txlog.Log) -> None:
    p = log.producer()
    for v in (b"r0", b"r1", b"r2"):
        p.send("a", v, partition=0)
    p.close()


@pytest.mark.parametrize("reset,expect", [("earliest", [b"r0", b"r1", b"r2"]),
                                          ("latest", [])])
def test_position_past_the_high_watermark_is_reset(log: txlog.Log, reset: str,
                                                   expect: list[bytes]) -> None:
    _three(log)
    c = log.consumer(auto_offset_reset=reset)
    c.assign([TP0])
    c.seek(TP0, 100)
    assert [r.value for r in c.poll(max_records=10)] == expect
    assert c.position(TP0) == 3
    p = log.producer()
    p.send("a", b"r3", partition=0)
    p.close()
    assert [r.value for r in c.poll(max_records=10)] == [b"r3"]


def test_position_out_of_range_with_reset_none_raises(log: txlog.Log) -> None:
    _three(log)
    c = log.consumer(auto_offset_reset="none")
    c.assign([TP0])
    c.seek(TP0, 4)
    with pytest.raises(OffsetOutOfRangeError, match="out of range"):
        c.poll(max_records=10)
    c.seek(TP0, 3)  # the high watermark itself is in range
    assert c.poll(max_records=10) == []


def test_committed_offset_past_the_end_is_reset(log: txlog.Log) -> None:
    """A group offset from before the topic was recreated lies past its end."""
    _three(log)
    g = log.consumer(group_id="g")
    g.commit({TP0: 50})
    c = log.consumer(group_id="g", auto_offset_reset="earliest")
    c.assign([TP0])
    assert [r.value for r in c.poll(max_records=10)] == [b"r0", b"r1", b"r2"]


def test_position_below_the_log_start_is_reset(tmp_path: Any) -> None:
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("r", partitions=1, config={"retention.ms": 0})
    tp = TopicPartition("r", 0)
    p = lg.producer()
    for v in (b"old0", b"old1"):
        p.send("r", v, partition=0)
        p.flush()
    p.close()
    c = lg.consumer(auto_offset_reset="latest")
    c.assign([tp])
    c.seek(tp, 0)
    maintain(lg, ["r"], compact=False, now=int(time.time() * 1000) + 1000)
    assert c.beginning_offsets([tp])[tp] == 2
    p = lg.producer()
    p.send("r", b"new", partition=0)
    p.close()
    # Kafka resets with auto_offset_reset: latest goes to the end, past b"new".
    assert c.poll(max_records=10) == []
    assert c.position(tp) == 3


def test_seek_and_position_need_an_assigned_partition(log: txlog.Log) -> None:
    c = log.consumer()
    c.assign([TP0])
    with pytest.raises(UnassignedPartitionError):
        c.seek(TP1, 0)
    with pytest.raises(UnassignedPartitionError):
        c.position(TP1)
    with pytest.raises(UnassignedPartitionError):
        c.seek_to_beginning([TP1])


# -- 5. KIP-447: committed() does not answer with an offset a transaction holds -------------


def test_committed_waits_for_pending_transactional_offsets(log: txlog.Log) -> None:
    p = log.producer(transactional_id="ctp")
    p.init_transactions()
    p.begin_transaction()
    p.send_offsets_to_transaction({TP0: 7}, "g")
    c = log.consumer(group_id="g")
    with pytest.raises(UnstableOffsetCommitError) as exc:
        c.committed([TP0], timeout=0)
    assert exc.value.retriable
    # Another group, or another partition of this group, is not held up.
    assert c.committed([TP1], timeout=0) == {TP1: None}
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(c.committed([TP0], timeout=60)))
    waiter.start()
    p.commit_transaction()
    waiter.join(60)
    assert got == [{TP0: 7}]
    p.close()


def test_committed_raises_after_its_timeout(log: txlog.Log) -> None:
    p = log.producer(transactional_id="ctp2")
    p.init_transactions()
    p.begin_transaction()
    p.send_offsets_to_transaction({TP0: 3}, "g2")
    c = log.consumer(group_id="g2", default_api_timeout_ms=50)
    with pytest.raises(UnstableOffsetCommitError, match="open transaction"):
        c.committed([TP0])
    p.abort_transaction()
    assert c.committed([TP0]) == {TP0: None}
    p.close()


# -- 6. transactional.id.expiration.ms -----------------------------------------------------


def test_maintain_expires_idle_transactional_ids(tmp_path: Any) -> None:
    lg = txlog.connect(str(tmp_path / "root"), transactional_id_expiration_ms=60_000)
    lg.create_topic("a", partitions=1)
    old = lg.producer(transactional_id="idle")
    old.init_transactions()
    old.begin_transaction()
    old.send("a", b"1", partition=0)
    old.commit_transaction()
    busy = lg.producer(transactional_id="busy")
    busy.init_transactions()
    busy.begin_transaction()
    busy.send("a", b"open", partition=0)
    busy.flush()
    idle = lg.coordinator.record("idle")
    assert idle is not None
    report = maintain(lg, compact=False, now=idle.last_update_ms + 59_000)
    assert report.expired_transactional_ids == []
    report = maintain(lg, compact=False, now=idle.last_update_ms + 61_000)
    assert report.expired_transactional_ids == ["idle"]  # not "busy": it is open
    assert report.to_json()["expired_transactional_ids"] == ["idle"]
    assert txlog.connect(lg.url).coordinator.record("idle") is None
    # The old instance cannot go on; a new one gets a new producer id.
    old.begin_transaction()
    old.send("a", b"2", partition=0)
    with pytest.raises(InvalidTxnStateError, match="expired"):
        old.flush()
    new = lg.producer(transactional_id="idle")
    new.init_transactions()
    assert new.producer_id != idle.producer_id and new.epoch == 0
    new.begin_transaction()
    new.send("a", b"3", partition=0)
    new.commit_transaction()
    busy.commit_transaction()
    for p in (old, new, busy):
        p.close()
    assert values(lg, [TopicPartition("a", 0)]) == [b"1", b"open", b"3"]


def test_maintain_expires_idle_producer_state_and_the_producer_starts_afresh(
        tmp_path: Any) -> None:
    lg = txlog.connect(str(tmp_path / "root"), producer_id_expiration_ms=60_000)
    lg.create_topic("a", partitions=1)
    tp = TopicPartition("a", 0)
    p = lg.producer()
    p.send("a", b"1", partition=0)
    p.flush()
    old_pid = p.producer_id
    st = lg.partition_log(tp).refresh()
    last = st.producers[old_pid].last_ms
    report = maintain(lg, compact=False, now=last + 59_000)
    assert report.partitions[0].expired_producers == 0
    report = maintain(lg, compact=False, now=last + 61_000)
    assert report.partitions[0].expired_producers == 1
    assert old_pid not in txlog.connect(lg.url).partition_log(tp).refresh().producers
    # The producer's next append meets a view loaded from that checkpoint: its sequence
    # is unknown there, so it starts again with a new producer id (KIP-360).
    lg.partition_log(tp).state = None
    p.send("a", b"2", partition=0)
    p.flush()
    assert p.producer_id != old_pid
    p.send("a", b"3", partition=0)
    p.close()
    assert values(lg, [tp]) == [b"1", b"2", b"3"]


def test_expired_producer_state_keeps_the_fence_of_ended_epochs(tmp_path: Any) -> None:
    """Expiry forgets a producer's sequences, never which of its epochs ended: a write
    of an ended epoch, met by a client that loads the partition from the checkpoint
    written after expiry, is still fenced."""
    lg = txlog.connect(str(tmp_path / "root"), producer_id_expiration_ms=60_000)
    lg.create_topic("a", partitions=1)
    p = lg.producer(transactional_id="t")
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"1", partition=0)
    p.commit_transaction()
    p.close()
    st = lg.partition_log(TP0).refresh()
    (pid, epoch), = st.fence_epoch.items()  # the committed transaction's
    report = maintain(lg, compact=False, now=st.producers[pid].last_ms + 61_000)
    assert report.partitions[0].expired_producers == 1
    fresh = txlog.connect(lg.url).partition_log(TP0).refresh()
    assert pid not in fresh.producers
    with pytest.raises(ProducerFencedError):
        fresh.check_sequence(pid, epoch, 0, 1, True)


# -- 8. smaller API gaps ---------------------------------------------------------------------


def test_second_init_transactions_is_refused(log: txlog.Log) -> None:
    p = log.producer(transactional_id="once")
    p.init_transactions()
    with pytest.raises(InvalidTxnStateError, match="already called"):
        p.init_transactions()
    p.close()


def test_transactional_id_without_idempotence_is_a_config_error(log: txlog.Log) -> None:
    with pytest.raises(ConfigError, match=r"enable\.idempotence"):
        log.producer(transactional_id="x", enable_idempotence=False)


def test_consumer_pause_resume_and_subscription(log: txlog.Log) -> None:
    p = log.producer()
    p.send("a", b"p0", partition=0)
    p.send("a", b"p1", partition=1)
    p.close()
    c = log.consumer(auto_offset_reset="earliest")
    c.subscribe(["a"])
    assert c.subscription() == {"a"}
    c.pause([TP1])
    assert c.paused() == {TP1}
    assert [r.value for r in c.poll(max_records=10)] == [b"p0"]
    assert c.poll(max_records=10) == []
    c.resume([TP1])
    assert c.paused() == set()
    assert [r.value for r in c.poll(max_records=10)] == [b"p1"]
    c.assign([TP0])
    assert c.subscription() == set()
    with pytest.raises(UnassignedPartitionError):
        c.pause([TP1])


def test_producer_partitions_for_and_metrics(log: txlog.Log) -> None:
    p = log.producer(transactional_id=f"m-{uuid.uuid4().hex[:6]}")
    assert p.partitions_for("a") == [TP0, TP1]
    p.init_transactions()
    m = p.metrics()
    assert m["state"] == "READY" and m["producer_id"] >= 0 and "store" in m["log"]
    p.close()
