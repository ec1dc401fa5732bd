"""Partition checkpoints: a PartitionState as one Arrow IPC object (no I/O here).

The batch index is columnar (fast to load for 100,000 batches); the rest of the state
(open transactions, fence epochs, producer state, aborted index) rides in the schema
metadata as JSON.  Never pickle.

Version 2 ends with a trailer: ``TXLCRC32`` and the CRC-32 (4 bytes, big-endian) of every
byte before it, so a flipped digit is found rather than trusted (a reader then falls
back to an older checkpoint or the log).  Version 1 has none and is read as before;
txlog before 0.4 skips version 2 checkpoints for the log.  Version 3 adds the batch
column ``object_rows`` (batches inside shared objects); versions 1 and 2 are read with
it 0 (they predate shared objects), and older txlog skips version 3 for the log.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlog.declared_size import check_declared_size, ipc_declared_size
from txlog.errors import CorruptObjectError, RecordTooLargeError, UnsupportedFormatError
from txlog.partition_state import (
    OPEN,
    AbortedTxn,
    BatchColumns,
    OpenTxn,
    PartitionState,
    ProducerState,
)

CHECKPOINT_VERSION = 3
#: The first version that ends with the checksum trailer.
CHECKSUM_VERSION = 2
#: The first version with the batch column ``object_rows``.
SHARED_VERSION = 3
_TRAILER = b"TXLCRC32"
_TRAILER_LEN = len(_TRAILER) + 4

#: The batch index's columns (:data:`txlog.partition_state.BATCH_COLUMNS`).
BATCH_SCHEMA = pa.schema([
    ("base_offset", pa.int64()),
    ("count", pa.int64()),
    ("producer_id", pa.int64()),
    ("epoch", pa.int32()),
    ("status", pa.int8()),
    ("data", pa.string()),
    ("nbytes", pa.int64()),
    ("ts_min", pa.int64()),
    ("ts_max", pa.int64()),
    ("append_ms", pa.int64()),
    ("txn_id", pa.string()),
    ("row", pa.int64()),
    ("object_rows", pa.int64()),
])
#: The batch columns of checkpoints before SHARED_VERSION.
_BATCH_SCHEMA_V2 = pa.schema(list(BATCH_SCHEMA)[:-1])


def encode_checkpoint(state: PartitionState) -> bytes:
    b = state.batches
    meta: dict[str, Any] = {
        "v": CHECKPOINT_VERSION,
        "next_slot": state.next_slot,
        "high_watermark": state.high_watermark,
        "log_start_offset": state.log_start_offset,
        "last_append_ms": state.last_append_ms,
        "pending_deletes": [[d, k] for d, k in state.pending_deletes],
        "open_txns": [[t.producer_id, t.epoch, t.first_offset, t.txn_id, t.batches,
                       t.first_append_ms] for t in state.open_txns.values()],
        "fence_epoch": [[pid, e] for pid, e in state.fence_epoch.items()],
        "producers": [[pid, p.epoch, p.last_seq, p.recent, p.last_ms]
                      for pid, p in state.producers.items()],
        "aborted": [[a.producer_id, a.first_offset, a.last_offset] for a in state.aborted],
    }
    table = b.arrow().replace_schema_metadata({"txlog": json.dumps(meta)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema,
                           options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table)
    return with_checksum(bytes(sink.getvalue().to_pybytes()))


def with_checksum(body: bytes) -> bytes:
    """A checkpoint's Arrow stream with its checksum trailer."""
    return body + _TRAILER + zlib.crc32(body).to_bytes(4, "big")


