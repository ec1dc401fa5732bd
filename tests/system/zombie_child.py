"""Child process for zombie tests: one transaction, stopped part-way by TXLOG_STOP_AT.

argv: root, transactional_id, mode.  ``commit``: writes "z<n>" records to partitions 0
and 1 of topic "a" and commits.  ``write``: registers partition 1 with a first record,
then (after the stop point) writes partition 0 and commits.  Prints what each step
ended with, one line each, so the parent can tell a fenced zombie from one that got
through.
"""

from __future__ import annotations

import sys

import txlog
from txlog.errors import TxlogError


def main() -> None:
    root, txn_id, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    log = txlog.connect(root)
    p = log.producer(transactional_id=txn_id, linger_ms=60_000)
    p.init_transactions()
    p.begin_transaction()
    try:
        if mode == "commit":
            for n in range(4):
                p.send("a", f"z{n}".encode(), partition=n % 2)
            p.commit_transaction()
        else:
            p.send("a", b"z-first", partition=1)
            p.flush()
            p.send("a", b"z-late", partition=0)
            p.flush()
            p.commit_transaction()
        print("ok", flush=True)
    except TxlogError as exc:
        print(type(exc).__name__, flush=True)
    finally:
        p.close(timeout=10)


if __name__ == "__main__":
    main()
