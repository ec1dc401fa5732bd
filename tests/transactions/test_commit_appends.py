"""A commit's last batches appended by its COMMIT markers (``commit.appends.batches``).

PrepareCommit names the batch objects no entry appended yet; each partition's COMMIT
marker appends them and commits the transaction there in one put-if-absent.  A BEGIN
entry, written while the objects upload, opens the transaction in a partition first, so
a reader meets it there and rolls a decided commit forward if its producer is gone.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog import TopicPartition
from txlog.errors import InvalidTxnStateError, StorageError, TxlogError
from txlog.model import BEGIN, COMMIT
from txlog.partition_log import AppendSpec, PartitionLog
from txlog.records import kafka_table
from txlog.txn_state import ONGOING, PREPARE_COMMIT, PendingAppend, TxnRecord

#: The decision written after the uploads, beside BEGIN entries (what these tests
#: look at); a commit decided beside its uploads is tested with its own name.
PLAIN = {"commit.inline.bytes": 0}


def entries(log: txlog.Log, topic: str, partition: int) -> list[Any]:
    from helpers import data_entries

    return data_entries(log, topic, partition, ("data", "commit", "abort", "begin"))


def values(log: txlog.Log, topic: str, isolation: str = "read_committed") -> list[bytes]:
    c = txlog.connect(log.url).consumer(isolation_level=isolation)
    c.assign(log.partitions_for(topic))
    c.seek_to_beginning()
    out: list[bytes] = []
    while got := c.poll(max_records=10_000):
        out.extend(r.value for r in got)
    return out


@pytest.fixture
def log(tmp_path: Path) -> txlog.Log:
    lg = txlog.connect(str(tmp_path))
    lg.create_topic("a", partitions=2)
    return lg


def test_a_small_commit_writes_begin_then_one_marker_that_carries_its_batch(
        log: txlog.Log) -> None:
    """Per partition: BEGIN, then COMMIT carrying the batch (no DATA entry): three
    conditional writes per transaction (AddPartitions, BEGIN, PrepareCommit) before the
    decision, and the marker after it.  The batch's records take the offsets before the
    marker; futures, a fresh reader and the LSO agree."""
    p = log.producer(transactional_id="small", **PLAIN)
    p.init_transactions()
    futs = []
    for n in range(3):
        p.begin_transaction()
        futs.append(p.send("a", f"r{n}".encode(), partition=0))
        p.commit_transaction()
    assert [f.get(60).offset for f in futs] == [0, 2, 4]
    p.close()
    assert [(e.kind, e.count) for e in entries(log, "a", 0)] == [
        (BEGIN, 0), (COMMIT, 2)] * 3
    assert values(log, "a") == [b"r0", b"r1", b"r2"]
    st = txlog.connect(log.url).partition_log(TopicPartition("a", 0)).refresh()
    assert st.last_stable_offset == st.high_watermark == 6 and not st.open_txns


@pytest.mark.parametrize("inline", [False, True], ids=["begin-entry", "decided-beside"])
def test_a_read_in_the_committing_process_sees_the_commit(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, inline: bool) -> None:
    """commit_transaction() returns once PrepareCommit is durable; a read in the same
    process waits for the marker that appends the batch (the BEGIN entry tells it the
    transaction is open there; a commit decided beside its uploads writes none, and the
    process knows the partitions it registered), so it never misses the commit it just
    made."""
    from txlog import completions

    gate, waiting = threading.Event(), threading.Event()
    name = "wait_for_partition" if inline else "wait_for"
    real_wait = getattr(completions, name)

    def spy(*args: Any) -> bool:
        if not inline or tuple(args) in completions._by_partition:
            waiting.set()  # (about to wait for this process's commit)
        return bool(real_wait(*args))

    monkeypatch.setattr(completions, name, spy)
    p = log.producer(transactional_id="ryw", **({} if inline else PLAIN))
    p.init_transactions()
    real = log.coordinator.write_marker

    def held(*args: Any, **kw: Any) -> None:
        assert gate.wait(60), "test never released the marker"
        real(*args, **kw)

    log.coordinator.write_marker = held  # type: ignore[method-assign]
    p.begin_transaction()
    p.send("a", b"mine", partition=1)
    p.commit_transaction()  # decided; the marker is held
    assert log.coordinator.record("ryw").state == PREPARE_COMMIT  # type: ignore[union-attr]
    seen: list[bytes] = []

    def read() -> None:
        c = log.consumer()
        c.assign([TopicPartition("a", 1)])
        c.seek_to_beginning()  # (waits for this process's marker)
        seen.extend(r.value for r in c.poll(1000))

    reader = threading.Thread(target=read)
    reader.start()
    assert waiting.wait(60), "the reader never waited for the commit"
    gate.set()
    reader.join(60)
    assert seen == [b"mine"]
    p.close()


def _prepared_with_pending(log: txlog.Log, txn_id: str, rows: int) -> TxnRecord:
    """A transaction decided as a crashed producer leaves it: registered, BEGIN written
    in partitions 0 and 1, objects uploaded, PrepareCommit naming them; no marker."""
    coord = log.coordinator
    pid, epoch = coord.init_producer_id(txn_id, 60_000)
    tps = [TopicPartition("a", 0), TopicPartition("a", 1)]
    coord.add_partitions(txn_id, pid, epoch, tps)
    pending = []
    for tp in tps:
        plog = log.partition_log(tp)
        plog.append(AppendSpec(kind=BEGIN, count=0, producer_id=pid, epoch=epoch,
                               transactional=True, txn_id=txn_id))
        key, nbytes = plog.write_data(kafka_table(
            [(None, f"{tp.partition}-{i}".encode(), None, None) for i in range(rows)]))
        pending.append(PendingAppend(tp.topic, tp.partition, 0,
                                     ((key, rows, nbytes, None, None, True),)))
    prep = coord.prepare_end(txn_id, pid, epoch, True, tuple(pending)).prep
    assert prep is not None and prep.state == PREPARE_COMMIT
    return prep


def test_a_reader_alone_rolls_a_decided_commit_forward_and_appends_its_batches(
        log: txlog.Log) -> None:
    _prepared_with_pending(log, "gone", 3)
    assert values(log, "a") == [b"0-0", b"0-1", b"0-2", b"1-0", b"1-1", b"1-2"]
    rec = log.coordinator.record("gone")
    assert rec is not None and rec.state == "CompleteCommit" and not rec.pending
    for part in (0, 1):
        assert [(e.kind, e.count) for e in entries(log, "a", part)] == [(BEGIN, 0), (COMMIT, 4)]


def test_racing_roll_forwards_append_the_batches_once(log: txlog.Log) -> None:
    """Four clients roll the same PrepareCommit forward at once: one marker per
    partition lands with the batches; the others see it and append nothing."""
    prep = _prepared_with_pending(log, "race", 2)
    clients = [txlog.connect(log.url) for _ in range(4)]
    start = threading.Barrier(len(clients))
    errors: list[BaseException] = []

    def roll(c: txlog.Log) -> None:
        try:
            start.wait(30)
            c.coordinator.write_markers(prep)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=roll, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for part in (0, 1):
        assert [(e.kind, e.count) for e in entries(log, "a", part)] == [(BEGIN, 0), (COMMIT, 3)]
    assert sorted(values(log, "a")) == [b"0-0", b"0-1", b"1-0", b"1-1"]


@pytest.mark.parametrize("then", ["next_transaction", "get_alone"])
def test_a_failed_marker_leaves_the_commit_standing_and_the_next_call_appends_it(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, then: str) -> None:
    """The marker that carries the batch fails: the commit stands (PrepareCommit is
    durable), the batch's future waits, and the producer's next call writes the marker
    (or the future's get() does, if the application only asks for the offset): the
    records appear once, where the future says."""
    real = PartitionLog.append
    failed: list[AppendSpec] = []

    def flaky(plog: PartitionLog, spec: AppendSpec) -> Any:
        if spec.kind == COMMIT and spec.parts and not failed:
            failed.append(spec)
            raise StorageError("injected: the marker failed")
        return real(plog, spec)

    monkeypatch.setattr(PartitionLog, "append", flaky)
    p = log.producer(transactional_id="flaky", retries=0, **PLAIN)
    p.init_transactions()
    p.begin_transaction()
    fut = p.send("a", b"kept", partition=0)
    p.commit_transaction()
    assert failed and not fut.done()
    if then == "get_alone":
        assert fut.get(60).offset == 0
        assert values(log, "a") == [b"kept"]
        p.close()
        return
    p.begin_transaction()  # settles the last commit first
    p.send("a", b"next", partition=0)
    p.commit_transaction()
    assert fut.get(60).offset == 0
    p.close()
    assert values(log, "a") == [b"kept", b"next"]


def test_a_prepare_commit_that_fails_appends_nothing_and_can_be_aborted(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused before it lands: the batch it would have named is never appended (and
    its object stays: a PrepareCommit of unknown outcome may still name it)."""
    from txlog.coordinator import Coordinator

    real = Coordinator.prepare_end

    def refuse(self: Coordinator, *args: Any, **kw: Any) -> Any:
        if args[3]:  # a commit
            raise StorageError("injected: PrepareCommit failed")
        return real(self, *args, **kw)

    monkeypatch.setattr(Coordinator, "prepare_end", refuse)
    p = log.producer(transactional_id="nope", retries=0)
    p.init_transactions()
    p.begin_transaction()
    fut = p.send("a", b"lost", partition=0)
    # Both say the outcome is unknown (the write may have landed): resending the records
    # on a failed future could duplicate them.
    with pytest.raises(StorageError, match=r"injected.*may have landed"):
        p.commit_transaction()
    with pytest.raises(StorageError, match=r"injected.*may have landed"):
        fut.get(60)
    p.abort_transaction()
    monkeypatch.setattr(Coordinator, "prepare_end", real)
    p.begin_transaction()
    p.send("a", b"after", partition=0)
    p.commit_transaction()
    p.close()
    assert values(log, "a") == [b"after"]
    assert values(log, "a", "read_uncommitted") == [b"after"]


@pytest.mark.parametrize("appends_batches", [True, False])
def test_the_last_commits_failed_marker_is_not_reported_as_this_commits_outcome(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch, appends_batches: bool) -> None:
    """The next commit first finishes the last one's markers; if that
    fails, the error is the last commit's own, not "this PrepareCommit may have landed"
    (none was attempted)."""
    _failing_markers(monkeypatch, StorageError("injected: the last commit's marker failed"),
                     any_marker=True)
    p = log.producer(transactional_id=f"settle-{appends_batches}", retries=0,
                     **{"commit.appends.batches": appends_batches})
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"first", partition=0)
    p.commit_transaction()  # decided; its marker fails behind it
    p.begin_transaction()
    with pytest.raises(StorageError) as err:
        p.commit_transaction()
    assert "last commit's marker" in str(err.value)
    assert "may have landed" not in str(err.value)
    p.close()


