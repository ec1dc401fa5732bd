"""Reading a poll's batch objects within a budget of decoded bytes, a window at a time.

A poll's byte limits count stored sizes (as Kafka's do), but what a reader holds is what
the objects decode into, which for records that compress well is many times more.  The
objects are fetched side by side in windows, each sized by the budget still left and by
how many bytes a stored byte of this partition decoded into so far, so that a poll cut
short by its budget has fetched no object it does not decode and holds no stored bytes
it will not use.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from txlog.model import share

if TYPE_CHECKING:
    from txlog.partition_state import PartitionState, ReadSpan

T = TypeVar("T")

def stored_sizes(state: PartitionState | None, spans: Sequence[ReadSpan],
                 keys: Sequence[str]) -> list[int]:
    """The stored bytes of each object of ``keys`` that a read of ``spans`` decodes, as
    ``state`` records them (0: not known): an object's size, a compacted segment's on
    the batch of its first run, and of a shared object the share of its batches read
    (the rest of it is fetched but not decoded)."""
    sizes = dict.fromkeys(keys, 0)
    if state is not None:
        b = state.batches
        base, data, n = b.base_offset, b.data, len(b)
        for s in spans:
            if s.data not in sizes:
                continue
            i = bisect.bisect_left(base, s.base_offset)
            if i < n and base[i] == s.base_offset and data[i] == s.data:
                sizes[s.data] += share(int(b.nbytes[i]), int(b.count[i]),
                                       int(b.object_rows[i]))
    return [sizes.get(k, 0) for k in keys]


def window(sizes: Sequence[int], room: int, expansion: float | None) -> int:
    """How many of the next objects (stored sizes ``sizes``; 0: not known) to fetch side
    by side: those that, at ``expansion`` decoded bytes per stored byte, are predicted to
    be decoded before the decoded bytes reach ``room``, the last of them passing it (a
    read decodes objects until its budget is reached, at least one).  One alone while
    the expansion is not known, and none past an object whose size is not."""
    if expansion is None or not sizes or room <= 0:
        return 1
    n = 0
    predicted = 0.0
    for size in sizes:
        if predicted >= room or (size <= 0 and n):
            break
        if size <= 0:
            return 1
        predicted += size * expansion
        n += 1
    return max(1, n)


def read_within(keys: Sequence[str], sizes: Sequence[int], *, max_decoded: int,
                expansion: float | None, get: Callable[[str], bytes],
                get_many: Callable[[Sequence[str]], list[bytes]] | None,
                decode: Callable[[str, bytes], T], decoded_size: Callable[[T], int],
                ) -> tuple[dict[str, T], float | None]:
    """Decode ``keys`` in order until the decoded bytes reach ``max_decoded`` (at least
    one object), fetching them a window at a time (:func:`window`) with ``get_many``
    (side by side), or one at a time with ``get`` where ``get_many`` is None.  Returns
    the decoded objects by key, a prefix of ``keys``, and the largest expansion (decoded
    bytes per stored byte) of the last window, for the next read to size its first
    window by (the largest, so that a window rarely takes an object it will not decode;
    where one does, the object is fetched but not decoded, and the next read learns)."""
    out: dict[str, T] = {}
    decoded = 0
    i = 0
    while i < len(keys) and not (out and decoded >= max_decoded):
        n = 1 if get_many is None else window(sizes[i:], max_decoded - decoded, expansion)
        batch = keys[i:i + n]
        raws = get_many(batch) if get_many is not None and n > 1 else [get(batch[0])]
        seen: float | None = None
        for j, key in enumerate(batch):
            if out and decoded >= max_decoded:
                break  # (only where an object decoded into more than its window allowed)
            raw, raws[j] = raws[j], b""  # each object's bytes let go once it is decoded
            # (what the decoded rows take stored, where known: a shared object's share)
            stored = sizes[i + j] or len(raw)
            table = decode(key, raw)
            del raw
            size = decoded_size(table)
            out[key] = table
            decoded += size
            if stored:
                seen = max(seen or 0.0, size / stored)
        del raws
        if seen is not None:
            expansion = seen
        i += n
    return out, expansion
