"""Cost of transactions: 1 KB records at full speed, committing every 100 ms, against the
same producer without transactions, in the same run (goal: at least
0.97 of non-transactional throughput).

Both producers have the same configuration (``batch.size``, ``linger.ms``: the defaults
unless ``--linger-ms``/``--batch-size`` are given) and send one
record at a time with ``send()`` as fast as the caller can; the transactional one calls
``commit_transaction()`` once 100 ms have passed since ``begin_transaction()``.  Segments
of equal duration (1 s; 0.3 s in --tiny) alternate between the two (order flipped every round,
many rounds, because the machine is shared and noisy); throughput is
records per second including the final flush, the ratio is the median of per-round ratios.
Commit latency is the ``commit_transaction()`` call, as a user makes it: it writes the
transaction's last batches, waits for the batches still queued, and returns once
PrepareCommit is durable (markers and Complete* follow in the background).

A third side commits with ``commit_transaction_async()`` (pipelined: the next transaction
is produced while the last one's batches and PrepareCommit are written); its segment ends
only when its last commit is decided.  Its "commit" latency is what the caller waits for.

    .venv/bin/python scripts/bench/txn_overhead.py [--tiny|--small|--full] [--store ...]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

GOAL = 0.97


def run_target(tg: C.Target, *, seconds: float, rounds: int, interval_ms: int,
               size: int, producer_config: dict[str, Any], fsync: bool = True,
               ) -> dict[str, Any]:
    import random

    import txlog

    log = tg.connect(tg.url("txn")) if fsync or tg.name != "local" else \
        txlog.connect(tg.url("txn"), {"fsync": False})
    log.create_topic("bench", 1)
    value = random.Random(1).randbytes(size)
    plain = log.producer(**producer_config)
    txn = log.producer(transactional_id="bench-txn", **producer_config)
    txn.init_transactions()
    interval = interval_ms / 1000

    def run_plain(duration: float) -> dict[str, Any]:
        n = 0
        t0 = C.perf()
        end = t0 + duration
        while True:
            for _ in range(100):
                plain.send("bench", value, partition=0)
            n += 100
            if C.perf() >= end:
                break
        plain.flush()
        return {"records": n, "elapsed": C.perf() - t0}

    def run_txn(duration: float, pipelined: bool = False) -> dict[str, Any]:
        n = txns = 0
        commit_lat: list[float] = []
        t0 = C.perf()
        end = t0 + duration
        while True:
            txn.begin_transaction()
            t_begin = C.perf()
            deadline = t_begin + interval
            while True:
                for _ in range(100):
                    txn.send("bench", value, partition=0)
                n += 100
                if C.perf() >= deadline:
                    break
            t_end = C.perf()
            if pipelined:
                last = txn.commit_transaction_async()
            else:
                txn.commit_transaction()
            done = C.perf()
            commit_lat.append(done - t_end)
            txns += 1
            if done >= end:
                break
        if pipelined:
            last.result()  # the segment's records count once their commit is decided
        return {"records": n, "elapsed": C.perf() - t0, "txns": txns,
                "commit_lat": commit_lat}

    sides = ("plain", "txn", "pipelined")
    run_plain(min(0.3, seconds))  # warm-up all
    run_txn(min(0.3, seconds))
    run_txn(min(0.3, seconds), pipelined=True)
    rate: dict[str, list[float]] = {k: [] for k in sides}
    ratios: list[float] = []
    pipe_ratios: list[float] = []
    reqs: dict[str, dict[str, int]] = {k: {} for k in sides}
    recs = dict.fromkeys(sides, 0)
    txns = 0
    commit_lat: list[float] = []
    pipe_lat: list[float] = []
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        got: dict[str, float] = {}
        for side in order:
            before = C.counts(log.store)
            res = run_plain(seconds) if side == "plain" else \
                run_txn(seconds, pipelined=side == "pipelined")
            for k, v in C.diff_counts(C.counts(log.store), before).items():
                reqs[side][k] = reqs[side].get(k, 0) + v
            recs[side] += res["records"]
            got[side] = res["records"] / res["elapsed"]
            rate[side].append(got[side])
            if side == "txn":
                txns += res["txns"]
                commit_lat += res["commit_lat"]
            elif side == "pipelined":
                pipe_lat += res["commit_lat"]
        ratios.append(C.ratio(got["txn"], got["plain"]))
        pipe_ratios.append(C.ratio(got["pipelined"], got["plain"]))
        C.progress(f"{tg.name}: round {r + 1}/{rounds}: plain {got['plain']:,.0f} rec/s, "
                   f"txn {got['txn']:,.0f} rec/s ({ratios[-1]:.3f}), pipelined "
                   f"{got['pipelined']:,.0f} rec/s ({pipe_ratios[-1]:.3f})")
    plain.close()
    txn.close()
    # Requests the transactional run made beyond what its data alone costs (the plain
    # run's requests per record, scaled to the transactional run's records).
    overhead = {k: (v - reqs["plain"].get(k, 0) * recs["txn"] / max(1, recs["plain"])) / txns
                for k, v in reqs["txn"].items()}
    return {
        "plain_records_per_s": C.median(rate["plain"]),
        "txn_records_per_s": C.median(rate["txn"]),
        "ratio": C.median(ratios),
        "per_round_ratio": ratios,
        "pipelined_records_per_s": C.median(rate["pipelined"]),
        "pipelined_ratio": C.median(pipe_ratios),
        "pipelined_per_round_ratio": pipe_ratios,
        "pipelined_caller_wait_p50_ms": C.percentile(pipe_lat, 50) * 1000,
        "pipelined_caller_wait_p99_ms": C.percentile(pipe_lat, 99) * 1000,
        "txns": txns,
        "records_per_txn": recs["txn"] / max(1, txns),
        "commit_p50_ms": C.percentile(commit_lat, 50) * 1000,
        "commit_p99_ms": C.percentile(commit_lat, 99) * 1000,
        "requests_per_txn": C.per(reqs["txn"], txns),
        "overhead_requests_per_txn": {k: v for k, v in overhead.items() if abs(v) >= 0.005},
        "plain_requests_per_1000_records": C.per(reqs["plain"], max(1, recs["plain"]) // 1000),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    def extra(p: Any) -> None:
        p.add_argument("--linger-ms", type=int, default=None,
                       help="linger.ms of both producers (default: the producer default)")
        p.add_argument("--batch-size", type=int, default=None,
                       help="batch.size of both producers (default: the producer default)")
        p.add_argument("--no-fsync", action="store_true",
                       help="local store without fsync, both producers (storage option "
                            "fsync=False)")
        p.add_argument("--switch-interval-ms", type=float, default=None,
                       help="diagnosis only: this process's GIL switch interval "
                            "(sys.setswitchinterval; Python's default is 5 ms)")

    args = C.parse_args(__doc__.splitlines()[0], argv=argv, extra=extra)
    if args.switch_interval_ms is not None:
        # How long a writer thread waits for the GIL after each I/O call while send() runs
        # Python (docs/benchmarks.md).  txlog itself never changes this process-wide
        # setting.
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    # Segments of 1 s in --small too: a segment's end (the plain producer's flush, the
    # pipelined side's wait for its last decision) is paid once per segment, where a real
    # producer pays it once per run: longer segments dilute it (docs/benchmarks.md).
    seconds = C.pick(args.mode, 0.3, 1.0, 1.0)
    # Single rounds on S3 vary (the server shares the machine's CPUs): the median of many
    # is stable.
    rounds = args.rounds or C.pick(args.mode, 1, 30, 40)
    producer_config: dict[str, Any] = {}
    if args.linger_ms is not None:
        producer_config["linger.ms"] = args.linger_ms
    if args.batch_size is not None:
        producer_config["batch.size"] = args.batch_size
    interval_ms, size = 100, 1024
    results: dict[str, Any] = {}
    with C.targets(args.store) as tgs:
        for tg in tgs:
            C.progress(f"{tg.name}: {rounds} rounds x {seconds}s per side, commit every "
                       f"{interval_ms} ms, {size} B records")
            results[tg.name] = run_target(tg, seconds=seconds, rounds=rounds,
                                          interval_ms=interval_ms, size=size,
                                          producer_config=producer_config,
                                          fsync=not args.no_fsync)
    rows = []
    for store, r in results.items():
        rows.append([store, "commit_transaction()", r["plain_records_per_s"],
                     r["txn_records_per_s"], r["ratio"], r["commit_p50_ms"],
                     r["commit_p99_ms"], r["records_per_txn"]])
        rows.append([store, "commit_transaction_async()", r["plain_records_per_s"],
                     r["pipelined_records_per_s"], r["pipelined_ratio"],
                     r["pipelined_caller_wait_p50_ms"], r["pipelined_caller_wait_p99_ms"],
                     "-"])
    C.print_table(f"Transactional vs plain producer, commit every {interval_ms} ms "
                  f"({args.mode}, {rounds} rounds x {seconds}s per side, medians)",
                  ["store", "commit with", "plain rec/s", "txn rec/s", "txn/plain",
                   "commit p50 ms", "commit p99 ms", "records/txn"], rows)
    C.print_table("Object-store requests per transaction",
                  ["store", "total per txn (data + protocol)", "protocol only"],
                  [[s, C.fmt_counts(r["requests_per_txn"]),
                    C.fmt_counts(r["overhead_requests_per_txn"])] for s, r in results.items()])
    mode_note = " (local store without fsync)" if args.no_fsync else ""
    goals = []
    for s, r in results.items():
        note = mode_note if s == "local" else ""
        goals.append({"name": "transactional produce at 100 ms commit interval vs "
                              "non-transactional" + note,
                      "store": s, "measured": C.clean(r["ratio"]), "target": GOAL,
                      "cmp": ">=", "pass": bool(r["ratio"] >= GOAL)})
        goals.append({"name": "the same with pipelined commits (commit_transaction_async)"
                              + note,
                      "store": s, "measured": C.clean(r["pipelined_ratio"]), "target": GOAL,
                      "cmp": ">=", "pass": bool(r["pipelined_ratio"] >= GOAL)})
    return C.emit_json(
        "txn_overhead", args.mode,
        params={"commit_interval_ms": interval_ms, "record_bytes": size, "seconds": seconds,
                "rounds": rounds, "producer_config": producer_config or "defaults",
                "local_fsync": not args.no_fsync,
                "switch_interval_ms": sys.getswitchinterval() * 1000},
        ratios={**{f"{s}.txn_vs_plain_throughput": C.clean(r["ratio"]) for s, r in
                   results.items()},
                **{f"{s}.pipelined_vs_plain_throughput": C.clean(r["pipelined_ratio"])
                   for s, r in results.items()}},
        goals=goals, results=C.clean(results))


if __name__ == "__main__":
    main()
