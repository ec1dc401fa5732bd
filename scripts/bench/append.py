"""Append throughput: txlog vs delta-rs on the same store, in the same run.

Appends batches of 1,000 records of 1 KB to one partition: txlog's (idempotent,
non-transactional) producer ``send_batch`` + ``flush`` (one batch object plus one log
entry per batch) against delta-rs ``write_deltalake(mode="append")`` of the same Arrow
table (one Parquet file plus one commit per batch).  The two sides alternate call by call
(order flipped each time); figures are medians over rounds (batches/s counts the time
spent in that side's own calls).

    .venv/bin/python scripts/bench/append.py [--tiny|--small|--full] [--store local|s3|both]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C


def run_target(tg: C.Target, *, batches: int, rounds: int, records: int, size: int,
               ) -> dict[str, Any]:
    table = C.kafka_records(records, size)
    log = tg.connect(tg.url("append"))
    log.create_topic("bench", 1)
    producer = log.producer()
    delta = C.DeltaAppender(tg, table)

    def txlog_append() -> None:
        producer.send_batch("bench", table, partition=0)
        producer.flush()

    sides = {"txlog": txlog_append, "delta": lambda: delta.append(table)}
    # Warm-up: producer id, topic metadata, first objects; delta-rs's first commit.
    for fn in sides.values():
        for _ in range(2):
            fn()
    m = C.interleaved(sides, rounds=rounds, per_round=batches, count_store=log.store,
                      count_side="txlog", label=f"{tg.name}: ")
    lat, rate, reqs = m["lat"], m["rate"], m["reqs"]
    producer.close()
    out: dict[str, Any] = {}
    for side in sides:
        out[side] = {
            "batches_per_s": C.median(rate[side]),
            "mb_per_s": C.median(rate[side]) * records * size / 1e6,
            "p50_ms": C.percentile(lat[side], 50) * 1000,
            "p99_ms": C.percentile(lat[side], 99) * 1000,
            "rounds_batches_per_s": rate[side],
        }
    out["txlog"]["requests_per_batch"] = C.per(reqs, batches * rounds)
    out["per_round_ratio"] = [C.ratio(a, b) for a, b in
                              zip(rate["txlog"], rate["delta"], strict=True)]
    out["ratio_vs_delta"] = C.median(out["per_round_ratio"])
    out["delta_version"] = delta.version()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = C.parse_args(__doc__.splitlines()[0], argv=argv)
    batches = C.pick(args.mode, 3, 10, 40)
    rounds = args.rounds or C.pick(args.mode, 1, 5, 9)
    records, size = 1000, 1024
    results: dict[str, Any] = {}
    with C.targets(args.store) as tgs:
        for tg in tgs:
            C.progress(f"{tg.name}: {rounds} rounds x {batches} batches of {records} x "
                       f"{size} B per side")
            results[tg.name] = run_target(tg, batches=batches, rounds=rounds,
                                          records=records, size=size)
    rows = []
    for store, r in results.items():
        for side, label in (("txlog", "txlog producer"), ("delta", "delta-rs append")):
            s = r[side]
            rows.append([f"{store} {label}", s["batches_per_s"], s["mb_per_s"], s["p50_ms"],
                         s["p99_ms"],
                         C.fmt_counts(s.get("requests_per_batch", {})) if side == "txlog"
                         else "(not counted)",
                         r["ratio_vs_delta"] if side == "txlog" else None])
    C.print_table(f"Append: batches of {records} x {size} B records to one partition "
                  f"({args.mode}, {rounds} rounds x {batches} batches, medians)",
                  ["store / writer", "batches/s", "MB/s", "p50 ms", "p99 ms",
                   "requests/batch", "txlog/delta"], rows)
    return C.emit_json(
        "append", args.mode,
        params={"records_per_batch": records, "record_bytes": size, "batches": batches,
                "rounds": rounds},
        ratios={f"{s}.append_vs_delta": C.clean(r["ratio_vs_delta"]) for s, r in
                results.items()},
        goals=[],
        results=C.clean(results),
    )


if __name__ == "__main__":
    main()
