"""Child process for crash tests: runs transactions until TXLOG_CRASH_AT kills it.

argv: root, transactional_id, transactions, timeout_ms[, "old": commit.appends.batches
off; "plain": commit.inline.bytes 0, so the decision waits for the uploads; "new": the
defaults][, "own": batch.objects.shared off, an object per partition; "shared": on, the
default].  Each transaction n writes
"n:<topic>:<partition>" to every partition of topics a (3) and b (2) and commits offsets.
"""

from __future__ import annotations

import sys

import txlog
from txlog import TopicPartition


def main() -> None:
    root, txn_id, count, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    log = txlog.connect(root)
    mode = sys.argv[5] if len(sys.argv) > 5 else "new"
    shared = (sys.argv[6] if len(sys.argv) > 6 else "shared") == "shared"
    p = log.producer(transactional_id=txn_id, transaction_timeout_ms=timeout, linger_ms=10_000,
                     **{"commit.appends.batches": mode != "old",
                        "commit.inline.bytes": 0 if mode == "plain" else 65_536,
                        "batch.objects.shared": shared})
    p.init_transactions()
    for n in range(count):
        p.begin_transaction()
        for topic, parts in (("a", 3), ("b", 2)):
            for part in range(parts):
                p.send(topic, f"{n}:{topic}:{part}".encode(), partition=part)
        p.send_offsets_to_transaction({TopicPartition("a", 0): n + 1}, "g")
        p.commit_transaction()
        print(f"committed {n}", flush=True)


if __name__ == "__main__":
    main()
