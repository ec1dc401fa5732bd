"""This machine's processes as /proc shows them, and killing a child with everything it
started (every process of its session)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path


def process_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, fields of /proc/PID/stat after the command name) for every process that is
    still there when read: field 0 is the state, 1 the parent pid, 3 the session id,
    11-14 the user and system CPU ticks of the process and of its reaped children."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces or parentheses itself.
        yield int(entry), stat[stat.rindex(")") + 2:].split()


def kill_session(sid: int) -> int:
    """SIGKILL every process whose session id is ``sid`` (a child started with
    ``start_new_session=True`` leads its own: a Spark driver, its JVM and its Python
    workers, whose daemon makes a process group of its own but stays in the session).
    Returns how many processes were signalled."""
    pids = [pid for pid, fields in process_stats() if int(fields[3]) == sid]
    killed = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed
