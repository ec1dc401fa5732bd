"""Pipelined commits (``Producer.commit_transaction_async``): the next transaction is
produced while the last one commits, and exactly-once holds through failures."""

from __future__ import annotations

import concurrent.futures
import threading
from concurrent.futures import Future
from typing import Any

import pytest
from helpers import read_all

import txlog
from txlog import TopicPartition
from txlog.errors import InvalidTxnStateError, ProducerFencedError, StorageError
from txlog.producer import Producer


@pytest.fixture
def log(tmp_path: object) -> txlog.Log:
    # One object per partition: these tests hold and fail uploads of each partition's
    # object (PartitionLog.write_object); test_shared_objects.py covers shared ones.
    own: dict[str, Any] = {"batch.objects.shared": False}
    lg = txlog.connect(str(tmp_path), **own)
    lg.create_topic("a", partitions=2)
    return lg


class Gate:
    """Holds the committer thread inside ``Coordinator.prepare_end`` until opened; then
    runs it, or raises ``fail`` instead."""

    def __init__(self, log: txlog.Log, fail: BaseException | None = None) -> None:
        self.coord = log.coordinator
        self.real = self.coord.prepare_end
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.fail = fail
        self.coord.prepare_end = self._gated  # type: ignore[method-assign]

    def _gated(self, *args: Any, **kw: Any) -> Any:
        self.entered.set()
        assert self.opened.wait(60), "test gate never opened"
        self.coord.prepare_end = self.real  # type: ignore[method-assign]
        if self.fail is not None:
            raise self.fail
        return self.real(*args, **kw)

    def open(self) -> None:
        self.opened.set()


def held_commit(log: txlog.Log, gates: list[Gate], txn_id: str, values: list[bytes], *,
                fail: BaseException | None = None, **config: Any,
                ) -> tuple[Producer, Gate, Future[None]]:
    """A producer whose first transaction (``values`` to partition 0) was committed with
    commit_transaction_async() and is held inside prepare_end: (producer, gate, the
    commit's future)."""
    p = log.producer(transactional_id=txn_id, **config)
    p.init_transactions()
    gate = Gate(log, fail=fail)
    gates.append(gate)
    p.begin_transaction()
    for v in values:
        p.send("a", v, partition=0)
    first = p.commit_transaction_async()
    assert gate.entered.wait(60)
    return p, gate, first


def test_pipelined_commits_are_exactly_once_and_in_order(log: txlog.Log) -> None:
    """Twenty transactions over two partitions, every third aborted, committed without
    waiting: the committed records appear once each, in send order per partition, with
    the offsets their futures report; the aborted ones never."""
    p = log.producer(transactional_id="pipe", batch_size=200)  # several flushes a txn
    p.init_transactions()
    want: dict[int, list[bytes]] = {0: [], 1: []}
    commits = []
    sent: list[tuple[bytes, Any]] = []
    for t in range(20):
        p.begin_transaction()
        mine = []
        for i in range(12):
            v = f"t{t}-{i}".encode()
            mine.append((i % 2, v, p.send("a", v, partition=i % 2)))
        if t % 3 == 2:
            p.abort_transaction()
            continue
        commits.append(p.commit_transaction_async())
        for part, v, fut in mine:
            want[part].append(v)
            sent.append((v, fut))
    p.flush()  # waits for the committer's queue
    for commit in commits:
        assert commit.result() is None
    p.close()
    offsets = {v: f.get() for v, f in sent}
    for part in (0, 1):
        c = log.consumer(isolation_level="read_committed", auto_offset_reset="earliest")
        c.assign([TopicPartition("a", part)])
        got = []
        while batch := c.poll(10_000):
            got.extend(batch)
        assert [r.value for r in got] == want[part]
        for r in got:
            md = offsets[r.value]
            assert (md.partition, md.offset) == (part, r.offset)


