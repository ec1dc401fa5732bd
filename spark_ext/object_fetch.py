"""Fetching the batch objects of a Python data source task, a bounded number of bytes
ahead of the one it decodes.

A task's slices come in plan order, and the runs of a compacted segment are consecutive
slices of one object: each object is fetched once for the slices that follow each other
in it.  On a remote store the next objects are fetched on threads while the task decodes
the current one, at most ``max_objects`` of them and (beyond the first) at most
``max_bytes`` of their sizes as the plan declares them, so an object larger than the
budget is still fetched, alone; on local disk the task reads each object itself.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

from spark_ext.read_plan import FileSlice
from txlog.errors import ObjectNotFoundError, OffsetOutOfRangeError

if TYPE_CHECKING:
    from txlog.storage import ObjectStore

log = logging.getLogger(__name__)

#: Objects fetched ahead of the one a task decodes, at most.
PREFETCH_OBJECTS = 8
#: Bytes of objects fetched ahead, at most (one larger object is still fetched alone).
PREFETCH_BYTES = 32 * 1024 * 1024


class ObjectRead(NamedTuple):
    """Consecutive slices of one object, read from one fetch of it."""

    key: str
    slices: list[FileSlice]
    size: int  # the object's size as the plan declares it (0: not known)


def object_reads(slices: Sequence[FileSlice]) -> list[ObjectRead]:
    """The slices, in order, as one read per run of consecutive slices of an object."""
    out: list[ObjectRead] = []
    for s in slices:
        if out and out[-1].key == s.key:
            out[-1].slices.append(s)
        else:
            out.append(ObjectRead(s.key, [s], s.object_bytes))
    return out


def admits(ahead: int, ahead_bytes: int, size: int, *, max_objects: int,
           max_bytes: int) -> bool:
    """Whether an object of ``size`` bytes (0: not known, counted as the whole budget) may
    be fetched while ``ahead`` objects of ``ahead_bytes`` are fetched or held ahead."""
    if ahead == 0:
        return True
    return ahead < max_objects and ahead_bytes + (size or max_bytes) <= max_bytes


def fetch_objects(store: ObjectStore, reads: Sequence[ObjectRead], *,
                  fail_on_data_loss: bool, max_objects: int = PREFETCH_OBJECTS,
                  max_bytes: int = PREFETCH_BYTES) -> Iterator[tuple[ObjectRead, bytes | None]]:
    """Each read with its object's bytes (None: the object is gone and
    ``fail_on_data_loss`` is off), in order; an error of a fetch surfaces at its read."""

    def get(r: ObjectRead) -> bytes | None:
        try:
            return store.get(r.key)
        except (ObjectNotFoundError, KeyError):
            first = r.slices[0]  # (where a read of the object's slices would fail first)
            if fail_on_data_loss:
                raise OffsetOutOfRangeError(
                    f"batch object {r.key} of {first.topic}-{first.partition} (offsets "
                    f"{first.start}..{first.stop - 1}) is gone: retention or compaction "
                    "deleted it after the read was planned. Re-run the query, or set "
                    "failOnDataLoss=false to skip missing data.") from None
            log.warning("skipping missing batch object %s (failOnDataLoss=false)", r.key)
            return None

    if store.local_requests or len(reads) < 2 or max_objects < 1:
        for r in reads:
            yield r, get(r)
        return
    yield from _ahead(reads, get, max_objects=max_objects, max_bytes=max_bytes)


def _ahead(reads: Sequence[ObjectRead], get: Callable[[ObjectRead], bytes | None], *,
           max_objects: int, max_bytes: int) -> Iterator[tuple[ObjectRead, bytes | None]]:
    ex = ThreadPoolExecutor(max_workers=max_objects, thread_name_prefix="txlog-prefetch")
    pending: deque[tuple[ObjectRead, Future[bytes | None]]] = deque()
    ahead_bytes = 0
    nxt = 0

    def fill() -> None:
        nonlocal ahead_bytes, nxt
        while nxt < len(reads):
            r = reads[nxt]
            if not admits(len(pending), ahead_bytes, r.size, max_objects=max_objects,
                          max_bytes=max_bytes):
                return
            pending.append((r, ex.submit(get, r)))
            ahead_bytes += r.size or max_bytes
            nxt += 1

    try:
        fill()
        while pending:
            r, fut = pending.popleft()
            ahead_bytes -= r.size or max_bytes
            # The room this object leaves goes to the next ones while it is decoded.
            fill()
            raw = fut.result()
            yield r, raw
            del raw
    finally:
        for _, fut in pending:
            fut.cancel()
        ex.shutdown(wait=True, cancel_futures=True)
