"""Releasing and deleting shared batch objects: the store I/O of
:mod:`txlog.shared_release`.

A partition's purge calls :func:`release` for a shared object it is done with: it puts
``topics/<topic>/_shared/_released/<name>/<partition>`` (empty; putting it again changes
nothing), then :func:`collect` deletes the object if the releases now cover every
partition its footer names, and then the markers.  Each releaser puts its marker before
it lists the markers, so of two partitions releasing at once at least the later one
sees both.  A process killed anywhere in between leaves markers that the next
``txlog maintain`` (:func:`collect_topic`) finishes: an object whose releases are
complete is deleted; markers whose object is gone are deleted.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from txlog import checksums, layout
from txlog.crashpoints import crashpoint
from txlog.errors import CorruptObjectError, ObjectNotFoundError, TxlogError
from txlog.shared_objects import FOOTER_KEY
from txlog.shared_release import (
    SharedFooter,
    may_be_complete,
    object_name,
    parse_footer,
    released_partitions,
    releases_complete,
)
from txlog.storage import ObjectStore

log = logging.getLogger(__name__)
_warned: set[str] = set()  # keys warned about in this process (see _warn_once)

#: What :func:`collect` found: the object deleted now, kept for partitions that have
#: not released it, already gone (its leftover markers deleted), or kept because its
#: footer cannot be trusted.
DELETED, WAITING, GONE, DAMAGED = "deleted", "waiting", "gone", "damaged"

_TAIL = 64 * 1024  # one ranged read holds the footer of any batch object txlog writes
#: Validated footers of objects not yet deleted (see _cached_footer), newest last.
_FOOTERS_KEPT = 4096
_footers: OrderedDict[tuple[str, str], tuple[int, SharedFooter]] = OrderedDict()
_footers_lock = threading.Lock()
_MAGIC = b"PAR1"


@dataclass
class CollectReport:
    """What :func:`collect_topic` did to one topic's released shared objects."""

    deleted: int = 0
    waiting: int = 0
    #: Objects left alone, one line each: damaged or missing footers, unknown names.
    warnings: list[str] = field(default_factory=list)
    #: Objects that could not be looked at (a store error), one line each.
    failures: list[str] = field(default_factory=list)


def is_shared(topic: str, key: str) -> bool:
    """Whether ``key`` lies under ``topic``'s shared objects (no partition deletes it)."""
    return key.startswith(layout.shared_prefix(topic))


def release(store: ObjectStore, topic: str, key: str, partition: int, *,
            partitions: int) -> str:
    """Record that ``partition`` is done with shared object ``key``, then delete the
    object if every partition it holds has released it.  Returns what :func:`collect`
    found (DAMAGED, without a marker, for a key that names no shared object)."""
    name = object_name(topic, key)
    if name is None:
        _warn_once(key)(f"not deleting {key}: it is under the shared objects of topic "
                        f"{topic} but names none")
        return DAMAGED
    store.put(layout.release_key(topic, name, partition), b"")
    crashpoint("after_shared_release")
    return collect(store, topic, name, partitions=partitions)


def collect(store: ObjectStore, topic: str, name: str, *, partitions: int,
            markers: list[str] | None = None,
            warn: Callable[[str], None] | None = None) -> str:
    """Delete shared object ``name`` of ``topic`` (of ``partitions`` partitions) and
    then its release markers if the markers cover every partition its footer names;
    delete only the markers if the object is gone.  A missing or invalid footer
    deletes nothing and warns (through ``warn``, else logged once per process and
    object).  ``markers``: the keys of its markers, if just listed."""
    key = layout.shared_prefix(topic) + name
    prefix = layout.release_markers_prefix(topic, name)
    if markers is None:
        markers = store.list(prefix)
    released = released_partitions(k[len(prefix):] for k in markers)
    try:
        footer = _cached_footer(store, key, partitions=partitions)
        if not releases_complete(footer, released):
            return WAITING
        # The footer decides a deletion only from bytes that match the name's checksum.
        raw = store.get(key)
        try:
            checksums.verify(key, raw, what="shared batch object")
        except CorruptObjectError:
            raise _unreadable(key, "fails the checksum its name carries (its bytes were "
                                   "damaged after it was written)") from None
        footer = _footer_of(_metadata(raw, key), key, partitions=partitions)
        if not releases_complete(footer, released):
            return WAITING
    except ObjectNotFoundError:
        _forget(store, key)
        for k in markers:
            store.delete(k)
        return GONE
    except CorruptObjectError as exc:
        (warn or _warn_once(key))(" ".join(str(exc).split()))
        return DAMAGED
    store.delete(key)
    _forget(store, key)
    crashpoint("after_shared_delete")
    for k in markers:
        store.delete(k)
    return DELETED


