#!/usr/bin/env python3
"""Exactly-once read-process-write in plain Python (Kafka's transactional copier).

Reads SOURCE with read_committed from the group's committed offsets, transforms each
record, writes it to the same partition of SINK, and commits the consumed offsets in the
same transaction.  Kill it at any point and run it again: the sink holds every result once.

    python scripts/copier.py ROOT SOURCE SINK --group copier [--batch 50] [--follow]
"""

from __future__ import annotations

import argparse
import sys

import txlog


def transform(value: bytes | None) -> bytes | None:
    return None if value is None else value.upper()


def run(root: str, source: str, sink: str, group: str, batch: int, follow: bool,
        storage_options: dict[str, str] | None = None) -> int:
    log = txlog.connect(root, storage_options)
    # One transactional.id per group: a restarted copier fences its previous incarnation,
    # and init_transactions() settles whatever that one left half-done before we read
    # the group's committed offsets.
    producer = log.producer(transactional_id=f"copier-{group}", linger_ms=60_000)
    producer.init_transactions()
    consumer = log.consumer(group_id=group, isolation_level="read_committed",
                            auto_offset_reset="earliest")
    consumer.subscribe([source])
    copied = 0
    while True:
        records = consumer.poll(max_records=batch)
        if not records:
            if follow:
                records = consumer.poll(max_records=batch, timeout_ms=1000)
            if not records:
                if not follow:
                    break
                continue
        producer.begin_transaction()
        for r in records:
            producer.send(sink, transform(r.value), key=r.key, partition=r.partition,
                          headers=r.headers)
        positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
        producer.send_offsets_to_transaction(positions, group)
        producer.commit_transaction()
        copied += len(records)
    producer.close()
    return copied


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root")
    ap.add_argument("source")
    ap.add_argument("sink")
    ap.add_argument("--group", default="copier")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--follow", action="store_true", help="keep waiting for new records")
    a = ap.parse_args(argv)
    n = run(a.root, a.source, a.sink, a.group, a.batch, a.follow)
    print(f"copied {n} records", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

