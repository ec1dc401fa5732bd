"""The latency proxy (txlog.testing.latency_proxy) in front of a real SeaweedFS server: it
delays every request by what its seeded model draws, forwards conditional creates
faithfully (an atomic create through it stays atomic), and the request timeline
(txlog.testing.timeline) reads sequential and parallel requests as such."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from txlog.storage import open_store
from txlog.testing.latency_proxy import LatencyModel, LatencyProxy, start_proxy_process
from txlog.testing.timeline import TimelineStore, account

pytestmark = pytest.mark.s3

SEED = 20261126


def _through(server: Any, proxy_endpoint: str) -> dict[str, Any]:
    opts = copy.deepcopy(server.storage_options)
    opts["client_kwargs"]["endpoint_url"] = proxy_endpoint
    return opts


@pytest.fixture
def proxied(seaweed: Any) -> Iterator[tuple[LatencyProxy, dict[str, Any]]]:
    model = LatencyModel(delay_ms=20, jitter_ms=10, tail_p=0.3, tail_ms=40, seed=SEED)
    print(f"latency model {model}")
    with LatencyProxy(seaweed.endpoint, model) as proxy:
        yield proxy, _through(seaweed, proxy.endpoint)


def test_every_request_waits_the_delay_its_model_draws(seaweed: Any, proxied: Any) -> None:
    proxy, opts = proxied
    store = TimelineStore(open_store(seaweed.fresh_url("lat"), opts))
    before = len(proxy.log())
    store.put("a/x", b"payload" * 10)
    assert store.put_if_absent("a/y", b"created once")
    assert store.get("a/x") == b"payload" * 10
    assert store.get_range("a/x", 2, 5) == b"ylo"
    assert store.list("a/") == ["a/x", "a/y"]
    assert store.size("a/y") == len(b"created once")
    store.delete("a/x")
    seen = proxy.log()[before:]
    # One HTTP request per store call, each of the kind the call is.
    assert [r.kind for r in seen] == ["put", "put_if_absent", "get", "get_range", "list",
                                      "head", "delete"]
    # The requests came one at a time, so they drew the model's sequence in order.
    reference = LatencyModel(delay_ms=20, jitter_ms=10, tail_p=0.3, tail_ms=40,
                             seed=SEED).generator()
    for _ in range(before):
        reference.draw_ms()
    expected = [reference.draw_ms() for _ in seen]
    assert [r.delay_ms for r in seen] == expected
    assert any(d > 30 for d in expected), "the seeded draws include a tail"
    for r, client_side in zip(seen, store.requests(), strict=True):
        assert r.forwarded - r.received >= r.delay_ms / 1000  # held back as drawn
        assert client_side.duration >= r.delay_ms / 1000  # and the caller waited for it


@pytest.mark.parametrize("client", ["obstore", "s3fs"])
def test_conditional_create_through_the_proxy_stays_atomic(seaweed: Any, proxied: Any,
                                                           client: str) -> None:
    proxy, opts = proxied
    opts = dict(opts, txlog_client=client)  # both S3 clients txlog uses, through the proxy
    url = seaweed.fresh_url("cas")
    first = open_store(url, opts)
    assert first.put_if_absent("k", b"writer one")
    assert not first.put_if_absent("k", b"writer two")
    assert open_store(url, seaweed.storage_options).get("k") == b"writer one"
    creates = [r for r in proxy.log() if r.kind == "put_if_absent" and r.path.endswith("/k")]
    assert [(r.if_none_match, r.status) for r in creates] == [("*", 200), ("*", 412)]

    # Racing writers, each with a client of its own, through the proxy: one wins per key.
    writers, keys = 6, 3
    stores = [open_store(url, opts) for _ in range(writers)]
    won: dict[str, list[int]] = {f"race/{k}": [] for k in range(keys)}
    start = threading.Barrier(writers)
    errors: list[BaseException] = []

    def race(i: int) -> None:
        try:
            start.wait()
            for key in won:
                if stores[i].put_if_absent(key, f"writer {i}".encode()):
                    won[key].append(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    direct = open_store(url, seaweed.storage_options)
    for key, winners in won.items():
        assert len(winners) == 1, (key, winners)
        assert direct.get(key) == f"writer {winners[0]}".encode()


def test_answers_are_not_held_back_by_nagles_algorithm(seaweed: Any, proxied: Any) -> None:
    # An answer's headers and body go out as two writes: with Nagle's algorithm on, the
    # body waited for the client's delayed ACK (40 ms on Linux), so a GET cost the delay
    # plus 40 ms whenever the client's TCP stack was not in quick-ACK mode, a cost of the
    # proxy and not of the store it models.
    proxy, opts = proxied
    store = open_store(seaweed.fresh_url("nodelay"), opts)
    before = len(proxy.log())
    store.put("k", b"v" * 1400)
    for _ in range(3):
        assert store.get("k") == b"v" * 1400
    seen = proxy.log()[before:]
    assert [r.kind for r in seen] == ["put", "get", "get", "get"]
    assert all(r.nodelay for r in seen), seen


def test_timeline_counts_parallel_requests_once_and_sequential_ones_each(
        seaweed: Any) -> None:
    # A long delay, so that requests sent together overlap whatever the machine's load.
    with LatencyProxy(seaweed.endpoint, LatencyModel(delay_ms=300, seed=SEED)) as proxy:
        store = TimelineStore(open_store(seaweed.fresh_url("tl"), _through(seaweed,
                                                                          proxy.endpoint)))
        store.put("warm", b"w")  # the client's connection set-up stays out of the window
        t0 = store.requests()[-1].end
        store.put("one", b"1")
        store.put("two", b"2")
        t1 = store.requests()[-1].end
        sequential = account(store.requests(), t0, t1)
        assert sequential.requests == {"put": 2}
        assert sequential.sequential == 2

        go = threading.Barrier(3)

        def put(key: str) -> None:
            go.wait()
            store.put(key, b"p")

        threads = [threading.Thread(target=put, args=(f"p{i}",)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        t2 = max(r.end for r in store.requests())
        parallel = account(store.requests(), t1, t2)
        assert parallel.requests == {"put": 3}
        assert parallel.sequential == 1


def test_proxy_in_a_process_of_its_own_serves_and_reports(seaweed: Any) -> None:
    proc = start_proxy_process(seaweed.endpoint, LatencyModel(delay_ms=5, seed=SEED))
    try:
        store = open_store(seaweed.fresh_url("proc"), _through(seaweed, proc.endpoint))
        assert store.put_if_absent("x", b"1")
        assert not store.put_if_absent("x", b"2")
        assert store.get("x") == b"1"
        stats = proc.stats()
        assert stats["requests"]["put_if_absent"] == 2
        assert stats["statuses"]["412"] == 1
        assert stats["model"]["seed"] == SEED
    finally:
        proc.stop()
    assert proc.process.poll() is not None
