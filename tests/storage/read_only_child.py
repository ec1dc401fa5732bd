"""Child process for read-only root tests (run without write access to the root).

argv: root, group.  Asks the group's committed offset of t-0 (an open transaction holds
it), then polls t five times, and prints one JSON line: the error committed() raised,
how many writes the client attempted, and the values polled.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import txlog
from txlog import TopicPartition
from txlog.errors import TxlogError


def main() -> None:
    root, group = sys.argv[1], sys.argv[2]
    log = txlog.connect(root, create=False)
    attempts = {"put": 0}
    put = log.store.put

    def counted(key: str, data: bytes) -> None:
        attempts["put"] += 1
        put(key, data)

    log.store.put = counted  # type: ignore[method-assign]
    out: dict[str, Any] = {}
    c = log.consumer(group_id=group, auto_offset_reset="earliest")
    try:
        out["committed"] = c.committed([TopicPartition("t", 0)], timeout=30)[
            TopicPartition("t", 0)]
    except TxlogError as exc:
        out["error"] = type(exc).__name__
        out["message"] = str(exc)
    out["puts_after_committed"] = attempts["put"]
    reader = log.consumer(auto_offset_reset="earliest")
    reader.assign([TopicPartition("t", 0)])
    values = []
    for _ in range(5):
        values += [r.value.decode() for r in reader.poll(max_records=100)]
    out["values"] = values
    out["puts"] = attempts["put"]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
