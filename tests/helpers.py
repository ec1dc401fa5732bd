"""Small helpers that tests of several subjects share (fixtures live in conftest.py)."""

from __future__ import annotations

import txlog
from txlog import layout
from txlog.model import Entry, decode_entry


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
