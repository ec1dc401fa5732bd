"""The producer writes a step's batches of several partitions of a topic as one shared
object (batch.objects.shared, the default): one put instead of one per partition, each
partition's entry naming its rows, and every partition reads back exactly its records,
committed, aborted or without a transaction; false keeps one object per partition.  A
consumer reading several of the object's partitions in one poll fetches it once."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import txlog
from txlog import TopicPartition, inline_copies, layout
from txlog.model import SHARED_PART_LEN, SHARED_VERSION
from txlog.testing.timeline import TimelineStore

PARTITIONS = 8
SEED = 6464


@pytest.fixture(autouse=True)
def _no_kept_copies() -> None:
    inline_copies.clear()


def _log(tmp_path: Path, *, remote: bool = False) -> tuple[txlog.Log, TimelineStore]:
    lg = txlog.connect(str(tmp_path))
    timeline = TimelineStore(lg.store)
    lg.store = timeline
    if remote:  # the producer writes side by side, as to a remote store
        timeline.local_requests = False
    lg.create_topic("t", partitions=PARTITIONS)
    return lg, timeline


def _object_puts(timeline: TimelineStore) -> dict[str, list[str]]:
    puts = [r.key for r in timeline.requests() if r.kind == "put"]
    return {"data": [k for k in puts if "/data/" in k],
            "shared": [k for k in puts if "/_shared/" in k]}


def _values(seed: int) -> dict[int, list[bytes]]:
    rng = random.Random(seed)
    print(f"seed {seed}")
    return {p: [b"%d-%d-" % (p, i) + rng.randbytes(rng.randint(0, 40))
                for i in range(rng.randint(1, 6))] for p in range(PARTITIONS)}


def _read(lg: txlog.Log, partition: int, isolation: str) -> list[Any]:
    c = txlog.connect(lg.url).consumer(isolation_level=isolation,
                                       auto_offset_reset="earliest")
    c.assign([TopicPartition("t", partition)])
    out: list[Any] = []
    while got := c.poll(timeout_ms=0):
        out += got
    return out


def _entries(lg: txlog.Log, partition: int) -> list[dict[str, Any]]:
    return [json.loads(lg.store.get(k))
            for k in lg.store.list(layout.log_prefix("t", partition))]


def _check_each_partition(lg: txlog.Log, want: dict[int, list[bytes]], *,
                          committed: bool) -> None:
    for p, values in want.items():
        got = _read(lg, p, "read_uncommitted")
        assert [r.value for r in got] == values, p
        assert [r.partition for r in got] == [p] * len(values)
        seen = [r.value for r in _read(lg, p, "read_committed")]
        assert seen == (values if committed else []), p


@pytest.mark.parametrize("inline", [True, False], ids=["decided-beside", "decided-after"])
@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote-like"])
def test_a_transaction_over_8_partitions_writes_one_object_and_each_reads_its_own(
        tmp_path: Path, inline: bool, remote: bool) -> None:
    lg, timeline = _log(tmp_path, remote=remote)
    want = _values(SEED)
    p = lg.producer(transactional_id="tx", **{
        "linger.ms": 600_000, "commit.inline.bytes": 65_536 if inline else 0})
    p.init_transactions()
    p.begin_transaction()
    futures = {q: [p.send("t", v, partition=q) for v in vs] for q, vs in want.items()}
    p.commit_transaction()
    p.close()
    puts = _object_puts(timeline)
    assert puts["data"] == [] and len(puts["shared"]) == 1
    (key,) = puts["shared"]
    assert lg.store.list("topics/t/_shared/") == [key]
    for q in range(PARTITIONS):
        assert [f.get().offset for f in futures[q]] == list(range(len(want[q])))
        marker = _entries(lg, q)[-1]
        assert marker["kind"] == "commit" and marker["v"] == SHARED_VERSION
        (part,) = marker["extra"]["parts"]
        assert len(part) == SHARED_PART_LEN and part[0] == key and part[1] == len(want[q])
        assert "inline" not in marker  # entries never carry a shared object
    _check_each_partition(lg, want, committed=True)


def test_an_aborted_transaction_over_shared_objects_stays_invisible(tmp_path: Path) -> None:
    lg, timeline = _log(tmp_path)
    want = _values(SEED + 1)
    p = lg.producer(transactional_id="tx", **{"linger.ms": 600_000})
    p.init_transactions()
    p.begin_transaction()
    for q, vs in want.items():
        for v in vs:
            p.send("t", v, partition=q)
    p.flush()  # DATA entries name the shared object's rows before the abort
    p.abort_transaction()
    p.close()
    assert len(_object_puts(timeline)["shared"]) == 1
    for q in range(PARTITIONS):
        kinds = [e["kind"] for e in _entries(lg, q)]
        assert kinds == ["data", "abort"], kinds
    _check_each_partition(lg, want, committed=False)


def test_an_idempotent_producer_shares_objects_too(tmp_path: Path) -> None:
    lg, timeline = _log(tmp_path)
    want = _values(SEED + 2)
    p = lg.producer(linger_ms=600_000)  # no transaction: DATA entries
    futures = {q: [p.send("t", v, partition=q) for v in vs] for q, vs in want.items()}
    p.flush()
    p.close()
    assert len(_object_puts(timeline)["shared"]) == 1 and not _object_puts(timeline)["data"]
    for q in range(PARTITIONS):
        (entry,) = _entries(lg, q)
        assert entry["kind"] == "data" and entry["v"] == SHARED_VERSION
        assert entry["base_sequence"] == 0 and "inline" not in entry
        assert [f.get().offset for f in futures[q]] == list(range(len(want[q])))
    _check_each_partition(lg, want, committed=True)


def test_a_typed_topic_shares_objects_and_keeps_its_types(tmp_path: Path) -> None:
    lg, timeline = _log(tmp_path)
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()),
                        ("score", pa.float32())])
    lg.create_topic("typed", partitions=3, schema=schema)
    p = lg.producer(transactional_id="typed", **{"linger.ms": 600_000})
    p.init_transactions()
    p.begin_transaction()
    for q in range(3):
        p.send_batch("typed", pa.table({"id": [q * 10, q * 10 + 1], "name": [f"n{q}", None],
                                        "score": pa.array([q, 0.5], pa.float32())}),
                     partition=q)
    p.commit_transaction()
    p.close()
    assert len([k for k in _object_puts(timeline)["shared"] if "/typed/" in k]) == 1
    for q in range(3):
        c = lg.consumer(auto_offset_reset="earliest")
        c.assign([TopicPartition("typed", q)])
        t = c.poll_arrow(timeout_ms=0)
        assert t.schema.field("score").type == pa.float32()
        assert t.column("offset").to_pylist() == [0, 1]
        assert [(r["id"], r["name"], r["score"]) for r in t.to_pylist()] == [
            (q * 10, f"n{q}", float(q)), (q * 10 + 1, None, 0.5)]


def test_several_topics_in_one_step_write_one_object_each(tmp_path: Path) -> None:
    lg, timeline = _log(tmp_path)
    lg.create_topic("u", partitions=3)
    lg.create_topic("single", partitions=2)
    p = lg.producer(transactional_id="tx", **{"linger.ms": 600_000})
    p.init_transactions()
    p.begin_transaction()
    for q in range(3):
        p.send("t", b"t%d" % q, partition=q)
        p.send("u", b"u%d" % q, partition=q)
    p.send("single", b"alone", partition=1)  # one partition of its topic: its own object
    p.commit_transaction()
    p.close()
    puts = _object_puts(timeline)
    assert sorted(k.split("/")[1] for k in puts["shared"]) == ["t", "u"]
    assert [k.split("/")[1:3] for k in puts["data"]] == [["single", "1"]]
    for topic in ("t", "u"):
        for q in range(3):
            c = lg.consumer(auto_offset_reset="earliest")
            c.assign([TopicPartition(topic, q)])
            assert [r.value for r in c.poll(timeout_ms=0)] == [b"%s%d" % (topic.encode(), q)]


def test_shared_objects_off_keeps_one_object_per_partition(tmp_path: Path) -> None:
    lg, timeline = _log(tmp_path)
    want = _values(SEED + 3)
    p = lg.producer(transactional_id="tx", **{"linger.ms": 600_000,
                                              "batch.objects.shared": False})
    p.init_transactions()
    p.begin_transaction()
    for q, vs in want.items():
        for v in vs:
            p.send("t", v, partition=q)
    p.commit_transaction()
    p.close()
    puts = _object_puts(timeline)
    assert puts["shared"] == [] and len(puts["data"]) == PARTITIONS
    assert all(e["v"] < SHARED_VERSION for q in range(PARTITIONS) for e in _entries(lg, q))
    _check_each_partition(lg, want, committed=True)


def test_a_transaction_of_several_steps_shares_an_object_per_step(tmp_path: Path) -> None:
    lg, timeline = _log(tmp_path)
    rng = random.Random(SEED + 4)
    print(f"seed {SEED + 4}")
    want: dict[int, list[bytes]] = {q: [] for q in range(PARTITIONS)}
    p = lg.producer(transactional_id="tx", **{"linger.ms": 600_000})
    p.init_transactions()
    p.begin_transaction()
    for step in range(3):
        for q in rng.sample(range(PARTITIONS), 5):
            v = b"%d-%d" % (step, q)
            want[q].append(v)
            p.send("t", v, partition=q)
        p.flush()
    p.commit_transaction()
    p.close()
    assert len(_object_puts(timeline)["shared"]) == 3
    _check_each_partition(lg, {q: vs for q, vs in want.items()}, committed=True)


def test_a_consumer_fetches_a_shared_object_once_for_its_partitions_in_a_poll(
        tmp_path: Path) -> None:
    lg, _ = _log(tmp_path)
    want = _values(SEED + 5)
    p = lg.producer(transactional_id="tx", **{"linger.ms": 600_000,
                                              "inline.batch.bytes": 0})
    p.init_transactions()
    p.begin_transaction()
    for q, vs in want.items():
        for v in vs:
            p.send("t", v, partition=q)
    p.commit_transaction()
    p.close()
    reader = txlog.connect(lg.url)
    timeline = TimelineStore(reader.store)
    reader.store = timeline
    c = reader.consumer(auto_offset_reset="earliest")
    c.assign([TopicPartition("t", q) for q in range(PARTITIONS)])
    got = c.poll(timeout_ms=0)
    assert sorted(r.value for r in got) == sorted(v for vs in want.values() for v in vs)
    gets = [r.key for r in timeline.requests() if r.kind == "get" and "/_shared/" in r.key]
    assert len(gets) == 1


def test_a_failed_append_never_deletes_a_shared_object_another_partition_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The appends of a step's entries go partition by partition: when one fails, the
    objects of the partitions after it were never named, and are deleted, but not a
    shared object, which the partitions before it named already."""
    from txlog.errors import StorageError
    from txlog.partition_log import PartitionLog

    lg, _ = _log(tmp_path)
    real_append = PartitionLog.append

    def append(plog: PartitionLog, spec: Any) -> Any:
        if spec.kind == "data" and plog.partition == 1:
            raise StorageError("injected: append failed")
        return real_append(plog, spec)

    monkeypatch.setattr(PartitionLog, "append", append)
    p = lg.producer(retries=0, linger_ms=600_000)
    ok = [p.send("t", b"zero", partition=0)]
    lost = [p.send("t", b"one", partition=1), p.send("t", b"two", partition=2)]
    with pytest.raises(StorageError, match="injected"):
        p.flush()
    p.close()
    assert ok[0].get().offset == 0
    for f in lost:
        with pytest.raises(StorageError):
            f.get()
    assert len(lg.store.list("topics/t/_shared/")) == 1
    assert [r.value for r in _read(lg, 0, "read_committed")] == [b"zero"]
    assert _read(lg, 1, "read_committed") == [] == _read(lg, 2, "read_committed")


