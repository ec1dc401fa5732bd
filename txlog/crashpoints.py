"""Named crash points for crash tests: real SIGKILLs at chosen protocol steps.

``TXLOG_CRASH_AT=name[:n]`` makes the process SIGKILL itself the n-th time (default 1st)
it reaches crash point ``name``.  Unset (always, in production) this costs one dict lookup.
"""

from __future__ import annotations

import os
import signal
import threading

_SPEC = os.environ.get("TXLOG_CRASH_AT", "")
_NAME, _, _N = _SPEC.partition(":")
_TARGET = int(_N) if _N else 1
_hits: dict[str, int] = {}
_lock = threading.Lock()  # points may be reached on several threads (staged appends)


def crashpoint(name: str) -> None:
    if not _NAME or name != _NAME:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        hit = _hits[name] >= _TARGET
    if hit:
        os.kill(os.getpid(), signal.SIGKILL)
