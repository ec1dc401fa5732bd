"""Strings unique across processes, forked ones too, without a system call each.

A random prefix per process and a counter: the system's random source (``uuid4``) for
each one made a Spark commit's threads wait for the GIL at every call.
"""

from __future__ import annotations

import itertools
import os
import secrets

_prefix = ""
_count = itertools.count()


def _new_source() -> None:
    global _prefix, _count
    _prefix = secrets.token_hex(16)  # 128 random bits, as many as a uuid4 has (122)
    _count = itertools.count()


_new_source()
# A forked child must not hand out its parent's strings.
os.register_at_fork(after_in_child=_new_source)


def unique() -> str:
    """A string no other call, in this process or any other, returns."""
    return f"{_prefix}{next(_count):x}"
