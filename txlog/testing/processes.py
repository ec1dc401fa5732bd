"""This machine's processes as /proc shows them."""

from __future__ import annotations

import os
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

