"""Inline copies of small batch objects, as log entries carry them (model.INLINE_VERSION).

A reader that follows a partition's tail reads each new entry as it lands; when the entry
carries copies of the objects it appends, the reader keeps them here, and the read that
follows takes them instead of a GET of each object: a commit's records then cost the
reader one round of requests (its marker), not two.

The copies are kept per process, newest first, up to a fixed number of bytes: a reader
takes them within a poll, and a process that only watches offsets (or follows many
partitions it does not read) holds no more than that.  A copy is checked before use as
the object itself would be (the checksum its key names); one that fails is dropped, and
the object is read instead.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING

from txlog import checksums
from txlog.errors import CorruptObjectError, ObjectNotFoundError

if TYPE_CHECKING:
    from txlog.storage.base import ObjectStore

log = logging.getLogger(__name__)

#: Bytes of copies (as stored: base64 text) a process keeps at most.
MAX_KEPT_BYTES = 4 << 20

_lock = threading.Lock()
_kept: OrderedDict[tuple[str, str], str] = OrderedDict()
_kept_bytes = 0


def keep(store_identity: str, copies: Mapping[str, str]) -> None:
    """Keep an entry's copies (object key -> base64) of the store ``store_identity``,
    dropping the oldest beyond MAX_KEPT_BYTES."""
    global _kept_bytes
    with _lock:
        for key, text in copies.items():
            old = _kept.pop((store_identity, key), None)
            if old is not None:
                _kept_bytes -= len(old)
            _kept[(store_identity, key)] = text
            _kept_bytes += len(text)
        while _kept_bytes > MAX_KEPT_BYTES and _kept:
            _, text = _kept.popitem(last=False)
            _kept_bytes -= len(text)


def take(store_identity: str, key: str) -> bytes | None:
    """The bytes of object ``key`` if a copy is kept and matches the checksum its key
    names (the copy is then forgotten), else None: read the object."""
    global _kept_bytes
    with _lock:
        text = _kept.pop((store_identity, key), None)
        if text is None:
            return None
        _kept_bytes -= len(text)
    try:
        raw = base64.b64decode(text, validate=True)
        if checksums.expected(key) is None:  # (decode_entry refuses such copies)
            raise CorruptObjectError("its key names no checksum")
        return checksums.verify(key, raw, what="inline copy of batch object")
    except (binascii.Error, ValueError, CorruptObjectError) as exc:
        log.warning("ignoring the inline copy of %s in its log entry (%s); reading the "
                    "object itself", key, exc)
        return None


def kept_bytes() -> int:
    """Bytes of copies kept now (for tests and metrics)."""
    with _lock:
        return _kept_bytes


def clear() -> None:
    global _kept_bytes
    with _lock:
        _kept.clear()
        _kept_bytes = 0


def ensure_objects(store: ObjectStore, copies: Mapping[str, bytes | None]) -> None:
    """Make sure each batch object ``copies`` holds the bytes of exists whole before an
    entry names it: a commit decided beside its uploads carries them in its PrepareCommit,
    and the uploads may never have landed (the producer was killed).  The bytes match
    the checksum the key names (TxnRecord.inline_bytes checked them), so an object found
    there already is the same one unless a killed upload left part of it: then it is
    replaced whole.  None: a damaged copy, so the object must exist already."""
    for key, data in copies.items():
        if data is None:  # (its copy failed its checksum: only the object itself will do)
            try:
                checksums.verify(key, store.get(key))
            except (CorruptObjectError, ObjectNotFoundError):
                raise CorruptObjectError(
                    f"the decided commit's copy of batch object {key} fails its checksum "
                    "and the object was never written whole: restore the state-log record "
                    "or the object from a backup; until then its markers are not "
                    "written") from None
            continue
        if store.put_if_absent(key, data):
            continue
        try:
            checksums.verify(key, store.get(key))
            continue  # (the upload landed, or another roll-forward wrote it)
        except (CorruptObjectError, ObjectNotFoundError):
            pass
        log.info("replacing the partial batch object %s from its commit's copy", key)
        store.put(key, data)
