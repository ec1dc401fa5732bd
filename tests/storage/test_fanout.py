"""txlog.fanout: one shared pool for every fan-out; nested fan-outs cannot deadlock."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from txlog import fanout


@pytest.fixture
def tiny_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(1, thread_name_prefix="test-io")
    monkeypatch.setattr(fanout, "_pool", pool)
    yield pool
    pool.shutdown(wait=True)


def test_results_in_order() -> None:
    assert fanout.fan_out(lambda x: x * x, list(range(40))) == [x * x for x in range(40)]
    assert fanout.fan_out(lambda x: x, []) == []
    assert fanout.fan_out(lambda x: x + 1, [1]) == [2]


def test_first_error_in_item_order_after_every_call_ended() -> None:
    ended: list[int] = []
    lock = threading.Lock()

    def fn(x: int) -> int:
        with lock:
            ended.append(x)
        if x in (3, 7):
            raise ValueError(f"item {x}")
        return x

    with pytest.raises(ValueError, match="item 3"):
        fanout.fan_out(fn, list(range(10)))
    assert sorted(ended) == list(range(10))
    errs = fanout.errors(fn, [1, 3, 5])
    assert errs[0] is None and str(errs[1]) == "item 3" and errs[2] is None


def test_nested_fan_outs_on_a_one_thread_pool(tiny_pool: ThreadPoolExecutor) -> None:
    # Every level waits for the level below, and the pool has one thread: waiting for
    # queued tasks instead of running them would hang here.
    def level(depth: int) -> int:
        if depth == 0:
            return 1
        return sum(fanout.fan_out(level, [depth - 1] * 3))

    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(level(4)), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "nested fan-outs deadlocked"
    assert result == [81]


def test_queued_items_run_on_the_caller(tiny_pool: ThreadPoolExecutor) -> None:
    gate = threading.Event()
    busy = tiny_pool.submit(gate.wait, 60)  # the pool's only thread is taken
    try:
        who = fanout.fan_out(lambda x: threading.current_thread().name, [0, 1, 2, 3])
    finally:
        gate.set()
        busy.result()
    assert who == [threading.current_thread().name] * 4


def test_interrupt_runs_nothing_more(tiny_pool: ThreadPoolExecutor) -> None:
    gate = threading.Event()
    busy = tiny_pool.submit(gate.wait, 60)  # items 1-3 stay queued behind it
    ran: list[int] = []

    def fn(x: int) -> None:
        ran.append(x)
        if x == 0:
            raise KeyboardInterrupt
        raise ValueError(f"item {x}")

    try:
        with pytest.raises(KeyboardInterrupt):
            fanout.fan_out(fn, [0, 1, 2, 3])
    finally:
        gate.set()
        busy.result()
    assert ran == [0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_a_pool_of_its_own() -> None:
    assert fanout.fan_out(lambda x: x, [1, 2, 3]) == [1, 2, 3]  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # the child: the parent's threads are not here
        code = 0
        try:
            code = 0 if fanout.fan_out(lambda x: x * 2, [1, 2, 3]) == [2, 4, 6] else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0



def test_interrupt_while_waiting_still_waits_for_the_running_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the caller waits for a call a worker runs: fan_out() raises it, but
    only once that call has ended (as a ``with ThreadPoolExecutor`` block waits)."""
    running, release, ended = threading.Event(), threading.Event(), threading.Event()
    caller = threading.current_thread()

    def fn(x: int) -> None:
        if x == 0:  # the caller's own item: go on once item 1 runs on a worker
            assert running.wait(60)
            return
        running.set()
        assert release.wait(60)
        ended.set()

    real = Future.result
    interrupts = [KeyboardInterrupt()]

    def result(self: Future[Any], timeout: float | None = None) -> Any:
        if threading.current_thread() is caller and interrupts:
            release.set()  # the call ends after the interrupt, not before
            raise interrupts.pop()
        return real(self, timeout)

    monkeypatch.setattr(Future, "result", result)
    with pytest.raises(KeyboardInterrupt):
        fanout.fan_out(fn, [0, 1])
    assert ended.is_set(), "fan_out returned while one of its calls was still running"


def test_a_second_interrupt_leaves_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that hangs must not hold the caller forever: the second Ctrl-C leaves."""
    running, release = threading.Event(), threading.Event()
    caller = threading.current_thread()

    def fn(x: int) -> None:
        if x == 0:
            assert running.wait(60)
            return
        running.set()
        assert release.wait(60)

    real = Future.result
    interrupts = [KeyboardInterrupt("second"), KeyboardInterrupt("first")]

    def result(self: Future[Any], timeout: float | None = None) -> Any:
        if threading.current_thread() is caller and interrupts:
            raise interrupts.pop()
        return real(self, timeout)

    monkeypatch.setattr(Future, "result", result)
    try:
        with pytest.raises(KeyboardInterrupt, match="second"):
            fanout.fan_out(fn, [0, 1])
    finally:
        release.set()


def test_at_interpreter_shutdown_the_caller_runs_everything(
        tiny_pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    """No new work is taken once the interpreter is shutting down (an atexit close()
    writing markers, say): what could not be handed over runs on the caller."""
    real_submit = tiny_pool.submit
    calls = [0]

    def submit(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > 1:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        return real_submit(*args, **kwargs)

    monkeypatch.setattr(tiny_pool, "submit", submit)
    assert fanout.fan_out(lambda x: x * 10, [1, 2, 3, 4]) == [10, 20, 30, 40]
