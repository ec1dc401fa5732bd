"""Run every benchmark under scripts/bench/ and write the report.

Each benchmark runs as a subprocess with the chosen size (``--small``: CI-sized, the
default; ``--full``; ``--tiny``: smoke), compares txlog with its baseline in the same run,
and prints one JSON line with a ``"bench"`` key; this script collects those lines and
writes ``bench-results/report.json``, ``bench-results/report.md`` (goal / measured /
pass-fail) and, when matplotlib is importable, ``bench-results/ratios.png`` and the
curves (plots.py: latency, scale) into ``--plots`` (default: docs/benchmarks/, or the
output directory for ``--tiny``).

    .venv/bin/python scripts/bench/run_all.py [--tiny|--small|--full] [--store local|s3|both]
        [--only append,read,...] [--out bench-results] [--plots docs/benchmarks]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C
import plots

HERE = Path(__file__).resolve().parent
# Benchmarks that take --store.
OWN = ("append", "txn_overhead", "read", "small_txn", "scale", "spark_scan", "spark_write")
# Run order; any other script found under scripts/bench/ runs after these.
ORDER = ("append", "txn_overhead", "small_txn", "read", "scale", "memory", "latency",
         "producers", "spark_scan", "spark_write", "spark_plan", "delta_exactly_once")
EXPECTED = ("spark_scan", "spark_write", "spark_plan")  # written by others; noted when missing
NOT_BENCHES = {"common", "run_all", "plots", "plot_history", "__init__"}

# The throughput goals, for benchmarks whose JSON carries no "goals" list of its own: the
# measured ratio is looked up under these keys (first found wins).
FALLBACK_GOALS = {
    "spark_scan": [("Spark read_committed scan (two columns) vs spark.read.parquet", 1.0,
                    ("ratio", "scan_ratio", "read_committed_vs_parquet",
                     "txlog_vs_parquet"))],
    "spark_write": [("Spark transactional write vs df.write.parquet", 1.0,
                     ("ratio", "write_ratio", "txlog_vs_parquet", "txn_vs_parquet"))],
}


def discover() -> list[str]:
    found = sorted(p.stem for p in HERE.glob("*.py")
                   if p.stem not in NOT_BENCHES and not p.stem.startswith("_"))
    return [b for b in ORDER if b in found] + [b for b in found if b not in ORDER]


def _pump(stream: Any, sink: Any, keep: list[str] | None) -> None:
    for line in iter(stream.readline, ""):
        if keep is not None:
            keep.append(line)
        sink.write(line)
        sink.flush()


def run_bench(name: str, mode: str, store: str, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / f"{name}.py"), f"--{mode}"]
    if name in OWN:
        cmd += ["--store", store]
    C.progress(f"== {name}: {' '.join(cmd[1:])}")
    # The last benchmark's dirty pages (gigabytes after txn_overhead or read) are written
    # back now, not during this one's rounds.
    os.sync()
    t0 = time.monotonic()
    out: list[str] = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(C.REPO), env=env, start_new_session=True)
    # The child's tables and JSON line go to our stderr: our stdout is the report and
    # our own single JSON line.
    threads = [threading.Thread(target=_pump, args=(proc.stdout, sys.stderr, out), daemon=True),
               threading.Thread(target=_pump, args=(proc.stderr, sys.stderr, None),
                                daemon=True)]
    for t in threads:
        t.start()
    timed_out = False
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        import signal

        try:
            os.killpg(proc.pid, signal.SIGTERM)
            rc = proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    for t in threads:
        t.join(timeout=10)
    results = []
    for line in out:
        line = line.strip()
        if line.startswith("{"):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict) and "bench" in d:
                results.append(d)
    return {"name": name, "command": " ".join(["python", *cmd[1:]]), "returncode": rc,
            "timed_out": timed_out, "seconds": round(time.monotonic() - t0, 1),
            "results": results}


def _find(d: Any, keys: tuple[str, ...]) -> float | None:
    if not isinstance(d, dict):
        return None
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    for sub in ("ratios", "results"):
        v = _find(d.get(sub), keys)
        if v is not None:
            return v
    return None


def goal_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for res in run["results"]:
        goals = res.get("goals")
        if isinstance(goals, list):
            for g in goals:
                if isinstance(g, dict):
                    rows.append({"bench": res["bench"], **g})
            if goals:
                continue
        for name, target, keys in FALLBACK_GOALS.get(res["bench"], []):
            v = _find(res, keys)
            rows.append({"bench": res["bench"], "name": name, "store": res.get("store", "-"),
                         "measured": v, "target": target, "cmp": ">=",
                         "pass": None if v is None else bool(v >= target)})
    return rows


def ratio_rows(run: dict[str, Any]) -> list[tuple[str, str, Any]]:
    rows = []
    for res in run["results"]:
        ratios = res.get("ratios")
        if isinstance(ratios, dict):
            for k, v in ratios.items():
                rows.append((res["bench"], k, v))
        else:
            for k, v in res.items():
                if "ratio" in k and isinstance(v, (int, float)):
                    rows.append((res["bench"], k, v))
    return rows


def _cell(x: Any) -> str:
    if isinstance(x, list):
        return ", ".join(_cell(v) for v in x)
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
    return "-" if x is None else str(x)


def write_markdown(path: Path, report: dict[str, Any]) -> None:
    lines = [f"# txlog benchmarks ({report['mode']})", "",
             f"Command: `{report['command']}`  ",
             f"Machine: {report['machine']['cpus']} CPUs, {report['machine']['platform']}, "
             f"Python {report['machine']['python']}; stores: {report['store']} (S3 is "
             "SeaweedFS `weed mini` on 127.0.0.1, same machine).  ",
             f"Code: commit {report['code']['commit']} ({report['code']['txlog']}).  ",
             f"Started {report['started']}, took {report['seconds']:.0f} s.  Each figure "
             "is a median over interleaved rounds of txlog and its baseline in the same "
             "run.  On a shared machine single rounds vary by 2x or more: compare ratios, "
             "and re-run before trusting a pass or fail near its goal.", "",
             "## Goals", "",
             "| benchmark | goal | store | measured | target | pass |",
             "|---|---|---|---|---|---|"]
    for g in report["goals"]:
        target = "-" if g.get("target") is None else f"{g.get('cmp', '>=')} {g['target']}"
        ok = {True: "pass", False: "**FAIL**", None: "-"}[g.get("pass")]
        lines.append(f"| {g['bench']} | {g.get('name', '')} | {g.get('store', '-')} | "
                     f"{_cell(g.get('measured'))} | {target} | {ok} |")
    lines += ["", "## Ratios (txlog / baseline unless named otherwise)", "",
              "| benchmark | ratio | value |", "|---|---|---|"]
    for bench, k, v in report["ratios"]:
        lines.append(f"| {bench} | {k} | {_cell(v)} |")
    lines += ["", "## Runs", "", "| benchmark | exit | seconds | note |", "|---|---|---|---|"]
    for r in report["runs"]:
        note = r.get("note", "")
        if r.get("timed_out"):
            note = "timed out"
        elif r.get("returncode") not in (0, None):
            note = note or "failed"
        elif r.get("returncode") == 0 and not r.get("results"):
            note = note or "no JSON line"
        lines.append(f"| {r['name']} | {_cell(r.get('returncode'))} | "
                     f"{_cell(r.get('seconds'))} | {note} |")
    path.write_text("\n".join(lines) + "\n")


def write_chart(path: Path, goals: list[dict[str, Any]]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [g for g in goals if isinstance(g.get("measured"), (int, float))
            and isinstance(g.get("target"), (int, float))]
    if not rows:
        return False
    labels = [f"{g['bench']} {g.get('store', '')}\n{g.get('name', '')[:40]}" for g in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 5))
    xs = range(len(rows))
    colours = ["tab:green" if g.get("pass") else "tab:red" for g in rows]
    ax.bar(xs, [g["measured"] for g in rows], color=colours, label="measured")
    ax.scatter(xs, [g["target"] for g in rows], color="black", marker="_", s=600,
               label="goal", zorder=3)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("ratio (or seconds, for open time)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> dict[str, Any]:
    def extra(p: Any) -> None:
        p.add_argument("--only", default=None, help="comma-separated benchmark names")
        p.add_argument("--out", default=str(C.REPO / "bench-results"),
                       help="output directory (default: bench-results/)")
        p.add_argument("--plots", default=None,
                       help="where the curves' PNG files go (default: docs/benchmarks/, "
                            "or --out for --tiny)")
        p.add_argument("--timeout", type=float, default=None,
                       help="seconds per benchmark (default: 1800 small, 7200 full)")

    args = C.parse_args(__doc__.splitlines()[0], argv=argv, extra=extra)
    timeout = args.timeout or C.pick(args.mode, 300, 1800, 7200)
    names = discover()
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        names = [n for n in names if n in wanted] + [n for n in wanted if n not in names]
    else:
        names += [n for n in EXPECTED if n not in names]
    started = time.strftime("%Y-%m-%d %H:%M:%S %z")
    t0 = time.monotonic()
    runs: list[dict[str, Any]] = []
    for name in names:
        if not (HERE / f"{name}.py").exists():
            C.progress(f"== {name}: scripts/bench/{name}.py does not exist yet: skipped")
            runs.append({"name": name, "returncode": None, "seconds": 0, "results": [],
                         "note": "skipped: script not present"})
            continue
        runs.append(run_bench(name, args.mode, args.store, timeout))
    goals = [g for r in runs for g in goal_rows(r)]
    ratios = [row for r in runs for row in ratio_rows(r)]
    cmd = " ".join(["python", "scripts/bench/run_all.py", f"--{args.mode}", "--store",
                    args.store] + (["--only", args.only] if args.only else []))
    report = {"mode": args.mode, "store": args.store, "command": cmd, "started": started,
              "seconds": time.monotonic() - t0, "machine": C.machine(), "code": C.code(),
              "goals": goals, "ratios": ratios, "runs": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    write_markdown(out / "report.md", report)
    chart = write_chart(out / "ratios.png", goals)
    plots_dir = Path(args.plots) if args.plots else (
        out if args.mode == "tiny" else C.REPO / "docs" / "benchmarks")
    curves = plots.draw([res for r in runs for res in r["results"]], plots_dir)
    C.progress(f"wrote {out / 'report.json'}, {out / 'report.md'}"
               + (f", {out / 'ratios.png'}" if chart else " (no matplotlib: no chart)")
               + "".join(f", {p}" for p in curves))
    print()
    print((out / "report.md").read_text())
    failed = [r["name"] for r in runs if r.get("returncode") not in (0, None)]
    return C.emit_json("run_all", args.mode, goals=goals, failed=failed,
                       report=str(out / "report.json"), plots=[str(p) for p in curves])


if __name__ == "__main__":
    main()