def decode_checkpoint(raw: bytes, where: str) -> PartitionState:
    checked = raw[-_TRAILER_LEN:-4] == _TRAILER
    if checked:
        crc = zlib.crc32(memoryview(raw)[:-_TRAILER_LEN])
        if crc != int.from_bytes(raw[-4:], "big"):
            raise CorruptObjectError(
                f"checkpoint {where} fails its checksum (its bytes were damaged); txlog "
                "falls back to an older checkpoint or the log itself")
        raw = raw[:-_TRAILER_LEN]
    try:
        declared = ipc_declared_size(raw)
    except Exception as exc:  # any damage to the stream's framing or metadata
        raise CorruptObjectError(
            f"checkpoint {where} cannot be decoded ({type(exc).__name__}: {exc}); txlog "
            "falls back to an older checkpoint or the log itself"
        ) from None
    try:
        # Before decoding: what decompression would allocate (a bomb is refused).
        check_declared_size(declared, len(raw), where, what="checkpoint")
    except RecordTooLargeError as exc:
        raise CorruptObjectError(f"{exc}; txlog falls back to an older checkpoint or the "
                                 "log itself") from None
    try:
        table = pa.ipc.open_stream(pa.py_buffer(raw)).read_all()
        meta = json.loads(table.schema.metadata[b"txlog"])
    except Exception as exc:  # pyarrow raises several types for damaged input
        raise CorruptObjectError(
            f"checkpoint {where} cannot be decoded ({type(exc).__name__}: {exc}); txlog "
            "falls back to an older checkpoint or the log itself"
        ) from None
    version = meta.get("v") if isinstance(meta, dict) else None
    if not isinstance(version, int):
        raise CorruptObjectError(f"checkpoint {where} has no format version")
    if version > CHECKPOINT_VERSION:
        raise UnsupportedFormatError(
            f"checkpoint {where} has format version {version}, newer than this txlog reads "
            f"({CHECKPOINT_VERSION}); upgrade txlog"
        )
    if version >= CHECKSUM_VERSION and not checked:
        raise CorruptObjectError(
            f"checkpoint {where} has lost its checksum trailer (truncated or damaged); "
            "txlog falls back to an older checkpoint or the log itself")
    try:
        if table.schema.remove_metadata() != (BATCH_SCHEMA if version >= SHARED_VERSION
                                              else _BATCH_SCHEMA_V2):
            raise ValueError("unexpected columns")
        if version < SHARED_VERSION:  # no batch of it is in a shared object
            table = table.append_column(BATCH_SCHEMA.field("object_rows"),
                                        pa.array(np.zeros(table.num_rows, np.int64)))
        head = [meta[k] for k in ("next_slot", "high_watermark", "log_start_offset")]
        if any(type(v) is not int or v < 0 for v in head) or head[2] > head[1]:
            raise ValueError(f"slot and offsets {head} are not offsets of one log")
        st = PartitionState(
            next_slot=int(meta["next_slot"]),
            high_watermark=int(meta["high_watermark"]),
            log_start_offset=int(meta["log_start_offset"]),
            last_append_ms=int(meta["last_append_ms"]),
        )
        st.pending_deletes = [(int(d), str(k)) for d, k in meta["pending_deletes"]]
        st.batches = BatchColumns.from_arrow(_checked_batches(table, where))
        for pid, epoch, first, txn_id, batches, first_ms in meta["open_txns"]:
            st.open_txns[(pid, epoch)] = OpenTxn(pid, epoch, first, txn_id, list(batches),
                                                 first_ms)
        st.fence_epoch = {int(pid): int(e) for pid, e in meta["fence_epoch"]}
        for pid, epoch, last_seq, recent, last_ms in meta["producers"]:
            st.producers[int(pid)] = ProducerState(epoch, last_seq,
                                                   [tuple(r) for r in recent],
                                                   last_ms)
        st.aborted = [AbortedTxn(*a) for a in meta["aborted"]]
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CorruptObjectError(f"checkpoint {where} has invalid contents ({exc})") from None
    b = st.batches.arrow()
    is_open = pc.equal(b.column("status"), OPEN)
    if pc.any(is_open).as_py():  # few batches are open, most often none
        opened = b.filter(is_open)
        for off, pid, epoch in zip(opened.column("base_offset").to_pylist(),
                                   opened.column("producer_id").to_pylist(),
                                   opened.column("epoch").to_pylist(), strict=True):
            if (pid, epoch) not in st.open_txns:
                # txlog 0.1 left such a batch after a batch of no records at its offset;
                # replaying the log gives it its transaction's outcome.
                raise CorruptObjectError(
                    f"checkpoint {where} marks the batch at offset {off} open, outside "
                    "any open transaction; txlog falls back to an older checkpoint or the "
                    "log itself")
    return st


def _checked_batches(table: pa.Table, where: str) -> pa.Table:
    """The batch columns, refused when a value is missing (only a batch's transactional id
    may be) or the offsets do not ascend."""
    nulls = [name for name in BATCH_SCHEMA.names
             if name != "txn_id" and table.column(name).null_count]
    if nulls:
        raise CorruptObjectError(f"checkpoint {where} has null values in {nulls}")
    table = table.replace_schema_metadata(None)
    bases = table.column("base_offset").to_numpy()
    counts = table.column("count").to_numpy()
    # Dense offsets: each batch starts at or after the previous one's end (a batch of no
    # records starts where the next one does).
    if len(bases) and ((counts < 0).any() or (bases[1:] < bases[:-1] + counts[:-1]).any()):
        raise CorruptObjectError(f"checkpoint {where} has batches whose offsets overlap or "
                                 "go backwards; txlog falls back to an older checkpoint or "
                                 "the log itself")
    rows = table.column("row").to_numpy()
    object_rows = table.column("object_rows").to_numpy()
    nbytes = table.column("nbytes").to_numpy()
    shared = object_rows != 0
    # A batch's rows lie inside its object, whose size is not negative; only a batch of
    # a shared object names the object's rows (rows of a compacted segment do not).
    if len(bases) and ((rows < 0).any() or (nbytes < 0).any() or (object_rows < 0).any()
                       or (rows[shared] + counts[shared] > object_rows[shared]).any()):
        raise CorruptObjectError(f"checkpoint {where} has batches whose rows or sizes are "
                                 "out of range; txlog falls back to an older checkpoint or "
                                 "the log itself")
    return table