def test_next_transaction_is_produced_while_the_commit_is_in_flight(
        log: txlog.Log, gates: list[Gate]) -> None:
    """While PrepareCommit of transaction 1 cannot be written, the caller begins
    transaction 2 and sends (with flushes) without waiting; transaction 2's entries land
    after transaction 1's, and both commit."""
    p, gate, first = held_commit(log, gates, "inflight",
                                 [f"one-{i}".encode() for i in range(5)], batch_size=100)
    assert not first.done()
    finished = threading.Event()

    def second_txn_sends() -> None:
        p.begin_transaction()
        for i in range(50):  # batch.size 100: many flushes, each queued
            p.send("a", f"two-{i}".encode(), partition=i % 2)
        finished.set()

    t = threading.Thread(target=second_txn_sends)
    t.start()
    t.join(60)
    assert finished.is_set(), "sends of the next transaction waited for the commit"
    assert not first.done()
    assert read_all(log, "a", "read_uncommitted") == [f"one-{i}".encode() for i in range(5)]
    gate.open()
    assert first.result(60) is None
    p.commit_transaction()
    p.close()
    got = read_all(log, "a")
    assert sorted(got) == sorted([f"one-{i}".encode() for i in range(5)]
                                 + [f"two-{i}".encode() for i in range(50)])
    part0 = [v for v in got if v.startswith(b"one")] + \
        [f"two-{i}".encode() for i in range(0, 50, 2)]
    c = log.consumer(isolation_level="read_committed", auto_offset_reset="earliest")
    c.assign([TopicPartition("a", 0)])
    seen: list[bytes] = []
    while batch := c.poll(10_000):
        seen.extend(r.value for r in batch)
    assert seen == part0  # transaction 1's records first


def test_failed_commit_fails_the_next_operation_and_abort_undoes_both(
        log: txlog.Log, gates: list[Gate]) -> None:
    """PrepareCommit fails while the next transaction's batches are queued behind it:
    those are skipped (never written), the caller's next operation raises the error, and
    one abort leaves neither transaction visible.  The producer then works again."""
    p, gate, first = held_commit(
        log, gates, "fails", [b"one"],
        fail=StorageError("injected: PrepareCommit write failed"), batch_size=100)
    p.begin_transaction()
    queued = [p.send("a", f"two-{i}".encode(), partition=0) for i in range(20)]
    gate.open()
    with pytest.raises(StorageError, match="injected"):
        first.result(60)
    with pytest.raises(StorageError, match="injected"):
        p.commit_transaction()
    with pytest.raises(InvalidTxnStateError, match="abort_transaction"):
        p.send("a", b"more", partition=0)
    p.abort_transaction()
    for f in queued:
        with pytest.raises(Exception):  # noqa: B017 - skipped, or failed by the abort
            f.get()
    assert not any(v.startswith(b"two") for v in read_all(log, "a", "read_uncommitted"))
    assert read_all(log, "a") == []
    p.begin_transaction()
    p.send("a", b"three", partition=1)
    p.commit_transaction_async().result(60)
    p.close()
    assert read_all(log, "a") == [b"three"]


def test_fenced_during_a_pipelined_commit(log: txlog.Log, gates: list[Gate],
                                          tmp_path: object) -> None:
    """A new instance fences this one while its commit waits: the commit fails as
    fenced, nothing of it is visible, and the old instance only closes."""
    p, gate, first = held_commit(log, gates, "zombie", [b"old"])
    gate.coord.prepare_end = gate.real  # type: ignore[method-assign]  # for the new one
    new = txlog.connect(str(tmp_path)).producer(transactional_id="zombie")
    new.init_transactions()  # aborts the old instance's open transaction
    gate.open()
    with pytest.raises(ProducerFencedError):
        first.result(60)
    with pytest.raises(ProducerFencedError):
        p.begin_transaction()
    p.close()
    new.begin_transaction()
    new.send("a", b"new", partition=0)
    new.commit_transaction()
    new.close()
    assert read_all(log, "a") == [b"new"]


