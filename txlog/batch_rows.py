"""A batch object's rows read a range at a time, decoding only the row groups a range
needs, in pieces of a bounded size.

A reader that wants a few runs of a large compacted segment should not hold the whole
segment decoded: :class:`BatchRows` decodes one row group at a time (and a large row
group a piece at a time), and ranges asked for in increasing order share one pass over
the object, so the runs of a segment read one after another decode each row group once.
The object's stored bytes are held whole (their checksum covers all of them); the
checks of :func:`txlog.batch_codec.open_parquet` hold as for a whole decode.

A log reader wants a batch's rows of an object that may hold more: a partition's batch
in a shared object, or runs of a compacted segment.  :meth:`BatchRows.read` decodes the
row groups that cover the rows asked for, once each, and makes those checks of them
alone, so a partition's batch in a shared object decodes within the limits whenever it
would in an object of its own.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from txlog.batch_codec import (
    checked_bound,
    corrupt,
    decode_row_groups,
    parse_parquet,
    too_large,
)
from txlog.declared_size import DEFAULT_FETCH_MAX_BYTES, decoded_limit, decoded_size
from txlog.errors import CorruptObjectError, RecordTooLargeError


class BatchRows:
    """The rows of one batch object (``raw``, already verified), read by :meth:`rows` or
    :meth:`read`.

    ``whole``: make the checks of the whole object now (a reader of all its rows, or of
    pieces of them with :meth:`rows`); False leaves them to each :meth:`read`, of the row
    groups it decodes (and to the first :meth:`rows`, of the whole object)."""

    def __init__(self, raw: bytes, where: str, columns: Sequence[str] | None, *,
                 piece_bytes: int, fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                 whole: bool = True) -> None:
        pf = parse_parquet(raw, where)
        self.raw = raw
        self._where = where
        self._stored = len(raw)
        self._fetch_max_bytes = fetch_max_bytes
        self._decoded_limit = decoded_limit(len(raw), fetch_max_bytes)
        self._columns = list(columns) if columns else None
        self._piece_bytes = max(1, piece_bytes)
        self._plain_pf = self._pf = pf
        self._limit: int | None = None
        self._checked = False
        if whole:
            self._check_whole()
        meta = pf.metadata
        try:
            self._rows = [int(meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
            self._bytes = [int(meta.row_group(i).total_byte_size)
                           for i in range(meta.num_row_groups)]
            plain = pf.schema_arrow
        except Exception as exc:  # pyarrow raises several types for damaged input
            raise corrupt(where, exc) from None
        if any(n < 0 for n in self._rows):
            raise CorruptObjectError(f"batch object {where} declares a negative row count")
        self._plain = plain
        self._starts = [0]
        for n in self._rows:
            self._starts.append(self._starts[-1] + n)
        self._expanded = 0
        # The cursor: the row group being read, its pieces still to come, and the last
        # piece decoded (a range may end inside it and the next one start there).
        self._group = -1
        self._pieces: Iterator[pa.RecordBatch] | None = None
        self._at = 0  # the row the next piece of the group starts at
        self._held: tuple[int, pa.Table] | None = None

    def _check_whole(self) -> None:
        bound = checked_bound(self.raw, self._plain_pf, self._where,
                              fetch_max_bytes=self._fetch_max_bytes)
        limit = self._decoded_limit
        # Dictionaries that could expand past the limit are decoded as dictionaries, and
        # measured as they would expand, before each piece is expanded.
        self._limit = limit if bound.potential > limit else None
        if self._limit is not None:
            self._pf = pq.ParquetFile(pa.BufferReader(self.raw), metadata=self._plain_pf.metadata,
                                      pre_buffer=False,
                                      read_dictionary=list(bound.dictionary_columns))
        self._checked = True

    @property
    def num_rows(self) -> int:
        """The rows the object's footer declares."""
        return self._starts[-1]

    @property
    def row_groups(self) -> int:
        return len(self._rows)

    @property
    def columns(self) -> list[str] | None:
        """The columns read (None: all)."""
        return self._columns

    def read(self, ranges: Sequence[tuple[int, int]]) -> list[pa.Table]:
        """Rows ``[row, row + count)`` of each of ``ranges``, decoding only the row groups
        that cover them, each once however many ranges fall in it.  The checks of
        :func:`txlog.batch_codec.open_parquet` are made of those row groups, and what they
        decode into may not exceed the object's limit."""
        groups = self._cover(ranges)
        bound = checked_bound(self.raw, self._plain_pf, self._where,
                              fetch_max_bytes=self._fetch_max_bytes, row_groups=groups)
        table = decode_row_groups(self.raw, self._plain_pf, bound, self._decoded_limit,
                                  self._where, self._columns, groups)
        at: dict[int, int] = {}
        pos = 0
        for g in groups:
            at[g] = pos
            pos += self._rows[g]
        if table.num_rows != pos:
            raise CorruptObjectError(
                f"batch object {self._where}: row groups {groups} decode into "
                f"{table.num_rows} rows, its footer says {pos}; it is truncated or corrupt")
        out = []
        for row, count in ranges:
            if count <= 0:
                out.append(table.slice(0, 0))
                continue
            g = self._group_of(row)
            out.append(table.slice(at[g] + row - self._starts[g], count))
        return out

    def _group_of(self, row: int) -> int:
        """The row group holding ``row`` (of the object's rows)."""
        group = bisect.bisect_right(self._starts, row) - 1
        while self._rows[group] == 0:  # (empty row groups hold no row)
            group += 1
        return group

    def _cover(self, ranges: Sequence[tuple[int, int]]) -> list[int]:
        """The non-empty row groups that hold rows of ``ranges``, in order."""
        groups: set[int] = set()
        for row, count in ranges:
            if count <= 0:
                continue
            if row < 0 or row + count > self.num_rows:
                raise ValueError(f"rows {row}..{row + count - 1} are not in {self._where} "
                                 f"({self.num_rows} rows)")
            last = self._group_of(row + count - 1)
            groups.update(g for g in range(self._group_of(row), last + 1) if self._rows[g])
        return sorted(groups)

    def rows(self, skip: int, take: int) -> Iterator[pa.Table]:
        """Rows ``[skip, skip + take)`` in pieces of about ``piece_bytes`` decoded bytes
        each (a row too large for one is a piece of its own), in order.  What the pieces
        of one range expand into counts against the object's limit, as a batch of its own
        would (the ranges of a shared object are other partitions' batches)."""
        end = skip + take
        if take <= 0:
            return
        if not self._checked:
            self._check_whole()
        self._expanded = 0
        if skip < 0 or end > self.num_rows:
            raise ValueError(f"rows {skip}..{end - 1} are not in {self._where} "
                             f"({self.num_rows} rows)")
        at = skip
        while at < end:
            first, piece = self._piece_at(at)
            stop = first + piece.num_rows
            lo, hi = at - first, min(end, stop) - first
            yield piece if lo == 0 and hi == piece.num_rows else piece.slice(lo, hi - lo)
            at = first + hi

    def _piece_at(self, row: int) -> tuple[int, pa.Table]:
        """The decoded piece holding ``row``, decoding on from the cursor when ``row`` is
        ahead of it in the same row group, else from the start of ``row``'s row group."""
        held = self._held
        if held is not None and held[0] <= row < held[0] + held[1].num_rows:
            return held
        group = self._group_of(row)
        if group != self._group or row < self._at:
            self._open(group)
        while True:
            first = self._at
            piece = self._next_piece()
            self._held = (first, piece)
            if row < first + piece.num_rows:
                return self._held

    def _open(self, group: int) -> None:
        self._group = group
        self._at = self._starts[group]
        self._held = None
        n, size = self._rows[group], self._bytes[group]
        # Rows per piece from the row group's declared decoded size (the declared sizes
        # were checked against the object's when it was opened).
        per_piece = n if size <= self._piece_bytes else max(1, n * self._piece_bytes // size)
        try:
            self._pieces = self._pf.iter_batches(batch_size=per_piece, row_groups=[group],
                                                 columns=self._columns, use_threads=False)
        except Exception as exc:  # pyarrow raises several types for damaged input
            raise corrupt(self._where, exc) from None

    def _next_piece(self) -> pa.Table:
        end = self._starts[self._group + 1]
        try:
            assert self._pieces is not None
            batch = next(self._pieces, None)
            n = 0 if batch is None else batch.num_rows
            if batch is None or not n or self._at + n > end:
                got = self._at - self._starts[self._group] + n
                raise CorruptObjectError(
                    f"batch object {self._where}: row group {self._group} decodes into "
                    f"{'more than ' if n else ''}{got} rows, its footer says "
                    f"{self._rows[self._group]}; it is truncated or corrupt")
            table = pa.Table.from_batches([batch])
            if self._limit is not None:
                table = self._expand(table)
        except (CorruptObjectError, RecordTooLargeError):
            raise
        except Exception as exc:  # pyarrow raises several types for damaged input
            raise corrupt(self._where, exc) from None
        self._at += table.num_rows
        return table

    def _expand(self, table: pa.Table) -> pa.Table:
        """A piece read with dictionaries, expanded if the object's decoded size so far
        stays within its limit."""
        assert self._limit is not None
        self._expanded += decoded_size(table)
        if self._expanded > self._limit:
            raise too_large(self._where, self._expanded, self._stored)
        schema = pa.schema([self._plain.field(n) for n in table.column_names])
        return table.cast(schema)


def held_bytes(tables: Sequence[pa.Table]) -> int:
    """The bytes of the decoded tables ``tables`` are slices of (each buffer counted
    once, however many slices share it)."""
    seen: dict[int, int] = {}
    for t in tables:
        for col in t.columns:
            for chunk in col.chunks:
                for buf in chunk.buffers():
                    if buf is not None:
                        seen[buf.address] = max(seen.get(buf.address, 0), buf.size)
    return sum(seen.values())
