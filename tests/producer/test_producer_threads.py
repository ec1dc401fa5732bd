"""A transactional producer used from several threads at once: another thread reading
``producer.epoch`` (or flushing) may take a queued step's failure first, and the
producer must still neither commit what failed nor lose the failure; a commit's
callbacks may read; a re-initialised producer forgets what it rolled forward."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import pytest
from helpers import read_all
from test_pipelined_commit import held_commit

import txlog
from txlog.coordinator import Coordinator
from txlog.errors import InvalidTxnStateError, StorageError, TxlogError
from txlog.producer import Producer, State


@pytest.fixture
def log(tmp_path: object) -> txlog.Log:
    lg = txlog.connect(str(tmp_path))
    lg.create_topic("a", partitions=2)
    return lg


def fail_once(monkeypatch: pytest.MonkeyPatch, name: str, exc: BaseException) -> None:
    """Coordinator.<name> raises ``exc`` on its next call, then works again."""
    real = getattr(Coordinator, name)
    fails = [exc]

    def call(self: Coordinator, *a: Any, **kw: Any) -> Any:
        if fails:
            raise fails.pop()
        return real(self, *a, **kw)

    monkeypatch.setattr(Coordinator, name, call)


def read_epoch_elsewhere(p: Producer) -> None:
    """Another thread reads p.epoch (which settles, and takes a failed step's error)."""
    t = threading.Thread(target=lambda: p.epoch)
    t.start()
    t.join(60)


def test_a_failure_taken_by_another_thread_still_fails_the_commit(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queued write fails, and another thread takes the failure between the commit's
    checks and its queueing: the commit is still skipped and raises, the transaction is
    abortable, and nothing of it is visible."""
    p = log.producer(transactional_id="lost", linger_ms=60_000, batch_size=100)
    p.init_transactions()
    p.begin_transaction()
    fail_once(monkeypatch, "add_partitions", StorageError("injected: AddPartitions"))
    lost = p.send("a", b"x" * 200, partition=0)  # full: queued now; its step fails
    p.send("a", b"kept", partition=1)
    real_check = p._check_can_end

    def check() -> None:
        real_check()
        assert p._pipeline is not None
        wait([p._pipeline])
        read_epoch_elsewhere(p)

    monkeypatch.setattr(p, "_check_can_end", check)
    with pytest.raises(TxlogError):
        p.commit_transaction()
    monkeypatch.setattr(p, "_check_can_end", real_check)
    with pytest.raises(StorageError):
        lost.get()
    assert p.state == State.ABORTABLE_ERROR
    p.abort_transaction()
    assert read_all(log, "a", "read_uncommitted") == []
    p.begin_transaction()
    p.send("a", b"next", partition=1)
    p.commit_transaction()
    assert read_all(log, "a") == [b"next"]
    p.close()


def test_a_failed_commit_seen_first_by_another_thread_stays_abortable(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit step fails and another thread takes the failure before the commit
    call returns: the state is abortable, not READY, so the failed transaction's first
    batch is never committed by the next one."""
    # (the commit's own AddPartitions fails: one decided after its uploads registers)
    p = log.producer(transactional_id="race", linger_ms=60_000, **{"commit.inline.bytes": 0})
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"t1-partial", partition=0)
    p.flush()
    p.send("a", b"t1-lost", partition=1)
    fail_once(monkeypatch, "add_partitions", StorageError("injected: AddPartitions"))
    real_queue = p._queue

    def queue(fn: Any, batches: Any, outcome: Any = None) -> Any:
        fut = real_queue(fn, batches, outcome)
        if outcome is not None:  # the commit step: let it fail, another thread looks
            wait([fut])
            read_epoch_elsewhere(p)
        return fut

    monkeypatch.setattr(p, "_queue", queue)
    with pytest.raises(StorageError):
        p.commit_transaction()
    monkeypatch.setattr(p, "_queue", real_queue)
    assert p.state == State.ABORTABLE_ERROR
    p.abort_transaction()
    p.begin_transaction()
    p.send("a", b"t2", partition=1)
    p.commit_transaction()
    assert read_all(log, "a") == [b"t2"]
    p.close()


def test_a_commit_that_could_not_be_queued_cannot_be_retried(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """Queueing the commit fails (its pools are shut down, say): its batches fail, and a
    second commit_transaction() is refused instead of committing the rest."""
    p = log.producer(transactional_id="qraise", linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"first", partition=0)
    p.flush()
    lost = p.send("a", b"lost", partition=1)
    committer = p._committer
    assert committer is not None
    real_submit = committer.submit
    fails = [RuntimeError("cannot schedule new futures after shutdown")]

    def submit(*args: Any, **kwargs: Any) -> Any:
        if fails:
            raise fails.pop()
        return real_submit(*args, **kwargs)

    monkeypatch.setattr(committer, "submit", submit)
    with pytest.raises(RuntimeError):
        p.commit_transaction()
    with pytest.raises(RuntimeError):
        lost.get()
    with pytest.raises(TxlogError):
        p.commit_transaction()
    p.close()
    txlog.connect(log.url).producer(transactional_id="qraise").init_transactions()
    assert read_all(log, "a", "read_uncommitted") == [b"first"]
    assert read_all(log, "a") == []


def test_settle_on_another_thread_while_the_committer_writes_markers(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread completes the commit (markers and CompleteCommit) while the
    committer is still writing its markers: both finish, the producer stays usable,
    and the commit is visible once."""
    p = log.producer(transactional_id="dbl", linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"v", partition=0)
    x_past, x_go, in_markers, markers_go = (threading.Event() for _ in range(4))
    real_await = p._await_pipeline

    def await_pipeline(*, quiet: bool = False) -> None:
        real_await(quiet=quiet)
        if threading.current_thread().name == "X":
            x_past.set()
            assert x_go.wait(60)

    monkeypatch.setattr(p, "_await_pipeline", await_pipeline)
    real_markers = Coordinator.write_markers

    def write_markers(coord: Coordinator, prep: Any, **kw: Any) -> None:
        if threading.current_thread().name.startswith("txlog-commit"):
            in_markers.set()
            assert markers_go.wait(60)
        real_markers(coord, prep, **kw)

    monkeypatch.setattr(Coordinator, "write_markers", write_markers)
    x = threading.Thread(target=lambda: p.epoch, name="X")
    x.start()
    assert x_past.wait(60)  # X found nothing queued
    done = p.commit_transaction_async()
    assert in_markers.wait(60)
    x_go.set()
    x.join(60)  # X's settle wrote the markers and CompleteCommit
    markers_go.set()
    done.result(60)
    monkeypatch.setattr(p, "_await_pipeline", real_await)
    p.begin_transaction()
    assert p.state == State.IN_TRANSACTION
    p.abort_transaction()
    assert read_all(log, "a") == [b"v"]
    p.close()


def test_a_commit_callback_may_wait_for_a_read_on_another_thread(log: txlog.Log) -> None:
    """The future of commit_transaction_async() resolves once the markers are written:
    a callback that waits for a read on another thread sees the commit."""
    p, gate, done = held_commit(log, [], "cbx", [b"v"])  # held in prepare_end
    seen: list[Any] = []
    with ThreadPoolExecutor(1) as ex:
        done.add_done_callback(lambda _: seen.append(ex.submit(read_all, log, "a").result(60)))
        gate.open()
        p.flush()
    assert seen == [[b"v"]]
    p.close()


def test_second_init_transactions_is_refused_and_the_commit_still_completes(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit's markers failed; a second init_transactions() on the same instance is
    refused (as Kafka's client refuses it: it would fence the instance's own work), and
    the next transaction completes the decided commit first."""
    p = log.producer(transactional_id="reinit", linger_ms=60_000)
    p.init_transactions()
    fail_once(monkeypatch, "write_markers", StorageError("injected: markers"))
    p.begin_transaction()
    p.send("a", b"t1", partition=0)
    p.commit_transaction_async().result(60)
    with pytest.raises(InvalidTxnStateError, match="already called"):
        p.init_transactions()
    p.begin_transaction()
    p.send("a", b"t2", partition=0)
    p.commit_transaction()
    assert read_all(log, "a") == [b"t1", b"t2"]
    p.close()


class Overtaken:
    """A producer's lock as a send takes it: ``first`` (a close, commit or abort, as
    another thread would run it) runs to its end before the send gets the lock."""

    def __init__(self, p: Producer, first: Any) -> None:
        self.p, self.first, self.real = p, first, p._lock

    def __enter__(self) -> None:
        self.p._lock = self.real
        self.first()
        self.real.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.real.release()


def send_one(p: Producer, how: str, value: bytes) -> None:
    import pyarrow as pa

    if how == "send":
        p.send("a", value, partition=0)
    else:
        p.send_batch("a", pa.table({"value": [value]}), partition=0)


@pytest.mark.parametrize("how", ["send", "send_batch"])
def test_a_send_that_close_overtakes_fails_instead_of_queuing(log: txlog.Log,
                                                               how: str) -> None:
    """close() finishing between a send's state check and its lock (another thread
    closed the producer) must fail that send: a batch queued after close() is never
    written, and its future would never resolve."""
    from txlog.errors import InvalidTxnStateError

    p = log.producer()
    p.send("a", b"first", partition=0)  # starts the linger thread
    p.flush()
    p._lock = Overtaken(p, p.close)  # type: ignore[assignment]
    with pytest.raises(InvalidTxnStateError, match="closed producer"):
        send_one(p, how, b"late")
    assert not p._pending
    assert read_all(log, "a", "read_uncommitted") == [b"first"]


@pytest.mark.parametrize("how", ["send", "send_batch"])
@pytest.mark.parametrize("end", ["commit", "abort"])
def test_a_send_that_its_transactions_end_overtakes_is_in_no_transaction(
        log: txlog.Log, end: str, how: str) -> None:
    """A commit or abort (on another thread) that takes the pending batches between a
    send's state check and its lock fails that send: the record must not slip into the
    next transaction (where an aborted transaction's record would become visible)."""
    from txlog.errors import InvalidTxnStateError

    p = log.producer(transactional_id=f"overtaken-{end}-{how}")
    p.init_transactions()
    p.begin_transaction()
    send_one(p, how, b"one")
    ending = p.commit_transaction if end == "commit" else p.abort_transaction
    p._lock = Overtaken(p, ending)  # type: ignore[assignment]
    with pytest.raises(InvalidTxnStateError, match=f"being {end}"):
        send_one(p, how, b"late")
    assert not p._pending
    p.begin_transaction()
    send_one(p, how, b"two")
    p.commit_transaction()
    p.close()
    want = [b"one", b"two"] if end == "commit" else [b"two"]
    assert read_all(log, "a") == want


def test_send_batch_while_close_flushes_fails(log: txlog.Log) -> None:
    """A send_batch() (no future to carry an error) after close()'s flush, before the
    producer is marked closed, fails at once instead of being dropped silently."""
    from txlog.errors import InvalidTxnStateError

    p = log.producer()
    p.send("a", b"first", partition=0)
    flush = p.flush
    refused = []

    def flush_then_send() -> None:
        flush()
        with pytest.raises(InvalidTxnStateError, match="being closed") as exc:
            send_one(p, "send_batch", b"late")
        refused.append(exc.value)

    p.flush = flush_then_send  # type: ignore[method-assign]
    p.close()
    assert refused
    assert read_all(log, "a", "read_uncommitted") == [b"first"]


def outcome(fn: Any) -> Any:
    """What ``fn()`` returned, or the exception it raised."""
    try:
        return fn()
    except Exception as exc:
        return exc


def one_staged_object(lg: txlog.Log, value: bytes) -> Any:
    from txlog.producer import StagedObject
    from txlog.records import TopicPartition, kafka_table

    tp = TopicPartition("a", 0)
    key, n = lg.partition_log(tp).write_data(kafka_table([(None, value, None, None)]))
    return StagedObject(tp, key, 1, n)


@pytest.mark.parametrize("how", ["staged", "staged_many", "offsets", "app_version",
                                 "add_partitions"])
@pytest.mark.parametrize("end", ["commit", "abort"])
def test_other_writes_that_the_end_overtakes_are_in_no_transaction(
        log: txlog.Log, end: str, how: str) -> None:
    """The same for staged objects, offsets, app versions and partition registrations."""
    from txlog.errors import InvalidTxnStateError
    from txlog.records import TopicPartition

    p = log.producer(transactional_id=f"overtaken-{end}-{how}")
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"one", partition=0)
    obj = one_staged_object(log, b"late")
    p._lock = Overtaken(p, p.commit_transaction if end == "commit"  # type: ignore[assignment]
                        else p.abort_transaction)
    with pytest.raises(InvalidTxnStateError, match=f"being {end}"):
        if how == "staged":
            p.send_staged(obj.tp, obj.key, obj.rows, obj.nbytes)
        elif how == "staged_many":
            p.send_staged_many([obj])
        elif how == "offsets":
            p.send_offsets_to_transaction({TopicPartition("a", 1): 7}, "g")
        elif how == "app_version":
            p.send_app_version("app", 3)
        else:
            p.add_partitions_to_transaction([TopicPartition("a", 1)])
    p.begin_transaction()
    p.send("a", b"two", partition=0)
    p.commit_transaction()
    p.close()
    assert read_all(log, "a") == ([b"one", b"two"] if end == "commit" else [b"two"])


def test_a_commit_while_another_thread_aborts_is_refused(log: txlog.Log) -> None:
    """commit_transaction() on another thread after abort_transaction() took the pending
    batches (before it wrote the abort): one of them fails, and nothing commits (a batch
    already queued for writing must not commit while the pending one was failed)."""
    from txlog.errors import InvalidTxnStateError

    p = log.producer(transactional_id="abort-commit", batch_size=100)
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"x" * 200, partition=0)  # full: queued for writing at once
    p.send("a", b"pending", partition=1)  # still pending: the abort fails it
    abort_now = p._abort_now
    other: list[Any] = []

    def commit_elsewhere_then_abort() -> None:
        t = threading.Thread(target=lambda: other.append(outcome(p.commit_transaction)))
        t.start()
        t.join(60)
        abort_now()

    p._abort_now = commit_elsewhere_then_abort  # type: ignore[method-assign]
    assert outcome(p.abort_transaction) is None
    assert isinstance(other[0], InvalidTxnStateError), other
    p.close()
    assert read_all(log, "a") == []


def test_an_abort_while_another_thread_commits_is_refused(log: txlog.Log) -> None:
    """abort_transaction() on another thread after a commit was queued (before the
    committing thread marked the producer ready): the abort fails, the commit holds."""
    from txlog.errors import InvalidTxnStateError

    p = log.producer(transactional_id="commit-abort")
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"one", partition=0)
    queue = p._queue
    other: list[Any] = []

    def queue_then_abort_elsewhere(*a: Any, **kw: Any) -> Any:
        fut = queue(*a, **kw)
        if not other:
            t = threading.Thread(target=lambda: other.append(outcome(p.abort_transaction)))
            t.start()
            t.join(60)
        return fut

    p._queue = queue_then_abort_elsewhere  # type: ignore[method-assign]
    assert outcome(p.commit_transaction) is None
    assert isinstance(other[0], InvalidTxnStateError), other
    p.close()
    assert read_all(log, "a") == [b"one"]


def test_begin_while_close_settles_is_refused(log: txlog.Log) -> None:
    """A begin_transaction() (another thread) while close() settles fails: its sends
    would be dropped by close() without an error."""
    from txlog.errors import InvalidTxnStateError

    p = log.producer(transactional_id="begin-close")
    p.init_transactions()
    settle = p._close_settle
    began: list[Any] = []

    def settle_then_begin() -> None:
        settle()
        began.append(outcome(p.begin_transaction))

    p._close_settle = settle_then_begin  # type: ignore[method-assign]
    p.close()
    assert isinstance(began[0], InvalidTxnStateError) and "being closed" in str(began[0])