def test_a_partitions_purge_never_deletes_a_shared_object_another_partition_reads(
        tmp_path: Path) -> None:
    """Partition 0 compacts its batches (a shared object's among them) into a segment and
    purges what it dropped: partition 1's batch in the shared object stays readable."""
    from txlog.maintenance import maintain

    lg = txlog.connect(str(tmp_path))
    lg.create_topic("t", partitions=2, config={"file.delete.delay.ms": 0})
    p = lg.producer(transactional_id="tx", linger_ms=600_000)
    p.init_transactions()
    for values in ([(0, b"a0"), (1, b"a1")], [(0, b"b0")]):
        p.begin_transaction()
        for q, v in values:
            p.send("t", v, partition=q)
        p.commit_transaction()
    p.close()
    (shared,) = lg.store.list("topics/t/_shared/")
    report = maintain(lg, ["t"])
    assert report.failures == []
    compacted = lg.partition_log(TopicPartition("t", 0)).refresh()
    assert shared not in compacted.batches.data and not compacted.pending_deletes
    assert lg.store.list("topics/t/_shared/") == [shared]
    assert [r.value for r in _read(lg, 0, "read_committed")] == [b"a0", b"b0"]
    assert [r.value for r in _read(lg, 1, "read_committed")] == [b"a1"]


