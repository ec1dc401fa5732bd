"""Charts of the benchmarks' curves, as PNG files (matplotlib, from the dev extras).

``run_all.py`` calls :func:`draw` with its collected results: the latency benchmark gives
``latency.png`` (commit latency in request times against partitions touched, and each
operation's p50 against its goal), the scale benchmark one ``scale-<dimension>.png`` per
curve it measured, the producers benchmark ``producers.png`` (commits per second against
producers) and the memory benchmark ``memory.png`` (peak RSS of each side).  Without
matplotlib nothing is drawn and :func:`draw` returns ``[]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def source_note(result: Mapping[str, Any]) -> str:
    """Which run a chart was drawn from: the benchmark, its size, the code's commit and
    the machine (a chart left from an older run shows it)."""
    code = result.get("code") or {}
    machine = result.get("machine") or {}
    parts = [f"scripts/bench/{result.get('bench')}.py --{result.get('mode')}",
             f"commit {code.get('commit', '?')}"]
    if machine.get("cpus"):
        parts.append(f"{machine['cpus']} CPUs")
    if isinstance(result.get("load_average"), (int, float)):
        parts.append(f"load {result['load_average']:.0f}")
    if result.get("finished"):
        parts.append(str(result["finished"]))
    return ", ".join(parts)


def _save(plt: Any, fig: Any, path: Path, result: Mapping[str, Any] | None = None) -> bool:
    if result is not None:
        fig.text(0.01, 0.005, source_note(result), fontsize=6, color="dimgray",
                 ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1) if result is not None else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def line_chart(path: Path, *, title: str, xlabel: str, ylabel: str,
               series: Mapping[str, Sequence[Sequence[Any]]],
               goals: Sequence[tuple[float, float, str]] = (), logx: bool = False,
               result: Mapping[str, Any] | None = None) -> bool:
    """One chart of ``series`` (name -> [(x, y), ...]); ``goals`` are (x, y, label)
    points drawn as black bars.  False when matplotlib is missing or nothing to draw."""
    plt = _pyplot()
    drawn = {k: [(x, y) for x, y in v if y is not None] for k, v in series.items()}
    if plt is None or not any(drawn.values()):
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    _lines(ax, drawn, goals)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        if min(x for pts in drawn.values() for x, _ in pts) > 0:
            ax.set_xscale("log")
        else:  # a curve from 0 (no history, no other transaction)
            ax.set_xscale("symlog", linthresh=1)
            ax.set_xlim(left=0)
    return _save(plt, fig, path, result)


def _lines(ax: Any, series: dict[str, list[tuple[float, float]]],
           goals: Sequence[tuple[float, float, str]]) -> None:
    for name, pts in series.items():
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    for i, (x, y, label) in enumerate(goals):
        ax.scatter([x], [y], marker="_", s=500, color="black", zorder=3,
                   label="goal" if i == 0 else None)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def latency_chart(result: dict[str, Any], path: Path) -> bool:
    """Commit p50/p99 in request times against partitions touched, beside each
    operation's p50 (bars) with the latency goals."""
    plt = _pyplot()
    curves = result.get("curves") or {}
    p50 = [tuple(p) for p in curves.get("commit_p50_rt_by_partitions") or []]
    if plt is None or not p50:
        return False
    p99 = [tuple(p) for p in curves.get("commit_p99_rt_by_partitions") or []]
    seq = [tuple(p) for p in curves.get("commit_sequential_by_partitions") or []]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    _lines(left, {"commit p50": p50, "commit p99": p99, "sequential requests (p50)": seq},
           [(1, 2.0, "<= 2"), (8, 2.5, "<= 2.5")])
    left.set_xlabel("partitions touched by the transaction")
    left.set_ylabel("request times")
    left.set_title("commit_transaction() at object-store latency", fontsize=10)
    res = result.get("results") or {}
    names = [k for k in ("init_new", "init_restart", "first_send", "commit_after_flush",
                         "idle_poll", "fresh_poll", "end_to_end") if k in res]
    values = [res[k].get("p50_rt") or 0.0 for k in names]
    right.bar(range(len(names)), values, color="tab:blue")
    if "end_to_end" in names:
        right.scatter([names.index("end_to_end")], [6.0], marker="_", s=500, color="black",
                      zorder=3, label="goal")
        right.legend(fontsize=8)
    right.set_xticks(list(range(len(names))))
    right.set_xticklabels([n.replace("_", " ") for n in names], rotation=30, ha="right",
                          fontsize=8)
    right.set_ylabel("p50, request times")
    rt = result.get("request_time_ms")
    model = result.get("model") or {}
    right.set_title(f"operations (request time {rt} ms: {model.get('delay_ms')} ms added)",
                    fontsize=10)
    right.grid(alpha=0.3, axis="y")
    return _save(plt, fig, path, result)


