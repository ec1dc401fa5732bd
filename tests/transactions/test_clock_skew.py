"""Transaction timeouts under clock skew: clients whose wall clocks run minutes ahead or
behind neither abort a live transaction early nor delay the abort of an abandoned one,
because expiry is judged on the object store's clock (txlog/store_clock.py).

The skewed clients are separate processes whose wall clock is shifted
(txlog.testing.harness.clock.shift_wall_clock, as the torture harness's clock-skew nemesis does).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

import txlog
from txlog import TopicPartition, records
from txlog.store_clock import SECOND, TICK, age_lower_bound_ms, resolution_ms, stamp_ms
from txlog.txn_state import COMPLETE_ABORT, COMPLETE_COMMIT

SKEW_MS = 120_000  # two minutes, as in the report that found it
TP = TopicPartition("a", 0)
#: The stated bound: an abandoned transaction is aborted within its timeout plus the
#: store's stamp resolution (1 s) and a reader's check interval, once a client looks.
#: The test allows more for a loaded machine; minutes of skew would blow it either way.
BOUND_S = 10.0

CHILD = textwrap.dedent("""
    import json, sys, time
    from txlog.testing.harness.clock import shift_wall_clock
    shift_wall_clock(int(sys.argv[3]))
    import txlog
    from txlog.records import TopicPartition
    from txlog.resolve import resolve_lso
    url, opts, role = sys.argv[1], json.loads(sys.argv[2]), sys.argv[4]
    log = txlog.connect(url, opts or None)
    tp = TopicPartition("a", 0)
    if role == "writer":
        p = log.producer(transactional_id="abandoned", transaction_timeout_ms=int(sys.argv[5]))
        p.init_transactions()
        p.begin_transaction()
        p.send("a", b"never", partition=0)
        p.flush()
        print("open", flush=True)
        time.sleep(600)  # SIGKILLed by the test
    elif role == "watch":
        # A reader and an operator's sweep, over and over: they must not abort it.
        for i in range(int(sys.argv[5])):
            log.coordinator.sweep()
            resolve_lso(log, tp)
        print("watched", flush=True)
    else:  # "reap": look until the abandoned transaction is aborted
        deadline = time.monotonic() + float(sys.argv[5])
        while time.monotonic() < deadline:
            log.coordinator.sweep()
            resolve_lso(log, tp)
            rec = log.coordinator.record("abandoned")
            if rec is not None and rec.state == "CompleteAbort":
                print("aborted", time.monotonic(), rec.abort_reason, flush=True)
                break
            time.sleep(0.05)  # a reader's polling interval
        else:
            print("not-aborted", flush=True)
""")


def child(url: str, opts: dict[str, Any], skew_ms: int, role: str, arg: Any,
          ) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, json.dumps(opts), str(skew_ms), role, str(arg)],
        stdout=subprocess.PIPE, text=True, start_new_session=True)


def line_of(p: subprocess.Popen[str]) -> str:
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line, f"child exited with {p.wait()} before saying anything"
    return line


@pytest.fixture(params=[pytest.param("local"), pytest.param("s3", marks=pytest.mark.s3)])
def root(request: pytest.FixtureRequest, store_factory: Any) -> tuple[str, dict[str, Any]]:
    url, opts = store_factory.url(request.param, "skew")
    txlog.connect(url, opts or None).create_topic("a", partitions=1)
    return url, opts


@pytest.mark.parametrize("skew_ms", [SKEW_MS, -SKEW_MS])
def test_skewed_client_never_aborts_a_live_transaction_early(
        root: tuple[str, dict[str, Any]], skew_ms: int) -> None:
    url, opts = root
    log = txlog.connect(url, opts or None)
    p = log.producer(transactional_id="live", transaction_timeout_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"live", partition=0)
    p.flush()
    began = time.monotonic()
    w = child(url, opts, skew_ms, "watch", 20)
    assert line_of(w) == "watched"
    assert w.wait(60) == 0
    assert time.monotonic() - began < 60  # (else an abort would be right)
    p.commit_transaction()  # raises TransactionTimeoutError if the watcher aborted it
    p.close()
    rec = log.coordinator.record("live")
    assert rec is not None and rec.state == COMPLETE_COMMIT and rec.abort_reason == ""


@pytest.mark.slow  # SIGKILLs the writer
def test_abandoned_transaction_is_aborted_within_timeout_plus_bound(
        root: tuple[str, dict[str, Any]]) -> None:
    """The writer's clock runs two minutes ahead (its start time lies in the future) and
    the reaper's two minutes behind: judged on their clocks, the abort would wait four
    minutes more."""
    url, opts = root
    timeout_ms = 3_000
    w = child(url, opts, SKEW_MS, "writer", timeout_ms)
    try:
        assert line_of(w) == "open"
    finally:
        os.kill(w.pid, signal.SIGKILL)
        w.wait()
    killed = time.monotonic()
    r = child(url, opts, -SKEW_MS, "reap", timeout_ms / 1000 + BOUND_S + 30)
    out = line_of(r).split()
    assert r.wait(120) == 0
    assert out[0] == "aborted", out
    assert out[2] == "timeout"
    waited = float(out[1]) - killed  # one monotonic clock for every process here
    assert waited <= timeout_ms / 1000 + BOUND_S, waited
    rec = txlog.connect(url, opts or None).coordinator.record("abandoned")
    assert rec is not None and rec.state == COMPLETE_ABORT
    c = txlog.connect(url, opts or None).consumer(auto_offset_reset="earliest")
    c.assign([TP])
    assert c.poll(max_records=10) == []
    assert c.last_stable_offset(TP) == c.end_offsets([TP])[TP]


# -- the store clock's arithmetic ----------------------------------------------------------


def test_age_is_a_lower_bound() -> None:
    # A probe stamped 10.000 s whose write returned at monotonic 100 s; now 105 s: the
    # store's time is at least 15.000 s.  An object stamped 12.000 (whole seconds: maybe
    # truncated) was written by 13.000, so it is at least 2 s old.
    assert age_lower_bound_ms(probe_stamp=10_000, probe_mono=100.0, now_mono=105.0,
                              written_stamp=12_000) == 15_000 - 12_000 - SECOND
    assert age_lower_bound_ms(probe_stamp=10_000, probe_mono=100.0, now_mono=105.0,
                              written_stamp=12_345) == 15_000 - 12_345 - TICK
    assert resolution_ms(5_000) == SECOND and resolution_ms(5_001) == TICK


def test_without_store_stamps_a_client_aborts_only_what_it_watched_for_the_timeout(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that gives no modification times: a client judges a transaction expired
    only once it has itself seen it open for the whole timeout (monotonic clock)."""
    from txlog.store_clock import StoreClock

    monkeypatch.setattr(StoreClock, "age_ms", lambda self, key: None)
    url = str(tmp_path / "root")
    log = txlog.connect(url)
    log.create_topic("a", partitions=1)
    p = log.producer(transactional_id="unstamped", transaction_timeout_ms=300)
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"x", partition=0)
    p.flush()
    watcher = txlog.connect(url).coordinator
    rec = watcher.record("unstamped")
    assert rec is not None
    first = time.monotonic()
    assert not watcher.expired(rec)  # first sight: watched for no time yet
    deadline = first + 30
    while not watcher.expired(rec):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert time.monotonic() - first >= 0.3
    p.close(timeout=0)


