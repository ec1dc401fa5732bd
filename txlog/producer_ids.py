"""Producer ids, allocated in blocks claimed with put-if-absent (Kafka's ProducerIdManager)."""

from __future__ import annotations

import json
import re
import threading

from txlog import layout
from txlog.model import new_token
from txlog.records import now_ms
from txlog.storage.base import ObjectStore

BLOCK_SIZE = 1000
_BLOCK_NAME = re.compile(r"[0-9]{12}\.json")


class ProducerIdAllocator:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._next = 0
        self._end = 0

    def allocate(self) -> int:
        with self._lock:
            if self._next >= self._end:
                block = self._claim_block()
                self._next, self._end = block * BLOCK_SIZE, (block + 1) * BLOCK_SIZE
            pid = self._next
            self._next += 1
            return pid

    def _claim_block(self) -> int:
        # Keys txlog did not write (any writer of the root can add some) are not blocks.
        keys = [k for k in self.store.list(layout.PID_BLOCK_PREFIX)
                if _BLOCK_NAME.fullmatch(k[len(layout.PID_BLOCK_PREFIX):])]
        block = layout.slot_of(keys[-1]) + 1 if keys else 0
        body = json.dumps({"v": 1, "token": new_token(), "claimed_ms": now_ms()}).encode()
        while not self.store.put_if_absent(layout.pid_block_key(block), body):
            block += 1
        return block
