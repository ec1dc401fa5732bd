"""Spark as separate processes for the tests: ``spark-submit`` jobs, a standalone
cluster (one master, two workers) and a Spark Connect server, all from pyspark's own
scripts, bound to 127.0.0.1, each in its own process group and stopped by its pid
(SIGTERM, then SIGKILL) whatever the test did.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from txlog.testing.processes import kill_session
from txlog.testing.servers import HOST, _log_tail, _stop_process_group, free_ports

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "spark_job.py"
START_TIMEOUT = 180.0  # JVMs start slowly on a loaded 2-core machine
JOB_TIMEOUT = 420.0
CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def s3a_jars() -> list[Path]:
    """hadoop-aws and its AWS SDK, fetched into .jars/ at set-up (scripts/jars.txt)."""
    names = ("hadoop-aws-", "bundle-", "analyticsaccelerator-s3-")
    return sorted(p for p in (REPO / ".jars").glob("*.jar") if p.name.startswith(names))


def env() -> dict[str, str]:
    """The environment of every Spark process: this interpreter for Python (driver and
    workers), pyspark's own Spark, everything bound to loopback."""
    return dict(os.environ, SPARK_HOME=str(spark_home()), PYSPARK_PYTHON=sys.executable,
                PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP=HOST,
                PYTHONUNBUFFERED="1")


LOOPBACK = ["--conf", f"spark.driver.host={HOST}", "--conf", f"spark.driver.bindAddress={HOST}",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
            "--conf", "spark.driver.memory=512m",
            "--conf", f"spark.pyspark.python={sys.executable}",
            "--conf", "spark.python.authenticate.socketTimeout=120s"]


def _start(cmd: list[str], log: Path, *, daemon_memory: str = "256m",
           ) -> subprocess.Popen[bytes]:
    # The heap of master, workers and the Connect server (which Spark's launcher sizes
    # as a daemon, not with spark.driver.memory).
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, env=dict(env(), SPARK_DAEMON_MEMORY=daemon_memory),
                                stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def submit(args: list[str], workdir: Path, *, name: str = "job") -> dict[str, Any]:
    """Run ``spark-submit ARGS`` and return the job's ``RESULT`` (AssertionError with the
    log's tail when it fails)."""
    return run([str(spark_home() / "bin" / "spark-submit"), *LOOPBACK, *args], workdir,
               name=name)


def run(cmd: list[str], workdir: Path, *, name: str = "job") -> dict[str, Any]:
    """Run ``cmd`` (a job of spark_job.py) and return its ``RESULT``."""
    log = workdir / f"{name}.log"
    proc = _start(cmd, log)
    try:
        code = proc.wait(timeout=JOB_TIMEOUT)
    finally:
        _stop_process_group(proc)
    lines = log.read_text(errors="replace").splitlines()
    results = [line[len("RESULT "):] for line in lines if line.startswith("RESULT ")]
    assert code == 0 and results, f"{cmd[0]} exited {code}:\n{_log_tail(log, 60)}"
    return json.loads(results[-1])  # type: ignore[no-any-return]


def _wait(ready: Any, procs: list[subprocess.Popen[bytes]], logs: list[Path],
          what: str) -> None:
    """Poll ``ready()`` until true; fail early when a process has exited."""
    deadline = time.monotonic() + START_TIMEOUT
    while not ready():
        for p, log in zip(procs, logs, strict=True):
            if p.poll() is not None:
                cmd = list(cast(Sequence[str], p.args))[:3]
                raise RuntimeError(f"{what}: {cmd} exited {p.returncode}:\n" + _log_tail(log))
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready:\n" + "\n".join(_log_tail(x) for x in logs))
        time.sleep(0.2)  # polling interval of a bounded readiness loop


@dataclass
class Cluster:
    """A standalone master (``url``) with two one-core workers."""

    url: str
    web: str


@contextlib.contextmanager
def standalone(workdir: Path) -> Iterator[Cluster]:
    """A master and two workers from ``spark-class``, stopped by pid on exit."""
    port, web, w1, w2 = free_ports(4)
    spark_class = str(spark_home() / "bin" / "spark-class")
    procs: list[subprocess.Popen[bytes]] = []
    logs = [workdir / "master.log", workdir / "worker-1.log", workdir / "worker-2.log"]
    try:
        procs.append(_start([spark_class, "org.apache.spark.deploy.master.Master",
                             "--host", HOST, "--port", str(port), "--webui-port", str(web)],
                            logs[0]))
        for i, wport in enumerate((w1, w2), start=1):
            (workdir / f"work-{i}").mkdir()
            procs.append(_start([spark_class, "org.apache.spark.deploy.worker.Worker",
                                 f"spark://{HOST}:{port}", "--host", HOST,
                                 "--webui-port", str(wport), "--cores", "1",
                                 "--memory", "768m", "--work-dir", str(workdir / f"work-{i}")],
                                logs[i]))
        status = f"http://{HOST}:{web}/json/"

        def two_workers() -> bool:
            try:
                with urllib.request.urlopen(status, timeout=2) as r:
                    return int(json.load(r).get("aliveworkers", 0)) == 2
            except (urllib.error.URLError, OSError, ValueError):
                return False

        _wait(two_workers, procs, logs, "standalone cluster")
        yield Cluster(f"spark://{HOST}:{port}", status)
    finally:
        for p in reversed(procs):  # workers (and their executors) first
            _stop_process_group(p)


