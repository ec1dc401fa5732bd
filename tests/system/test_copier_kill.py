"""Kafka's transactions system test, rebuilt: a copier SIGKILLed at random points many
times and restarted; the output equals the input, with no duplicates, per-partition order
kept, and a read_committed reader running alongside never sees an aborted or uncommitted
record."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import txlog
from txlog import TopicPartition

#: Kills processes (or runs many): outside the fast lane.
pytestmark = pytest.mark.slow

ROOT_DIR = Path(__file__).resolve().parents[2]
COPIER = str(ROOT_DIR / "scripts" / "copier.py")
SEED = 20261122
PARTS = 3
POINTS = ["after_data_append", "after_add_partitions", "after_prepare", "after_marker",
          "before_complete"]


def make_input(log: txlog.Log, rng: random.Random) -> dict[int, list[bytes]]:
    """Transactional input with some aborted transactions; returns the committed values."""
    log.create_topic("src", partitions=PARTS)
    log.create_topic("dst", partitions=PARTS)
    p = log.producer(transactional_id="input")
    p.init_transactions()
    committed: dict[int, list[bytes]] = {k: [] for k in range(PARTS)}
    n = 0
    for _ in range(60):
        p.begin_transaction()
        staged: dict[int, list[bytes]] = {k: [] for k in range(PARTS)}
        for _ in range(rng.randint(1, 12)):
            part = rng.randrange(PARTS)
            v = f"rec-{n:05d}".encode()
            n += 1
            p.send("src", v, partition=part)
            staged[part].append(v)
        p.flush()
        if rng.random() < 0.2:
            p.abort_transaction()
        else:
            p.commit_transaction()
            for k in range(PARTS):
                committed[k].extend(staged[k])
    return committed


class SideReader(threading.Thread):
    """Reads the sink with read_committed while the copier is being killed."""

    def __init__(self, root: str, valid: set[bytes]) -> None:
        super().__init__(daemon=True)
        self.log = txlog.connect(root)
        self.valid = valid
        self.stop = threading.Event()
        self.seen: dict[int, list[bytes]] = {k: [] for k in range(PARTS)}
        self.bad: list[bytes] = []

    def run(self) -> None:
        c = self.log.consumer(auto_offset_reset="earliest")
        c.subscribe(["dst"])
        while not self.stop.is_set():
            for r in c.poll(1000):
                if r.value not in self.valid:
                    self.bad.append(r.value)
                self.seen[r.partition].append(r.value)


def test_copier_killed_repeatedly_is_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"seed={SEED}")
    root = str(tmp_path)
    log = txlog.connect(root)
    committed = make_input(log, rng)
    expected = {k: [v.upper() for v in vs] for k, vs in committed.items()}
    total = sum(len(v) for v in expected.values())
    reader = SideReader(root, {v for vs in expected.values() for v in vs})
    reader.start()
    kills = runs = 0
    env = dict(os.environ)
    for _ in range(40):
        runs += 1
        point = rng.choice(POINTS)
        hit = rng.randint(1, 4)
        env["TXLOG_CRASH_AT"] = f"{point}:{hit}"
        proc = subprocess.run([sys.executable, COPIER, root, "src", "dst", "--group", "g",
                               "--batch", str(rng.randint(2, 8))],
                              env=env, capture_output=True, timeout=120)
        if proc.returncode == -9:
            kills += 1
            continue
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        break  # it ran to the end without reaching its crash point
    env.pop("TXLOG_CRASH_AT")
    final = subprocess.run([sys.executable, COPIER, root, "src", "dst", "--group", "g"],
                           env=env, capture_output=True, timeout=120)
    assert final.returncode == 0, final.stderr.decode()[-2000:]
    # Let the side reader catch up to the end, then stop it.
    check = txlog.connect(root)
    c = check.consumer(auto_offset_reset="earliest")
    c.subscribe(["dst"])
    out: dict[int, list[bytes]] = {k: [] for k in range(PARTS)}
    while got := c.poll(10_000):
        for r in got:
            out[r.partition].append(r.value)
    while sum(len(v) for v in reader.seen.values()) < total and reader.is_alive():
        reader.join(0.05)
    reader.stop.set()
    reader.join(10)
    dups = sum(len(v) - len(set(v)) for v in out.values())
    missing = sum(len(set(expected[k]) - set(out[k])) for k in range(PARTS))
    print(f"records={total} runs={runs} kills={kills} duplicates={dups} missing={missing} "
          f"side_reader_bad={len(reader.bad)}")
    assert kills >= 10
    assert out == expected  # equal per partition: nothing lost, nothing twice, order kept
    assert reader.bad == []
    assert reader.seen == expected
    g = check.consumer(group_id="g")
    tps = [TopicPartition("src", k) for k in range(PARTS)]
    ends = g.end_offsets(tps)
    assert g.committed(tps) == ends
