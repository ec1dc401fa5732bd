"""A short torture run (scripts/torture.py's harness) as part of the suite, and the
fault-injecting store it runs on.

The run: a few histories with fixed seeds on the local store, each with concurrent client
processes (transactional producers, read_committed and read_uncommitted consumers,
consume-transform-produce, a sweeper), SIGKILLs, zombies, timeouts and injected store
faults; the checker must find no anomaly.  Replay a failing seed with
``scripts/torture.py --histories 1 --seed SEED --keep``.
"""

from __future__ import annotations

import pickle
import time
import uuid
from pathlib import Path

import pytest

from txlog.errors import ConfigError, StorageError
from txlog.storage import open_store
from txlog.testing import checker
from txlog.testing.faults import (
    FaultRates,
    FaultyStore,
    InjectedStorageError,
    InjectedTimeout,
)
from txlog.testing.harness import HistoryConfig, run_history
from txlog.testing.harness.history import load_events

#: Fixed seeds of the short run (printed with every failure).
SEEDS = [1001, 1002, 1003]


# -- the short run ---------------------------------------------------------------------------


@pytest.mark.slow
def test_short_torture_run_has_no_anomalies(tmp_path: Path) -> None:
    totals = {"ops": 0, "txns_committed": 0, "kills": 0, "polls": 0, "faults": 0}
    failures = []
    kept = None
    for seed in SEEDS:
        cfg = HistoryConfig(seed=seed, workdir=tmp_path, duration=3.0,
                            keep=seed == SEEDS[0])
        res = run_history(cfg)
        print(f"seed {seed}: {res.stats['ops']} ops, {res.stats['txn_outcomes']}, kills "
              f"{res.stats['kills']}, faults {res.stats['injected']}, {res.elapsed:.1f} s")
        for k in ("ops", "txns_committed", "kills", "polls"):
            totals[k] += res.stats[k]
        totals["faults"] += sum(res.stats["injected"].values())
        if not res.valid:
            failures.append(
                f"seed {seed} ({res.directory}): "
                + "; ".join(f"{a.kind}: {a.detail[:200]}" for a in res.anomalies[:5]))
        if seed == SEEDS[0]:
            kept = res.directory
    assert not failures, "anomalies (replay: scripts/torture.py --histories 1 --seed SEED):\n" \
        + "\n".join(failures)
    # The run did exercise what it is meant to (loose bounds: the machine may be busy).
    assert totals["txns_committed"] > 5, totals
    assert totals["polls"] > 20, totals
    assert totals["kills"] > 0, totals
    assert totals["faults"] > 0, totals
    assert kept is not None
    _checker_sees_tampering(kept)


def _checker_sees_tampering(directory: Path) -> None:
    """End-to-end canary: drop one committed value from the recorded final read of a real
    history and the checker reports it."""
    ops = checker.pair_events(load_events(directory))
    assert checker.check(ops).valid
    final = next(o for o in ops if o.f == "final_read"
                 and o.value["isolation"] == "read_committed")
    acked = {v for o in ops if o.f == "txn" and o.outcome == checker.OK
             for _, _, v in o.value.get("sends", ()) if not v.startswith("ofs|")}
    victim = next(r for r in final.value["records"] if r[3] in acked)
    final.value["records"].remove(victim)
    kinds = checker.check(ops).counts()
    assert kinds[checker.LOST_WRITE] == 1, kinds


# -- the fault-injecting store ------------------------------------------------------------------


def _store(**kw: object) -> FaultyStore:
    inner = open_store(f"memory://faults/{uuid.uuid4().hex}")
    return FaultyStore(inner, **kw)  # type: ignore[arg-type]


def test_error_before_has_no_effect() -> None:
    s = _store(seed=1, rates={"put_if_absent": FaultRates(error_before=1.0)})
    with pytest.raises(InjectedStorageError, match="before it was sent"):
        s.put_if_absent("a/b", b"x")
    assert not s.inner.exists("a/b")
    assert s.injected["put_if_absent.error_before"] == 1
    s.put("a/c", b"y")  # other kinds: no faults
    assert s.get("a/c") == b"y"


def test_error_after_took_effect() -> None:
    s = _store(seed=1, rates={"put_if_absent": FaultRates(error_after=1.0)})
    with pytest.raises(StorageError, match="after it took effect"):
        s.put_if_absent("a/b", b"x")
    assert s.inner.get("a/b") == b"x"  # the create won, but the caller was told it failed
    with s.paused():
        assert s.put_if_absent("a/b", b"y") is False