def test_commit_appends_batches_false_writes_the_version_2_format(log: txlog.Log) -> None:
    """For logs that txlog 0.2 still reads: DATA entries before the decision, plain
    markers, no BEGIN, and PrepareCommit records of version 1."""
    import json

    p = log.producer(transactional_id="v2", **{"commit.appends.batches": False})
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"x", partition=0)
    p.commit_transaction()
    p.close()
    keys = log.store.list("topics/a/0/log/")
    assert [json.loads(log.store.get(k))["v"] for k in keys] == [1, 1]
    assert [e.kind for e in entries(log, "a", 0)] == ["data", COMMIT]
    assert all(json.loads(log.store.get(k)).get("record", {}).get("v", 1) == 1
               for k in log.store.list("_txn/state/"))


def test_pending_appends_are_kept_by_prepare_commit_only() -> None:
    rec = TxnRecord("t", 1, 0, ONGOING, 1000, (("a", 0),))
    pending = (PendingAppend("a", 0, 0, (("topics/a/0/data/k.parquet", 1, 10, None, None,
                                          True),)),)
    prep = rec.transition(PREPARE_COMMIT, pending=pending)
    assert TxnRecord.from_json(prep.to_json(), "x") == prep
    assert prep.to_json()["v"] == 2 and rec.to_json()["v"] == 1
    assert not prep.transition("CompleteCommit").pending
    with pytest.raises(InvalidTxnStateError):
        rec.transition(ONGOING, pending=pending)


