"""A batch that cannot be turned into Arrow (send() checks every record, so only an
injected failure or a record check that misses a case gets here): the batch fails, the
transaction with it, and nothing else is lost, written twice or committed without it."""

from __future__ import annotations

import contextlib
import threading
import uuid
from typing import Any

import pytest

import txlog
from txlog import records
from txlog.errors import SchemaMismatchError
from txlog.producer import accumulator as producer_mod
from txlog.records import TopicPartition


def new_log() -> txlog.Log:
    log = txlog.connect(f"memory://seal-failures/{uuid.uuid4().hex}")
    log.create_topic("t", partitions=2)
    return log


def committed_values(log: txlog.Log, partition: int) -> list[bytes]:
    c = log.consumer()
    c.assign([TopicPartition("t", partition)])
    c.seek_to_beginning()
    return [r.value for r in c.poll()]


def test_header_key_that_cannot_be_utf8_fails_its_send_not_its_batch() -> None:
    """checked_row() still lets through a record seal() cannot build: a header key
    with a lone surrogate.  It fails the whole batch (and the transaction) at commit."""
    log = new_log()
    p = log.producer(transactional_id="surrogate", linger_ms=10**9)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"good", partition=0)
    with pytest.raises(SchemaMismatchError):
        p.send("t", b"bad", partition=0, headers=[("\ud800", b"x")])
    p.send("t", b"good2", partition=0)
    p.commit_transaction()
    p.close()
    assert committed_values(log, 0) == [b"good", b"good2"]


def _poison_seal(monkeypatch: pytest.MonkeyPatch, before_raise: Any) -> None:
    real = records.checked_kafka_batch

    def seal(rows: Any) -> Any:
        if any(r[1].startswith(b"poison") for r in rows):
            before_raise()
            raise MemoryError("injected: cannot build the batch")
        return real(rows)

    monkeypatch.setattr(producer_mod, "checked_kafka_batch", seal)


def test_commit_racing_a_failed_seal_does_not_commit_without_the_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Thread A's send() fails to seal p0's batch (which holds "early", sent before
    commit_transaction() was called) while the commit has passed _check_can_end() and
    waits for _lock.  _seal_pending() only sets ABORTABLE_ERROR; _queue_commit() never
    looks at the state again, so the commit is queued and succeeds without the batch."""
    sealing, checked = threading.Event(), threading.Event()

    def before_raise() -> None:
        sealing.set()
        assert checked.wait(60)  # the commit passed its state check

    _poison_seal(monkeypatch, before_raise)
    log = new_log()
    p = log.producer(transactional_id="race", linger_ms=10**9, batch_size=1024)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"keep", partition=1)
    early = p.send("t", b"early", partition=0)

    real_check = p._check_can_end

    def check() -> None:
        real_check()
        checked.set()

    p._check_can_end = check  # type: ignore[method-assign]
    a_err: list[BaseException] = []

    def a() -> None:
        try:
            p.send("t", b"poison" * 400, partition=0)  # > batch.size: flushes p0
        except BaseException as exc:
            a_err.append(exc)

    ta = threading.Thread(target=a)
    ta.start()
    assert sealing.wait(60)  # A holds _lock, sealing p0's batch
    try:
        p.commit_transaction()
        committed = True
    except Exception:
        committed = False
    ta.join(60)
    p.close()
    with pytest.raises(MemoryError):
        early.get(1)
    got = committed_values(log, 1) + committed_values(log, 0)
    assert not committed, (
        f"commit_transaction() succeeded although a batch of the transaction failed "
        f"(its futures raise MemoryError); committed: {got}")


def test_send_does_not_raise_for_another_partitions_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full batch on p0 takes p1's batch (past linger) along; p1's seal fails, and
    send() raises although its own record was queued and is written: a caller that
    retries a send() that raised writes it twice."""
    _poison_seal(monkeypatch, lambda: None)
    log = new_log()
    p = log.producer(linger_ms=10**9, batch_size=1024)
    bad = p.send("t", b"poison", partition=1)
    p.linger_ms = 0  # p1's batch is now past linger (the linger thread sleeps on)
    raised: BaseException | None = None
    try:
        p.send("t", b"big" * 400, partition=0)  # > batch.size: flushes p0 and p1
    except MemoryError as exc:
        raised = exc
    with contextlib.suppress(MemoryError):
        p.flush()
    p.close()
    with pytest.raises(MemoryError):
        bad.get(1)
    written = committed_values(log, 0)
    assert raised is None or written == [], (
        f"send() raised {raised!r} (another partition's batch), yet its record was "
        f"written: {[v[:6] for v in written]}")