def collect_topic(store: ObjectStore, topic: str, *, partitions: int,
                  holders: Mapping[str, Iterable[int]] | None = None) -> CollectReport:
    """Finish what releasers of ``topic``'s shared objects left undone (a process
    killed between its release and the deletion, or releasers that raced): every
    object with release markers is collected.  ``holders`` (shared key -> partitions
    whose state still names it, as just read) spares reading the footer of an object
    a partition still holds and has not released: that partition collects it when it
    does.  A failure on one object does not stop the others."""
    report = CollectReport()
    shared = layout.shared_prefix(topic)
    released_root = layout.released_prefix(topic)
    by_name: dict[str, list[str]] = {}
    for k in store.list(released_root):  # one listing for all, not one per object
        by_name.setdefault(k[len(released_root):].split("/", 1)[0], []).append(k)
    held = holders or {}
    for name, markers in by_name.items():
        if object_name(topic, shared + name) is None:
            report.warnings.append(f"{released_root}{name}: release markers of no shared "
                                   "object name; left alone")
            continue
        prefix = layout.release_markers_prefix(topic, name)
        released = released_partitions(k[len(prefix):] for k in markers)
        if not may_be_complete(released, held.get(shared + name, ())):
            report.waiting += 1
            continue
        try:
            outcome = collect(store, topic, name, partitions=partitions, markers=markers,
                              warn=report.warnings.append)
        except TxlogError as exc:
            report.failures.append(f"shared object {shared}{name}: "
                                   + " ".join(str(exc).split()))
            continue
        if outcome == DELETED:
            report.deleted += 1
        elif outcome == WAITING:
            report.waiting += 1
    return report


def _warn_once(key: str) -> Callable[[str], None]:
    """A warning about ``key`` logged the first time in this process, then at debug
    level: every partition's purge, and every maintenance run, meets the object again."""
    first = key not in _warned
    _warned.add(key)
    return lambda msg: (log.warning if first else log.debug)("%s", msg)


def _cached_footer(store: ObjectStore, key: str, *, partitions: int) -> SharedFooter:
    """The validated footer of ``key``, read once per process: every partition of the
    object releases it, usually in one maintenance run.  (A shared object never
    changes under its name, and the deletion itself re-reads the whole object.)"""
    ck = (store.identity, key)
    with _footers_lock:
        got = _footers.get(ck)
        if got is not None and got[0] == partitions:
            _footers.move_to_end(ck)
            return got[1]
    footer = _read_footer(store, key, partitions=partitions)
    with _footers_lock:
        _footers[ck] = (partitions, footer)
        while len(_footers) > _FOOTERS_KEPT:
            _footers.popitem(last=False)
    return footer


def _forget(store: ObjectStore, key: str) -> None:
    with _footers_lock:
        _footers.pop((store.identity, key), None)


def _read_footer(store: ObjectStore, key: str, *, partitions: int) -> SharedFooter:
    """The validated footer of ``key``, from the object's tail alone."""
    size = store.size(key)
    tail = store.get_range(key, max(0, size - _TAIL), size)
    if len(tail) < 8 or tail[-4:] != _MAGIC:
        raise _unreadable(key, "does not end as a Parquet file does")
    (length,) = struct.unpack("<I", tail[-8:-4])
    if length + 8 > size:
        raise _unreadable(key, f"declares a footer of {length} bytes in {size}")
    if length + 8 > len(tail):
        tail = store.get_range(key, size - length - 8, size)
    # The magic in front stands in for the rest of the file: only the footer is parsed.
    return _footer_of(_metadata(_MAGIC + tail[-(length + 8):], key), key,
                      partitions=partitions)


def _metadata(raw: bytes, key: str) -> pq.FileMetaData:
    try:
        return pq.read_metadata(pa.BufferReader(raw))
    except Exception as exc:  # pyarrow raises several types for damaged input
        raise _unreadable(key, f"has a footer that cannot be parsed ({exc})") from None


def _footer_of(meta: pq.FileMetaData, key: str, *, partitions: int) -> SharedFooter:
    try:
        kv = meta.metadata or {}
        starts, row = [], 0
        for i in range(meta.num_row_groups):
            starts.append(row)
            row += meta.row_group(i).num_rows
        rows = int(meta.num_rows)
    except Exception as exc:  # pyarrow raises several types for damaged input
        raise _unreadable(key, f"has a footer that cannot be parsed ({exc})") from None
    return parse_footer(kv.get(FOOTER_KEY.encode()), where=key, partitions=partitions,
                        object_rows=rows, row_group_starts=starts)


def _unreadable(key: str, what: str) -> CorruptObjectError:
    return CorruptObjectError(f"shared batch object {key} {what}; it is not deleted (the "
                              "partitions it holds are unknown)")
