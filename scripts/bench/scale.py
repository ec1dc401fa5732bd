"""Scale curves: how commit and planning cost grow with

* partitions touched by one transaction (1 .. 256),
* batches already in the partition (history: 0 .. 100,000),
* other transactions open on the partition (0 .. 100),
* transaction size (records per transaction),

with object-store requests per transaction split by kind.  The claim under test: cost
grows with new work (partitions touched, records written), not with history (checkpoints
bound what is read) and not with records for the commit itself.

For each point: ``send`` = the transaction's writes (data objects, log entries, the
AddPartitions registration); ``commit`` = ``commit_transaction()`` after an explicit
``flush()`` (EndTxn: Prepare*, one marker per partition, Complete*, the last two
written in the background and waited for here); ``plan`` = a cold
read_committed plan of the partitions (fresh ``txlog.connect``, load each partition's
checkpoint + tail, compute the LSO and the batch objects to read).

    .venv/bin/python scripts/bench/scale.py [--tiny|--small|--full] [--store ...]
        [--only partitions,history,open,size]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

DIMENSIONS = ("partitions", "history", "open", "size")


def _merge(acc: dict[str, int], c: dict[str, int]) -> None:
    for k, v in c.items():
        acc[k] = acc.get(k, 0) + v


class TxnMeter:
    """Runs transactions and accumulates send/commit times and requests."""

    def __init__(self, log: Any, producer: Any) -> None:
        self.log, self.producer = log, producer

    def run(self, send: Any, reps: int) -> dict[str, Any]:
        send_t, commit_t = [], []
        send_r: dict[str, int] = {}
        commit_r: dict[str, int] = {}
        for _ in range(reps):
            c0 = C.counts(self.log.store)
            t0 = C.perf()
            self.producer.begin_transaction()
            send(self.producer)
            self.producer.flush()
            t1 = C.perf()
            c1 = C.counts(self.log.store)
            self.producer.commit_transaction()
            _ = self.producer.epoch  # waits for the background markers and Complete*
            t2 = C.perf()
            c2 = C.counts(self.log.store)
            send_t.append(t1 - t0)
            commit_t.append(t2 - t1)
            _merge(send_r, C.diff_counts(c1, c0))
            _merge(commit_r, C.diff_counts(c2, c1))
        return {"send_ms": C.median(send_t) * 1000, "commit_ms": C.median(commit_t) * 1000,
                "commit_p99_ms": C.percentile(commit_t, 99) * 1000,
                "send_requests": C.per(send_r, reps), "commit_requests": C.per(commit_r, reps),
                "reps": reps}


def cold_plan(tg: C.Target, url: str, tps: list[Any], *, start: str = "zero",
              reps: int = 3) -> dict[str, Any]:
    """Fresh connect; load every partition, compute the LSO and the read_committed plan.

    Partitions load in parallel (16 threads) on remote stores, as the Spark planner
    (spark_ext.read_plan.load_states) does; sequentially on the local store.
    """
    from concurrent.futures import ThreadPoolExecutor

    times, reqs, spans = [], {}, 0
    for _ in range(reps):
        t0 = C.perf()
        fresh = tg.connect(url)
        plogs = [fresh.partition_log(tp) for tp in tps]
        if tg.name != "local" and len(plogs) > 1:
            with ThreadPoolExecutor(max_workers=min(16, len(plogs))) as ex:
                states = list(ex.map(lambda pl: pl.load(), plogs))
        else:
            states = [pl.load() for pl in plogs]
        spans = 0
        for st in states:
            lo = 0 if start == "zero" else max(0, st.high_watermark - 1000)
            plan, _ = st.plan_read(lo, None, "read_committed")
            spans += len(plan)
        times.append(C.perf() - t0)
        reqs = C.counts(fresh.store)
    return {"plan_ms": C.median(times) * 1000, "plan_requests": reqs, "plan_spans": spans}


def small_table(n: int, size: int = 1024) -> Any:
    return C.kafka_records(n, size)


# -- dimensions -----------------------------------------------------------------------------


def dim_partitions(tg: C.Target, points: list[int], reps: int) -> list[dict[str, Any]]:
    from txlog.records import TopicPartition

    url = tg.url("scale-parts")
    log = tg.connect(url)
    top = max(points)
    log.create_topic("wide", top)
    prod = log.producer(transactional_id="scale-parts")
    prod.init_transactions()
    meter = TxnMeter(log, prod)
    table = small_table(10)
    out = []
    for n in points:
        def send(p: Any, n: int = n) -> None:
            for part in range(n):
                p.send_batch("wide", table, partition=part)

        meter.run(send, 1)  # warm: partition states cached, as for a long-lived producer
        r = meter.run(send, reps)
        r.update(cold_plan(tg, url, [TopicPartition("wide", i) for i in range(n)], reps=2))
        r["x"] = n
        out.append(r)
        C.progress(f"{tg.name}: partitions={n}: send {r['send_ms']:.0f} ms, commit "
                   f"{r['commit_ms']:.0f} ms, commit requests {r['commit_requests']}")
    prod.close()
    return out


def dim_history(tg: C.Target, points: list[int], reps: int) -> list[dict[str, Any]]:
    from txlog.records import TopicPartition

    url = tg.url("scale-hist")
    log = tg.connect(url)
    log.create_topic("hist", 1)
    tp = TopicPartition("hist", 0)
    plog = log.partition_log(tp)
    interval = plog.checkpoint_interval
    key, nbytes = plog.write_data(C.kafka_records(1, 16))
    quick = C.quick_local_store(url) if tg.name == "local" else None
    prod = log.producer(transactional_id="scale-hist")
    prod.init_transactions()
    meter = TxnMeter(log, prod)
    table = small_table(100)

    def send(p: Any) -> None:
        p.send_batch("hist", table, partition=0)

    out = []
    have = 0
    for h in points:
        if h > have:
            C.progress(f"{tg.name}: history: appending {h - have:,} batches")
            C.build_history(plog, h - have, shared_key=key, nbytes=nbytes, quick_store=quick,
                            report_every=50_000)
            have = h
        meter.run(send, 1)
        r = meter.run(send, reps)
        have += 2 * (reps + 1)  # each transaction adds a data batch and a marker
        if h > 0:
            # Top up to a checkpoint boundary, so that every point's cold reads see the
            # same short tail and differ only in history.
            fill = -have % interval
            C.build_history(plog, fill, shared_key=key, nbytes=nbytes, quick_store=quick,
                            report_every=0)
            have += fill
        r["tail_entries"] = have % interval + 2
        # Cold commit: a new process's first transaction on this partition.
        t0 = C.perf()
        fresh = tg.connect(url)
        p2 = fresh.producer(transactional_id=f"scale-hist-cold-{h}")
        p2.init_transactions()
        t1 = C.perf()
        c1 = C.counts(fresh.store)
        p2.begin_transaction()
        send(p2)
        p2.commit_transaction()
        _ = p2.epoch  # waits for the background markers and Complete*
        r["cold_init_ms"] = (t1 - t0) * 1000
        r["cold_txn_ms"] = (C.perf() - t1) * 1000
        r["cold_txn_requests"] = C.diff_counts(C.counts(fresh.store), c1)
        have += 2
        r.update(cold_plan(tg, url, [tp], start="tail", reps=3))
        r["x"] = h
        out.append(r)
        C.progress(f"{tg.name}: history={h:,}: commit {r['commit_ms']:.0f} ms, cold txn "
                   f"{r['cold_txn_ms']:.0f} ms, cold plan {r['plan_ms']:.0f} ms, "
                   f"plan requests {r['plan_requests']}")
    # Off the checkpoint boundary: half an interval of entries after the last appender
    # checkpoint.  The first cold open replays them (one GET each) and leaves a checkpoint
    # behind, so the next process's cold open costs what one at a boundary does.
    C.build_history(plog, interval // 2, shared_key=key, nbytes=nbytes, quick_store=quick,
                    report_every=0)
    first_open = cold_plan(tg, url, [tp], start="tail", reps=1)
    next_open = cold_plan(tg, url, [tp], start="tail", reps=1)
    out[-1]["off_boundary"] = {"tail_entries": interval // 2,
                               "first_open_requests": first_open["plan_requests"],
                               "first_open_ms": first_open["plan_ms"],
                               "next_open_requests": next_open["plan_requests"],
                               "next_open_ms": next_open["plan_ms"]}
    C.progress(f"{tg.name}: {interval // 2} entries past a checkpoint: first cold open "
               f"{_total(first_open['plan_requests']):.0f} requests, the next "
               f"{_total(next_open['plan_requests']):.0f}")
    prod.close()
    return out


def dim_open(tg: C.Target, points: list[int], reps: int) -> list[dict[str, Any]]:
    from txlog.records import TopicPartition

    url = tg.url("scale-open")
    log = tg.connect(url)
    log.create_topic("open", 1)
    tp = TopicPartition("open", 0)
    prod = log.producer(transactional_id="scale-open")
    prod.init_transactions()
    meter = TxnMeter(log, prod)
    table = small_table(10)

    def send(p: Any) -> None:
        p.send_batch("open", table, partition=0)

    others: list[Any] = []
    out = []
    for k in points:
        while len(others) < k:
            o = log.producer(transactional_id=f"scale-open-{len(others)}",
                             transaction_timeout_ms=900_000)
            o.init_transactions()
            o.begin_transaction()
            o.send_batch("open", table, partition=0)
            o.flush()
            others.append(o)
        meter.run(send, 1)
        r = meter.run(send, reps)
        r.update(cold_plan(tg, url, [tp], reps=3))
        # A read_committed consumer's end offsets: the LSO, held by the oldest open
        # transaction (in time, so it is not resolved: it keeps holding, as in Kafka).
        times = []
        reqs: dict[str, int] = {}
        for _ in range(3):
            fresh = tg.connect(url)
            c = fresh.consumer(isolation_level="read_committed")
            c.assign([tp])
            t0 = C.perf()
            lso = c.end_offsets([tp])[tp]
            times.append(C.perf() - t0)
            reqs = C.counts(fresh.store)
        r["end_offsets_ms"] = C.median(times) * 1000
        r["end_offsets_requests"] = reqs
        r["lso"] = lso
        r["x"] = k
        out.append(r)
        C.progress(f"{tg.name}: open transactions={k}: commit {r['commit_ms']:.0f} ms, "
                   f"end_offsets {r['end_offsets_ms']:.0f} ms ({reqs})")
    for o in others:
        o.abort_transaction()
    prod.close()
    return out


def dim_size(tg: C.Target, points: list[int], reps: int) -> list[dict[str, Any]]:
    url = tg.url("scale-size")
    log = tg.connect(url)
    log.create_topic("size", 1)
    prod = log.producer(transactional_id="scale-size")
    prod.init_transactions()
    meter = TxnMeter(log, prod)
    chunk = small_table(1000)
    out = []
    for n in points:
        def send(p: Any, n: int = n) -> None:
            left = n
            while left > 0:
                t = chunk if left >= 1000 else chunk.slice(0, left)
                p.send_batch("size", t, partition=0)
                p.flush()  # one batch object per 1,000 records (batch.size is 1 MB)
                left -= t.num_rows

        meter.run(send, 1)
        r = meter.run(send, reps)
        r["x"] = n
        out.append(r)
        C.progress(f"{tg.name}: records={n:,}: send {r['send_ms']:.0f} ms, commit "
                   f"{r['commit_ms']:.0f} ms, commit requests {r['commit_requests']}")
    prod.close()
    return out


# -- report ---------------------------------------------------------------------------------


def _total(c: dict[str, float]) -> float:
    return float(sum(c.values()))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    def extra(p: Any) -> None:
        p.add_argument("--only", default=",".join(DIMENSIONS),
                       help=f"comma-separated subset of {', '.join(DIMENSIONS)}")

    args = C.parse_args(__doc__.splitlines()[0], argv=argv, extra=extra)
    only = [d.strip() for d in args.only.split(",") if d.strip()]
    reps = args.rounds or C.pick(args.mode, 1, 3, 5)
    points = {
        "partitions": {"local": C.pick(args.mode, [1, 4], [1, 4, 16, 64, 256],
                                       [1, 4, 16, 64, 256]),
                       "s3": C.pick(args.mode, [1, 4], [1, 4, 16, 64],
                                    [1, 4, 16, 64, 256])},
        "history": {"local": C.pick(args.mode, [0, 1000], [0, 1000, 10_000, 30_000],
                                    [0, 1000, 10_000, 100_000]),
                    "s3": C.pick(args.mode, [0, 1000], [0, 1000], [0, 1000, 3000])},
        "open": {"local": C.pick(args.mode, [0, 2], [0, 1, 10, 50], [0, 1, 10, 100]),
                 "s3": C.pick(args.mode, [0, 2], [0, 1, 10], [0, 1, 10, 50])},
        "size": {"local": C.pick(args.mode, [100, 2000], [100, 1000, 10_000],
                                 [100, 1000, 10_000, 100_000]),
                 "s3": C.pick(args.mode, [100, 2000], [100, 1000, 10_000],
                              [100, 1000, 10_000, 50_000])},
    }
    fns = {"partitions": dim_partitions, "history": dim_history, "open": dim_open,
           "size": dim_size}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with C.targets(args.store) as tgs:
        for tg in tgs:
            for dim in only:
                pts = points[dim][tg.name]
                C.progress(f"{tg.name}: {dim}: points {pts}, {reps} transactions each")
                results.setdefault(dim, {})[tg.name] = fns[dim](tg, pts, reps)
    labels = {"partitions": "partitions touched", "history": "batches in partition",
              "open": "open transactions", "size": "records per transaction"}
    checks: list[dict[str, Any]] = []
    ratios: dict[str, Any] = {}
    for dim, per_store in results.items():
        rows = []
        for store, pts in per_store.items():
            for r in pts:
                row = [store, r["x"], r["send_ms"], r["commit_ms"],
                       _total(r["commit_requests"]), C.fmt_counts(r["commit_requests"]),
                       C.fmt_counts(r["send_requests"])]
                if dim == "history":
                    row += [r["cold_txn_ms"], C.fmt_counts(r["cold_txn_requests"]),
                            r["plan_ms"], C.fmt_counts(r["plan_requests"])]
                elif dim in ("partitions",):
                    row += [r["plan_ms"], C.fmt_counts(r["plan_requests"])]
                elif dim == "open":
                    row += [r["plan_ms"], r["end_offsets_ms"],
                            C.fmt_counts(r["end_offsets_requests"])]
                rows.append(row)
            first, last = pts[0], pts[-1]
            grow = C.ratio(_total(last["commit_requests"]), _total(first["commit_requests"]))
            key = f"{store}.{dim}"
            ratios[f"{key}.commit_requests_last_vs_first"] = C.clean(grow)
            ratios[f"{key}.commit_ms_last_vs_first"] = C.clean(
                C.ratio(last["commit_ms"], first["commit_ms"]))
            if dim == "partitions":
                # Commit requests per partition touched should be a constant.
                per_part = [(_total(r["commit_requests"]) - _total(first["commit_requests"]))
                            / max(1, r["x"] - first["x"]) for r in pts[1:]]
                checks.append({"name": "commit requests grow linearly with partitions "
                                       "touched (extra requests per extra partition)",
                               "store": store, "measured": C.clean(per_part),
                               "target": None, "cmp": "info", "pass": None})
            elif dim in ("history", "size", "open"):
                what = {"history": "batches already in the partition",
                        "size": "records in the transaction",
                        "open": "other open transactions"}[dim]
                checks.append({"name": f"commit requests independent of {what} "
                                       f"({first['x']:,} -> {last['x']:,})",
                               "store": store, "measured": C.clean(grow), "target": 1.0,
                               "cmp": "<=", "pass": bool(grow <= 1.0)})
            if dim == "history":
                # Compare points that both have a checkpoint (history > 0): their cold
                # reads see the same short tail, so only the history differs.
                base = next((r for r in pts if r["x"] > 0), first)
                pg = C.ratio(_total(last["plan_requests"]), _total(base["plan_requests"]))
                checks.append({"name": f"cold plan requests independent of history "
                                       f"({base['x']:,} -> {last['x']:,} batches)",
                               "store": store, "measured": C.clean(pg), "target": 1.0,
                               "cmp": "<=", "pass": bool(pg <= 1.0)})
                cg = C.ratio(_total(last["cold_txn_requests"]),
                             _total(base["cold_txn_requests"]))
                checks.append({"name": f"a new producer's first transaction: requests "
                                       f"independent of history ({base['x']:,} -> "
                                       f"{last['x']:,} batches)",
                               "store": store, "measured": C.clean(cg), "target": 1.0,
                               "cmp": "<=", "pass": bool(cg <= 1.0)})
                off = last.get("off_boundary")
                if off is not None:
                    og = C.ratio(_total(off["next_open_requests"]),
                                 _total(last["plan_requests"]))
                    checks.append({"name": f"cold plan requests {off['tail_entries']} "
                                           "entries past a checkpoint, after one cold open "
                                           "there, vs at a checkpoint",
                                   "store": store, "measured": C.clean(og), "target": 1.0,
                                   "cmp": "<=", "pass": bool(og <= 1.0)})
                    ratios[f"{key}.off_boundary"] = C.clean(off)
                ratios[f"{key}.plan_ms_last_vs_first_checkpointed"] = C.clean(
                    C.ratio(last["plan_ms"], base["plan_ms"]))
        headers = ["store", labels[dim], "send ms", "commit ms", "commit reqs",
                   "commit requests by kind", "send requests by kind"]
        if dim == "history":
            headers += ["cold txn ms", "cold txn requests", "cold plan ms",
                        "cold plan requests"]
        elif dim == "partitions":
            headers += ["cold plan ms", "cold plan requests"]
        elif dim == "open":
            headers += ["cold plan ms", "end_offsets ms", "end_offsets requests"]
        C.print_table(f"Scale: {labels[dim]} ({args.mode}, {reps} transactions per point, "
                      "medians; requests per transaction)", headers, rows)
    C.print_table("Scale checks", ["check", "store", "measured", "target", "pass"],
                  [[c["name"], c["store"], str(c["measured"]), c["target"],
                    {True: "yes", False: "NO", None: "-"}[c["pass"]]] for c in checks])
    return C.emit_json("scale", args.mode, params={"reps": reps, "points": points,
                                                   "dimensions": only},
                       ratios=ratios, goals=checks, results=C.clean(results))


if __name__ == "__main__":
    main()
