"""Request accounting (txlog.testing.timeline): the critical path read from request
intervals, an operation's window, and the wrapper's record of kinds and calling code."""

from __future__ import annotations

import txlog
from txlog.storage import MemoryStore
from txlog.testing.timeline import Request, TimelineStore, account, critical_chain, in_flight


def _r(kind: str, start: float, end: float, key: str = "k") -> Request:
    return Request(kind, key, start, end, "t", "", True)


def test_critical_chain_counts_waves_not_requests() -> None:
    # Eight uploads two at a time (four waves), then one decision: five round trips.
    uploads = [_r("put", w, w + 0.9, f"u{w}{i}") for w in range(4) for i in range(2)]
    decision = _r("put_if_absent", 4.0, 4.9)
    chain = critical_chain([*uploads, decision])
    assert len(chain) == 5
    assert chain[-1] == decision
    # Eight uploads at once, then the decision: two.
    assert len(critical_chain([_r("put", 0, 0.9, str(i)) for i in range(8)]
                              + [decision])) == 2
    # A request that starts before the previous one ended overlaps it: not sequential.
    assert len(critical_chain([_r("get", 0, 1.0), _r("get", 0.99, 2.0)])) == 1
    assert critical_chain([]) == []


def test_account_splits_the_window_from_background_work() -> None:
    reqs = [_r("get", -1.0, -0.1),           # before the operation
            _r("put", 0.0, 1.0),
            _r("put_if_absent", 1.0, 2.0),
            _r("put_if_absent", 1.9, 3.5),    # still running when it returned at 3.0
            _r("put_if_absent", 3.2, 4.0),    # after it returned (markers)
            _r("list", 5.0, 6.0)]             # past ``until``
    a = account(reqs, 0.0, 3.0, until=4.5)
    assert a.requests == {"put": 1, "put_if_absent": 2}
    assert a.sequential == 2
    assert a.sequential_by_kind == {"put": 1, "put_if_absent": 1}
    assert a.background == {"put_if_absent": 2}
    assert a.total == 3
    assert [r.kind for r in a.all] == ["put", "put_if_absent", "put_if_absent"]
    # From ``since``: an upload started before the call and still running counts, one
    # that was over before the call does not.
    early = [_r("put", -2.0, -1.5, "done"), _r("put", -0.5, 0.6, "running"),
             _r("put_if_absent", 0.7, 1.5)]
    b = account(early, 0.0, 2.0, since=-3.0)
    assert b.requests == {"put": 1, "put_if_absent": 1}
    assert [r.key for r in b.chain] == ["running", "k"]


def test_wrapper_records_kind_key_and_calling_code() -> None:
    log = txlog.connect("memory://timeline-wrapper")
    timeline = TimelineStore(log.store)
    log.store = timeline
    log.create_topic("t", 1)
    p = log.producer(transactional_id="tl")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"v")
    p.commit_transaction()
    p.close()
    reqs = timeline.requests()
    kinds = {r.kind for r in reqs}
    assert {"put_if_absent", "put"} <= kinds
    assert all(r.start <= r.end for r in reqs)
    assert timeline.wait_idle(quiet=0.0, timeout=10)
    topic = [r for r in reqs if r.key.startswith("topics/t/") and r.kind == "put_if_absent"]
    assert topic and all(r.site.startswith("txlog/") for r in topic), topic
    assert not any("txlog/storage/" in r.site for r in reqs)
    store = TimelineStore(MemoryStore("memory://timeline-kinds", "timeline-kinds"))
    store.put("a", b"1")
    assert store.get_range("a", 0, 1) == b"1"
    assert store.size("a") == 1
    store.delete("a")
    assert store.list("") == []
    assert [r.kind for r in store.requests()] == ["put", "get_range", "head", "delete",
                                                  "list"]


def test_in_flight_time_is_the_union_of_requests_clipped_to_the_call() -> None:
    reqs = [_r("put", -0.5, 0.5),             # began before the call: counts from 0
            _r("put_if_absent", 0.2, 1.0),    # overlaps the first: counts once
            _r("get", 2.0, 3.0),              # after a gap of 1.0 with nothing in flight
            _r("get", 3.5, 5.0)]              # runs past the call's end at 4.0
    assert in_flight(reqs, 0.0, 4.0) == 1.0 + 1.0 + 0.5
    assert in_flight([], 0.0, 4.0) == 0.0
    a = account(reqs, 0.0, 4.0)
    assert a.busy == in_flight(a.all, 0.0, 4.0)
