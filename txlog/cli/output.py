"""What the command line prints: tables or ``--json`` on stdout, remarks and progress on
stderr, and the one-line form of an error."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from txlog.tables import json_value

PROG = "txlog"


class CliError(Exception):
    """A user-facing failure of a command (exit 1), e.g. malformed input lines."""


# -- output helpers -----------------------------------------------------------------------


class Out:
    def __init__(self, as_json: bool, stream: IO[str] | None = None) -> None:
        self.json = as_json
        self.stream = stream or sys.stdout

    def emit(self, obj: Any, text: str | Callable[[], str]) -> None:
        if self.json:
            self.stream.write(json.dumps(json_value(obj), indent=2, ensure_ascii=False) + "\n")
        else:
            s = text() if callable(text) else text
            if s:
                self.stream.write(s.rstrip("\n") + "\n")

    def line(self, s: str) -> None:
        self.stream.write(s + "\n")


def note(msg: str) -> None:
    """A remark for the human (stderr, so stdout stays parseable)."""
    sys.stderr.write(msg + "\n")


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, enabled: bool, width: int = 30) -> None:
        self.enabled = enabled
        self.width = width
        self.t0 = time.monotonic()

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.enabled:
            return
        frac = done / total if total else 1.0
        fill = int(self.width * frac)
        bar = "#" * fill + "-" * (self.width - fill)
        elapsed = time.monotonic() - self.t0
        sys.stderr.write(f"\r[{bar}] {done}/{total} {elapsed:5.1f}s {what[:40]:<40}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def quiet_stdout() -> None:
    # Python flushes stdout at exit; after EPIPE that would print a second error.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
