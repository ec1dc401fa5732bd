"""Scan plans handed to the JVM (spark_ext/plan_file.py) are transient: one the JVM never
reads (its query failed first, or the driver went away) is removed by the process that
wrote it, not left in the temporary directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

import spark_ext
import txlog
from spark_ext import jvm_scan, plan_file

pytestmark = pytest.mark.spark


def build(url: str) -> int:
    """Topic "p", two partitions, three committed transactions; returns the records."""
    log = txlog.connect(url)
    log.create_topic("p", partitions=2)
    prod = log.producer(transactional_id="p-tx")
    prod.init_transactions()
    for i in range(3):
        prod.begin_transaction()
        for part in (0, 1):
            prod.send("p", f"v{i}-{part}".encode(), partition=part)
        prod.commit_transaction()
    prod.close()
    return 6


def planner(tmp: Path) -> subprocess.Popen[str]:
    """The planner process the JVM connector starts, writing its plans into ``tmp``."""
    env = dict(os.environ, TMPDIR=str(tmp))
    return subprocess.Popen([sys.executable, "-m", "spark_ext.planner_server"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)


def ask(proc: subprocess.Popen[str], req: dict[str, Any]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(req) + "\n")
    proc.stdin.flush()
    answer: dict[str, Any] = json.loads(proc.stdout.readline())
    assert "error" not in answer, answer
    return answer


def scan(url: str) -> dict[str, Any]:
    return {"op": "scan", "planFormat": plan_file.PLAN_VERSION,
            "options": {"path": url, "topic": "p"}}


@pytest.mark.parametrize("ending", ["stdin closed", "SIGTERM"])
def test_the_planner_process_removes_the_plans_nobody_read_when_it_ends(
        tmp_path: Path, ending: str) -> None:
    """The driver JVM that asked for a plan went away (stdin closes when it exits; a
    restart stops the process) before reading it: the plan goes with the planner."""
    url = str(tmp_path / "lake")
    build(url)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = planner(tmp)
    try:
        read = Path(ask(proc, scan(url))["planFile"])
        plan_file.read(str(read))
        read.unlink()  # as the JVM deletes a plan it read
        unread = Path(ask(proc, scan(url))["planFile"])
        assert unread.parent == tmp and unread.exists()
        assert proc.stdin is not None
        if ending == "SIGTERM":
            proc.terminate()
        else:
            proc.stdin.close()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sorted(p.name for p in tmp.iterdir()) == []


def test_a_read_that_fails_before_the_jvm_reads_its_plan_removes_it(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """spark_ext.read(engine="jvm") writes the plan, then Spark loads the scan, which
    reads it; a load that fails first leaves no plan behind."""
    url = str(tmp_path / "lake")
    records = build(url)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    assert spark_ext.read(spark, url, topic="p", engine="jvm").count() == records
    assert list(tmp.iterdir()) == []  # read, and deleted by the JVM
    monkeypatch.setattr(jvm_scan, "PROVIDER", "io.txlog.spark.NoSuchScan")
    with pytest.raises(Exception, match="NoSuchScan"):
        spark_ext.read(spark, url, topic="p", engine="jvm")
    assert sorted(p.name for p in tmp.iterdir()) == []
