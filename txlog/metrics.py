"""Counters a user can read: ``log.metrics()`` and ``txlog describe --metrics``.

* ``store``: object-store requests and bytes by kind (get, put, put_if_absent, list, ...)
  made by this process through this Log;
* ``transactions``: latency of ending transactions (EndTxn: Prepare*, markers,
  Complete*) measured by this process's producers, by outcome (commit / abort);
* ``open_transactions`` and ``partitions``: per partition the high watermark, the last
  stable offset and the LSO lag (high watermark minus LSO: how much written data
  read_committed readers cannot see yet), and how many transactions are open there.

Client-side like Kafka's client metrics: request counts and latencies describe this
process; the partition gauges describe the log (fresh with ``refresh=True``, else as this
Log last saw each partition it opened).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from txlog.partition_state import PartitionState
from txlog.records import TopicPartition

if TYPE_CHECKING:
    from txlog.log import Log

_SAMPLES = 1024  # recent latencies kept per kind, for percentiles


class Timings:
    """Thread-safe latency statistics by kind (count, mean, max, p50, p99, last)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: dict[str, int] = {}
        self._total: dict[str, float] = {}
        self._max: dict[str, float] = {}
        self._recent: dict[str, deque[float]] = {}

    def record(self, kind: str, ms: float) -> None:
        with self._lock:
            self._count[kind] = self._count.get(kind, 0) + 1
            self._total[kind] = self._total.get(kind, 0.0) + ms
            self._max[kind] = max(self._max.get(kind, 0.0), ms)
            self._recent.setdefault(kind, deque(maxlen=_SAMPLES)).append(ms)

    def snapshot(self) -> dict[str, dict[str, float | int]]:
        with self._lock:
            out: dict[str, dict[str, float | int]] = {}
            for kind, n in self._count.items():
                recent = sorted(self._recent[kind])
                out[kind] = {
                    "count": n,
                    "mean_ms": round(self._total[kind] / n, 3),
                    "max_ms": round(self._max[kind], 3),
                    "p50_ms": round(_pct(recent, 0.50), 3),
                    "p99_ms": round(_pct(recent, 0.99), 3),
                    "last_ms": round(self._recent[kind][-1], 3),
                }
            return out

    def reset(self) -> None:
        with self._lock:
            self._count.clear()
            self._total.clear()
            self._max.clear()
            self._recent.clear()


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


_timings: weakref.WeakKeyDictionary[Any, Timings] = weakref.WeakKeyDictionary()
_timings_lock = threading.Lock()


def timings(txlog: Log) -> Timings:
    """The latency statistics of ``txlog`` (created on first use)."""
    with _timings_lock:
        t = _timings.get(txlog)
        if t is None:
            t = _timings[txlog] = Timings()
        return t


def record_end_txn(txlog: Log, commit: bool, ms: float) -> None:
    """Hook for the producer: one transaction ended (committed or aborted) in ``ms``."""
    timings(txlog).record("commit" if commit else "abort", ms)


def partition_gauges(st: PartitionState) -> dict[str, int]:
    return {
        "log_start_offset": st.log_start_offset,
        "high_watermark": st.high_watermark,
        "last_stable_offset": st.last_stable_offset,
        "lso_lag": st.high_watermark - st.last_stable_offset,
        "open_transactions": len(st.open_txns),
        "batches": len(st.batches),
        "size_bytes": st.size_bytes(),
    }


def log_metrics(txlog: Log, *, refresh: bool = False,
                topics: Iterable[str] | None = None) -> dict[str, Any]:
    """Everything ``log.metrics()`` returns (see the module docstring).

    With ``refresh`` (or ``topics``), the partitions of ``topics`` (default: every topic,
    internal ones included) are re-read from the store and the state log is scanned for
    transaction states; otherwise only partitions this Log already opened are reported,
    as last seen, and no request is made.
    """
    snap = txlog.store.counter.snapshot()
    store = {"backend": txlog.store.backend, "requests": snap["requests"],
             "bytes": snap["bytes"], "requests_total": sum(snap["requests"].values()),
             "bytes_total": sum(snap["bytes"].values())}
    states: dict[TopicPartition, PartitionState] = {}
    txn_states: dict[str, int] | None = None
    if refresh or topics is not None:
        names = list(topics) if topics is not None else txlog.list_topics(internal=True)
        for name in names:
            for tp in txlog.partitions_for(name):
                states[tp] = txlog.partition_log(tp).refresh()
        txn_states = {}
        for rec in txlog.coordinator.state_log.all_records():
            txn_states[rec.state] = txn_states.get(rec.state, 0) + 1
    else:
        with txlog._lock:
            cached = dict(txlog._partitions)
        for tp, plog in cached.items():
            if plog.state is not None:
                states[tp] = plog.state
    open_keys = {k for st in states.values() for k in st.open_txns}
    out: dict[str, Any] = {
        "store": store,
        "transactions": timings(txlog).snapshot(),
        "open_transactions": len(open_keys),
        "partitions": {f"{tp.topic}-{tp.partition}": partition_gauges(st)
                       for tp, st in sorted(states.items())},
    }
    if txn_states is not None:
        out["transaction_states"] = dict(sorted(txn_states.items()))
    return out
