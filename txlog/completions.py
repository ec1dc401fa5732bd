"""Transaction completions in flight in this process.

A committing producer writes markers and CompleteCommit on its committer thread after
PrepareCommit is durable, while the caller goes on.  Readers in the same process that
meet such a transaction at a partition's LSO wait for that work instead of racing it (or,
rate-limited, leaving the records hidden for a while): a commit is then visible to the
next read in the process that made it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import Any

_lock = threading.Lock()
_in_flight: dict[tuple[str, int, int], Future[Any]] = {}
_by_partition: dict[tuple[str, str, int], set[Future[Any]]] = {}
_local = threading.local()  # .completing: this thread runs completions (never waits)


@contextlib.contextmanager
def running() -> Iterator[None]:
    """Marks the calling thread as writing a completion (it must never wait for one)."""
    before = getattr(_local, "completing", False)
    _local.completing = True
    try:
        yield
    finally:
        _local.completing = before


def track(store_url: str, producer_id: int, epoch: int, fut: Future[Any],
          partitions: Iterable[tuple[str, int]] = ()) -> None:
    """Track a completion in flight.  ``partitions``: those where the transaction holds
    no entry (a commit that registered them in its decision): readers there cannot meet
    it, so they wait for it by partition (wait_for_partition)."""
    key = (store_url, producer_id, epoch)
    parts = [(store_url, t, p) for t, p in partitions]
    with _lock:
        _in_flight[key] = fut
        for part in parts:
            _by_partition.setdefault(part, set()).add(fut)

    def done(_: Future[Any]) -> None:
        with _lock:
            if _in_flight.get(key) is fut:
                del _in_flight[key]
            for part in parts:
                futs = _by_partition.get(part)
                if futs is not None:
                    futs.discard(fut)
                    if not futs:
                        del _by_partition[part]

    fut.add_done_callback(done)


def wait_for_partition(store_url: str, topic: str, partition: int) -> bool:
    """Wait for this process's completions of commits that hold no entry in
    ``topic``/``partition`` yet (see track); True if there were any."""
    if getattr(_local, "completing", False) or not _by_partition:
        return False
    with _lock:
        futs = list(_by_partition.get((store_url, topic, partition), ()))
    return _wait_all(futs)


def wait_for(store_url: str, txns: Iterable[tuple[int, int]]) -> bool:
    """Wait for this process's completions of ``txns`` ((producer id, epoch) pairs);
    True if there were any.  Their failures are the committing producer's to report."""
    if getattr(_local, "completing", False):
        return False  # a completion reading a partition must not wait for itself
    with _lock:
        futs = [f for pid, epoch in txns
                if (f := _in_flight.get((store_url, pid, epoch))) is not None]
    return _wait_all(futs)


def _wait_all(futs: list[Future[Any]]) -> bool:
    """Wait for ``futs``; True if there were any.  Their failures are the committing
    producer's to report, not the waiting reader's."""
    for f in futs:
        try:
            f.result()
        except Exception:
            pass
    return bool(futs)
