"""Small helpers that tests of several subjects share (fixtures live in conftest.py)."""

from __future__ import annotations

import json

import pyarrow as pa

import txlog
from txlog import layout
from txlog.model import Entry, decode_entry
from txlog.partition_state import PartitionState


def read_all(log: txlog.Log, topic: str, iso: str = "read_committed") -> list[bytes]:
    c = log.consumer(isolation_level=iso, auto_offset_reset="earliest")
    c.subscribe([topic])
    out: list[bytes] = []
    while True:
        got = c.poll(10_000)
        if not got:
            return out
        out.extend(r.value for r in got)


def entry_keys(log: txlog.Log, topic: str, partition: int) -> list[str]:
    return log.store.list(layout.log_prefix(topic, partition))


def data_entries(log: txlog.Log, topic: str, partition: int,
                 kinds: tuple[str, ...] = ("data",)) -> list[Entry]:
    return [e for e in (decode_entry(log.store.get(k), k)
                        for k in entry_keys(log, topic, partition)) if e.kind in kinds]


def old_checkpoint(state: PartitionState, version: int) -> bytes:
    """``state`` as a partition checkpoint of an older ``version`` (1: no checksum
    trailer; 1 and 2: no ``object_rows`` batch column) wrote it."""
    from txlog.checkpoint import encode_checkpoint, with_checksum

    table = pa.ipc.open_stream(encode_checkpoint(state)[:-12]).read_all()
    meta = json.loads(table.schema.metadata[b"txlog"])
    meta["v"] = version
    table = table.drop_columns(["object_rows"]).replace_schema_metadata(
        {"txlog": json.dumps(meta)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    body = sink.getvalue().to_pybytes()
    return body if version < 2 else with_checksum(body)