def test_linger_writes_a_quiet_producers_batch(log: txlog.Log, tmp_path: object) -> None:
    """A non-transactional producer's batch is written linger.ms after its first record
    although nothing else is sent and nobody flushes (Kafka's sender thread does the
    same); a transactional producer's records still wait for flush or commit."""
    p = log.producer(linger_ms=20)
    p._maybe_flush = lambda tp, batch: None  # type: ignore[method-assign]  # only the thread
    fut = p.send("a", b"quiet", partition=1)
    md = fut.get(timeout=60)  # waits for the linger thread, no flush()
    assert (md.partition, md.offset) == (1, 0)
    other = txlog.connect(str(tmp_path))  # a fresh client sees it
    assert read_all(other, "a", "read_uncommitted") == [b"quiet"]
    lingerer = p._lingerer
    assert lingerer is not None and lingerer.is_alive()
    p.send("a", b"last", partition=0)
    p.close()  # writes what is left and stops the thread
    assert not lingerer.is_alive()
    assert sorted(read_all(other, "a", "read_uncommitted")) == [b"last", b"quiet"]
    # An hour's linger: send() itself would write a batch past linger, on a slow machine
    # too soon for the check below.
    t = log.producer(transactional_id="no-linger", linger_ms=3_600_000)
    t.init_transactions()
    t.begin_transaction()
    pending = t.send("a", b"txn", partition=0)
    with pytest.raises(InvalidTxnStateError, match="flush"):
        pending.get(timeout=0.5)
    t.commit_transaction()
    assert pending.get().partition == 0
    t.close()


def test_flush_on_another_thread_while_sends_queue(log: txlog.Log,
                                                   gates: list[Gate]) -> None:
    """A flush() on one thread, waiting for the committer, must not lose
    track of steps another thread's sends queued meanwhile (the commit then went ahead
    of their entries and 18 of 55 records were missing).  One thread sends single-record
    batches behind a pipelined commit while another flushes; every record is committed
    once, at the offset its future reports."""
    # batch.size 1: every send queues a step
    p, gate, first = held_commit(log, gates, "threads", [b"first"], batch_size=1)
    p.begin_transaction()
    futs: list[tuple[bytes, Any]] = []
    errors: list[BaseException] = []

    def sender() -> None:
        try:
            for i in range(150):
                v = b"x%03d" % i
                futs.append((v, p.send("a", v, partition=0)))
        except BaseException as exc:  # reported by the assert below
            errors.append(exc)

    t = threading.Thread(target=sender)
    t.start()
    gate.open()
    while t.is_alive():
        p.flush()
    t.join()
    assert not errors
    first.result(60)
    p.commit_transaction()
    p.close()
    got = read_all(log, "a")
    assert got == [b"first"] + [v for v, _ in futs]
    c = log.consumer(isolation_level="read_committed", auto_offset_reset="earliest")
    c.assign([TopicPartition("a", 0)])
    by_offset: dict[int, bytes] = {}
    while batch := c.poll(10_000):
        by_offset.update((r.offset, r.value) for r in batch)
    assert all(by_offset[f.get().offset] == v for v, f in futs)


