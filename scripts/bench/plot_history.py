#!/usr/bin/env python
"""Draw the plots of docs/benchmarks.md from the figures that page gives.

    python scripts/bench/plot_history.py --out docs/img

Needs matplotlib (``pip install matplotlib``); the figures are kept here, beside the page
that states them, so a plot always shows what the text says.  Each figure names the
version or commit of the code it measured.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

#: Goal rows of ``run_all.py --small --store both`` on version 0.3.0 (commit 13d10b9):
#: (benchmark row, store, measured ratio, goal).
GOALS_030: list[tuple[str, str, float, float]] = [
    ("produce, commit_transaction()", "local", 1.01, 0.97),
    ("produce, commit_transaction_async()", "local", 1.03, 0.97),
    ("produce, commit_transaction()", "s3", 1.01, 0.97),
    ("produce, commit_transaction_async()", "s3", 1.08, 0.97),
    ("small transactions vs delta-rs", "local", 1.93, 1.5),
    ("small transactions, pipelined", "local", 3.65, 1.5),
    ("small transactions vs delta-rs", "s3", 1.62, 1.5),
    ("small transactions, pipelined", "s3", 2.12, 1.5),
    ("read_committed, 1% aborted", "local", 1.0, 0.97),
    ("read_committed, 30% aborted", "local", 0.997, 0.97),
    ("read_committed, 1% aborted", "s3", 1.03, 0.97),
    ("read_committed, 30% aborted", "s3", 0.994, 0.97),
    ("Spark scan format('txlog'), 1% aborted", "local", 1.12, 0.9),
    ("Spark scan JVM, 1% aborted", "local", 1.41, 0.9),
    ("Spark scan format('txlog'), 30% aborted", "local", 1.16, 0.9),
    ("Spark scan JVM, 30% aborted", "local", 1.55, 0.9),
    ("Spark write (JVM) throughput", "local", 1.11, 0.9),
    ("Spark write (JVM) CPU efficiency", "local", 1.07, 0.9),
]

#: The Spark scan at 5,000,000 records, ratio to spark.read.parquet (1% / 30% aborted),
#: at the JVM scan's commit (d20683b); the SQL join path from before the perfect hash.
SCAN_5M: list[tuple[str, float, float]] = [
    ("SQL path, join", 0.506, 0.628),
    ("format('txlog')\n(Python source)", 0.635, 0.618),
    ("SQL path,\nperfect hash", 0.764, 0.746),
    ("JVM scan", 0.856, 1.20),
]

#: S3 rows by the change that moved them: (change, commit, low, high) of the ratio measured
#: over the runs of that code (low == high: one run).
S3_PRODUCE: list[tuple[str, str, float, float]] = [
    ("s3fs", "before f046961", 0.75, 0.75),
    ("obstore", "f046961", 0.973, 0.973),
    ("committer steps", "1279ad9", 0.942, 0.96),
    ("in-flight bound,\nbuffer.memory", "f423fc9", 0.92, 1.00),
    ("grouped appends\n(0.2.0)", "a19a967", 0.990, 0.990),
    ("batches in markers\n(0.3.0)", "a45f5b1", 0.995, 0.995),
    ("0.3.0", "13d10b9", 0.972, 1.02),
]
S3_SMALL_TXN: list[tuple[str, str, float, float]] = [
    ("s3fs", "before f046961", 0.964, 0.964),
    ("obstore", "f046961", 1.31, 1.44),
    ("unsigned payloads", "7a89877", 1.56, 1.77),
    ("batches in markers\n(0.3.0)", "a45f5b1", 1.87, 1.87),
    ("0.3.0", "13d10b9", 1.62, 1.62),
]


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plot_history.py needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_goals(plt: Any, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 6.5))
    labels = [f"{name} ({store})" for name, store, _, _ in GOALS_030]
    ys = range(len(GOALS_030))
    values = [v for _, _, v, _ in GOALS_030]
    goals = [g for _, _, _, g in GOALS_030]
    ax.barh(list(ys), values, color=["#3a7" if v >= g else "#c44"
                                     for v, g in zip(values, goals, strict=True)])
    ax.scatter(goals, list(ys), marker="|", s=200, color="black", label="goal", zorder=3)
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_yticks(list(ys), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("txlog / baseline (higher is better)")
    ax.set_title("Goal rows, version 0.3.0 (commit 13d10b9)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_scan(plt: Any, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(SCAN_5M))
    ax.bar([x - 0.2 for x in xs], [a for _, a, _ in SCAN_5M], width=0.4, label="1% aborted")
    ax.bar([x + 0.2 for x in xs], [b for _, _, b in SCAN_5M], width=0.4, label="30% aborted")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.axhline(0.9, color="black", linestyle="--", linewidth=0.8, label="goal 0.9")
    ax.set_xticks(list(xs), [name for name, _, _ in SCAN_5M], fontsize=8)
    ax.set_ylabel("ratio to spark.read.parquet")
    ax.set_title("Spark scan, 5,000,000 records (JVM scan at d20683b)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_s3(plt: Any, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    series = [(S3_PRODUCE, "produce, commit_transaction() / plain", 0.97),
              (S3_SMALL_TXN, "small transactions / delta-rs", 1.5)]
    for ax, (rows, title, goal) in zip(axes, series, strict=True):
        xs = list(range(len(rows)))
        lows = [lo for _, _, lo, _ in rows]
        highs = [hi for _, _, _, hi in rows]
        ax.vlines(xs, lows, highs, linewidth=6, color="#37a")
        ax.scatter(xs, [(lo + hi) / 2 for lo, hi in zip(lows, highs, strict=True)],
                   color="#37a", zorder=3)
        ax.axhline(goal, color="black", linestyle="--", linewidth=0.8, label=f"goal {goal}")
        ax.set_xticks(xs, [f"{name}\n{commit}" for name, commit, _, _ in rows], fontsize=6.5)
        ax.set_title(f"S3: {title}", fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle("S3 rows by the change that moved them (bars: spread over runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    args = ap.parse_args(argv)
    plt = _plt()
    args.out.mkdir(parents=True, exist_ok=True)
    plot_goals(plt, args.out / "ratios-0.3.0.png")
    plot_scan(plt, args.out / "spark-scan-5m.png")
    plot_s3(plt, args.out / "s3-rows.png")
    print(f"wrote 3 plots to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