def test_a_step_larger_than_a_shared_object_writes_several(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past SHARED_OBJECT_BYTES a topic's batches of one step go in several shared
    objects (each of several partitions, in partition order), which upload side by side
    as an object per partition did; every partition still reads exactly its records."""
    from txlog.producer import sender

    lg, timeline = _log(tmp_path, remote=True)
    monkeypatch.setattr(sender, "SHARED_OBJECT_BYTES", 2500)  # two of the batches below
    rng = random.Random(SEED + 6)
    print(f"seed {SEED + 6}")
    want = {q: [rng.randbytes(1000)] for q in range(PARTITIONS)}
    p = lg.producer(transactional_id="tx", linger_ms=600_000)
    p.init_transactions()
    p.begin_transaction()
    for q, vs in want.items():
        p.send("t", vs[0], partition=q)
    p.commit_transaction()
    p.close()
    puts = _object_puts(timeline)
    assert puts["data"] == [] and len(puts["shared"]) == PARTITIONS // 2
    # (row, object_rows) of each partition's batch: the first or second of an object of 2
    rows = sorted(tuple(_entries(lg, q)[-1]["extra"]["parts"][0][5:]) for q in range(PARTITIONS))
    assert rows == [(0, 2)] * 4 + [(1, 2)] * 4
    _check_each_partition(lg, want, committed=True)
