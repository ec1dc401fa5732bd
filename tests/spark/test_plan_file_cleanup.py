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
from spark_ext import jvm_scan, plan_file, plan_owner

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
    assert plan_files(tmp) == set()  # read, and deleted by the JVM
    monkeypatch.setattr(jvm_scan, "PROVIDER", "io.txlog.spark.NoSuchScan")
    with pytest.raises(Exception, match="NoSuchScan"):
        spark_ext.read(spark, url, topic="p", engine="jvm")
    assert plan_files(tmp) == set()


def plan_files(tmp: Path) -> set[str]:
    return {p.name for p in tmp.iterdir() if p.name.endswith(".arrows")}


def stop(proc: subprocess.Popen[str]) -> None:
    """End a planner as the driver JVM's exit does: stdin closes."""
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=120)


@pytest.mark.slow
def test_a_starting_planner_removes_the_plans_of_killed_planners_never_a_live_ones(
        tmp_path: Path) -> None:
    """A planner killed with SIGKILL cannot remove its unread plans; the next planner to
    start does, while the plans of a planner still running stay."""
    url = str(tmp_path / "lake")
    build(url)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    procs: list[subprocess.Popen[str]] = []

    def start() -> subprocess.Popen[str]:
        procs.append(planner(tmp))
        return procs[-1]

    try:
        live = start()
        kept = Path(ask(live, scan(url))["planFile"])
        killed = start()
        left = Path(ask(killed, scan(url))["planFile"])
        killed.kill()  # SIGKILL: no exit handler runs
        killed.wait(timeout=120)
        assert plan_files(tmp) == {kept.name, left.name}
        # A new planner's first answer comes after its start: the dead one's plan is
        # gone by then, the live one's stays (and reads as usual).
        newcomer = start()
        assert ask(newcomer, {"op": "ping"}) == {"pong": True}
        assert plan_files(tmp) == {kept.name}
        plan_file.read(str(kept))
        own = Path(ask(newcomer, scan(url))["planFile"])
        # The live planner is killed too; its plan goes at the next start, and a
        # planner that ends cleanly takes its own with it.
        live.kill()
        live.wait(timeout=120)
        stop(newcomer)
        assert plan_files(tmp) == {kept.name} and not own.exists()
        last = start()
        assert ask(last, {"op": "ping"}) == {"pong": True}
        assert plan_files(tmp) == set()
        stop(last)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # Lock files included: nothing is left once every planner is gone and swept.
    assert sorted(p.name for p in tmp.iterdir()) == []


def test_plans_are_matched_to_their_owner_by_the_exact_token() -> None:
    a, b = "0" * 32, "ab" * 16
    names = [f"txlog-plans-{a}.lock", f"txlog-plans-{b}.making", "txlog-plans-xyz.lock",
             f"txlog-plans-{a}.lock.bak", f"txlog-plan-{a}-k1.arrows", f"txlog-plan-{a}-k2.arrows",
             f"txlog-plan-{b}-k3.arrows", f"txlog-plan-{a}-k4.arrows.tmp",
             "txlog-plan-test-123.arrows", "txlog-plan-q1w2e3r4.arrows"]
    assert plan_owner.lock_tokens(names) == {a: f"txlog-plans-{a}.lock",
                                             b: f"txlog-plans-{b}.making"}
    assert plan_owner.plans_of(a, names) == [f"txlog-plan-{a}-k1.arrows",
                                             f"txlog-plan-{a}-k2.arrows"]
    assert plan_owner.plans_of(b, names) == [f"txlog-plan-{b}-k3.arrows"]
