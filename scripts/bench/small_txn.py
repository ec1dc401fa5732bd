"""Small transactions: txlog commits/s vs delta-rs commits/s on the same store (issue 9
goal: at least 1.5x).

One transaction = 1,000 records of 1 KB to one partition: ``begin_transaction()``,
``send_batch()`` of an Arrow table, ``commit_transaction()``.  One delta-rs commit =
``write_deltalake(dt, table, mode="append")`` of the same table (a Parquet file plus a
commit).  The two sides alternate commit by commit (order flipped each time); the ratio
is the median of per-round ratios of commits per second of each side's own time.

    .venv/bin/python scripts/bench/small_txn.py [--tiny|--small|--full] [--store ...]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

GOAL = 1.5


def run_target(tg: C.Target, *, txns: int, rounds: int, records: int, size: int,
               ) -> dict[str, Any]:
    table = C.kafka_records(records, size)
    log = tg.connect(tg.url("smalltxn"))
    log.create_topic("bench", 1)
    producer = log.producer(transactional_id="bench-small")
    producer.init_transactions()
    delta = C.DeltaAppender(tg, table)

    def txlog_commit() -> None:
        producer.begin_transaction()
        producer.send_batch("bench", table, partition=0)
        producer.commit_transaction()

    sides = {"txlog": txlog_commit, "delta": lambda: delta.append(table)}
    for fn in sides.values():
        for _ in range(2):
            fn()
    m = C.interleaved(sides, rounds=rounds, per_round=txns, count_store=log.store,
                      count_side="txlog", label=f"{tg.name}: ")
    lat, rate, reqs = m["lat"], m["rate"], m["reqs"]
    ratios = [C.ratio(a, b) for a, b in zip(rate["txlog"], rate["delta"], strict=True)]
    producer.close()
    out: dict[str, Any] = {
        side: {"commits_per_s": C.median(rate[side]),
               "p50_ms": C.percentile(lat[side], 50) * 1000,
               "p99_ms": C.percentile(lat[side], 99) * 1000}
        for side in sides}
    out["txlog"]["requests_per_txn"] = C.per(reqs, txns * rounds)
    out["ratio"] = C.median(ratios)
    out["per_round_ratio"] = ratios
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = C.parse_args(__doc__.splitlines()[0], argv=argv)
    txns = C.pick(args.mode, 3, 10, 30)
    rounds = args.rounds or C.pick(args.mode, 1, 5, 9)
    records, size = 1000, 1024
    results: dict[str, Any] = {}
    with C.targets(args.store) as tgs:
        for tg in tgs:
            C.progress(f"{tg.name}: {rounds} rounds x {txns} transactions per side")
            results[tg.name] = run_target(tg, txns=txns, rounds=rounds, records=records,
                                          size=size)
    rows = []
    for store, r in results.items():
        rows.append([f"{store} txlog transaction", r["txlog"]["commits_per_s"],
                     r["txlog"]["p50_ms"], r["txlog"]["p99_ms"],
                     C.fmt_counts(r["txlog"]["requests_per_txn"]), r["ratio"]])
        rows.append([f"{store} delta-rs append", r["delta"]["commits_per_s"],
                     r["delta"]["p50_ms"], r["delta"]["p99_ms"], "(not counted)", None])
    C.print_table(f"Small transactions: {records} x {size} B records, one partition "
                  f"({args.mode}, {rounds} rounds x {txns} commits, medians)",
                  ["store / writer", "commits/s", "p50 ms", "p99 ms", "requests/commit",
                   "txlog/delta"], rows)
    goals = [{"name": "small transactions vs delta-rs commits/s", "store": s,
              "measured": C.clean(r["ratio"]), "target": GOAL, "cmp": ">=",
              "pass": bool(r["ratio"] >= GOAL)} for s, r in results.items()]
    return C.emit_json(
        "small_txn", args.mode,
        params={"records_per_txn": records, "record_bytes": size, "txns": txns,
                "rounds": rounds},
        ratios={f"{s}.txn_commits_vs_delta": C.clean(r["ratio"]) for s, r in results.items()},
        goals=goals, results=C.clean(results))


if __name__ == "__main__":
    main()
