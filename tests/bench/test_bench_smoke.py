"""Smoke test of the benchmarks under scripts/bench/: each runs in its tiniest mode as a
subprocess and must exit 0 and print a valid JSON line with a "bench" key.

No timing is asserted (the numbers of a --tiny run mean nothing).  The benchmarks run
concurrently (they wait on I/O, not CPU) so that the whole file stays well under a minute.
``append`` also runs against a real SeaweedFS S3 server when ``weed`` is installed, so the
S3 code path (server start/stop, delta-rs storage options) is exercised too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: Kills processes (or runs many): outside the fast lane.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "scripts" / "bench"
TIMEOUT = 240


def _has_weed() -> bool:
    return (Path(sys.executable).parent / "weed").exists() or shutil.which("weed") is not None


def _has_deltalake() -> bool:
    try:
        import deltalake  # noqa: F401
    except ImportError:
        return False
    return True


OUT_DIR = tempfile.mkdtemp(prefix="txlog-bench-smoke-")
CASES: dict[str, list[str]] = {
    "append": ["--store", "both" if _has_weed() else "local"],
    "txn_overhead": ["--store", "local"],
    "small_txn": ["--store", "local"],
    "read": ["--store", "local"],
    "scale": ["--store", "local"],
    "memory": [],
    # (forked from a server that imported txlog once; needs SeaweedFS)
    **({"producers": []} if _has_weed() else {}),
    "run_all": ["--store", "local", "--only", "append", "--out", OUT_DIR],
}
NEEDS_DELTA = {"append", "small_txn", "run_all"}


@pytest.fixture(scope="module")
def runs() -> Any:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = {}
    for name, extra in CASES.items():
        if name in NEEDS_DELTA and not _has_deltalake():
            continue
        procs[name] = subprocess.Popen(
            [sys.executable, str(BENCH / f"{name}.py"), "--tiny", "--quiet", *extra],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
    out = {}
    for name, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            stdout, stderr = p.communicate()
        out[name] = (p.returncode, stdout, stderr)
    yield out
    shutil.rmtree(OUT_DIR, ignore_errors=True)


def _json_lines(stdout: str) -> list[dict[str, Any]]:
    found = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            d = json.loads(line)  # a line that looks like JSON must be JSON
            if isinstance(d, dict) and "bench" in d:
                found.append(d)
    return found


@pytest.mark.parametrize("name", list(CASES))
def test_benchmark_prints_json(runs: Any, name: str) -> None:
    if name not in runs:
        pytest.skip("deltalake is not installed")
    rc, stdout, stderr = runs[name]
    assert rc == 0, f"{name} exited {rc}:\n{stderr[-3000:]}"
    lines = _json_lines(stdout)
    assert len(lines) == 1, f"{name} printed {len(lines)} JSON lines:\n{stdout[-2000:]}"
    d = lines[0]
    assert d["bench"] == name
    assert d["mode"] == "tiny"
    assert d["code"]["txlog"] == str(REPO / "txlog"), d["code"]  # this checkout's code
    assert isinstance(d.get("goals", []), list)
    for g in d.get("goals", []):
        assert {"name", "store", "measured", "pass"} <= set(g)
    if name != "run_all":
        assert isinstance(d["ratios"], dict) and d["ratios"], d
        # Readable output comes first: a table, not only the JSON line.
        assert stdout.strip().splitlines()[0] == "" or len(stdout.splitlines()) > 3
    if name == "append" and "both" in CASES["append"]:
        assert set(d["results"]) == {"local", "s3"}
    if name == "run_all":
        report = json.loads((Path(OUT_DIR) / "report.json").read_text())
        assert [r["name"] for r in report["runs"]] == ["append"]
        assert report["runs"][0]["returncode"] == 0
        assert report["code"]["txlog"] == str(REPO / "txlog")
        assert report["runs"][0]["results"][0]["bench"] == "append"
        md = (Path(OUT_DIR) / "report.md").read_text()
        assert "| benchmark | goal | store | measured | target | pass |" in md


def test_benchmarks_measure_this_checkout(tmp_path: Path) -> None:
    """An installed txlog from elsewhere (here one ahead on PYTHONPATH, as an editable
    install made from another clone is) is neither what the benchmarks import nor what
    the processes they start (Spark's workers) import."""
    fake = tmp_path / "txlog"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import common, os, subprocess; "
             "import txlog; print(txlog.__file__); print(subprocess.run([sys.executable, '-c', "
             "'import txlog; print(txlog.__file__)'], capture_output=True, text=True, "
             "cwd='/').stdout.strip()); print(common.code()['txlog'])")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", probe, str(BENCH)], cwd="/", env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    here, child, reported = out.stdout.split()
    assert here == child == str(REPO / "txlog" / "__init__.py")
    assert reported == str(REPO / "txlog")
