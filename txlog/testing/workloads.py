"""Input whose outcome is known, for end-to-end checks of exactly-once pipelines:
transactions of records, a seeded quarter of them aborted after their records reached the
log."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from txlog.log import Log


def transactions_with_aborts(
        log: Log, topic: str, *, seed: int, txns: int, per_txn: int,
        record: Callable[[int, random.Random], tuple[bytes, bytes]],
        transactional_id: str = "order-service") -> tuple[set[int], set[int]]:
    """``txns`` transactions of ``per_txn`` records each on ``topic``, one producer; the
    n-th record overall is ``record(n, rng)``, a (value, key) pair.  A quarter of the
    transactions, picked by ``seed``, are aborted.  Returns the record numbers committed
    and those aborted."""
    rng = random.Random(seed)
    aborted_txns = set(rng.sample(range(txns), txns // 4))
    committed: set[int] = set()
    aborted: set[int] = set()
    p = log.producer(transactional_id=transactional_id)
    p.init_transactions()
    n = 0
    for t in range(txns):
        p.begin_transaction()
        ids = range(n, n + per_txn)
        n += per_txn
        for i in ids:
            value, key = record(i, rng)
            p.send(topic, value, key=key)
        p.flush()  # the records are in the log now, committed or not
        if t in aborted_txns:
            p.abort_transaction()
            aborted.update(ids)
        else:
            p.commit_transaction()
            committed.update(ids)
    p.close()
    return committed, aborted
