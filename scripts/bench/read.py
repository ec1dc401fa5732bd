"""Reading: read_committed vs read_uncommitted over the same partition, and the time to
open a partition with 100,000 batches (goals: read_committed at
least 0.97 of read_uncommitted, opening under one second on the local store).

1. A partition of transactions (one batch of 1 KB records each, 1% or 30% of them
   aborted) is read from the beginning to the end by a consumer with ``poll_arrow``, once
   per isolation level, interleaved, several rounds.  Throughput is records delivered per
   second (read_committed delivers fewer records: the aborted batches are never read).
   The partition is built directly through ``PartitionLog`` (data object, transactional
   entry, COMMIT/ABORT marker per transaction), so building it costs three requests per
   transaction instead of a whole protocol round.
2. A partition with 100,000 batches (tiny entries sharing one data object, appended
   through ``PartitionLog.append`` with checkpoints every ``checkpoint.interval.batches``,
   default 1,000) is opened cold: a fresh ``txlog.connect`` each time, then the partition's
   state is loaded (latest checkpoint plus the tail after it).  Measured with no tail and
   with the longest tail (interval - 1 entries).  Local store only.  In ``--small`` mode
   the fixture lives on /dev/shm (tmpfs) so that creating 100,000 entry files does not
   take minutes on a busy disk; ``--full`` builds it on disk (``--open-root`` overrides).

    .venv/bin/python scripts/bench/read.py [--tiny|--small|--full] [--store ...]
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

RC_GOAL = 0.97
OPEN_GOAL_S = 1.0


# -- read_committed vs read_uncommitted ------------------------------------------------------


def build_txn_partition(log: Any, topic: str, *, txns: int, records: int, size: int,
                        abort_pct: float, seed: int) -> dict[str, int]:
    """Transactions of one batch each; exactly round(txns * abort_pct / 100) aborted."""
    from txlog.model import ABORT, COMMIT, DATA
    from txlog.partition_log import AppendSpec
    from txlog.records import TopicPartition

    log.create_topic(topic, 1)
    plog = log.partition_log(TopicPartition(topic, 0))
    rnd = random.Random(seed)
    n_abort = round(txns * abort_pct / 100)
    aborted = set(rnd.sample(range(txns), n_abort))
    pid = 10_000 + seed
    committed_records = 0
    for i in range(txns):
        table = C.kafka_records(records, size, seed=i)
        key, nbytes = plog.write_data(table)
        plog.append(AppendSpec(kind=DATA, count=records, producer_id=pid, epoch=i,
                               base_sequence=0, transactional=True, txn_id="bench-read",
                               data=key, nbytes=nbytes, ts_min=1, ts_max=1))
        plog.append(AppendSpec(kind=ABORT if i in aborted else COMMIT, count=1,
                               producer_id=pid, epoch=i, transactional=True))
        if i not in aborted:
            committed_records += records
    return {"txns": txns, "aborted": n_abort, "committed_records": committed_records,
            "all_records": txns * records}


def read_all(log: Any, topic: str, isolation: str, expect: int) -> tuple[int, float, float]:
    """Read the partition from the beginning; (records, wall seconds, CPU seconds)."""
    import time

    from txlog.records import TopicPartition

    tp = TopicPartition(topic, 0)
    c = log.consumer(isolation_level=isolation)
    c.assign([tp])
    cpu0 = time.process_time()
    t0 = C.perf()
    c.seek_to_beginning([tp])
    n = 0
    while n < expect:
        t = c.poll_arrow(max_records=1_000_000)
        if t.num_rows == 0:
            break
        n += t.num_rows
    elapsed = C.perf() - t0
    cpu = time.process_time() - cpu0
    c.close()
    if n != expect:
        raise AssertionError(f"{isolation} read {n} records, expected {expect}")
    return n, elapsed, cpu


def run_isolation(tg: C.Target, *, txns: int, records: int, size: int, rounds: int,
                  pcts: list[float]) -> dict[str, Any]:
    log = tg.connect(tg.url("read"))
    built = {}
    for j, pct in enumerate(pcts):
        C.progress(f"{tg.name}: building {txns} transactions x {records} records, "
                   f"{pct:g}% aborted")
        built[pct] = build_txn_partition(log, f"r{j}", txns=txns, records=records, size=size,
                                         abort_pct=pct, seed=j)
    out: dict[str, Any] = {}
    for j, pct in enumerate(pcts):
        b = built[pct]
        topic = f"r{j}"
        expect = {"read_committed": b["committed_records"],
                  "read_uncommitted": b["all_records"]}
        read_all(log, topic, "read_committed", expect["read_committed"])  # warm-up
        read_all(log, topic, "read_uncommitted", expect["read_uncommitted"])
        rate: dict[str, list[float]] = {k: [] for k in expect}
        secs: dict[str, list[float]] = {k: [] for k in expect}
        cpu_rate: dict[str, list[float]] = {k: [] for k in expect}
        ratios, cpu_ratios = [], []
        reqs: dict[str, dict[str, int]] = {k: {} for k in expect}
        for r in range(rounds):
            order = list(expect) if r % 2 == 0 else list(reversed(expect))
            got = {}
            for iso in order:
                before = C.counts(log.store)
                n, el, cpu = read_all(log, topic, iso, expect[iso])
                for k, v in C.diff_counts(C.counts(log.store), before).items():
                    reqs[iso][k] = reqs[iso].get(k, 0) + v
                got[iso] = n / el
                got[f"{iso}.cpu"] = n / cpu if cpu > 0 else float("nan")
                rate[iso].append(got[iso])
                cpu_rate[iso].append(got[f"{iso}.cpu"])
                secs[iso].append(el)
            ratios.append(C.ratio(got["read_committed"], got["read_uncommitted"]))
            cpu_ratios.append(C.ratio(got["read_committed.cpu"],
                                      got["read_uncommitted.cpu"]))
        out[f"{pct:g}"] = {
            **b,
            "rc_records_per_s": C.median(rate["read_committed"]),
            "ru_records_per_s": C.median(rate["read_uncommitted"]),
            "rc_seconds": C.median(secs["read_committed"]),
            "ru_seconds": C.median(secs["read_uncommitted"]),
            "rc_mb_per_s": C.median(rate["read_committed"]) * size / 1e6,
            "ru_mb_per_s": C.median(rate["read_uncommitted"]) * size / 1e6,
            "ratio": C.median(ratios),
            "per_round_ratio": ratios,
            # Records per CPU-second (all threads): less sensitive to other load on the
            # machine than wall time.
            "cpu_ratio": C.median(cpu_ratios),
            "rc_records_per_cpu_s": C.median(cpu_rate["read_committed"]),
            "ru_records_per_cpu_s": C.median(cpu_rate["read_uncommitted"]),
            "rc_requests_per_read": C.per(reqs["read_committed"], rounds),
            "ru_requests_per_read": C.per(reqs["read_uncommitted"], rounds),
        }
        C.progress(f"{tg.name}: {pct:g}% aborted: read_committed/read_uncommitted "
                   f"{out[f'{pct:g}']['ratio']:.3f} (rounds {[round(x, 3) for x in ratios]}), "
                   f"per CPU-second {out[f'{pct:g}']['cpu_ratio']:.3f}")
    return out


# -- opening a long partition ----------------------------------------------------------------


def run_open(tg: C.Target, *, batches: int, interval: int, opens: int,
             root: str | None) -> dict[str, Any]:
    import os
    import tempfile

    fs = "disk"
    if root == "shm":
        shm = "/dev/shm"
        if os.path.isdir(shm) and os.access(shm, os.W_OK):
            root, fs = tempfile.mkdtemp(prefix="txlog-bench-open-", dir=shm), "tmpfs"
        else:
            root = None
    if root is not None and fs == "disk":
        root = tempfile.mkdtemp(prefix="txlog-bench-open-", dir=root)
    try:
        return _run_open(tg, batches=batches, interval=interval, opens=opens,
                         url=(root or tg.url("open")), fs=fs)
    finally:
        if root is not None:
            import shutil

            shutil.rmtree(root, ignore_errors=True)


def _run_open(tg: C.Target, *, batches: int, interval: int, opens: int, url: str,
              fs: str) -> dict[str, Any]:
    from txlog.records import TopicPartition

    log = tg.connect(url)
    log.create_topic("long", 1, config={"checkpoint.interval.batches": interval})
    tp = TopicPartition("long", 0)
    plog = log.partition_log(tp)
    key, nbytes = plog.write_data(C.kafka_records(1, 16))
    quick = C.quick_local_store(url) if tg.name == "local" else None
    C.progress(f"{tg.name}: building a partition of {batches:,} batches "
               f"(checkpoint every {interval}, on {fs})")
    t0 = C.perf()
    C.build_history(plog, batches, shared_key=key, nbytes=nbytes, quick_store=quick)
    build_s = C.perf() - t0
    C.progress(f"{tg.name}: built in {build_s:.1f}s")

    def open_cold() -> tuple[float, int, dict[str, int]]:
        t = C.perf()
        fresh = tg.connect(url)
        st = fresh.partition_log(tp).load()
        el = C.perf() - t
        return el, len(st.batches), C.counts(fresh.store)

    res: dict[str, Any] = {"batches": batches, "checkpoint_interval": interval,
                           "build_s": build_s, "filesystem": fs}
    for label, extra in (("no_tail", 0), ("max_tail", interval - 1)):
        if extra:
            C.build_history(plog, extra, shared_key=key, nbytes=nbytes, quick_store=quick,
                            report_every=0)
        open_cold()  # warm the OS page cache and imports
        times: list[float] = []
        reqs: dict[str, int] = {}
        n = 0
        for _ in range(opens):
            el, n, reqs = open_cold()
            times.append(el)
        res[label] = {"batches_loaded": n, "tail_entries": extra,
                      "open_s_median": C.median(times), "open_s_max": max(times),
                      "requests": reqs}
        C.progress(f"{tg.name}: open {n:,} batches ({label}): median "
                   f"{C.median(times) * 1000:.0f} ms, requests {reqs}")
    return res


def _extra_args(p: Any) -> None:
    p.add_argument("--no-open", action="store_true",
                   help="skip the 100,000-batch open measurement")
    p.add_argument("--open-root", default=None,
                   help="directory for the 100,000-batch partition ('shm': /dev/shm, "
                        "the small mode's default, so that building 100,000 entries "
                        "does not wait on disk metadata; default otherwise: the local "
                        "store's temp directory on disk)")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = C.parse_args(__doc__.splitlines()[0], argv=argv, extra=_extra_args)
    # Each read pays a fixed cost (listing, the first fetch) that read_committed spreads
    # over fewer records: enough transactions keep that share small.
    txns = C.pick(args.mode, 6, 100, 200)
    records = C.pick(args.mode, 200, 1000, 1000)
    # Single rounds of a short read vary widely: medians need many of them (with fewer,
    # the medians of unchanged code moved by several percent between runs).
    rounds = args.rounds or C.pick(args.mode, 1, 101, 101)
    size = 1024
    pcts = [1.0, 30.0]
    batches = C.pick(args.mode, 2000, 100_000, 100_000)
    interval = 1000
    opens = C.pick(args.mode, 2, 5, 9)
    open_root = args.open_root or C.pick(args.mode, None, "shm", None)
    results: dict[str, Any] = {"isolation": {}, "open": None}
    with C.targets(args.store) as tgs:
        for tg in tgs:
            results["isolation"][tg.name] = run_isolation(
                tg, txns=txns, records=records, size=size, rounds=rounds, pcts=pcts)
            if tg.name == "local" and not args.no_open:
                results["open"] = run_open(tg, batches=batches, interval=interval,
                                           opens=opens, root=open_root)
    rows = []
    for store, per_pct in results["isolation"].items():
        for pct, r in per_pct.items():
            rows.append([f"{store} {pct}% aborted", r["txns"], r["rc_records_per_s"],
                         r["ru_records_per_s"], r["rc_seconds"], r["ru_seconds"], r["ratio"],
                         r["cpu_ratio"]])
    C.print_table(f"read_committed vs read_uncommitted ({args.mode}, {txns} txns x {records} "
                  f"x {size} B, {rounds} rounds, medians; rate = records delivered/s)",
                  ["store / partition", "txns", "rc rec/s", "ru rec/s", "rc s", "ru s",
                   "rc/ru", "rc/ru per CPU-s"], rows)
    goals = []
    for store, per_pct in results["isolation"].items():
        for pct, r in per_pct.items():
            goals.append({"name": f"read_committed vs read_uncommitted, {pct}% aborted",
                          "store": store, "measured": C.clean(r["ratio"]), "target": RC_GOAL,
                          "cmp": ">=", "pass": bool(r["ratio"] >= RC_GOAL)})
            goals.append({"name": f"(info) the same per CPU-second, {pct}% aborted: "
                                  "less sensitive to other load",
                          "store": store, "measured": C.clean(r["cpu_ratio"]), "target": None,
                          "cmp": "info", "pass": None})
    ratios = {f"{s}.rc_vs_ru_{p}pct": C.clean(r["ratio"])
              for s, per_pct in results["isolation"].items() for p, r in per_pct.items()}
    ratios.update({f"{s}.rc_vs_ru_{p}pct_per_cpu_s": C.clean(r["cpu_ratio"])
                   for s, per_pct in results["isolation"].items()
                   for p, r in per_pct.items()})
    if results["open"] is not None:
        o = results["open"]
        C.print_table(f"Cold open of a partition with {o['batches']:,} batches (local store "
                      f"on {o['filesystem']}, checkpoint every {o['checkpoint_interval']}, "
                      f"{opens} opens)",
                      ["case", "batches", "tail entries", "median ms", "max ms", "requests"],
                      [[k, o[k]["batches_loaded"], o[k]["tail_entries"],
                        o[k]["open_s_median"] * 1000, o[k]["open_s_max"] * 1000,
                        C.fmt_counts(o[k]["requests"])] for k in ("no_tail", "max_tail")])
        for k in ("no_tail", "max_tail"):
            secs = o[k]["open_s_median"]
            goals.append({"name": f"open a {o['batches']:,}-batch partition ({k}), seconds",
                          "store": "local", "measured": C.clean(secs), "target": OPEN_GOAL_S,
                          "cmp": "<", "pass": bool(secs < OPEN_GOAL_S)})
            ratios[f"local.open_{k}_vs_1s"] = C.clean(secs / OPEN_GOAL_S)
    return C.emit_json(
        "read", args.mode,
        params={"txns": txns, "records_per_txn": records, "record_bytes": size,
                "rounds": rounds, "abort_pcts": pcts, "open_batches": batches},
        ratios=ratios, goals=goals, results=C.clean(results))


if __name__ == "__main__":
    main()