def test_stamps_from_fsspec_info() -> None:
    utc = datetime.UTC
    assert stamp_ms({"LastModified": datetime.datetime(2026, 1, 1, tzinfo=utc)}) == \
        int(datetime.datetime(2026, 1, 1, tzinfo=utc).timestamp() * 1000)
    assert stamp_ms({"mtime": 12.5}) == 12_500
    assert stamp_ms({"last_modified": "2026-01-01T00:00:01Z"}) == \
        int(datetime.datetime(2026, 1, 1, 0, 0, 1, tzinfo=utc).timestamp() * 1000)
    assert stamp_ms({"updated": "2026-01-01T00:00:02.5Z"}) == \
        int(datetime.datetime(2026, 1, 1, 0, 0, 2, 500_000, tzinfo=utc).timestamp() * 1000)
    assert stamp_ms({"size": 3}) is None


@pytest.mark.parametrize("backend", ["local", pytest.param("s3", marks=pytest.mark.s3),
                                     pytest.param("s3fs", marks=pytest.mark.s3)])
def test_open_transaction_has_an_age_on_the_store_clock(store_factory: Any,
                                                        backend: str) -> None:
    """The store gives stamps, so expiry never falls back to watching on this client's
    own monotonic clock."""
    url, opts = store_factory.url(backend, "stamps")
    log = txlog.connect(url, opts or None)
    log.create_topic("a", partitions=1)
    p = log.producer(transactional_id="aged")
    p.init_transactions()
    p.begin_transaction()
    p.send("a", b"x", partition=0)
    p.flush()
    rec = log.coordinator.record("aged")
    assert rec is not None and rec.start_slot >= 0
    key = log.coordinator.state_log.partition_for("aged").entry_key(rec.start_slot)
    age = txlog.connect(url, opts or None).coordinator.clock.age_ms(key)
    assert age is not None and -2 * SECOND <= age < 60_000, age
    p.abort_transaction()
    p.close()


def test_a_reader_whose_clock_steps_back_still_aborts_an_abandoned_transaction(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer settles what holds its LSO at most every so often.  Timed by the wall
    clock, a step back (an NTP correction, a VM resumed) kept it from settling for as
    long as the step, and an abandoned transaction held its reads far past the timeout."""
    import txlog.consumer as consumer_module

    root = str(tmp_path / "root")
    log = txlog.connect(root)
    log.create_topic("a")
    hung = log.producer(transactional_id="hung", transaction_timeout_ms=5_000)
    hung.init_transactions()
    hung.begin_transaction()
    hung.send("a", b"never", partition=0)
    hung.flush()
    later = log.producer()
    later.send("a", b"after", partition=0)
    later.flush()
    later.close()
    c = txlog.connect(root).consumer(auto_offset_reset="earliest")
    c.assign([TP])
    assert c.poll() == []  # the transaction is open and in time: it holds the LSO
    wall = records.now_ms  # what the consumer reads the wall clock with
    monkeypatch.setattr(consumer_module, "now_ms", lambda: wall() - 3_600_000)
    got = c.poll(timeout_ms=int((5 + BOUND_S) * 1000))
    assert [r.value for r in got] == [b"after"]
    rec = log.coordinator.record("hung")
    assert rec is not None and rec.state == COMPLETE_ABORT and rec.abort_reason == "timeout"
    c.close()
    hung.close(timeout=0)
