"""Named crash points for crash tests: real SIGKILLs at chosen protocol steps.

``TXLOG_CRASH_AT=name[:n]`` makes the process SIGKILL itself the n-th time (default 1st)
it reaches crash point ``name``.  ``TXLOG_STOP_AT=name[:n]`` makes it SIGSTOP itself
there instead: a zombie that a test wakes up later with SIGCONT (its parent learns that
it stopped from ``waitpid(..., WUNTRACED)``).  Unset (always, in production) this costs
one dict lookup.
"""

from __future__ import annotations

import os
import signal
import threading


def _parse(spec: str) -> tuple[str, int]:
    name, _, n = spec.partition(":")
    return name, int(n) if n else 1


_KILL = _parse(os.environ.get("TXLOG_CRASH_AT", ""))
_STOP = _parse(os.environ.get("TXLOG_STOP_AT", ""))
_hits: dict[str, int] = {}
_lock = threading.Lock()  # points may be reached on several threads (staged appends)


def crashpoint(name: str) -> None:
    if name != _KILL[0] and name != _STOP[0]:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        hits = _hits[name]
    if name == _KILL[0] and hits >= _KILL[1]:
        os.kill(os.getpid(), signal.SIGKILL)
    if name == _STOP[0] and hits == _STOP[1]:
        os.kill(os.getpid(), signal.SIGSTOP)


def armed(name: str) -> bool:
    """Whether a crash test set crash point ``name`` (it may then hold the process at a
    state that the test needs, such as a decision landed before an upload)."""
    return name in (_KILL[0], _STOP[0])
