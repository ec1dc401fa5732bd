"""The requests the JVM connector's planner sends to S3 for a query: a counting proxy
(txlog.testing.latency_proxy, no delay) between txlog's client and SeaweedFS on
127.0.0.1, and the planner's requests answered as the JVM would send them."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

import txlog
from spark_ext import jvm_plan, options, plan_file
from txlog import layout
from txlog.testing.latency_proxy import LatencyProxy
from txlog.testing.servers import SeaweedServer

pytestmark = pytest.mark.s3


@pytest.fixture
def proxy(seaweed: SeaweedServer) -> Iterator[LatencyProxy]:
    with LatencyProxy(seaweed.endpoint) as p:
        yield p


def write_topic(url: str, opts: dict[str, Any], seed: int, partitions: int = 3) -> int:
    """A topic ``t`` of a few transactions over ``partitions`` partitions, some aborted;
    returns how many batch objects were committed."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    log = txlog.connect(url, opts)
    log.create_topic("t", partitions=partitions)
    p = log.producer(transactional_id=f"req-{seed}")
    p.init_transactions()
    committed = 0
    for _ in range(rng.randint(3, 6)):
        p.begin_transaction()
        parts = rng.sample(range(partitions), rng.randint(1, partitions))
        for part in parts:
            p.send("t", b"v", partition=part)
        p.flush()
        if rng.random() < 0.3:
            p.abort_transaction()
        else:
            p.commit_transaction()
            committed += 1  # an object of its one partition, or one shared by them all
    return committed


def through(proxy: LatencyProxy, opts: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(opts))
    out["client_kwargs"]["endpoint_url"] = proxy.endpoint
    return out


def query(proxy: LatencyProxy, url: str, opts: dict[str, Any]) -> tuple[int, int]:
    """One query as the JVM plans it (its schema, then its scan): the GETs of the topic's
    metadata it sent, and the batch objects planned."""
    req = {"path": url, "topic": "t", "storage_options": json.dumps(opts)}
    first = len(proxy.log())
    for op in ("schema", "scan"):
        answer = jvm_plan.answer({"op": op, "options": req,
                                  "planFormat": plan_file.PLAN_VERSION})
        assert "error" not in answer, answer
    meta = layout.topic_meta("t")
    gets = sum(1 for r in proxy.log()[first:]
               if r.method == "GET" and r.path.split("?")[0].endswith(meta))
    return gets, int(answer["objects"])


def test_a_query_reads_the_topic_metadata_once(seaweed: SeaweedServer, proxy: LatencyProxy,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # However long the machine takes between the two requests.
    monkeypatch.setattr(options, "TOPIC_CHECK_REUSE_SECONDS", 3600.0)
    url = seaweed.fresh_url("reqs")
    committed = write_topic(url, seaweed.storage_options, seed=41)
    opts = through(proxy, seaweed.storage_options)
    # Cold (the planner's first Log for the root), then warm.
    assert [query(proxy, url, opts) for _ in range(3)] == [(1, committed)] * 3


def test_a_scan_long_after_the_check_checks_again(seaweed: SeaweedServer,
                                                  proxy: LatencyProxy,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options, "TOPIC_CHECK_REUSE_SECONDS", 0.0)
    url = seaweed.fresh_url("reqs")
    committed = write_topic(url, seaweed.storage_options, seed=42)
    opts = through(proxy, seaweed.storage_options)
    query(proxy, url, opts)
    assert query(proxy, url, opts) == (2, committed)


def test_a_topic_recreated_between_queries_is_planned_afresh(
        seaweed: SeaweedServer, proxy: LatencyProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options, "TOPIC_CHECK_REUSE_SECONDS", 3600.0)
    url = seaweed.fresh_url("reqs")
    before = write_topic(url, seaweed.storage_options, seed=43)
    opts = through(proxy, seaweed.storage_options)
    assert query(proxy, url, opts)[1] == before
    txlog.connect(url, seaweed.storage_options).delete_topic("t")
    after = write_topic(url, seaweed.storage_options, seed=44, partitions=2)
    assert query(proxy, url, opts)[1] == after
