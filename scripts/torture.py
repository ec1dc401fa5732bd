#!/usr/bin/env python
"""Torture txlog: run harness histories (txlog.testing.harness) and print the anomalies found.

    scripts/torture.py --histories 20                 # 20 histories on the local disk
    scripts/torture.py --time 600 --store s3          # 10 minutes on SeaweedFS (S3)
    scripts/torture.py --histories 1 --seed 1234      # replay one history's seed

Each history: client processes (transactional producers, read_committed and
read_uncommitted consumers, consume-transform-produce clients, a sweeper) work over
several topics and partitions through a fault-injecting store, while a nemesis SIGKILLs
and restarts them and starts zombies; then a final sweep and full reads, and the checker.
Prints one line per history, a table of anomalies by kind, the totals (histories,
operations, kills, injected faults) and the seeds of failing histories (their files are
kept under --workdir), then one JSON line with everything.  Exit status 1 if any anomaly.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from txlog.testing import servers
from txlog.testing.checker import ANOMALY_KINDS
from txlog.testing.harness import HistoryConfig, run_history


def start_s3() -> Any:
    return servers.start_seaweed()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--time", type=float, help="run histories for this many seconds")
    what.add_argument("--histories", type=int, help="run this many histories (default 10)")
    ap.add_argument("--store", choices=("local", "s3"), default="local")
    ap.add_argument("--seed", type=int, default=None,
                    help="seed of the first history (default: from the clock); history i "
                         "uses seed + i")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where histories are written (failing ones are kept)")
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds of workload each (default 4; 8 on s3)")
    ap.add_argument("--startup", type=float, default=None,
                    help="seconds allowed for clients to start (default 1.5; 3 on s3)")
    ap.add_argument("--producers", type=int, default=None, help="default 3; 2 on s3")
    ap.add_argument("--nemesis-every", type=float, default=None,
                    help="mean seconds between kills/zombies (0: no nemesis; default 0.8, "
                         "2 on s3)")
    ap.add_argument("--txn-timeout-ms", type=int, default=1500)
    ap.add_argument("--clock-skew-ms", type=int, default=120_000,
                    help="clients' wall clocks run this far ahead or behind (one of -skew, "
                         "0, +skew per process; 0: every clock right)")
    ap.add_argument("--no-faults", action="store_true", help="no injected store faults")
    ap.add_argument("--keep", action="store_true", help="keep clean histories too")
    ap.add_argument("--quiet", action="store_true", help="no line per history")
    args = ap.parse_args(argv)
    if args.time is None and args.histories is None:
        args.histories = 10
    # Each S3 request costs ~10 ms (more under load), client start-up ~1 s: fewer clients,
    # longer histories, rarer kills.
    s3 = args.store == "s3"
    defaults = {"duration": 8.0 if s3 else 4.0, "startup": 3.0 if s3 else 1.5,
                "producers": 2 if s3 else 3, "nemesis_every": 2.0 if s3 else 0.8}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    seed0 = args.seed if args.seed is not None else int(time.time()) % 1_000_000 * 1000
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="txlog-torture-"))
    workdir.mkdir(parents=True, exist_ok=True)

    server = start_s3() if args.store == "s3" else None
    totals: dict[str, Any] = {"histories": 0, "operations": 0, "transactions": 0,
                              "committed": 0, "kills": 0, "zombies": 0, "polls": 0,
                              "shared_objects": 0, "shared_batches": 0,
                              "clocks_ahead": 0, "clocks_behind": 0,
                              "injected": {}, "anomalies": dict.fromkeys(ANOMALY_KINDS, 0)}
    failing: list[dict[str, Any]] = []
    t_start = time.time()
    print(f"torture: store={args.store} first seed={seed0} workdir={workdir}", flush=True)
    try:
        i = 0
        while True:
            if args.histories is not None and i >= args.histories:
                break
            if args.time is not None and time.time() - t_start >= args.time:
                break
            seed = seed0 + i
            i += 1
            cfg = HistoryConfig(seed=seed, workdir=workdir, duration=args.duration,
                                startup=args.startup, producers=args.producers,
                                nemesis_every=args.nemesis_every,
                                txn_timeout_ms=args.txn_timeout_ms, keep=args.keep,
                                clock_skew_ms=args.clock_skew_ms,
                                lso_check_rate=0.3 if s3 else 1.0)
            if args.no_faults:
                cfg.faults = None
            if server is not None:
                cfg.store = "s3"
                cfg.url = server.fresh_url(f"torture-{seed}")
                cfg.storage_options = dict(server.storage_options)
            try:
                res = run_history(cfg)
            except Exception as exc:  # a harness failure: report it like an anomaly
                print(f"seed {seed}: harness error {type(exc).__name__}: {exc}", flush=True)
                failing.append({"seed": seed, "error": f"{type(exc).__name__}: {exc}",
                                "dir": str(cfg.dir)})
                totals["anomalies"]["harness_error"] = \
                    totals["anomalies"].get("harness_error", 0) + 1
                totals["histories"] += 1
                continue
            s = res.stats
            totals["histories"] += 1
            totals["operations"] += s["ops"]
            totals["transactions"] += s["txns"]
            totals["committed"] += s["txns_committed"]
            totals["kills"] += s["kills"]
            totals["zombies"] += s["zombies"]
            totals["clocks_ahead"] += s["clocks_ahead"]
            totals["clocks_behind"] += s["clocks_behind"]
            totals["polls"] += s["polls"]
            totals["shared_objects"] += s.get("shared_objects", 0)
            totals["shared_batches"] += s.get("shared_batches", 0)
            for k, n in s["injected"].items():
                totals["injected"][k] = totals["injected"].get(k, 0) + n
            counts = res.counts()
            for k, n in counts.items():
                totals["anomalies"][k] = totals["anomalies"].get(k, 0) + n
            if not res.valid:
                failing.append({"seed": seed, "dir": str(res.directory),
                                "anomalies": {k: n for k, n in counts.items() if n}})
            if not args.quiet:
                bad = {k: n for k, n in counts.items() if n}
                o = s["txn_outcomes"]
                print(f"seed {seed}: {s['ops']} ops, txns ok/fail/unknown "
                      f"{o.get('ok', 0)}/{o.get('fail', 0)}/{o.get('unknown', 0)} "
                      f"(committed {s['txns_committed']}), kills {s['kills']}, zombies "
                      f"{s['zombies']}, faults {sum(s['injected'].values())}, "
                      f"{res.elapsed:.1f} s: {bad or 'ok'}", flush=True)
                for a in res.anomalies[:5]:
                    print(f"    {a.kind}: {a.detail[:300]}", flush=True)
    finally:
        if server is not None:
            server.stop()
    elapsed = time.time() - t_start
    print()
    print(f"{'anomaly':<24}{'count':>8}")
    print("-" * 32)
    for k, n in totals["anomalies"].items():
        print(f"{k:<24}{n:>8}")
    print("-" * 32)
    inj = totals["injected"]
    by_kind = ", ".join(f"{k} {v}" for k, v in sorted(inj.items()))
    print(f"histories {totals['histories']}, operations {totals['operations']}, transactions "
          f"{totals['transactions']} (committed {totals['committed']}), polls "
          f"{totals['polls']}, kills {totals['kills']}, zombies {totals['zombies']}, "
          f"clients with clocks ahead/behind {totals['clocks_ahead']}/"
          f"{totals['clocks_behind']} (by {args.clock_skew_ms} ms), "
          f"injected faults {sum(inj.values())} ({by_kind}), shared objects "
          f"{totals['shared_objects']} holding {totals['shared_batches']} batches still "
          f"in the logs; {elapsed:.0f} s on {args.store}")
    if failing:
        replay = (f"scripts/torture.py --histories 1 --seed SEED --store {args.store} "
                  f"--duration {args.duration} --startup {args.startup} --producers "
                  f"{args.producers} --nemesis-every {args.nemesis_every} --txn-timeout-ms "
                  f"{args.txn_timeout_ms} --clock-skew-ms {args.clock_skew_ms}"
                  f"{' --no-faults' if args.no_faults else ''} --keep")
        print(f"failing seeds (replay: {replay}):")
        for f in failing:
            print(f"    {f['seed']}: {f.get('anomalies') or f.get('error')}  {f['dir']}")
    else:
        print("no anomalies")
    print(json.dumps({"store": args.store, "first_seed": seed0, "elapsed_s": round(elapsed, 1),
                      **totals, "failing": failing}))
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