@contextlib.contextmanager
def connect_server(workdir: Path, *, jars: Sequence[Path] = ()) -> Iterator[str]:
    """A Spark Connect server (local[2]) on 127.0.0.1, given ``jars`` (``--jars``); yields
    its ``sc://`` URL. Its log (INFO, with the connector's) is ``connect.log``."""
    (port,) = free_ports(1)
    extra = ["--jars", ",".join(map(str, jars))] if jars else []
    cmd = [str(spark_home() / "bin" / "spark-submit"), *LOOPBACK, "--master", "local[2]", *extra,
           "--conf", f"spark.connect.grpc.binding.address={HOST}",
           "--conf", f"spark.connect.grpc.binding.port={port}",
           "--conf", "spark.sql.session.timeZone=UTC",
           "--class", CONNECT_SERVER, "spark-internal"]
    log = workdir / "connect.log"
    proc = _start(cmd, log, daemon_memory="768m")
    try:
        def listening() -> bool:
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex((HOST, port)) == 0

        _wait(listening, [proc], [log], "Spark Connect server")
        yield f"sc://{HOST}:{port}"
    finally:
        _stop_process_group(proc)


@dataclass
class Execution:
    """A SQL execution of an application's event log: its physical plans (the first and
    each adaptive re-plan) and the executors its jobs' tasks ran on."""

    plans: list[str]
    executors: set[str]


def event_log(events: Path) -> list[Execution]:
    """The SQL executions of the one application that logged to ``events``
    (``spark.eventLog.dir``, one uncompressed file), in the order they started."""
    (path,) = [p for p in events.iterdir() if p.is_file()]
    plans: dict[int, list[str]] = {}
    stages: dict[int, int] = {}  # stage id -> execution id
    executors: dict[int, set[str]] = {}
    for line in path.read_text().splitlines():
        e = json.loads(line)
        kind = e["Event"].rsplit(".", 1)[-1]
        if kind in ("SparkListenerSQLExecutionStart", "SparkListenerSQLAdaptiveExecutionUpdate"):
            plans.setdefault(e["executionId"], []).append(e["physicalPlanDescription"])
        elif kind == "SparkListenerJobStart":
            run = (e.get("Properties") or {}).get("spark.sql.execution.id")
            for stage in e["Stage IDs"]:
                if run is not None:
                    stages[stage] = int(run)
        elif kind == "SparkListenerTaskEnd" and e["Stage ID"] in stages:
            executors.setdefault(stages[e["Stage ID"]], set()).add(
                e["Task Info"]["Executor ID"])
    return [Execution(plans[i], executors.get(i, set())) for i in sorted(plans)]


class Child:
    """A test file (``script``) run as a script in its own session, optionally paused at
    a step of its own (``pause_at``, after ``skip`` passes; it then makes ``paused`` in
    its pause directory and waits).  Subclasses name their file as ``script``."""

    script: Path

    def __init__(self, tmp: Path, *args: str, pause_at: str | None = None, skip: int = 0,
                 env: dict[str, str] | None = None, script: Path | None = None) -> None:
        self.dir = tmp / f"pause-{time.monotonic_ns()}"
        e = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                 **(env or {}))
        if pause_at:
            e.update(TXLOG_TEST_PAUSE_DIR=str(self.dir), TXLOG_TEST_PAUSE_AT=pause_at,
                     TXLOG_TEST_PAUSE_SKIP=str(skip))
        self.log = tmp / f"child-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen(
            [sys.executable, str(script or self.script), *args], cwd=REPO, env=e,
            start_new_session=True, stdout=subprocess.PIPE,
            stderr=open(self.log, "w"), text=True)  # noqa: SIM115

    # Generous: a loaded 2-core machine starts a JVM in over a minute.
    def wait_for(self, ready: Any, what: str, timeout: float = 1200) -> None:
        """Until ``ready()``; fails if the child exits first (it never got there)."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"child exited ({self.proc.returncode}) before {what}:\n"
                                     + self.log.read_text()[-3000:])
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"child never reached {what}")
            time.sleep(0.01)  # polling interval of a bounded wait

    def wait_paused(self, timeout: float = 1200) -> None:
        self.wait_for((self.dir / "paused").exists, "its pause point", timeout)

    def kill(self) -> None:
        kill_session(self.proc.pid)
        self.proc.wait(timeout=60)
        # Nothing of the session may survive (a live commit worker could still finish).
        kill_session(self.proc.pid)

    def result(self, timeout: float = 1200) -> dict[str, Any]:
        """The child's last JSON line, once it exited 0 (AssertionError with its log's
        tail when it failed)."""
        out, _ = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            raise AssertionError(f"child failed ({self.proc.returncode}):\n"
                                 + self.log.read_text()[-4000:])
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else {}
