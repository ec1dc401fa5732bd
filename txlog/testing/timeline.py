"""Per-request accounting of object-store traffic: :class:`TimelineStore` wraps a store
and records every request's kind, key, start and end, thread and the txlog code that made
it; :func:`account` turns the requests of one operation into counts by kind and the
number of *sequential* round trips on its critical path.

The critical path is read from the intervals alone: two requests are sequential when one
starts after the other has ended, so the round trips an operation waited for in sequence
are the longest chain of such requests inside its window.  A set of intervals that pairwise
do not overlap is always such a chain, so the longest chain is the largest set of
pairwise disjoint intervals, which the earliest-end-first greedy finds.  Under a store
that delays every request by a request time, requests sent together overlap and count
once, requests sent one after another count each.

Install the wrapper before the first use of a :class:`~txlog.log.Log`'s store (its
partition logs and coordinator keep the store they were built with)::

    log = txlog.connect(url, options)
    timeline = TimelineStore(log.store)
    log.store = timeline
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from txlog.storage.base import ObjectStore
from txlog.testing.delegating import DelegatingStore

#: Request kinds, as :attr:`Request.kind` names them.
KINDS = ("put_if_absent", "put", "get", "get_range", "list", "delete", "head")

_T = TypeVar("_T")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP = (os.path.join(_PACKAGE, "storage") + os.sep, os.path.join(_PACKAGE, "testing") + os.sep)


@dataclass(frozen=True)
class Request:
    """One store request: ``start``/``end`` from ``time.monotonic()`` (seconds);
    ``site`` names the innermost txlog frames (up to five) that made it (``producer.py:1234 fn <
    ...``), outside the storage layer."""

    kind: str
    key: str
    start: float
    end: float
    thread: str
    site: str
    ok: bool
    #: A conditional create that found the object there already (it lost the slot).
    lost: bool = False

    @property
    def duration(self) -> float:
        return self.end - self.start


def _site(depth: int) -> str:
    """The txlog frames (at most five) that called into the store."""
    frames: list[str] = []
    f: Any = sys._getframe(depth)
    while f is not None and len(frames) < 5:
        name = f.f_code.co_filename
        if name.startswith(_PACKAGE) and not name.startswith(_SKIP):
            frames.append(f"{os.path.relpath(name, os.path.dirname(_PACKAGE))}:{f.f_lineno} "
                          f"{f.f_code.co_name}")
        f = f.f_back
    return " < ".join(frames)


class TimelineStore(DelegatingStore):
    """Wraps ``inner`` and records every request made through it (thread-safe).

    ``sites=False`` skips recording the calling code (a few microseconds per request).
    """

    size_kind = "head"

    def __init__(self, inner: ObjectStore, *, sites: bool = True) -> None:
        super().__init__(inner)
        self.sites = sites
        self._lock = threading.Condition()
        self._requests: list[Request] = []
        self._in_flight = 0
        self._last_end = time.monotonic()

    @property
    def identity(self) -> str:
        return self.inner.identity

    def __getstate__(self) -> dict[str, Any]:
        return {"inner": self.inner, "sites": self.sites}

    def __setstate__(self, s: dict[str, Any]) -> None:
        self.__init__(s["inner"], sites=s["sites"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"TimelineStore({self.inner!r})"

    # -- the record ------------------------------------------------------------------------

    def _call(self, kind: str, key: str, fn: Callable[..., _T], *args: Any) -> _T:
        thread = threading.current_thread().name
        # A request from a pool's thread has no txlog frame above it: name the thread.
        site = (_site(3) or f"(from thread {thread})") if self.sites else ""
        with self._lock:
            self._in_flight += 1
        start = time.monotonic()
        ok = lost = False
        try:
            result = fn(*args)
            ok = True
            lost = kind == "put_if_absent" and result is False
            return result
        finally:
            end = time.monotonic()
            with self._lock:
                self._requests.append(Request(kind, key, start, end, thread, site, ok, lost))
                self._in_flight -= 1
                self._last_end = end
                self._lock.notify_all()

    def requests(self, since: float = float("-inf")) -> list[Request]:
        """Requests that started at or after ``since``, in order of start."""
        with self._lock:
            found = [r for r in self._requests if r.start >= since]
        return sorted(found, key=lambda r: r.start)

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()

    def wait_idle(self, *, quiet: float, timeout: float) -> bool:
        """Wait until no request is in flight and none ended in the last ``quiet``
        seconds (a producer's background work, markers after a commit, is done);
        False if that did not happen within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                now = time.monotonic()
                if self._in_flight == 0 and now - self._last_end >= quiet:
                    return True
                if now >= deadline:
                    return False
                wait = (quiet - (now - self._last_end)) if self._in_flight == 0 else quiet
                self._lock.wait(timeout=max(0.001, min(wait, deadline - now)))


# -- the accounting (pure) -----------------------------------------------------------------


def critical_chain(requests: Iterable[Request]) -> list[Request]:
    """The longest chain of requests each starting after the previous one ended."""
    chain: list[Request] = []
    for r in sorted(requests, key=lambda r: (r.end, r.start)):
        if not chain or r.start >= chain[-1].end:
            chain.append(r)
    return chain


def in_flight(requests: Iterable[Request], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` during which at least one of ``requests`` was in
    flight (the union of their intervals, clipped to the window).  The rest of the window
    is time with no request in flight: the client computing, or waiting for a CPU."""
    busy, reach = 0.0, start
    for r in sorted(requests, key=lambda r: r.start):
        lo, hi = max(r.start, reach), min(r.end, end)
        if hi > lo:
            busy += hi - lo
        reach = max(reach, min(r.end, end))
    return busy


@dataclass
class Account:
    """What one operation cost: requests by kind, the sequential round trips before it
    returned (by kind), and the requests still running or started after it returned
    (background work, such as markers after a commit's decision)."""

    requests: dict[str, int] = field(default_factory=dict)
    sequential: int = 0
    sequential_by_kind: dict[str, int] = field(default_factory=dict)
    chain: list[Request] = field(default_factory=list)
    background: dict[str, int] = field(default_factory=dict)
    #: Every request counted in ``requests``, in order of start.
    all: list[Request] = field(default_factory=list)
    #: Seconds of the call during which a request was in flight (see in_flight()); the
    #: rest of the call had none.
    busy: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.requests.values())


def account(requests: Iterable[Request], start: float, end: float, *,
            until: float | None = None, since: float | None = None) -> Account:
    """The cost of the operation that ran from ``start`` to ``end``.

    Its requests are those that started in the window, and, with ``since`` (earlier
    than ``start``), also those that started from ``since`` on and were still running
    at ``start`` (background work the call had to wait for, such as a send's upload
    under way when ``commit_transaction()`` was called).  The critical path is the
    chain among them that ended by ``end``; requests that end after ``end`` and start
    before ``until`` (default: ``end``) are background work left running.
    """
    first = start if since is None else min(since, start)
    stop = end if until is None else until
    inside = [r for r in requests if first <= r.start <= end and r.end >= start]
    done = [r for r in inside if r.end <= end]
    later = [r for r in requests if first <= r.start <= stop and r.end > end]
    chain = critical_chain(done)
    return Account(requests=dict(Counter(r.kind for r in inside)),
                   sequential=len(chain),
                   sequential_by_kind=dict(Counter(r.kind for r in chain)),
                   chain=chain, background=dict(Counter(r.kind for r in later)),
                   all=sorted(inside, key=lambda r: r.start),
                   busy=in_flight(inside, start, end))


def mean_counts(counts: Sequence[dict[str, int]]) -> dict[str, float]:
    """Per-kind means over several operations' counts (kinds missing in one count 0)."""
    if not counts:
        return {}
    kinds = sorted({k for c in counts for k in c})
    return {k: sum(c.get(k, 0) for c in counts) / len(counts) for k in kinds}


def describe_chain(chain: Sequence[Request], origin: float, unit: float) -> list[str]:
    """One line per request (of a chain, or any list): start and end in request times
    from ``origin``, kind, key and the code that made the request."""
    return [f"{(r.start - origin) / unit:5.2f}-{(r.end - origin) / unit:5.2f}  "
            f"{r.kind:<13} {r.key}  [{r.site}]" for r in chain]
