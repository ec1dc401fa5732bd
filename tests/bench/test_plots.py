"""The benchmark charts are drawn from the results they are given, and each names the run
it came from (a chart left from an older run shows its commit and date)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "bench"))

import plots  # noqa: E402

RESULT = {"bench": "producers", "mode": "small", "delay_ms": 25.0,
          "finished": "2026-11-27 04:00 UTC", "load_average": 12.3,
          "curves": {"commits_per_s_by_producers": [[1, 8.0], [4, 30.0], [16, 60.0]]},
          "machine": {"cpus": 2}, "code": {"commit": "abc1234"}}


def test_source_note_names_the_run() -> None:
    note = plots.source_note(RESULT)
    assert note == ("scripts/bench/producers.py --small, commit abc1234, 2 CPUs, load 12, "
                    "2026-11-27 04:00 UTC")


def test_draw_writes_each_chart_its_results_allow(tmp_path: Path) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed (dev extras)")
    memory = {"bench": "memory", "mode": "small", "mb": 256,
              "median_peak_mb": {"produce": 120.0, "pyarrow_write": 100.0, "poll": 110.0,
                                 "floor": 75.0}, "code": {"commit": "abc1234"}}
    made = plots.draw([RESULT, memory, {"bench": "latency", "mode": "small"}], tmp_path)
    # (the latency result has no curves: nothing drawn for it, nothing left from before)
    assert sorted(p.name for p in made) == ["memory.png", "producers.png"]
    assert all(p.stat().st_size > 0 for p in made)
    assert not (tmp_path / "latency.png").exists()