def test_prepare_commit_refuses_batches_of_an_unregistered_partition(
        log: txlog.Log) -> None:
    coord = log.coordinator
    pid, epoch = coord.init_producer_id("unreg", 60_000)
    coord.add_partitions("unreg", pid, epoch, [TopicPartition("a", 0)])
    with pytest.raises(InvalidTxnStateError, match="unregistered"):
        coord.prepare_end("unreg", pid, epoch, True, (
            PendingAppend("a", 1, 0, (("k", 1, 10, None, None, True),)),))


def test_begin_entries_written_in_parallel_do_not_wait_for_the_committer(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a remote store a commit that opens several partitions writes their BEGIN
    entries on fan-out threads.  Found by the torture run on S3: those threads read the
    producer id through the property that settles the last commit first, which waits
    for the committer, which waited for them."""
    monkeypatch.setattr(type(log.store), "backend", "s3")  # fan out, on the local disk
    p = log.producer(transactional_id="wide")
    p.init_transactions()
    done = threading.Event()

    def two_commits() -> None:
        for n in range(2):
            p.begin_transaction()
            p.send("a", f"x{n}".encode(), partition=0)
            p.send("a", f"y{n}".encode(), partition=1)
            p.commit_transaction()
        done.set()

    t = threading.Thread(target=two_commits, daemon=True)
    t.start()
    assert done.wait(60), "the commit hung"
    p.close()
    assert sorted(values(log, "a")) == [b"x0", b"x1", b"y0", b"y1"]


def _failing_markers(monkeypatch: pytest.MonkeyPatch, error: Exception | None = None, *,
                     any_marker: bool = False) -> dict[str, bool]:
    """Every COMMIT marker that carries batches (``any_marker``: every one) fails with
    ``error`` while ``["on"]`` is true."""
    real = PartitionLog.append
    fail = {"on": True}

    def flaky(plog: PartitionLog, spec: AppendSpec) -> Any:
        if spec.kind == COMMIT and (spec.parts or any_marker) and fail["on"]:
            raise error or StorageError("injected: the marker failed")
        return real(plog, spec)

    monkeypatch.setattr(PartitionLog, "append", flaky)
    return fail


def _outcome(fut: Any) -> Any:
    try:
        return fut.get()
    except BaseException as exc:
        return exc


def _get_in_a_thread(fut: Any) -> list[Any]:
    """fut.get() (no timeout) on a thread of its own: its outcome, if it ended in 30 s."""
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(_outcome(fut)), daemon=True)
    t.start()
    t.join(30)
    return got


def _commit_whose_marker_fails(log: txlog.Log, monkeypatch: pytest.MonkeyPatch,
                               txn_id: str, error: Exception | None = None,
                               ) -> tuple[Any, Any, dict[str, bool]]:
    """A producer whose commit of one record was decided but whose marker failed:
    (producer, the record's future, the switch that heals the store)."""
    fail = _failing_markers(monkeypatch, error)
    p = log.producer(transactional_id=txn_id, retries=0, **PLAIN)
    p.init_transactions()
    p.begin_transaction()
    fut = p.send("a", b"kept", partition=0)
    p.commit_transaction()
    return p, fut, fail


def test_get_returns_after_close_completes_the_commit(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """The markers fail; a second init_transactions() is refused (it runs once per
    instance), and close() completes the decided commit: the batch's future then takes
    its offset, not waiting for markers nobody will write again."""
    p, fut, fail = _commit_whose_marker_fails(log, monkeypatch, "reinit")
    with pytest.raises(InvalidTxnStateError, match="already called"):
        p.init_transactions()
    fail["on"] = False
    p.close()
    got = _get_in_a_thread(fut)
    assert got and got[0].offset == 0


def test_get_ends_once_a_newer_instance_rolled_the_commit_forward(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a newer instance fenced the producer (rolling the commit
    forward), get() stops retrying the markers and takes the offset from the log."""
    _, fut, fail = _commit_whose_marker_fails(log, monkeypatch, "zombie")
    fail["on"] = False
    q = txlog.connect(log.url).producer(transactional_id="zombie")
    q.init_transactions()  # rolls the decided commit forward: b"kept" is committed
    got = _get_in_a_thread(fut)
    assert got and got[0].offset == 0
    assert values(log, "a") == [b"kept"]
    q.close()


def test_get_ends_when_the_marker_meets_a_corrupt_log(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """A marker that fails for a reason retrying cannot mend (a corrupt object) ends
    get() at once with an error that says the batch is committed, instead of retrying
    until get()'s timeout (for ever without one)."""
    from txlog.errors import CorruptObjectError

    p, fut, fail = _commit_whose_marker_fails(
        log, monkeypatch, "corrupt",
        CorruptObjectError("injected: an entry of the partition is corrupt"))
    got = _get_in_a_thread(fut)
    assert got, "get() kept retrying a marker that cannot be written"
    assert isinstance(got[0], TxlogError)
    assert "is committed" in str(got[0]) and "corrupt" in str(got[0])
    fail["on"] = False  # repaired: the reader rolls it on
    assert values(txlog.connect(log.url), "a") == [b"kept"]
    p.close()


def test_abort_by_start_offset_refuses_transactions_that_share_it(log: txlog.Log) -> None:
    """A BEGIN entry takes no offset, so two transactions opened one
    after the other start at the same offset: ``abort --start-offset`` must name them
    and ask for the producer id and epoch instead of picking one."""
    from txlog.admin import abort_partition_txn

    coord = log.coordinator
    tp = TopicPartition("a", 0)
    opened = []
    for tid in ("hung", "healthy"):
        pid, epoch = coord.init_producer_id(tid, 60_000)
        coord.add_partitions(tid, pid, epoch, [tp])
        log.partition_log(tp).append(AppendSpec(kind=BEGIN, count=0, producer_id=pid,
                                                epoch=epoch, transactional=True,
                                                txn_id=tid))
        opened.append((pid, epoch))
    with pytest.raises(InvalidTxnStateError, match="2 open transactions"):
        abort_partition_txn(log, tp, start_offset=0)
    pid, epoch = opened[0]
    abort_partition_txn(log, tp, producer_id=pid, producer_epoch=epoch)
    st = log.partition_log(tp).refresh()
    assert list(st.open_txns) == [opened[1]]


def test_a_commit_with_no_batch_of_its_own_leaves_the_writes_before_it_to_its_markers(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last full batch took every record, so the commit has no batch of its own:
    the writes queued before it are still named by PrepareCommit and appended by the
    marker (the benchmark found them appended as a DATA entry before the decision)."""
    import txlog.producer as producer_mod

    real_claim = producer_mod.Producer._claim_ready
    go = threading.Event()

    def held_claim(self: Any) -> Any:
        assert go.wait(60), "test never released the committer"
        return real_claim(self)

    p = log.producer(transactional_id="nobatch", batch_size=300, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    futs = [p.send("a", b"a" * 400, partition=0)]
    p.flush()  # a DATA entry: the transaction holds the partition
    monkeypatch.setattr(producer_mod.Producer, "_claim_ready", held_claim)
    futs += [p.send("a", v * 400, partition=0) for v in (b"b", b"c")]  # full: queued
    assert not p._pending
    decided = p.commit_transaction_async()
    go.set()
    decided.result(60)
    assert [(e.kind, e.count) for e in entries(log, "a", 0)] == [("data", 1), (COMMIT, 3)]
    assert [f.get(60).offset for f in futs] == [0, 1, 2]
    p.close()
    assert values(log, "a") == [b"a" * 400, b"b" * 400, b"c" * 400]


def test_a_get_begun_before_the_decision_drives_markers_that_failed(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """get() called while the commit is still undecided (its batch not
    yet named by PrepareCommit) must still write the markers if they fail, not wait for
    a producer call that may never come."""
    import txlog.producer as producer_mod

    fail = _failing_markers(monkeypatch)
    real_write = producer_mod.Producer._conform_and_write
    gate, waiting = threading.Event(), threading.Event()
    real_event_wait = threading.Event.wait

    def slow_write(self: Any, step: Any) -> Any:
        assert gate.wait(30)
        return real_write(self, step)

    monkeypatch.setattr(producer_mod.Producer, "_conform_and_write", slow_write)
    p = log.producer(transactional_id="early-get", retries=0)
    p.init_transactions()
    p.begin_transaction()
    fut = p.send("a", b"kept", partition=0)
    done = p.commit_transaction_async()  # queued: its upload is held
    written = fut._outcome.written
    assert written is not None

    def spy_wait(self: threading.Event, timeout: float | None = None) -> bool:
        if self is written:
            waiting.set()
        return real_event_wait(self, timeout)

    monkeypatch.setattr(threading.Event, "wait", spy_wait)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(_outcome(fut)), daemon=True)
    t.start()
    assert waiting.wait(30)  # get() waits before the decision
    gate.set()
    done.result(30)  # decided; the markers failed
    fail["on"] = False  # the store heals; nobody calls the producer
    t.join(30)
    assert got and got[0].offset == 0
    p.close()
    assert values(log, "a") == [b"kept"]


def test_a_prepare_commit_that_landed_although_its_write_failed_goes_on_as_decided(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """PrepareCommit lands but its write reports a store error.  The
    record, read once more, shows the decision: the commit goes on (markers, futures)
    instead of failing the futures of records that whoever rolls it forward commits
    (an application would resend them: duplicates)."""
    from txlog.coordinator import Coordinator

    real = Coordinator.prepare_end
    once: list[bool] = []

    def landed_then_lost(self: Coordinator, *a: Any, **kw: Any) -> Any:
        got = real(self, *a, **kw)
        if a[3] and not once:  # a commit's
            once.append(True)
            raise StorageError("injected: PrepareCommit landed, the reply was lost")
        return got

    monkeypatch.setattr(Coordinator, "prepare_end", landed_then_lost)
    p = log.producer(transactional_id="unknown")
    p.init_transactions()
    p.begin_transaction()
    fut = p.send("a", b"kept", partition=0)
    p.commit_transaction()
    assert once and fut.get(30).offset == 0
    p.begin_transaction()
    p.send("a", b"next", partition=0)
    p.commit_transaction()
    p.close()
    assert values(log, "a") == [b"kept", b"next"]


def test_a_commit_decided_beside_its_uploads_is_one_state_log_write_and_no_begin(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """With commit.inline.bytes (the default) a commit of unsent small batches writes
    one state-log record before its markers (PrepareCommit straight from Empty or
    CompleteCommit, registering both partitions, with copies of both objects) and no
    BEGIN entry; each marker carries its object; the records are visible once."""
    from txlog.state_log import StateLogPartition

    p = log.producer(transactional_id="inl")
    p.init_transactions()
    writes: list[str] = []
    real = StateLogPartition.compare_and_set

    def spy(part: StateLogPartition, txn_id: str, expected: Any, new: Any) -> bool:
        writes.append(new.state)
        return real(part, txn_id, expected, new)

    monkeypatch.setattr(StateLogPartition, "compare_and_set", spy)
    for n in range(2):
        p.begin_transaction()
        p.send("a", f"r{n}".encode(), partition=0)
        p.send("a", f"s{n}".encode(), partition=1)
        p.commit_transaction()
    p.close()
    monkeypatch.setattr(StateLogPartition, "compare_and_set", real)
    assert writes[:2] == ["PrepareCommit", "CompleteCommit"]
    assert writes[2] == "PrepareCommit"
    for part in (0, 1):
        assert [e.kind for e in entries(log, "a", part)] == [COMMIT, COMMIT]
    assert sorted(values(log, "a")) == [b"r0", b"r1", b"s0", b"s1"]


def test_an_upload_that_fails_after_the_decision_is_written_from_its_copy(
        log: txlog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision landed beside the upload, and the upload failed: the commit is
    decided, so commit_transaction() writes the object from its copy (a create-if-absent
    checked against the key's checksum) and returns; the records are visible once."""
    real = type(log.store).put_new
    failed: list[str] = []

    def flaky(store: Any, key: str, data: Any) -> None:
        if "/data/" in key and not failed:
            failed.append(key)
            raise StorageError("injected: the upload failed")
        real(store, key, data)

    monkeypatch.setattr(type(log.store), "put_new", flaky)
    p = log.producer(transactional_id="upl", retries=0)
    p.init_transactions()
    p.begin_transaction()
    fut = p.send("a", b"kept", partition=0)
    p.commit_transaction()
    assert failed and log.store.exists(failed[0])
    assert fut.get(60).offset == 0
    p.close()
    assert values(log, "a") == [b"kept"]


@pytest.mark.parametrize("before", ["complete_commit", "empty"])
def test_an_abort_after_a_decision_of_unknown_outcome_keeps_it_from_landing_later(
        log: txlog.Log, before: str) -> None:
    """A PrepareCommit that registers its partitions follows Empty or CompleteCommit
    with no Ongoing record, so an abort finds nothing open.  If that write failed with an
    unknown outcome (its read-back found nothing) and its request lands only after
    abort_transaction() returned, the transaction would be committed although the abort
    succeeded: the abort claims the record's next slot, and the late write loses."""
    p = log.producer(transactional_id="late")
    p.init_transactions()
    if before == "complete_commit":
        p.begin_transaction()
        p.send("a", b"kept", partition=0)
        p.commit_transaction()
    store = p.log.store
    real = store.put_if_absent
    held: list[tuple[str, bytes]] = []

    def delayed(key: str, data: Any) -> bool:
        if "_txn/state/" in key and b'"inline"' in bytes(data) and not held:
            held.append((key, bytes(data)))
            raise StorageError("injected: the request timed out and may still land")
        return real(key, data)

    store.put_if_absent = delayed  # type: ignore[method-assign]
    p.begin_transaction()
    p.send("a", b"aborted-0", partition=0)
    p.send("a", b"aborted-1", partition=1)
    with pytest.raises(StorageError, match="may have landed"):
        p.commit_transaction()
    assert held
    p.abort_transaction()
    store.put_if_absent = real  # type: ignore[method-assign]
    assert real(*held[0]) is False  # the delayed request lands on a claimed slot
    p.begin_transaction()
    p.send("a", b"after", partition=1)
    p.commit_transaction()
    p.close()
    txlog.connect(log.url).coordinator.sweep()
    want = [b"after"] if before == "empty" else [b"after", b"kept"]
    assert sorted(values(log, "a")) == want