def test_a_flush_waiting_on_another_thread_keeps_later_steps_in_order(
        log: txlog.Log, gates: list[Gate], monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving behind this bug, step by step: thread B's flush() waits
    for the commit; the caller then queues a batch ("one") that is still being written
    when B's wait ends.  The caller's next batch ("two") must queue behind "one", not be
    written at once ahead of it."""
    import txlog.producer as producer_module

    b_waiting = threading.Event()
    release_one = threading.Event()
    from txlog.producer import sender

    real_wait = concurrent.futures.wait
    real_write = producer_module.Producer._write_batches

    def spying_wait(fs: Any, *args: Any, **kw: Any) -> Any:
        if threading.current_thread().name == "flusher":
            b_waiting.set()
        return real_wait(fs, *args, **kw)

    def held_write(self: Any, batches: Any, *args: Any, **kw: Any) -> Any:
        if any(r[1] == b"one" for _, b in batches for r in b.rows):
            assert release_one.wait(60), "test never released batch one"
        return real_write(self, batches, *args, **kw)

    monkeypatch.setattr(sender, "wait", spying_wait)
    monkeypatch.setattr(producer_module.Producer, "_write_batches", held_write)
    p, gate, first = held_commit(log, gates, "order", [b"first"], batch_size=1)
    p.begin_transaction()
    b = threading.Thread(target=p.flush, name="flusher")
    b.start()
    assert b_waiting.wait(60)
    one = p.send("a", b"one", partition=0)  # queued behind the commit, then held
    gate.open()
    b.join(60)
    assert not b.is_alive()
    assert first.result(60) is None
    two = p.send("a", b"two", partition=0)
    release_one.set()
    p.commit_transaction()
    p.close()
    assert read_all(log, "a") == [b"first", b"one", b"two"]
    assert one.get().offset < two.get().offset


def test_a_write_the_linger_thread_failed_is_raised_by_the_next_flush(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """send_batch() returns no future, so a batch the linger thread
    queued and the background writer failed to write must fail the next flush(), as the
    flush would have."""
    from txlog.partition_log import PartitionLog

    real_write = PartitionLog.write_object
    attempted = threading.Event()

    def failing_write(self: Any, table: Any, **kw: Any) -> Any:
        if threading.current_thread().name.startswith("txlog-write"):
            attempted.set()
            raise StorageError("injected: batch object write failed")
        return real_write(self, table, **kw)

    monkeypatch.setattr(PartitionLog, "write_object", failing_write)
    p = log.producer(linger_ms=1)
    # Only the linger thread writes: send_batch() itself would flush a batch past linger
    # (CI run: a slow send_batch() wrote it on the caller's thread).
    monkeypatch.setattr(p, "_maybe_flush", lambda tp, batch: None)
    import pyarrow as pa

    p.send_batch("a", pa.table({"value": [b"lost"]}), partition=0)
    assert attempted.wait(60)
    with pytest.raises(StorageError, match="injected"):
        p.flush()
    p.flush()  # raised once; nothing else is pending
    p.close()
    assert read_all(log, "a", "read_uncommitted") == []


def _commit_second_while_first_held(
        log: txlog.Log, gates: list[Gate], monkeypatch: pytest.MonkeyPatch, txn_id: str,
        fail: BaseException) -> tuple[Producer, Future[None], list[str],
                                      list[BaseException | None]]:
    """Hold a first transaction inside prepare_end (then fail it with ``fail``), and call
    commit_transaction_async() for a second one (b"second" to partition 0) on a thread.
    Returns once the second batch object is written, with the first still held: (producer,
    the first commit's future, keys of every batch object written, the second call's
    outcome, filled once the gate opens and the thread is joined)."""
    from txlog.partition_log import PartitionLog

    written: list[str] = []
    second_written = threading.Event()
    real_write = PartitionLog.write_object

    def write_object(self: PartitionLog, table: Any, **kw: Any) -> Any:
        out = real_write(self, table, **kw)
        written.append(out[0])
        if b"second" in table.column("value").to_pylist():
            second_written.set()
        return out

    monkeypatch.setattr(PartitionLog, "write_object", write_object)
    # (the objects as write_object writes them: decided after its uploads)
    p, gate, first = held_commit(log, gates, txn_id, [b"first"], fail=fail,
                                 **{"commit.inline.bytes": 0})
    p.begin_transaction()
    p.send("a", b"second", partition=0)
    outcome: list[BaseException | None] = []

    def commit_second() -> None:
        try:
            p.commit_transaction_async()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=commit_second)
    t.start()
    assert second_written.wait(60), "the second batch was not written while the first " \
                                    "commit was held"
    assert not first.done()
    gate.open()
    t.join(60)
    assert not t.is_alive()
    return p, first, written, outcome


def test_next_commit_uploads_while_the_last_is_decided(
        log: txlog.Log, gates: list[Gate], monkeypatch: pytest.MonkeyPatch) -> None:
    """commit_transaction_async() queues its transaction before it waits for the last
    commit: the batch object is written while that commit is still held.  When the held
    commit then fails, the waiting call raises its error, the queued transaction is never
    written, and one abort leaves the producer working."""
    p, first, written, outcome = _commit_second_while_first_held(
        log, gates, monkeypatch, "overlap", StorageError("injected: PrepareCommit failed"))
    assert len(outcome) == 1 and isinstance(outcome[0], StorageError)
    with pytest.raises(StorageError, match="injected"):
        first.result(60)
    p.abort_transaction()
    # Neither: "first" was named by the PrepareCommit that failed (its COMMIT marker would
    # have appended it), "second" was never written.
    assert read_all(log, "a", "read_uncommitted") == []
    assert read_all(log, "a") == []
    # The skipped transaction's object was discarded (no entry ever named it).
    assert all(not log.store.exists(k) for k in written[1:])
    p.begin_transaction()
    p.send("a", b"third", partition=1)
    p.commit_transaction_async().result(60)
    p.close()
    assert read_all(log, "a") == [b"third"]


def test_next_commit_after_a_fenced_one_leaves_the_producer_fenced(
        log: txlog.Log, gates: list[Gate], monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit held in flight turns out fenced while the next commit_transaction_async()
    waits for it: that call raises ProducerFencedError and the producer stays fenced (its
    next operation raises the same), as if the two calls had not overlapped."""
    from txlog.producer import State

    p, first, _, outcome = _commit_second_while_first_held(
        log, gates, monkeypatch, "fenced-next", ProducerFencedError("injected: fenced"))
    assert len(outcome) == 1 and isinstance(outcome[0], ProducerFencedError)
    with pytest.raises(ProducerFencedError):
        first.result(60)
    assert p.state == State.FATAL_ERROR
    with pytest.raises(ProducerFencedError):
        p.begin_transaction()
    p.close()
    assert read_all(log, "a") == []


class MarkerGate:
    """Holds the first ``Coordinator.write_markers`` call (the committer's) until opened,
    and records every state-log write that lands."""

    def __init__(self, log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
        from txlog.coordinator import Coordinator
        from txlog.state_log import StateLogPartition

        self.entered = threading.Event()
        self.opened = threading.Event()
        self.writes: list[Any] = []
        self.calls = 0
        real_markers = Coordinator.write_markers
        real_cas = StateLogPartition.compare_and_set
        gate = self

        def write_markers(coord: Coordinator, prep: Any, **kw: Any) -> None:
            gate.calls += 1
            if gate.calls == 1:
                gate.entered.set()
                assert gate.opened.wait(60), "test gate never opened"
            real_markers(coord, prep, **kw)

        def compare_and_set(part: StateLogPartition, txn_id: str, expected: Any,
                            new: Any) -> bool:
            won = real_cas(part, txn_id, expected, new)
            if won:
                gate.writes.append(new)
            return won

        monkeypatch.setattr(Coordinator, "write_markers", write_markers)
        monkeypatch.setattr(StateLogPartition, "compare_and_set", compare_and_set)

    def open(self) -> None:
        self.opened.set()


def queue_behind(p: Producer, monkeypatch: pytest.MonkeyPatch) -> threading.Thread:
    """flush() ``p`` on another thread; returns once the flush has queued its batches
    (the thread then waits for the committer)."""
    queued = threading.Event()
    real = p._backpressure

    def backpressure() -> None:
        queued.set()
        real()

    monkeypatch.setattr(p, "_backpressure", backpressure)
    flusher = threading.Thread(target=p.flush)
    flusher.start()
    assert queued.wait(60)
    return flusher


def commit_with_markers_held(log: txlog.Log, monkeypatch: pytest.MonkeyPatch,
                             gates: list[Any], txn_id: str, **config: Any,
                             ) -> tuple[Producer, MarkerGate]:
    """A producer whose first transaction (b"first" to partition 0) is decided, with
    its markers held by a MarkerGate."""
    gate = MarkerGate(log, monkeypatch)
    gates.append(gate)
    p = log.producer(transactional_id=txn_id, linger_ms=60_000, **config)
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"first", partition=0)
    done = p.commit_transaction_async()
    assert gate.entered.wait(60)  # decided; its markers are held
    assert p._last_commit is not None and p._last_commit.done() and not done.done()
    return p, gate


def test_complete_commit_is_written_with_the_next_add_partitions(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[Any]) -> None:
    """When the next transaction's first write is queued while the last commit's markers
    are being written, CompleteCommit and that write's AddPartitions are one state-log
    write: PrepareCommit is followed by an Ongoing record that names the
    commit; both transactions are visible exactly once, and a retried EndTxn of the
    first gets the second's epoch, not an error."""
    p, gate = commit_with_markers_held(log, monkeypatch, gates, "fold")
    pid, epoch = first_txn = (p._producer_id, p._epoch)
    p.begin_transaction()
    p.send("a", b"second", partition=1)
    flusher = queue_behind(p, monkeypatch)
    gate.open()
    flusher.join(60)
    states = [(r.state, r.prev_outcome) for r in gate.writes]
    i = states.index(("PrepareCommit", ""))
    assert states[i + 1:] == [("Ongoing", "commit")], states  # no CompleteCommit
    folded = gate.writes[i + 1]
    assert (folded.prev_producer_id, folded.prev_epoch) == first_txn
    assert folded.partitions == (("a", 1),) and folded.epoch == epoch + 1
    # EndTxn of the first transaction again (a retry) is answered from the record.
    other = txlog.connect(log.url).coordinator
    assert other.end_txn("fold", pid, epoch, commit=True).next_id == (folded.producer_id,
                                                                      folded.epoch)
    p.commit_transaction()
    assert sorted(read_all(log, "a")) == [b"first", b"second"]
    p.close()


def test_a_commit_rolled_forward_by_another_client_meanwhile(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[Any]) -> None:
    """Another client (here ``txlog maintain``'s sweep) completes the commit after its
    CompleteCommit was left to the next transaction: the combined write loses its race, the
    producer takes the other client's CompleteCommit and registers the usual way, and
    both transactions are visible exactly once."""
    p, gate = commit_with_markers_held(log, monkeypatch, gates, "race")
    p.begin_transaction()
    p.send("a", b"second", partition=0)
    flusher = queue_behind(p, monkeypatch)
    other = txlog.connect(log.url)
    assert other.coordinator.sweep() == ["race"]  # markers (not held) and CompleteCommit
    gate.open()
    flusher.join(60)
    p.commit_transaction()
    states = [r.state for r in gate.writes]
    assert "CompleteCommit" in states and states.count("PrepareCommit") == 2
    assert read_all(log, "a") == [b"first", b"second"]
    p.close()


def test_only_a_commit_completes_into_the_next_transaction() -> None:
    """Pure state machine: Ongoing may follow PrepareCommit (the combined write), never
    PrepareAbort (an abort completes before the producer goes on); the record keeps
    what it completed through JSON."""
    from txlog.txn_state import TxnRecord

    ongoing = TxnRecord("t", 7, 3, "Ongoing", 60_000, (("a", 0),))
    nxt = ongoing.transition("PrepareCommit").transition(
        "Ongoing", epoch=4, prev_producer_id=7, prev_epoch=3, prev_outcome="commit")
    assert TxnRecord.from_json(nxt.to_json(), "test") == nxt
    with pytest.raises(InvalidTxnStateError):
        ongoing.transition("PrepareAbort").transition("Ongoing")


def test_a_decided_callback_may_read_without_deadlock(log: txlog.Log,
                                                      gates: list[Any]) -> None:
    """Callbacks of the future from commit_transaction_async() run on the committer
    thread right after the decision, before it writes the markers: a read there must not
    wait for those markers (it would wait for its own thread)."""
    p, gate, decided = held_commit(log, gates, "cb", [b"v"])  # held in prepare_end
    seen: list[list[bytes]] = []
    decided.add_done_callback(lambda f: seen.append(read_all(log, "a")))
    gate.open()
    flusher = threading.Thread(target=p.flush, daemon=True)
    flusher.start()
    flusher.join(60)
    assert not flusher.is_alive(), "the committer is stuck in the callback's read"
    assert len(seen) == 1 and seen[0] in ([], [b"v"])
    assert read_all(log, "a") == [b"v"]
    p.close()


def test_a_queued_commit_cannot_be_cancelled(log: txlog.Log, gates: list[Any]) -> None:
    """The future of a queued commit refuses cancel(): the commit goes on, and it is
    visible once decided."""
    p, gate, decided = held_commit(log, gates, "cancel", [b"v"])
    assert not decided.cancel()
    gate.open()
    decided.result(60)
    p.flush()
    assert read_all(log, "a") == [b"v"]
    p.close()


def test_close_completes_a_commit_whose_combined_write_failed(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, gates: list[Any]) -> None:
    """CompleteCommit was left to the next transaction's first write, and that combined
    write failed: close() still writes CompleteCommit (the store works again), so no
    PrepareCommit is left behind."""
    from txlog.coordinator import Coordinator

    real = Coordinator.complete_into_next
    fails = [StorageError("injected: combined write failed")]

    def complete_into_next(coord: Coordinator, prep: Any, tps: Any) -> Any:
        if fails:
            raise fails.pop()
        return real(coord, prep, tps)

    monkeypatch.setattr(Coordinator, "complete_into_next", complete_into_next)
    p, gate = commit_with_markers_held(log, monkeypatch, gates, "fc", batch_size=300)
    p.begin_transaction()
    p.send("a", b"x" * 400, partition=1)  # full: queued behind the held markers
    gate.open()
    p.close()
    rec = txlog.connect(log.url).coordinator.record("fc")
    assert rec is not None and rec.state == "CompleteCommit"
    assert read_all(log, "a") == [b"first"]


def test_a_retried_end_is_answered_by_the_record_that_ended_it(log: txlog.Log) -> None:
    """Coordinator: EndTxn of a transaction that already ended is answered from the next
    transaction's Ongoing record too, with the outcome it ended with: after a plain
    CompleteCommit + AddPartitions, and after a combined write followed by an abort."""
    c = log.coordinator
    pid, e0 = c.init_producer_id("t", 60_000)
    c.add_partitions("t", pid, e0, [TopicPartition("a", 0)])
    first = c.prepare_end("t", pid, e0, True).prep
    assert first is not None
    nxt = c.complete(first).next_id
    assert nxt is not None
    c.add_partitions("t", *nxt, [TopicPartition("a", 1)])
    assert c.end_txn("t", pid, e0, True).next_id == nxt  # not "fenced"
    # A combined write, then that transaction aborts: the record must say "abort".
    pid, e1 = nxt
    prep = c.prepare_end("t", pid, e1, True).prep
    assert prep is not None
    c.write_markers(prep)
    got = c.complete_into_next(prep, [TopicPartition("a", 0)])
    assert got is not None and got.next_id is not None
    pid, e2 = got.next_id
    aborted = c.end_txn("t", pid, e2, False).next_id
    assert aborted is not None
    pid, e3 = aborted
    c.add_partitions("t", pid, e3, [TopicPartition("a", 1)])
    rec = c.record("t")
    assert rec is not None and (rec.prev_epoch, rec.prev_outcome) == (e2, "abort")
    with pytest.raises(ProducerFencedError):
        c.end_txn("t", pid, e2, True)  # it aborted: a commit retry is refused
    assert c.end_txn("t", pid, e2, False).next_id == (pid, e3)
