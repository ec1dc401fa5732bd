"""Shared batch objects: one object holding one producer step's batches of several
partitions of a topic, instead of one object per partition.

The object is a batch object of the topic like any other (same columns, same encoding),
under ``layout.shared_prefix(topic)``, with the CRC-32 of its bytes in its name.  Its rows
are the batches in ascending partition order, each batch's rows contiguous and starting a
row group of its own.  Each partition's log entry names its batch's rows by a part of 7
(model.SHARED_VERSION).  The footer's key-value metadata ``txlog.shared`` records which
partition holds which rows, for maintenance to know which partitions must release the
object before it is deleted; readers never need it.

Encoding and the footer's validation are pure; :func:`write_shared` puts the object.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from txlog import arrow_memory, checksums, layout
from txlog.batch_codec import row_group_rows, writer_options
from txlog.errors import CorruptObjectError
from txlog.unique import unique

if TYPE_CHECKING:
    from txlog.storage import ObjectStore

#: The footer key-value metadata key that lists the object's partitions.
FOOTER_KEY = "txlog.shared"
FOOTER_VERSION = 1


@dataclass(frozen=True, slots=True)
class SharedSlice:
    """One batch's place in a shared object: rows [row, row + count) of ``object_rows``;
    ``nbytes`` is the whole object's stored size."""

    partition: int
    key: str
    nbytes: int
    row: int
    count: int
    object_rows: int

    def part(self, ts_min: int, ts_max: int) -> list[Any]:
        """The batch as a log entry's part of 7 (model.PARTS)."""
        return [self.key, self.count, self.nbytes, ts_min, ts_max, self.row,
                self.object_rows]


def encode_shared(topic: str, batches: Sequence[tuple[int, pa.Table]],
                  ) -> tuple[str, pa.Buffer, list[SharedSlice]]:
    """A shared object of ``batches`` ((partition, table), one schema, each table
    non-empty): its key, its bytes, and each batch's slice, in the order of ``batches``.
    The object holds them in ascending partition order (stable for batches of one
    partition)."""
    if not batches:
        raise ValueError("a shared object needs at least one batch")
    schema = batches[0][1].schema
    for p, t in batches:
        if type(p) is not int or p < 0 or t.num_rows <= 0:
            raise ValueError(f"batch of partition {p!r} with {t.num_rows} rows cannot be "
                             "part of a shared object")
        if not t.schema.equals(schema):
            raise ValueError("the batches of one shared object must have one schema")
    order = sorted(range(len(batches)), key=lambda i: batches[i][0])
    rows: dict[int, int] = {}
    runs: list[list[int]] = []  # [partition, row, count], one per partition
    row = 0
    for i in order:
        p, t = batches[i]
        rows[i] = row
        if runs and runs[-1][0] == p:
            runs[-1][2] += t.num_rows
        else:
            runs.append([p, row, t.num_rows])
        row += t.num_rows
    options = writer_options(schema)
    buf = pa.BufferOutputStream(memory_pool=options["memory_pool"])
    with pq.ParquetWriter(buf, schema, **options) as w:
        for i in order:
            t = batches[i][1]
            w.write_table(t, row_group_size=row_group_rows(t))
        w.add_key_value_metadata({FOOTER_KEY: json.dumps(
            {"v": FOOTER_VERSION, "partitions": runs}, separators=(",", ":"))})
    data = buf.getvalue()
    key = layout.shared_key(topic, unique() + checksums.tag(memoryview(data)))
    slices = [SharedSlice(p, key, data.size, rows[i], t.num_rows, row)
              for i, (p, t) in enumerate(batches)]
    return key, data, slices


def write_shared(store: ObjectStore, topic: str, batches: Sequence[tuple[int, pa.Table]],
                 ) -> list[SharedSlice]:
    """Write a shared object of ``batches`` (see :func:`encode_shared`) under a new name
    (not yet named by any log entry); returns each batch's slice, in their order."""
    key, buf, slices = encode_shared(topic, batches)
    try:
        store.put_new(key, memoryview(buf) if store.writes_buffers else buf.to_pybytes())
    finally:
        del buf
        arrow_memory.release()
    return slices


def footer_partitions(metadata: pq.FileMetaData, where: str) -> list[tuple[int, int, int]]:
    """The ``(partition, row, count)`` runs a shared object's footer records, validated
    by :func:`footer_runs`.  Raises CorruptObjectError for a footer that lacks them or
    breaks a rule."""
    raw = (metadata.metadata or {}).get(FOOTER_KEY.encode())
    if raw is None:
        raise CorruptObjectError(
            f"shared batch object {where} has no {FOOTER_KEY} footer metadata: it was not "
            "written as a shared object, or was damaged; nothing relies on it being deleted")
    try:
        return footer_runs(raw, partitions=None, object_rows=metadata.num_rows)
    except ValueError as exc:
        raise CorruptObjectError(
            f"shared batch object {where} has an invalid {FOOTER_KEY} footer ({exc}); "
            "nothing relies on it being deleted") from None


def footer_runs(value: bytes | str | None, *, partitions: int | None, object_rows: int,
                row_group_starts: Sequence[int] | None = None) -> list[tuple[int, int, int]]:
    """The rules of a ``txlog.shared`` footer, the one place they live: the runs it names
    if it is valid for an object of ``object_rows`` rows (and, given, a topic of
    ``partitions`` partitions; with ``row_group_starts``, the first row of each row group,
    every batch must start one, as the writer lays them out); else ValueError saying
    what is wrong, which each caller words for its own use."""
    if value is None:
        raise ValueError(f"has no {FOOTER_KEY} footer metadata")
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: JSON nested past the parser's depth, which any object under
        # _shared/ may hold; it must not stop maintenance of every later partition.
        raise ValueError(f"has a {FOOTER_KEY} footer that is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"has a {FOOTER_KEY} footer that is not a JSON object")
    if type(doc.get("v")) is not int or doc["v"] != FOOTER_VERSION:
        raise ValueError(f"has a {FOOTER_KEY} footer of version {doc.get('v')!r}; this "
                         f"txlog knows version {FOOTER_VERSION}")
    raw = doc.get("partitions")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"has a {FOOTER_KEY} footer without a list of partitions")
    parts: list[tuple[int, int, int]] = []
    next_row = 0
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3
                and all(type(x) is int for x in item)):
            raise ValueError(f"names {item!r} in its footer, not [partition, row, count]")
        p, row, count = item
        if p < 0 or (partitions is not None and p >= partitions):
            has = f"the topic has {partitions}" if partitions is not None else "none is negative"
            raise ValueError(f"names partition {p} in its footer; {has}")
        if parts and p <= parts[-1][0]:
            raise ValueError(f"names partition {p} after partition {parts[-1][0]} in its "
                             "footer (they must be distinct and ascending)")
        if row != next_row or count < 1:
            raise ValueError(f"puts partition {p} at rows [{row}, {row + count}) in its "
                             f"footer, where the batches so far end at row {next_row}")
        parts.append((p, row, count))
        next_row = row + count
    if next_row != object_rows:
        raise ValueError(f"names {next_row} rows in its footer but holds {object_rows}")
    if row_group_starts is not None:
        starts = set(row_group_starts)
        for p, row, _ in parts:
            if row not in starts:
                raise ValueError(f"puts partition {p}'s batch at row {row} in its footer, "
                                 "which starts no row group")
    return parts
