"""log.metrics(): requests and bytes, transaction latency, open transactions, LSO lag."""

from __future__ import annotations

import uuid

import txlog
from txlog.metrics import Timings


def test_metrics_counters_latency_and_lso_lag() -> None:
    log = txlog.connect(f"memory://metrics-tests/{uuid.uuid4().hex}")
    log.create_topic("m", partitions=2)
    p = log.producer(transactional_id="m1")
    p.init_transactions()
    for commit in (True, True, False):
        p.begin_transaction()
        p.send("m", b"x" * 100, partition=0)
        p.flush()
        if commit:
            p.commit_transaction()
        else:
            p.abort_transaction()
    # A transaction left open holds o-1's LSO back.
    q = txlog.connect(log.url).producer(transactional_id="m2")
    q.init_transactions()
    q.begin_transaction()
    q.send("m", b"pending", partition=1)
    q.flush()

    m = log.metrics()
    assert m["store"]["requests"]["put_if_absent"] > 0
    assert m["store"]["bytes"]["put"] > 300  # three data objects
    assert m["store"]["requests_total"] == sum(m["store"]["requests"].values())
    tx = m["transactions"]
    assert tx["commit"]["count"] == 2 and tx["abort"]["count"] == 1
    assert 0 < tx["commit"]["mean_ms"] <= tx["commit"]["max_ms"]
    assert set(m["partitions"]) == {"m-0"}  # only what this Log has opened so far

    # Cached view: no requests.
    before = log.store.counter.total()
    log.metrics()
    assert log.store.counter.total() == before

    fresh = log.metrics(refresh=True)
    assert fresh["open_transactions"] == 1
    assert fresh["partitions"]["m-1"]["lso_lag"] == 1
    assert fresh["partitions"]["m-1"]["open_transactions"] == 1
    assert fresh["partitions"]["m-0"]["lso_lag"] == 0
    assert fresh["transaction_states"] == {"CompleteAbort": 1, "Ongoing": 1}
    only = log.metrics(topics=["m"])
    assert set(only["partitions"]) == {"m-0", "m-1"}
    q.commit_transaction()
    assert log.metrics(refresh=True)["partitions"]["m-1"]["lso_lag"] == 0


def test_timings_percentiles() -> None:
    t = Timings()
    for ms in range(1, 101):
        t.record("commit", float(ms))
    s = t.snapshot()["commit"]
    assert (s["count"], s["max_ms"], s["last_ms"]) == (100, 100.0, 100.0)
    assert s["p50_ms"] in (50.0, 51.0) and s["p99_ms"] >= 99.0 and s["mean_ms"] == 50.5
    t.reset()
    assert t.snapshot() == {}