def test_lost_response_takes_effect_and_waits() -> None:
    s = _store(seed=1, rates={"put": FaultRates(lost_response=1.0)}, lost_response_ms=30,
               error_style="os")
    t0 = time.monotonic()
    with pytest.raises(InjectedTimeout, match="no response"):
        s.put("k", b"v")
    assert time.monotonic() - t0 >= 0.025
    assert s.inner.get("k") == b"v"
    assert isinstance(InjectedTimeout("x"), OSError)


def test_latency_and_counts() -> None:
    s = _store(seed=3, rates={"*": FaultRates(latency=1.0, latency_ms=2)})
    for i in range(5):
        s.put(f"k{i}", b"v")
    assert s.list("") == [f"k{i}" for i in range(5)]
    assert s.injected_by_kind()["latency"] == 6
    assert s.requests["put"] == 5 and s.requests["list"] == 1
    assert s.counter is s.inner.counter and s.backend == "memory"


def test_seeded_faults_are_deterministic() -> None:
    def pattern(seed: int, stream: str = "") -> list[bool]:
        s = _store(seed=seed, stream=stream, rates=FaultRates(error_before=0.3))
        out = []
        for i in range(200):
            try:
                s.put(f"k{i}", b"v")
                out.append(True)
            except InjectedStorageError:
                out.append(False)
        return out

    a = pattern(7)
    assert a == pattern(7)
    assert a != pattern(8)
    assert a != pattern(7, "other-process")
    assert 20 < a.count(False) < 100


def test_picklable_and_paused() -> None:
    s = _store(seed=5, rates=FaultRates(error_before=1.0), error_style="mixed")
    s2 = pickle.loads(pickle.dumps(s))
    assert isinstance(s2, FaultyStore) and s2.seed == 5 and s2.rates == s.rates
    with pytest.raises((InjectedStorageError, InjectedTimeout)):
        s2.get("missing")
    with s2.paused(), pytest.raises(KeyError):
        s2.get("missing")  # the real answer: not found
    assert s2.enabled


def test_scripted_faults() -> None:
    s = _store(seed=0)
    s.script("get", "topics/a/", "error_before", times=2)
    s.put("topics/a/x", b"1")
    s.put("topics/b/x", b"2")
    assert s.get("topics/b/x") == b"2"
    for _ in range(2):
        with pytest.raises(InjectedStorageError):
            s.get("topics/a/x")
    assert s.get("topics/a/x") == b"1"
    with pytest.raises(ConfigError):
        s.script("nope")
    with pytest.raises(ConfigError):
        s.script("get", fault="latency")


@pytest.mark.parametrize("bad", [
    {"error_before": -0.1}, {"error_after": 1.5}, {"latency": "often"},
    {"error_before": 0.6, "error_after": 0.6}])
def test_bad_fault_rates(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        FaultRates(**bad)  # type: ignore[arg-type]


def test_bad_fault_config() -> None:
    inner = open_store(f"memory://faults/{uuid.uuid4().hex}")
    with pytest.raises(ConfigError, match="bogus"):
        FaultyStore(inner, rates={"bogus": FaultRates()})
    with pytest.raises(ConfigError, match="error_style"):
        FaultyStore(inner, error_style="loud")


def test_worker_records_a_commit_whose_offset_is_unknown_as_committed() -> None:
    """After a commit, a future may say its batch committed but its offset is unknown
    (the read that finds it failed): the harness records the transaction as committed
    (its value is still checked for loss), with no offset for that value, instead of
    crashing the client as if txlog had raised an unexpected error."""
    from txlog.errors import TxlogError
    from txlog.testing.harness.worker import Worker

    class Done:
        partition, offset = 0, 7

        def get(self) -> Done:
            return self

    class Unknown:
        def get(self) -> None:
            raise TxlogError("the batch committed, but its offset in a-0 is unknown")

    got = Worker.acks([("a", "v1", Done()), ("a", "v2", Unknown())])
    assert got["acks"] == [["a", 0, 7, "v1"]]
    assert got["offsets_unknown"] == [
        "v2: the batch committed, but its offset in a-0 is unknown"]
    assert "offsets_unknown" not in Worker.acks([("a", "v1", Done())])
