"""Zombies outlive the expiry of their producer's state.

A producer process is stopped (SIGSTOP, at a named crash point) in the middle of its
protocol; meanwhile others finish what it left, ``txlog maintain`` runs far enough in the
future to expire its producer id's state in every partition and its transactional.id,
and then the process is woken up (SIGCONT).  What it does next must change nothing
visible: an epoch that ended stays fenced after its producer state is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import txlog
from txlog import TopicPartition
from txlog.maintenance import maintain
from txlog.records import now_ms

#: Kills processes: outside the fast lane.
pytestmark = pytest.mark.slow

CHILD = str(Path(__file__).with_name("zombie_child.py"))
EXPIRY_MS = 60_000
TPS = [TopicPartition("a", 0), TopicPartition("a", 1)]


def start_stopped(root: str, mode: str, stop_at: str) -> subprocess.Popen[bytes]:
    """Start the child and return once it has stopped itself at ``stop_at``."""
    env = dict(os.environ)
    env.pop("TXLOG_CRASH_AT", None)
    env["TXLOG_STOP_AT"] = stop_at
    proc = subprocess.Popen([sys.executable, CHILD, root, "z", mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), f"child ended before {stop_at}: {proc.communicate()}"
    except BaseException:
        proc.kill()
        raise
    return proc


def wake(proc: subprocess.Popen[bytes]) -> str:
    os.kill(proc.pid, signal.SIGCONT)
    try:
        out, err = proc.communicate(timeout=120)
    except BaseException:
        proc.kill()
        raise
    assert proc.returncode == 0, err.decode()
    return out.decode().strip()


def values(root: str) -> list[bytes]:
    c = txlog.connect(root).consumer(auto_offset_reset="earliest")
    c.assign(TPS)
    got: list[bytes] = []
    while batch := c.poll(max_records=1000, timeout_ms=0):
        got.extend(r.value for r in batch)
    c.close()
    return sorted(got)


def expire_everything(root: str) -> None:
    lg = txlog.connect(root, producer_id_expiration_ms=EXPIRY_MS,
                       transactional_id_expiration_ms=EXPIRY_MS)
    report = maintain(lg, compact=False, now=now_ms() + 10 * EXPIRY_MS)
    assert not report.failures, report.failures
    assert sum(p.expired_producers for p in report.partitions) >= 2
    assert report.expired_transactional_ids == ["z"]


def test_commit_rolled_forward_by_a_zombie_after_expiry_appends_nothing_twice(
        tmp_path: Path) -> None:
    """The producer stops right after its PrepareCommit is durable; a reader's sweep
    rolls the commit forward (its COMMIT markers append the batches), maintenance expires
    the producer everywhere; then the producer wakes and rolls its commit forward too."""
    root = str(tmp_path)
    txlog.connect(root).create_topic("a", partitions=2)
    proc = start_stopped(root, "commit", "after_decision")
    try:
        swept = maintain(txlog.connect(root), compact=False)
        assert swept.swept_transactions == ["z"]
        assert values(root) == [b"z0", b"z1", b"z2", b"z3"]
        expire_everything(root)
    finally:
        out = wake(proc)
    assert out == "ok"  # its commit was decided: it did commit
    assert values(root) == [b"z0", b"z1", b"z2", b"z3"]


def test_zombie_of_an_expired_transactional_id_stays_fenced(tmp_path: Path) -> None:
    """The producer stops in the middle of a transaction; a newer instance fences it,
    commits and goes idle; the transactional.id and every producer state expire; a third
    instance starts afresh.  The zombie then wakes and writes on: it is fenced, and
    nothing of it is ever visible or holds a partition's LSO."""
    root = str(tmp_path)
    txlog.connect(root).create_topic("a", partitions=2)
    proc = start_stopped(root, "write", "after_data_append")
    try:
        lg = txlog.connect(root)
        newer = lg.producer(transactional_id="z")
        newer.init_transactions()
        newer.begin_transaction()
        newer.send("a", b"newer", partition=0)
        newer.commit_transaction()
        newer.close()
        expire_everything(root)
        third = txlog.connect(root).producer(transactional_id="z")
        third.init_transactions()
        third.close()
    finally:
        out = wake(proc)
    assert out == "ProducerFencedError"
    assert values(root) == [b"newer"]
    lg = txlog.connect(root)
    c = lg.consumer()
    for tp in TPS:
        assert c.last_stable_offset(tp) == lg.partition_log(tp).refresh().high_watermark
