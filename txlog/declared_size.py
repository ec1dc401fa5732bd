"""What a stored object declares it decodes into, read before decoding it.

Parquet batch objects and Arrow IPC checkpoints are compressed; their headers say how many
bytes decompression will allocate.  A reader compares that with the object's stored size
and refuses a decompression bomb (kilobytes that declare gigabytes) before a byte of it is
decompressed.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txlog.errors import RecordTooLargeError

#: A batch object may declare this many times its stored size in decoded bytes before
#: its declared size counts against fetch.max.bytes: txlog's own objects (snappy) stay
#: far below it, while a decompression bomb (kilobytes that decode into gigabytes) does not.
MAX_DECODED_RATIO = 64
DEFAULT_FETCH_MAX_BYTES = 52_428_800


def decoded_limit(stored: int, fetch_max_bytes: int) -> int:
    """The most bytes an object of ``stored`` bytes may decode into."""
    return max(fetch_max_bytes, MAX_DECODED_RATIO * stored)


def check_declared_size(declared: int, stored: int, where: str, *,
                        fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                        what: str = "batch object") -> None:
    """Refuse to decode an object whose header declares more decoded bytes than both
    ``fetch_max_bytes`` and MAX_DECODED_RATIO times its stored size."""
    if declared > decoded_limit(stored, fetch_max_bytes):
        raise RecordTooLargeError(
            f"{what} {where} declares {declared} bytes decoded from {stored} stored, "
            f"more than fetch.max.bytes ({fetch_max_bytes}) and {MAX_DECODED_RATIO} times "
            "its size; txlog does not decode it (raise fetch.max.bytes if it is genuine)")


def ipc_declared_size(raw: bytes) -> int:
    """The bytes an Arrow IPC stream's record batches declare they decode into, read from
    the messages' metadata and the compressed buffers' length prefixes without decoding
    (or decompressing) anything.  Raises on a stream that cannot be parsed."""

    def field(b: bytes, table: int, i: int) -> int:
        """The position of field ``i`` of the flatbuffer table at ``table``."""
        vtable = table - struct.unpack_from("<i", b, table)[0]
        if 4 + 2 * i + 2 > struct.unpack_from("<H", b, vtable)[0]:
            raise ValueError(f"flatbuffer field {i} absent")
        off = struct.unpack_from("<H", b, vtable + 4 + 2 * i)[0]
        if not off:
            raise ValueError(f"flatbuffer field {i} absent")
        return table + int(off)

    def ref(b: bytes, pos: int) -> int:
        return pos + int(struct.unpack_from("<I", b, pos)[0])

    total = 0
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(raw))
    while True:
        try:
            msg = reader.read_next_message()
        except StopIteration:
            break
        if msg.type not in ("record batch", "dictionary"):
            continue
        meta = msg.metadata.to_pybytes()
        body = msg.body.to_pybytes() if msg.body is not None else b""
        batch = ref(meta, field(meta, ref(meta, 0), 2))  # Message.header
        if msg.type == "dictionary":
            batch = ref(meta, field(meta, batch, 1))  # DictionaryBatch.data
        try:
            field(meta, batch, 3)  # RecordBatch.compression
            compressed = True
        except ValueError:
            compressed = False
        buffers = ref(meta, field(meta, batch, 2))  # RecordBatch.buffers
        for k in range(struct.unpack_from("<I", meta, buffers)[0]):
            offset, length = struct.unpack_from("<qq", meta, buffers + 4 + 16 * k)
            if compressed and length >= 8:
                # A compressed buffer starts with its decoded length (-1: stored as is).
                decoded = struct.unpack_from("<q", body, offset)[0]
                total += length - 8 if decoded == -1 else decoded
            else:
                total += length
    return total


def parquet_declared_size(raw: bytes, meta: Any) -> int:
    """The bytes a Parquet file's pages declare they decode into: the larger of what its
    footer says and the sum of its page headers' uncompressed sizes (each page is
    decompressed into a buffer of its header's size, whatever the footer says)."""
    footer: int = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    pages = sum(size for i in range(meta.num_row_groups)
                for j in range(meta.row_group(i).num_columns)
                for _, size in _page_sizes(raw, meta.row_group(i).column(j)))
    return max(footer, pages)


#: Decoded bytes per value of each Parquet physical type (BYTE_ARRAY: its offset; its
#: bytes are counted from its pages or its dictionary).
_VALUE_BYTES = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12,
                "BYTE_ARRAY": 4}
_DICTIONARY_PAGE = 2


@dataclass(frozen=True)
class ExpansionBound:
    """What a Parquet file's metadata and page headers bound its decoded size by."""

    #: Bytes its values take whatever they hold (offsets and fixed-width values).
    fixed: int
    #: An upper bound of the whole decoded size: a dictionary-encoded value may be any
    #: entry of its dictionary, so each counts as large as the dictionary page.
    potential: int
    #: Paths of the dictionary-encoded byte-array columns (read as dictionaries, they
    #: decode without expanding).
    dictionary_columns: tuple[str, ...]
    #: What parquet_declared_size() says (from the same page headers).
    declared: int


