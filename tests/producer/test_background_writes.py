"""Batches are written in the background (as Kafka's sender thread does): ``send()`` goes
on while a full batch uploads, commits and ``flush()`` wait for what was queued, a failed
write fails the transaction, and too much queued makes ``send()`` wait."""

from __future__ import annotations

import threading
from concurrent.futures import wait
from typing import Any

import pyarrow as pa
import pytest
from helpers import read_all

import txlog
from txlog import TopicPartition
from txlog import producer as producer_mod
from txlog.errors import (
    InvalidTxnStateError,
    SchemaMismatchError,
    StorageError,
    UnknownTopicError,
)
from txlog.partition_log import PartitionLog
from txlog.producer import accumulator, sender


@pytest.fixture
def log(tmp_path: object) -> txlog.Log:
    # One object per partition: these tests hold and fail uploads of each partition's
    # object (PartitionLog.write_object); test_shared_objects.py covers shared ones.
    own: dict[str, Any] = {"batch.objects.shared": False}
    lg = txlog.connect(str(tmp_path), **own)
    lg.create_topic("a", partitions=2)
    return lg


class UploadGate:
    """Holds every batch-object upload (``PartitionLog.write_object``) until opened, and
    fails the first ``fail`` of them, or those whose values start with ``fail_prefix``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, hold: bool = True,
                 fail: int = 0, fail_prefix: bytes | None = None) -> None:
        self.real = PartitionLog.write_object
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.failing = threading.Event()  # releases the failing uploads only
        if not hold:
            self.opened.set()
            self.failing.set()
        self.fail = fail
        self.calls = 0
        self.lock = threading.Condition()
        gate = self

        def write_object(plog: PartitionLog, table: Any, **kw: Any) -> Any:
            with gate.lock:
                gate.calls += 1
                failing = gate.calls <= gate.fail or (
                    fail_prefix is not None
                    and table.column("value")[0].as_py().startswith(fail_prefix))
                gate.lock.notify_all()
            gate.entered.set()
            released = gate.failing if failing else gate.opened
            assert released.wait(60), "test gate never opened"
            if failing:
                raise StorageError("injected: batch object upload failed")
            return gate.real(plog, table, **kw)

        monkeypatch.setattr(PartitionLog, "write_object", write_object)

    def open(self) -> None:
        self.failing.set()
        self.opened.set()

    def fail_open(self) -> None:
        """Let the failing uploads fail now; hold the others."""
        self.failing.set()

    def wait_entered(self, n: int) -> None:
        """Until ``n`` uploads have started."""
        with self.lock:
            assert self.lock.wait_for(lambda: self.calls >= n, 60), "uploads never started"

    def send_behind_two(self, p: Any, values: list[bytes]) -> list[Any]:
        """Send ``values`` (each a full batch) to partition 0, each of the first two once
        the upload before it is held: the rest then wait for a writer, in order (a batch
        queued before its predecessor's upload started would join that one)."""
        futures = []
        for i, v in enumerate(values):
            futures.append(p.send("a", v, partition=0))
            if i < 2:
                self.wait_entered(i + 1)
        return futures


def test_send_goes_on_while_a_full_batch_uploads(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """A transaction's full batch is queued: send() returns while its upload is held, and
    later records queue behind it; the commit waits for the upload, then every record is
    visible once, in send order, at the offsets its future reports."""
    gate = UploadGate(monkeypatch)
    gates.append(gate)
    p = log.producer(transactional_id="bg", batch_size=300, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    futures = [p.send("a", f"r{i}".encode() * 20, partition=0) for i in range(12)]
    assert gate.entered.wait(60), "no upload started although batches were full"
    # Every send above returned with the first upload still held.
    assert not futures[0].done()
    assert read_all(log, "a", "read_uncommitted") == []
    gate.open()
    p.commit_transaction()
    values = [f"r{i}".encode() * 20 for i in range(12)]
    assert read_all(log, "a") == values
    offsets = [f.get().offset for f in futures]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    p.close()


def test_get_waits_for_a_queued_batch_and_raises_for_one_still_filling(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """A transactional future of a queued batch waits for its write; one whose batch is
    still filling raises at once (nothing would write it before flush or commit)."""
    gate = UploadGate(monkeypatch)
    gates.append(gate)
    p = log.producer(transactional_id="get", batch_size=100, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    queued = p.send("a", b"x" * 200, partition=0)  # full at once: queued
    filling = p.send("a", b"y", partition=1)
    with pytest.raises(InvalidTxnStateError, match="not written yet"):
        filling.get()
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(queued.get(60)))
    waiter.start()
    assert gate.entered.wait(60)
    gate.open()
    waiter.join(60)
    assert got and got[0].partition == 0 and got[0].offset == 0
    p.commit_transaction()
    assert filling.get().partition == 1
    p.close()


def test_a_failed_background_write_fails_the_transaction(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """The first upload fails after send() returned: the commit raises it, the
    transaction is abortable, nothing of it is visible, and the next one commits."""
    gates.append(UploadGate(monkeypatch, hold=False, fail=1))
    p = log.producer(transactional_id="fail", batch_size=100, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    lost = p.send("a", b"lost" * 40, partition=0)  # full: queued, its upload fails
    with pytest.raises(StorageError, match="injected"):
        p.commit_transaction()
    with pytest.raises(StorageError, match="injected"):
        lost.get()
    p.abort_transaction()
    p.begin_transaction()
    p.send("a", b"kept", partition=0)
    p.commit_transaction()
    assert read_all(log, "a", "read_uncommitted") == [b"kept"]
    assert read_all(log, "a") == [b"kept"]
    p.close()


def test_send_waits_for_the_oldest_write_when_too_much_is_queued(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """Past the queue's bound, send() waits inside back-pressure until a write ends;
    once the uploads go on, every send returns and everything commits."""
    monkeypatch.setattr(accumulator, "MAX_QUEUED_STEPS", 3)
    gate = UploadGate(monkeypatch)
    gates.append(gate)
    p = log.producer(transactional_id="bp", batch_size=100, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    waiting = threading.Event()
    real = p._backpressure

    def backpressure() -> None:
        if p._queued_steps > accumulator.MAX_QUEUED_STEPS:
            waiting.set()
        real()

    monkeypatch.setattr(p, "_backpressure", backpressure)
    done = threading.Event()

    def sends() -> None:
        for i in range(10):  # each record fills a batch: one queued write per send
            p.send("a", f"{i:03d}".encode() * 40, partition=i % 2)
        done.set()

    t = threading.Thread(target=sends)
    t.start()
    assert waiting.wait(60), "send() never hit the queue's bound"
    assert not done.is_set()  # it is inside back-pressure, with every upload held
    gate.open()
    t.join(60)
    assert done.is_set()
    p.commit_transaction()
    assert sorted(read_all(log, "a")) == [f"{i:03d}".encode() * 40 for i in range(10)]
    p.close()


def test_without_a_transaction_nothing_lands_behind_a_lost_batch(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """A plain producer's failed write fails its futures, those of the write queued
    behind it before the failure was known (which would otherwise land after a batch the
    application may send again), and the next flush(), once; writes queued after go on."""
    gate = UploadGate(monkeypatch, fail_prefix=b"lost")
    gates.append(gate)
    p = log.producer(batch_size=100, linger_ms=60_000)
    lost = p.send("a", b"lost" * 30, partition=0)  # full: queued, its upload will fail
    gate.wait_entered(1)  # uploading: the next batch cannot join it
    behind = p.send("a", b"behind" * 30, partition=0)  # queued behind it
    gate.open()
    with pytest.raises(StorageError, match="injected"):
        p.flush()
    with pytest.raises(StorageError, match="injected"):
        lost.get()
    with pytest.raises(InvalidTxnStateError, match="earlier queued write failed"):
        behind.get()
    later = p.send("a", b"later" * 30, partition=0)
    p.flush()  # the failure was raised once; this write goes on
    assert later.get().offset == 0
    p.close()
    assert read_all(log, "a", "read_uncommitted") == [b"later" * 30]


def test_a_batch_sent_after_a_failure_does_not_join_a_doomed_write(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """Plain producer: a write queued before a failure was known fails with it; a full
    batch sent after that must not join such a write, still waiting for a writer, but
    go on in a write of its own."""
    gate = UploadGate(monkeypatch, fail_prefix=b"lost")
    gates.append(gate)
    p = log.producer(batch_size=100, linger_ms=60_000)
    lost = p.send("a", b"lost" * 30, partition=0)  # write 1: held, then fails
    gate.wait_entered(1)
    p.send("a", b"a" * 120, partition=1)  # write 2: held
    gate.wait_entered(2)
    p.send("a", b"b" * 120, partition=1)  # write 3: takes write 1's writer, held
    doomed = p.send("a", b"c" * 120, partition=0)  # write 4: waits for a writer
    first = p._steps[0]
    gate.fail_open()  # write 1 fails
    gate.wait_entered(3)  # writes 2 and 3 hold both writers: write 4 cannot start
    wait([first])  # the committer has taken the failure: writes 2-4 will be skipped
    with pytest.raises(StorageError, match="injected"):
        lost.get(0)
    later = p.send("a", b"later" * 24, partition=0)  # full: its own write
    gate.open()
    with pytest.raises(StorageError, match="injected"):
        p.flush()  # the failure, raised once
    with pytest.raises(InvalidTxnStateError, match="earlier queued write failed"):
        doomed.get(0)
    assert later.get(0).partition == 0
    p.close()
    assert read_all(log, "a", "read_uncommitted").count(b"later" * 24) == 1


def test_a_full_batch_takes_the_batches_past_linger_along(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """With the writes busy, a batch past linger waits; the next full batch takes it
    along, so a quiet partition is not starved by a busy one."""
    gate = UploadGate(monkeypatch)
    gates.append(gate)
    p = log.producer(transactional_id="along", batch_size=100, linger_ms=0)
    p.init_transactions()
    p.begin_transaction()
    for i in range(3):  # full batches: the writes are busy (their uploads held)
        p.send("a", f"{i}".encode() * 200, partition=0)
    quiet = p.send("a", b"quiet", partition=1)  # past linger at once, but must wait
    assert TopicPartition("a", 1) in p._pending
    p.send("a", b"3" * 200, partition=0)  # full: takes the quiet batch along
    assert TopicPartition("a", 1) not in p._pending
    gate.open()
    assert quiet.get(60).partition == 1  # written before any flush or commit
    p.commit_transaction()
    values = read_all(log, "a")
    assert len(values) == 5 and values.count(b"quiet") == 1
    p.close()


def test_finished_writes_are_not_kept(log: txlog.Log) -> None:
    """The producer keeps no trace of writes that ended (a long-lived producer would
    otherwise hold every write's future, and a failed one's batch)."""
    p = log.producer(batch_size=100, linger_ms=60_000)
    for i in range(200):
        p.send("a", f"{i:04d}".encode() * 30, partition=i % 2)
    p.flush()
    p.send("a", b"last" * 30, partition=0)
    p.flush()
    assert len(p._steps) <= 2
    p.close()


def test_a_partial_batch_joins_a_queued_one_that_has_not_started(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """With two uploads held and a third batch waiting for a writer, the commit's last
    (partial) batch joins the waiting one: one object and one entry fewer, the records
    in send order at consecutive offsets."""
    gate = UploadGate(monkeypatch)
    gates.append(gate)
    p = log.producer(transactional_id="join", batch_size=300, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    full = gate.send_behind_two(p, [f"full{i}".encode() * 80 for i in range(3)])
    tail = [p.send("a", f"tail{i}".encode(), partition=0) for i in range(2)]
    decided = p.commit_transaction_async()
    gate.open()
    decided.result(60)
    assert gate.calls == 3  # the tail rode in the third batch's object
    values = [f"full{i}".encode() * 80 for i in range(3)] + [b"tail0", b"tail1"]
    assert read_all(log, "a") == values
    assert [f.get().offset for f in full + tail] == [0, 1, 2, 3, 4]
    st = p.log.partition_log(TopicPartition("a", 0)).refresh()
    assert len(st.batches) == 3 and st.high_watermark == 6  # 3 objects, 5 records, marker
    p.close()


def test_full_batches_behind_a_backlog_share_objects_up_to_the_join_limit(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """Full batches queued while both uploads are busy join the partition's waiting
    batch until it holds JOIN_BATCHES batch sizes; the records keep their send order and
    consecutive offsets, and each future gets its own record's offset."""
    from txlog.producer import JOIN_BATCHES

    gate = UploadGate(monkeypatch)
    gates.append(gate)
    p = log.producer(transactional_id="fulljoin", batch_size=300, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    # 416 bytes a record (400 B value + 16): each send fills a batch of its own.
    per_object = (JOIN_BATCHES * 300) // 416
    assert per_object >= 2
    n = 2 + 2 * per_object + 1  # two uploading, two full waiting objects, one more
    futures = gate.send_behind_two(p, [f"{i:03d}".encode() * 133 + b"x" for i in range(n)])
    decided = p.commit_transaction_async()
    gate.open()
    decided.result(60)
    assert gate.calls == 2 + 2 + 1
    assert read_all(log, "a") == [f"{i:03d}".encode() * 133 + b"x" for i in range(n)]
    assert [f.get().offset for f in futures] == list(range(n))
    p.close()


def test_a_batch_never_joins_one_of_the_previous_transaction(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """A committed transaction's last batch may still wait for a writer when the next
    transaction queues its first; that one gets its own object, so aborting it leaves
    the committed records and nothing of its own."""
    gate = UploadGate(monkeypatch)
    gates.append(gate)
    p = log.producer(transactional_id="boundary", batch_size=300, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    gate.send_behind_two(p, [f"kept{i}".encode() * 80 for i in range(3)])
    decided = p.commit_transaction_async()
    p.begin_transaction()
    p.send("a", b"aborted", partition=0)
    from test_pipelined_commit import queue_behind

    flusher = queue_behind(p, monkeypatch)
    gate.open()
    flusher.join(60)
    decided.result(60)
    assert gate.calls == 4
    p.abort_transaction()
    assert read_all(log, "a") == [f"kept{i}".encode() * 80 for i in range(3)]
    p.close()


def test_a_joined_plain_batch_wakes_get_waiting_on_its_own_event(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """A plain producer's batch has its own ``written`` event from its first record, and a
    get() may already wait on it when the batch joins a queued one: that event is set
    too once the records are written."""
    gate = UploadGate(monkeypatch)
    gates.append(gate)
    p = log.producer(batch_size=300, linger_ms=60_000)
    gate.send_behind_two(p, [f"full{i}".encode() * 80 for i in range(3)])
    small = p.send("a", b"small", partition=0)
    own_event = small._outcome.written  # what a get() called now waits on
    assert own_event is not None
    from test_pipelined_commit import queue_behind

    flusher = queue_behind(p, monkeypatch)  # the small batch joins (nothing is queued)
    gate.open()
    flusher.join(60)
    assert gate.calls == 3
    assert own_event.is_set()
    assert small.get(0).offset == 3
    p.close()


def test_writes_in_flight_are_bounded_and_later_batches_join_meanwhile(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """While three writes are between the start of their upload and the end of their
    entry's append (the committer is held), the next write does not start uploading:
    it keeps taking later batches, and lands as one object after the three."""
    appends_go, appending = threading.Event(), threading.Event()
    real_append = PartitionLog.append

    def append(plog: PartitionLog, spec: Any) -> Any:
        appending.set()
        assert appends_go.wait(60), "test never released the appends"
        return real_append(plog, spec)

    monkeypatch.setattr(PartitionLog, "append", append)
    uploaded = threading.Condition()
    finished = [0]
    real_write_step = producer_mod.Producer._write_step

    def write_step(self: Any, step: Any, fut: Any) -> None:
        real_write_step(self, step, fut)
        with uploaded:
            finished[0] += 1
            uploaded.notify_all()

    monkeypatch.setattr(producer_mod.Producer, "_write_step", write_step)
    gate = UploadGate(monkeypatch)
    gates.append(gate)
    p = log.producer(batch_size=300, linger_ms=60_000)
    values = [f"v{i}".encode() * 160 for i in range(8)]  # each one full batch
    # Writes 0 and 1 upload (held); write 2 waits for a writer and takes batches 3 and 4
    # (four batch sizes at most); write 3 starts with batch 5 and takes batch 6.
    futures = gate.send_behind_two(p, values[:7])
    gate.open()
    with uploaded:
        assert uploaded.wait_for(lambda: finished[0] == 3, 60), "uploads never ended"
    assert appending.wait(60)
    assert producer_mod.MAX_IN_FLIGHT == 3 and gate.calls == 3  # write 3 waits
    futures.append(p.send("a", values[7], partition=0))  # still joins write 3
    appends_go.set()
    p.flush()
    assert gate.calls == 4
    assert read_all(log, "a", "read_uncommitted") == values
    assert [f.get().offset for f in futures] == list(range(8))
    assert len(p.log.partition_log(TopicPartition("a", 0)).refresh().batches) == 4  # objects
    p.close()


class AppendGate:
    """Holds the first data append (the committer) until opened; counts finished uploads;
    fails every append of several objects in one entry if ``fail_parts``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, fail_parts: bool = False) -> None:
        self.held, self.go = threading.Event(), threading.Event()
        self.uploads = 0
        self.cond = threading.Condition()
        real_append = PartitionLog.append
        real_write_step = producer_mod.Producer._write_step
        gate = self

        def append(plog: PartitionLog, spec: Any) -> Any:
            if spec.kind == "data" and not gate.held.is_set():
                gate.held.set()
                assert gate.go.wait(60), "test never released the append"
            if fail_parts and spec.parts is not None:
                raise StorageError("injected: the grouped append failed")
            return real_append(plog, spec)

        def write_step(self: Any, step: Any, fut: Any) -> None:
            real_write_step(self, step, fut)
            with gate.cond:
                gate.uploads += 1
                gate.cond.notify_all()

        monkeypatch.setattr(PartitionLog, "append", append)
        monkeypatch.setattr(producer_mod.Producer, "_write_step", write_step)

    def open(self) -> None:
        self.go.set()

    def wait_uploads(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.uploads >= n, 60), "uploads never ended"


def _behind_a_held_append(p: Any, gate: AppendGate, values: list[bytes]) -> list[Any]:
    """Send ``values`` (each a full batch) to partition 0: the first one's append is held
    (it found nothing else written to take along), the others upload meanwhile."""
    futures = [p.send("a", values[0], partition=0)]
    assert gate.held.wait(60)
    futures += [p.send("a", v, partition=0) for v in values[1:]]
    return futures


@pytest.mark.parametrize("in_marker", [True, False], ids=["commit-appends", "v2"])
def test_objects_written_behind_a_slow_append_share_one_entry(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[Any],
        in_marker: bool) -> None:
    """While the committer is held in an append, the next steps' objects and the
    commit's are written; then one entry appends all three (one put-if-absent, not
    three): the COMMIT marker, after PrepareCommit named them (or, with
    ``commit.appends.batches=false``, a DATA entry before the decision).  Offsets, reads
    and a cold reader agree."""
    from helpers import data_entries

    gate = AppendGate(monkeypatch)
    gates.append(gate)
    p = log.producer(transactional_id="group", batch_size=300, linger_ms=60_000,
                     **{"commit.appends.batches": in_marker})
    p.init_transactions()
    p.begin_transaction()
    values = [f"v{i}".encode() * 160 for i in range(3)]
    futures = _behind_a_held_append(p, gate, values)
    futures.append(p.send("a", b"tail", partition=0))  # the commit's own batch
    decided = p.commit_transaction_async()
    gate.wait_uploads(4)
    gate.open()
    decided.result(60)
    entries = data_entries(log, "a", 0, ("data", "commit", "begin"))
    assert [(e.kind, e.count) for e in entries] == (
        [("data", 1), ("commit", 4)] if in_marker else
        [("data", 1), ("data", 3), ("commit", 1)])
    assert entries[1].extra is not None and [part[1] for part in entries[1].extra["parts"]] \
        == [1, 1, 1]
    assert [f.get().offset for f in futures] == [0, 1, 2, 3]
    assert read_all(log, "a") == [*values, b"tail"]
    assert read_all(txlog.connect(log.url), "a") == [*values, b"tail"]
    st = txlog.connect(log.url).partition_log(TopicPartition("a", 0)).refresh()
    assert len(st.batches) == 4 and st.last_stable_offset == st.high_watermark == 5
    p.close()


def test_a_plain_producers_grouped_entry_keeps_its_sequence_numbers(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[Any]) -> None:
    """Without a transaction too; the entry takes the sequence numbers of all its
    records, so the next batch follows on without a gap."""
    from helpers import data_entries

    gate = AppendGate(monkeypatch)
    gates.append(gate)
    p = log.producer(batch_size=300, linger_ms=60_000)
    values = [f"w{i}".encode() * 160 for i in range(3)]
    futures = _behind_a_held_append(p, gate, values)
    gate.wait_uploads(3)
    gate.open()
    p.flush()
    futures.append(p.send("a", b"after", partition=0))
    p.flush()
    assert [(e.count, e.base_sequence) for e in data_entries(log, "a", 0)] == [
        (1, 0), (2, 1), (1, 3)]
    assert [f.get().offset for f in futures] == [0, 1, 2, 3]
    assert read_all(log, "a", "read_uncommitted") == [*values, b"after"]
    p.close()


def test_a_failed_grouped_append_fails_every_batch_in_it_and_the_transaction(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[Any]) -> None:
    gate = AppendGate(monkeypatch, fail_parts=True)
    gates.append(gate)
    # (a DATA entry of several objects; with the commit's markers appending them, the
    # marker's failure is the next test's)
    p = log.producer(transactional_id="gfail", batch_size=300, linger_ms=60_000, retries=0,
                     **{"commit.appends.batches": False})
    p.init_transactions()
    p.begin_transaction()
    values = [f"x{i}".encode() * 160 for i in range(3)]
    futures = _behind_a_held_append(p, gate, values)
    decided = p.commit_transaction_async()
    gate.wait_uploads(3)
    gate.open()
    with pytest.raises(InvalidTxnStateError, match="grouped append failed"):
        decided.result(60)  # the commit step is skipped for it
    assert futures[0].get().offset == 0  # appended on its own, before the group
    for f in futures[1:]:
        with pytest.raises(StorageError, match="grouped append failed"):
            f.get()
    p.abort_transaction()
    assert read_all(log, "a") == []
    p.begin_transaction()  # the producer goes on
    p.send("a", b"next", partition=0)
    p.commit_transaction()
    assert read_all(log, "a") == [b"next"]
    p.close()


def test_a_failed_group_deletes_the_objects_it_never_tried_to_append(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[Any]) -> None:
    """The group fails at partition 0: partition 1's object in it was never named by any
    append, so nothing can read it and it is deleted; partition 0's may have landed (an
    outcome can be unknown), so those stay."""
    gate = AppendGate(monkeypatch, fail_parts=True)
    gates.append(gate)
    p = log.producer(transactional_id="gleak", batch_size=300, linger_ms=60_000, retries=0)
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"a" * 400, partition=1)  # its append is held
    assert gate.held.wait(60)
    p.send("a", b"b" * 400, partition=0)  # registers partition 0 in its own turn
    p.send("a", b"c" * 200, partition=0)  # the commit's: partitions 0 and 1
    p.send("a", b"d" * 200, partition=1)
    decided = p.commit_transaction_async()
    gate.wait_uploads(3)
    gate.open()
    with pytest.raises(InvalidTxnStateError, match="grouped append failed"):
        decided.result(60)
    p.abort_transaction()
    p.close()
    objects = {tp: log.store.list(f"topics/a/{tp}/data/") for tp in (0, 1)}
    assert len(objects[0]) == 2  # b and c: their append was tried
    assert len(objects[1]) == 1  # a (appended); d was deleted
    assert read_all(log, "a", "read_uncommitted") == [b"a" * 400]


@pytest.mark.parametrize("transactional", [True, False])
def test_an_empty_send_batch_writes_nothing_and_hides_no_record(
        log: txlog.Log, transactional: bool) -> None:
    """An empty table is checked and then left out: a batch of no records started where
    the next batch does, and its commit marked only the empty one committed, so the
    record sent after it never became visible to read_committed readers."""
    empty = pa.table({"key": pa.array([], pa.binary()), "value": pa.array([], pa.binary())})
    p = log.producer(transactional_id="empty" if transactional else None)
    if transactional:
        p.init_transactions()
        p.begin_transaction()
    p.send_batch("a", empty, partition=0)
    p.flush()
    p.send("a", b"after", partition=0)
    with pytest.raises(SchemaMismatchError):
        p.send_batch("a", pa.table({"x": pa.array([], pa.int64())}), partition=0)
    with pytest.raises(UnknownTopicError):
        p.send_batch("a", empty, partition=7)
    if transactional:
        p.commit_transaction()
    p.flush()
    assert read_all(txlog.connect(log.url), "a") == [b"after"]
    st = txlog.connect(log.url).partition_log(TopicPartition("a", 0)).refresh()
    assert st.batches.count == [1]
    p.close()


def test_append_parts_false_appends_one_entry_per_object(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[Any]) -> None:
    """``append.parts=false`` keeps a producer's entries readable by txlog 0.1 (format
    version 1): the same backlog as above, one entry per object."""
    from helpers import data_entries

    gate = AppendGate(monkeypatch)
    gates.append(gate)
    p = log.producer(transactional_id="v1", batch_size=300, linger_ms=60_000,
                     **{"append.parts": False})
    p.init_transactions()
    p.begin_transaction()
    values = [f"v{i}".encode() * 160 for i in range(3)]
    _behind_a_held_append(p, gate, values)
    decided = p.commit_transaction_async()
    gate.wait_uploads(3)
    gate.open()
    decided.result(60)
    assert [(e.count, e.extra) for e in data_entries(log, "a", 0)] == [(1, None)] * 3
    assert read_all(log, "a") == values
    p.close()


def test_the_commit_appends_its_uploading_objects_in_one_entry(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """The committer comes to a transaction's first object while the later ones and the
    commit's own are still uploading: it waits for them (the commit waits for every one
    of them anyway) and appends one entry for all four, instead of one for the first and
    one for the rest; offsets and reads agree."""
    from helpers import data_entries

    real_write, real_claim, real_append = (PartitionLog.write_object,
                                           producer_mod.Producer._claim_ready,
                                           PartitionLog.append)
    uploads_go, claim_go = threading.Event(), threading.Event()
    claiming, decided_what = threading.Event(), threading.Event()
    first = threading.Event()

    def write_object(plog: PartitionLog, table: Any, **kw: Any) -> Any:
        if first.is_set():  # the first object goes at once, the rest wait
            assert uploads_go.wait(60), "test never released the uploads"
        first.set()
        return real_write(plog, table, **kw)

    def claim_ready(self: Any) -> Any:
        claiming.set()
        assert claim_go.wait(60), "test never released the committer"
        return real_claim(self)

    def committer_wait(fs: Any, *args: Any, **kw: Any) -> Any:
        if fs and threading.current_thread().name.startswith("txlog-commit"):
            decided_what.set()  # waiting for uploads: the committer chose to group
        return wait(fs, *args, **kw)

    def append(plog: PartitionLog, spec: Any) -> Any:
        if spec.kind == "data":
            decided_what.set()  # appending: the committer chose what to take along
        return real_append(plog, spec)

    monkeypatch.setattr(PartitionLog, "write_object", write_object)
    monkeypatch.setattr(producer_mod.Producer, "_claim_ready", claim_ready)
    monkeypatch.setattr(sender, "wait", committer_wait)
    monkeypatch.setattr(PartitionLog, "append", append)
    p = log.producer(transactional_id="tail", batch_size=300, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    values = [f"t{i}".encode() * 160 for i in range(3)]
    futures = [p.send("a", values[0], partition=0)]
    assert claiming.wait(60)  # the first object is written; the committer is held
    futures += [p.send("a", v, partition=0) for v in values[1:]]
    futures.append(p.send("a", b"tail", partition=0))
    decided = p.commit_transaction_async()
    claim_go.set()
    assert decided_what.wait(60)
    uploads_go.set()
    decided.result(60)
    assert [e.count for e in data_entries(log, "a", 0)] == [4]
    assert [f.get().offset for f in futures] == [0, 1, 2, 3]
    assert read_all(txlog.connect(log.url), "a") == [*values, b"tail"]
    p.close()


def test_a_commit_without_a_batch_of_its_own_starts_the_uploads_it_waits_for(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """The steps before a commit are past the in-flight bound and their uploads are
    done but the last one's, which waits for a slot; the commit has no batch of its own
    (the last full batch took every record), so it uploads nothing.  Queueing the
    commit must still start that upload, which the committer now waits for (a hang
    found in the benchmark)."""
    from helpers import data_entries

    real_claim, real_write_step = (producer_mod.Producer._claim_ready,
                                   producer_mod.Producer._write_step)
    claim_go, claiming = threading.Event(), threading.Event()
    done = threading.Condition()
    uploads = [0]

    def claim_ready(self: Any) -> Any:
        claiming.set()
        assert claim_go.wait(60), "test never released the committer"
        return real_claim(self)

    def write_step(self: Any, step: Any, fut: Any) -> None:
        real_write_step(self, step, fut)
        with done:
            uploads[0] += 1
            done.notify_all()

    monkeypatch.setattr(producer_mod.Producer, "_claim_ready", claim_ready)
    monkeypatch.setattr(producer_mod.Producer, "_write_step", write_step)
    p = log.producer(transactional_id="nobatch", batch_size=300, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    values = [f"n{i}".encode() * 160 for i in range(4)]
    futures = [p.send("a", values[0], partition=0)]
    assert claiming.wait(60)  # the first object is written; the committer is held
    futures += [p.send("a", v, partition=0) for v in values[1:]]
    with done:  # the second and third upload; the fourth waits (in-flight bound)
        assert done.wait_for(lambda: uploads[0] >= 3, 60)
    assert not p._pending  # nothing left for the commit's own batch
    assert len(p._to_upload) == 1  # the fourth, held back by the in-flight bound
    decided = p.commit_transaction_async()
    claim_go.set()
    decided.result(60)
    assert sum(e.count for e in data_entries(log, "a", 0)) == 4
    assert [f.get().offset for f in futures] == [0, 1, 2, 3]
    assert read_all(txlog.connect(log.url), "a") == values
    p.close()


def test_the_uploads_a_queued_commit_waits_for_run_more_at_once(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[UploadGate]) -> None:
    """While records are being sent, MAX_UPLOADS objects upload at once; once a commit is
    queued behind the waiting steps (its caller waits for them), DRAIN_UPLOADS do."""
    assert producer_mod.MAX_UPLOADS == 2 and producer_mod.DRAIN_UPLOADS == 4
    gate = UploadGate(monkeypatch)
    gates.append(gate)
    p = log.producer(transactional_id="drain", batch_size=300, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    # Writes 0 and 1 upload (held); the rest wait for a writer, three full batches to a
    # step (the join limit is four batch sizes): steps 2 (batches 2-4) .. 5 (11).
    values = [f"d{i:02}".encode() * 100 for i in range(12)]
    futures = gate.send_behind_two(p, values)
    with p._qlock:
        assert p._uploading == 2 and len(p._to_upload) == 4
    decided = p.commit_transaction_async()
    with p._qlock:  # queueing the commit started steps 2 and 3, no more
        assert p._uploading == 4 and len(p._to_upload) == 2
    gate.wait_entered(4)
    gate.open()
    decided.result(60)
    assert [f.get().offset for f in futures] == list(range(12))
    assert read_all(txlog.connect(log.url), "a") == values
    p.close()


def test_a_plain_producer_keeps_max_uploads_writer_threads(log: txlog.Log) -> None:
    """The writer pool sized for a commit's drain made a plain producer
    (which never drains for a commit) start a third writer thread."""
    p = log.producer(batch_size=300, linger_ms=60_000)
    for i in range(6):
        p.send("a", f"t{i}".encode() * 100, partition=0)
    p.flush()
    assert p._writer is not None and p._writer._max_workers == producer_mod.MAX_UPLOADS
    p.close()
