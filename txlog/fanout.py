"""Independent requests side by side on one shared pool of threads.

A commit fans out several times (loading partitions, appending staged objects, writing
markers), and starting a pool of threads per fan-out was a large part of a commit
across many partitions.  One pool lives for the process.
Fan-outs nest (an append that loses a race reads the partition's tail with a fan-out of
its own), and a nested fan-out waiting for a full pool would wait forever; so the caller
runs every task that no worker has started yet itself, and never waits for a task that
is only queued.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")

#: Threads of the shared pool: requests in flight at once, across every fan-out.
WORKERS = 32

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _shared() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="txlog-io")
        return _pool


def _forget_after_fork() -> None:
    # A forked child (Spark's Python workers are forked) has the pool object but none of
    # its threads: a task submitted there would never run.
    global _lock, _pool
    _lock = threading.Lock()
    _pool = None


os.register_at_fork(after_in_child=_forget_after_fork)


def errors(fn: Callable[[T], object], items: Sequence[T]) -> list[BaseException | None]:
    """Call ``fn(x)`` for each item, side by side; returns once every call has ended,
    with what each raised (None: it returned)."""
    return [err for _, err in _run(fn, items)]


def fan_out(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(x) for x in items]``, the calls side by side.  Returns once every call has
    ended; if any raised, raises the first one's error in ``items`` order (as
    ``list(executor.map(...))`` inside a ``with`` block does)."""
    got = _run(fn, items)
    errs = [err for _, err in got if err is not None]
    if errs:  # an interrupt (KeyboardInterrupt, SystemExit) before any error
        raise next((e for e in errs if not isinstance(e, Exception)), errs[0])
    return [cast("R", r) for r, _ in got]


def _run(fn: Callable[[T], R], items: Sequence[T]) -> list[tuple[R | None, BaseException | None]]:
    if len(items) < 2:
        return [_call(fn, x) for x in items]
    pool = _shared()
    # The caller takes the first item itself: one thread fewer to hand work to.
    futures: list[Future[R]] = []
    try:
        for x in items[1:]:
            futures.append(pool.submit(fn, x))
    except RuntimeError:  # the interpreter is shutting down: no new threads start
        for f in futures:
            f.cancel()  # what no worker took runs here, below
        futures += [Future() for _ in items[1 + len(futures):]]  # never started: run here
    got = [_call(fn, items[0])]
    interrupt = _interrupt(got[0])  # Ctrl-C on this thread: run nothing more here
    for x, fut in zip(items[1:], futures, strict=True):
        if fut.cancel():  # no worker took it yet: run it here rather than wait for it
            got.append((None, interrupt) if interrupt is not None else _call(fn, x))
            interrupt = interrupt or _interrupt(got[-1])
            continue
        got.append(_wait(fut))
        interrupt = interrupt or _interrupt(got[-1])
    return got


def _wait(fut: Future[Any]) -> tuple[Any, BaseException | None]:
    """The call's outcome once it has ended: Ctrl-C while waiting does not leave it
    running behind the caller's back (it is reported as the call's outcome); a second
    Ctrl-C leaves at once (a request that hangs must not hold the caller forever)."""
    interrupt: BaseException | None = None
    while True:
        try:
            value = fut.result()
        except BaseException as exc:
            if not fut.done():  # interrupted while waiting: the call goes on
                if interrupt is not None:
                    raise
                interrupt = exc
                continue
            return None, interrupt or exc
        return (value, None) if interrupt is None else (None, interrupt)


def _interrupt(outcome: tuple[object, BaseException | None]) -> BaseException | None:
    err = outcome[1]
    return err if err is not None and not isinstance(err, Exception) else None


def _call(fn: Callable[[T], R], x: T) -> tuple[R | None, BaseException | None]:
    try:
        return fn(x), None
    except BaseException as exc:
        return None, exc