def parquet_expansion_bound(raw: bytes, meta: Any, schema: Any,
                            row_groups: Sequence[int] | None = None) -> ExpansionBound:
    """Bound what decoding ``raw`` (footer ``meta``, Parquet ``schema``) allocates, from
    its metadata and page headers only: run-length and dictionary encoding let a few
    bytes of pages stand for any number of values, each as large as a dictionary entry.
    ``row_groups``: bound decoding those row groups only (default: all)."""
    groups = range(meta.num_row_groups) if row_groups is None else row_groups
    fixed = potential = page_total = 0
    dictionary: list[str] = []
    for i in groups:
        rg = meta.row_group(i)
        for j in range(rg.num_columns):
            c = rg.column(j)
            width = _VALUE_BYTES.get(c.physical_type)
            if width is None:  # FIXED_LEN_BYTE_ARRAY
                width = max(0, int(schema.column(j).length or 0))
            values = max(0, int(c.num_values))
            fixed += values * width
            pages = _page_sizes(raw, c)
            dict_page = pages[0][1] if pages and pages[0][0] == _DICTIONARY_PAGE else None
            page_total += sum(size for _, size in pages)
            potential += values * width + sum(size for _, size in pages)
            if dict_page is not None and c.physical_type in ("BYTE_ARRAY",
                                                             "FIXED_LEN_BYTE_ARRAY"):
                potential += values * dict_page
                if c.physical_type == "BYTE_ARRAY":
                    dictionary.append(c.path_in_schema)
    footer = sum(meta.row_group(i).total_byte_size for i in groups)
    return ExpansionBound(fixed, potential, tuple(dict.fromkeys(dictionary)),
                          max(footer, page_total))


def _page_sizes(raw: bytes, c: Any) -> list[tuple[int, int]]:
    """(page type, uncompressed size) of each page of column chunk ``c``."""
    start = c.data_page_offset
    if c.dictionary_page_offset and 0 < c.dictionary_page_offset < start:
        start = c.dictionary_page_offset
    end = start + c.total_compressed_size
    out = []
    pos = start
    while pos < end:
        fields, pos = _thrift_struct(raw, pos, 0, want=(1, 2, 3))
        if fields[2] < 0 or fields[3] < 0:
            raise ValueError("a page header with a negative size")
        out.append((fields[1], fields[2]))
        pos += fields[3]
    return out


def decoded_size(table: pa.Table) -> int:
    """The bytes ``table`` takes once its dictionary columns are expanded into plain
    values, computed without expanding them."""
    return sum(_expanded(chunk) for col in table.columns for chunk in col.chunks)


def _expanded(arr: pa.Array) -> int:
    t = arr.type
    if pa.types.is_dictionary(t):
        if not (pa.types.is_binary(t.value_type) or pa.types.is_string(t.value_type)
                or pa.types.is_large_binary(t.value_type)
                or pa.types.is_large_string(t.value_type)):
            return int(arr.nbytes)
        lengths = pc.binary_length(arr.dictionary)
        total = pc.sum(pc.take(lengths, arr.indices)).as_py() or 0
        return int(total) + 5 * len(arr)  # (offsets and validity)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        own = int(arr.offsets.nbytes) + len(arr)
        return own + _expanded(arr.values)
    if pa.types.is_struct(t):
        return len(arr) + sum(_expanded(arr.field(k)) for k in range(t.num_fields))
    return int(arr.nbytes)


# Thrift's compact protocol, as far as reading a PageHeader needs: every field is skipped
# except the i32 fields asked for.
_MAX_DEPTH = 32


def _varint(b: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = b[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 64 bits")


def _thrift_struct(b: bytes, pos: int, depth: int, want: tuple[int, ...] = (),
                   ) -> tuple[dict[int, int], int]:
    field_id = 0
    found: dict[int, int] = {}
    while True:
        head = b[pos]
        pos += 1
        kind = head & 0x0F
        if kind == 0:  # STOP
            if any(f not in found for f in want):
                raise ValueError(f"a page header without fields {want}")
            return found, pos
        if head >> 4:
            field_id += head >> 4
        else:
            raw_id, pos = _varint(b, pos)
            field_id = (raw_id >> 1) ^ -(raw_id & 1)
        if field_id in want and kind == 5:  # an i32, zigzag-encoded
            v, pos = _varint(b, pos)
            found[field_id] = (v >> 1) ^ -(v & 1)
        else:
            pos = _thrift_skip(b, pos, kind, depth)


def _thrift_skip(b: bytes, pos: int, kind: int, depth: int) -> int:
    # Past the end is an error here, so that no loop of fixed-width elements (which read
    # nothing) runs on for a count the file made up.
    if pos > len(b):
        raise ValueError("a page header runs past the end of the object")
    if depth > _MAX_DEPTH:
        raise ValueError("thrift structures nested too deeply")
    if kind in (1, 2):  # booleans carry their value in the type
        return pos
    if kind == 3:  # byte
        return pos + 1
    if kind in (4, 5, 6):  # i16, i32, i64
        return _varint(b, pos)[1]
    if kind == 7:  # double
        return pos + 8
    if kind == 8:  # binary
        n, pos = _varint(b, pos)
        return pos + n
    if kind in (9, 10):  # list, set
        head = b[pos]
        pos += 1
        n, elem = head >> 4, head & 0x0F
        if n == 15:
            n, pos = _varint(b, pos)
        if elem in (1, 2):  # booleans in a list take a byte each
            if pos + n > len(b):
                raise ValueError("a page header runs past the end of the object")
            return pos + n
        for _ in range(n):
            pos = _thrift_skip(b, pos, elem, depth + 1)
        return pos
    if kind == 11:  # map
        n, pos = _varint(b, pos)
        if n:
            types = b[pos]
            pos += 1
            for _ in range(n):
                pos = _thrift_skip(b, pos, types >> 4, depth + 1)
                pos = _thrift_skip(b, pos, types & 0x0F, depth + 1)
        return pos
    if kind == 12:  # struct
        return _thrift_struct(b, pos, depth + 1)[1]
    raise ValueError(f"unknown thrift type {kind}")
