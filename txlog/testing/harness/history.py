"""History files: one JSONL file of events per client process (see :mod:`txlog.testing.checker`).

Each event is written with one ``write`` to a file opened for appending, so a process
SIGKILLed mid-operation leaves whole lines: its last invocation simply has no completion.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from txlog.testing.harness.clock import real_time_ns

HISTORY_SUFFIX = ".history.jsonl"


def now_ms() -> int:
    return real_time_ns() // 1_000_000  # unshifted by the clock-skew nemesis


class Recorder:
    """Appends invoke/complete events of one process to ``path``."""

    def __init__(self, path: str | os.PathLike[str], process: str) -> None:
        self.path = str(path)
        self.process = process
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._seq = 0
        self._lock = threading.Lock()  # client threads of one process share a recorder

    def _write(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":"), default=str) + "\n"
        os.write(self._fd, line.encode())

    def invoke(self, f: str, value: dict[str, Any] | None = None) -> str:
        """Record an invocation; returns the operation id for :meth:`complete`."""
        with self._lock:
            self._seq += 1
            oid = f"{self.process}#{self._seq}"
        self._write({"type": "invoke", "process": self.process, "f": f, "id": oid,
                     "time": now_ms(), "value": value or {}})
        return oid

    def complete(self, oid: str, f: str, outcome: str, value: dict[str, Any] | None = None,
                 error: BaseException | str | None = None, unexpected: bool = False) -> None:
        """Record a completion: ``outcome`` is ok, fail or info (unknown)."""
        if outcome not in ("ok", "fail", "info"):
            raise ValueError(f"outcome must be ok, fail or info, not {outcome!r}")
        event: dict[str, Any] = {"type": outcome, "process": self.process, "f": f, "id": oid,
                                 "time": now_ms(), "value": value or {}}
        if error is not None:
            event["error"] = (f"{type(error).__name__}: {error}"
                              if isinstance(error, BaseException) else str(error))
        if unexpected:
            event["unexpected"] = True
        self._write(event)

    def event(self, f: str, outcome: str = "ok", value: dict[str, Any] | None = None,
              error: BaseException | str | None = None, unexpected: bool = False) -> str:
        """An instantaneous operation (invoke and complete at once)."""
        oid = self.invoke(f, value)
        self.complete(oid, f, outcome, None, error, unexpected)
        return oid

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def iter_events(directory: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every event of every history file in ``directory`` (file by file, in file order).

    A torn last line (a process killed mid-write) is skipped.
    """
    for path in sorted(Path(directory).glob(f"*{HISTORY_SUFFIX}")):
        with open(path, "rb") as f:
            for raw in f:
                try:
                    yield json.loads(raw)
                except ValueError:
                    continue


def load_events(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    return list(iter_events(directory))
