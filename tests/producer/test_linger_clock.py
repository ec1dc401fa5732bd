"""linger.ms is measured on the monotonic clock: a wall clock that jumps (NTP, a VM
resumed, an operator) neither sends a batch early nor holds it back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import txlog
from txlog import TopicPartition

HOUR_NS = 3600 * 10**9
TP = TopicPartition("a", 0)


def _jump(monkeypatch: pytest.MonkeyPatch, by_ns: int) -> None:
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + by_ns)
    monkeypatch.setattr(time, "time", lambda: (real() + by_ns) / 1e9)


def test_a_wall_clock_jumping_ahead_does_not_end_linger(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    log = txlog.connect(str(tmp_path))
    log.create_topic("a")
    p = log.producer(linger_ms=600_000)
    p.send("a", b"1", partition=0)
    _jump(monkeypatch, HOUR_NS)
    p.send("a", b"2", partition=0)
    # Still lingering: the batch was neither queued nor written.
    assert TP in p._pending and p._pending[TP].count() == 2
    assert log.partition_log(TP).refresh().high_watermark == 0
    p.close()
    assert log.partition_log(TP).refresh().high_watermark == 2


def test_a_wall_clock_jumping_back_does_not_hold_a_batch(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    log = txlog.connect(str(tmp_path))
    log.create_topic("a")
    p = log.producer(linger_ms=1000)
    pending = p.send("a", b"1", partition=0)
    _jump(monkeypatch, -HOUR_NS)  # while it lingers
    # linger.ms after its first record the batch goes, whatever the wall clock says.
    assert pending.get(timeout=60).offset == 0
    p.close()
