"""Producer ids, allocated in blocks claimed with put-if-absent (Kafka's ProducerIdManager)."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import Future

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
        self._ahead: Future[int] | None = None  # a block being claimed in the background

    def claim_ahead(self) -> None:
        """Start claiming a block now if none is left, so that an ``allocate()`` soon
        after does not wait for the claim's list and create: a new transactional.id's
        init_transactions() reads its state-log partition meanwhile, and then needs an
        id.  A block claimed and not used stays this allocator's for later ids."""
        with self._lock:
            if self._next < self._end or self._ahead is not None:
                return
            fut: Future[int] = Future()
            self._ahead = fut
        threading.Thread(target=self._claim_into, args=(fut,), daemon=True,
                         name="txlog-pid-block").start()

    def _claim_into(self, fut: Future[int]) -> None:
        try:
            fut.set_result(self._claim_block())
        except BaseException as exc:
            fut.set_exception(exc)

    def allocate(self) -> int:
        with self._lock:
            ahead, self._ahead = self._ahead, None
            if self._next >= self._end:
                block: int | None = None
                if ahead is not None:
                    try:
                        block = ahead.result()
                    except Exception:
                        block = None  # claimed again below: its error was a store's
                if block is None:
                    block = self._claim_block()
                self._next, self._end = block * BLOCK_SIZE, (block + 1) * BLOCK_SIZE
            elif ahead is not None:
                self._ahead = ahead  # not needed yet: kept for when this block runs out
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
