"""Checksums of stored objects, so that a flipped bit is an error rather than data.

A batch object's CRC-32 is part of its key (``<unique>.crc32-<8 hex>.parquet``), so the
log entry (or transaction record, or checkpoint) that names the object carries it, and
the object cannot be changed, by a disk or a person, without the name no longer matching.
Keys without one (objects written before txlog 0.4, or by the JVM writer) are read
unchecked.  A partition checkpoint ends with the CRC-32 of the rest of it (see
checkpoint.py).  CRC-32 detects accidental damage; it is no defence against someone who
can write the root, who could as well write a new object and a matching name.
"""

from __future__ import annotations

import re
import zlib

from txlog.errors import CorruptObjectError

_TAG = re.compile(r"\.crc32-([0-9a-f]{8})\.[a-z]+$")


def tag(data: bytes | memoryview) -> str:
    """The part of a new object's name that carries the checksum of ``data``."""
    return f".crc32-{zlib.crc32(data):08x}"


def expected(key: str) -> int | None:
    """The checksum ``key`` names, or None for a key without one."""
    m = _TAG.search(key)
    return int(m.group(1), 16) if m else None


def verify(key: str, data: bytes, *, what: str = "batch object") -> bytes:
    """``data`` itself if it matches the checksum in ``key`` (or the key has none)."""
    want = expected(key)
    if want is not None:
        got = zlib.crc32(data)
        if got != want:
            raise CorruptObjectError(
                f"{what} {key} fails its checksum (CRC-32 {got:08x}, its name says "
                f"{want:08x}): its bytes were damaged after it was written. Restore it from "
                "a backup; readers will not return its records")
    return data