_SCALE_LABELS = {"partitions": "partitions touched", "history": "batches in the partition",
                 "open": "other open transactions", "size": "records per transaction"}


def scale_charts(result: dict[str, Any], out: Path) -> list[Path]:
    """Commit time against each scale dimension, one line per store."""
    made = []
    for dim, per_store in (result.get("results") or {}).items():
        if not isinstance(per_store, dict):
            continue
        series = {f"{store} commit ms": [(p["x"], p.get("commit_ms")) for p in pts]
                  for store, pts in per_store.items() if isinstance(pts, list)}
        path = out / f"scale-{dim}.png"
        if line_chart(path, title=f"commit_transaction() against "
                      f"{_SCALE_LABELS.get(dim, dim)}", xlabel=_SCALE_LABELS.get(dim, dim),
                      ylabel="ms (median)", series=series,
                      logx=dim in ("partitions", "history", "size"), result=result):
            made.append(path)
    return made


def producers_chart(result: dict[str, Any], path: Path) -> bool:
    """Commits per second of N producers against N times one producer alone."""
    curves = result.get("curves") or {}
    rate = [tuple(p) for p in curves.get("commits_per_s_by_producers") or []]
    one = {p[0]: p[1] for p in rate}.get(1)
    if not rate or one is None:
        return False
    delay = result.get("delay_ms")
    return line_chart(path, title=f"transactional producers on one root, one partition "
                      f"each ({delay} ms per request)", xlabel="producers (processes)",
                      ylabel="commits per second (all producers)",
                      series={"measured": rate,
                              "N x one producer alone": [(n, n * one) for n, _ in rate]},
                      result=result)


def memory_chart(result: dict[str, Any], path: Path) -> bool:
    """Peak RSS of each side against the goal and the interpreter's own."""
    plt = _pyplot()
    med = result.get("median_peak_mb") or {}
    names = [k for k in ("produce", "pyarrow_write", "poll", "poll_arrow", "pyarrow_read",
                         "source_read", "floor") if isinstance(med.get(k), (int, float))]
    if plt is None or not names:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    # The Python data source's task reads whole compacted segments: the 150 MB goal is the
    # producer's and the consumer's, so its bar has a colour of its own.
    colours = ["tab:gray" if n.startswith("pyarrow") or n == "floor"
               else "tab:orange" if n == "source_read" else "tab:blue" for n in names]
    ax.bar(range(len(names)), [med[n] for n in names], color=colours)
    ax.axhline(150, color="black", linewidth=1, linestyle="--", label="goal: 150 MB")
    ax.set_xticks(list(range(len(names))))
    ax.set_xticklabels([n.replace("_", " ") for n in names], rotation=20, ha="right",
                       fontsize=8)
    ax.set_ylabel("peak RSS, MB (median)")
    ax.set_title(f"{result.get('mb')} MiB through a producer and back (txlog blue, "
                 "pyarrow grey, Spark's Python source orange)", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(plt, fig, path, result)


def draw(results: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """Every chart the benchmarks' JSON results allow; the paths written."""
    made: list[Path] = []
    for res in results:
        if res.get("bench") == "latency" and latency_chart(res, out / "latency.png"):
            made.append(out / "latency.png")
        elif res.get("bench") == "scale":
            made += scale_charts(res, out)
        elif res.get("bench") == "producers" and producers_chart(res, out / "producers.png"):
            made.append(out / "producers.png")
        elif res.get("bench") == "memory" and memory_chart(res, out / "memory.png"):
            made.append(out / "memory.png")
    return made
