"""The clock-skew nemesis: a worker process whose wall clock is shifted.

``shift_wall_clock`` moves ``time.time`` and ``time.time_ns`` for the whole process, so
everything txlog stamps with the wall clock (transaction start times, batch append times,
deletion due times) is off by the skew, as on a machine whose clock is wrong.  Monotonic
time and the object store's own clock are not moved: a wrong wall clock does not move
them either.  The harness itself (deadlines, history timestamps) reads the real clock.
"""

from __future__ import annotations

import time

_REAL_TIME = time.time
_REAL_TIME_NS = time.time_ns


def real_time() -> float:
    """The unshifted wall clock, in seconds."""
    return _REAL_TIME()


def real_time_ns() -> int:
    return _REAL_TIME_NS()


def shift_wall_clock(skew_ms: int) -> None:
    """From now on this process's wall clock reads ``skew_ms`` ahead (negative: behind)."""
    skew_ns = int(skew_ms) * 1_000_000

    def shifted_time() -> float:
        return (_REAL_TIME_NS() + skew_ns) / 1e9

    def shifted_time_ns() -> int:
        return _REAL_TIME_NS() + skew_ns

    time.time = shifted_time
    time.time_ns = shifted_time_ns
