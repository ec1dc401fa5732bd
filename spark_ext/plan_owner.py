"""Which process a scan plan file belongs to (spark_ext/plan_file.py), and the removal of
the plans of processes that are gone.

A process that writes plans into a directory holds an exclusive lock (``flock``) on a file
of its own there, ``txlog-plans-<token>.lock``, for as long as it lives, and names its plans
``txlog-plan-<token>-<random>.arrows``.  The kernel releases the lock when the process
ends, however it ends (SIGKILL included), so a lock that another process can take belongs
to a process that is gone: its plans are nobody's, and :func:`sweep` removes them with
the lock file.  A live writer's lock cannot be taken, so its plans are never touched, and
a pid reused by another process changes nothing.  A clean exit removes the process's own
lock file (:func:`release`).  Where ``fcntl`` is missing (Windows) no lock is held and
nothing is swept.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from collections.abc import Iterable

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_PREFIX = "txlog-plans-"
LOCK_SUFFIX = ".lock"
PLAN_PREFIX = "txlog-plan-"
PLAN_SUFFIX = ".arrows"
# A lock file made but not yet locked and renamed into place carries this suffix instead.
_MAKING_SUFFIX = ".making"
_TOKEN = re.compile(r"[0-9a-f]{32}")

#: This process's lock per directory: (pid, token, descriptor of the locked file).
_HELD: dict[str, tuple[int, str, int]] = {}


def plan_prefix(token: str) -> str:
    """The start of the names of the plans written under ``token``."""
    return f"{PLAN_PREFIX}{token}-"


def lock_tokens(names: Iterable[str]) -> dict[str, str]:
    """The owner tokens that lock files among ``names`` name: {token: file name}."""
    out: dict[str, str] = {}
    for name in names:
        if not name.startswith(LOCK_PREFIX):
            continue
        rest = name[len(LOCK_PREFIX):]
        for suffix in (LOCK_SUFFIX, _MAKING_SUFFIX):
            if rest.endswith(suffix) and _TOKEN.fullmatch(rest[:-len(suffix)]):
                out.setdefault(rest[:-len(suffix)], name)
    return out


def plans_of(token: str, names: Iterable[str]) -> list[str]:
    """The plan files among ``names`` written under ``token``."""
    prefix = plan_prefix(token)
    return sorted(n for n in names if n.startswith(prefix) and n.endswith(PLAN_SUFFIX))


def token(directory: str | None = None) -> str:
    """This process's token for plans in ``directory`` (the temporary directory by
    default): on the first call (and again in a forked child) its lock file is made,
    locked, and the plans of writers that are gone are swept."""
    where = directory or tempfile.gettempdir()
    held = _HELD.get(where)
    if held is not None and held[0] == os.getpid():
        return held[1]
    if fcntl is None:  # pragma: no cover - Windows
        _HELD[where] = (os.getpid(), secrets.token_hex(16), -1)
        return _HELD[where][1]
    while True:
        mine = secrets.token_hex(16)
        # Locked before it appears under its final name, so no sweep finds it unlocked
        # while this process lives.  A sweep that locked it in the instant before this
        # did removed it: then the rename fails, and a new one is made.
        making = os.path.join(where, f"{LOCK_PREFIX}{mine}{_MAKING_SUFFIX}")
        fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(making, os.path.join(where, f"{LOCK_PREFIX}{mine}{LOCK_SUFFIX}"))
        except OSError:
            os.close(fd)
            continue
        _HELD[where] = (os.getpid(), mine, fd)
        sweep(where)
        return mine


def sweep(directory: str | None = None) -> list[str]:
    """Remove the plans (and lock files) of writers in ``directory`` that are gone;
    returns the names removed."""
    if fcntl is None:  # pragma: no cover - Windows
        return []
    where = directory or tempfile.gettempdir()
    try:
        names = os.listdir(where)
    except FileNotFoundError:
        return []
    own = _HELD.get(where)
    removed: list[str] = []
    for owner, lock_name in lock_tokens(names).items():
        if own is not None and own[0] == os.getpid() and owner == own[1]:
            continue
        path = os.path.join(where, lock_name)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue  # its writer ended cleanly meanwhile, or another sweep was first
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: its writer is alive
            for plan in plans_of(owner, names):
                if _unlink(os.path.join(where, plan)):
                    removed.append(plan)
            if _unlink(path):
                removed.append(lock_name)
        finally:
            os.close(fd)
    return removed


def release() -> None:
    """Remove this process's lock files (at exit: its unread plans are gone by then).
    It takes no lock, so that a signal handler may call it."""
    for where, (pid, mine, fd) in list(_HELD.items()):
        if pid != os.getpid() or fd < 0:
            continue
        _unlink(os.path.join(where, f"{LOCK_PREFIX}{mine}{LOCK_SUFFIX}"))
        try:
            os.close(fd)
        except OSError:
            pass
        _HELD.pop(where, None)


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
