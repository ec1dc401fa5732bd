"""Compaction and retention while producers and readers work (txlog.maintenance)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog.errors import StorageError
from txlog.maintenance import apply_retention, compact_partition, maintain, plan_compaction, purge
from txlog.partition_state import ABORTED, COMMITTED, READ_COMMITTED
from txlog.records import TopicPartition, now_ms


def data_objects(root: Path, topic: str) -> dict[str, int]:
    """Every batch/segment object of ``topic`` on disk: key -> size."""
    out = {}
    for p in (root / "topics" / topic).glob("*/data/*.parquet"):
        out[str(p.relative_to(root))] = p.stat().st_size
    return out


def read_all(log: txlog.Log, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    """(offset, value) per partition: a fresh read_committed read from the beginning."""
    c = log.consumer(auto_offset_reset="earliest")
    c.subscribe([topic])
    out: dict[int, list[tuple[int, bytes]]] = {tp.partition: [] for tp in c.assignment()}
    while True:
        recs = c.poll(max_records=1000)
        if not recs:
            return out
        for r in recs:
            out[r.partition].append((r.offset, r.value))


# -- compaction while a producer commits and a reader reads -----------------------------------


def test_compaction_while_producing_and_reading(tmp_path: Path) -> None:
    root = tmp_path / "root"
    url = str(root)
    delay_ms = 1000
    admin_log = txlog.connect(url)
    admin_log.create_topic("c", partitions=2, config={"file.delete.delay.ms": delay_ms})
    tps = [TopicPartition("c", 0), TopicPartition("c", 1)]

    committed: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    written = {"committed": 0, "aborted": 0}
    aborted_keys: set[str] = set()
    done = threading.Event()
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            log = txlog.connect(url)
            p = log.producer(transactional_id="writer", linger_ms=3_600_000)
            p.init_transactions()
            for n in range(36):
                p.begin_transaction()
                futs = [(part, f"v{n}-{part}-{i}".encode(),
                         p.send("c", f"v{n}-{part}-{i}".encode(), partition=part))
                        for part in (0, 1) for i in range(3)]
                p.flush()
                # The producer's own view of what it just wrote: one open batch per
                # partition (not yet decided, so compaction cannot have touched it).
                batches = []
                for tp in tps:
                    st = log.partition_log(tp).state
                    assert st is not None
                    i = st.batch_index_at(next(f for q, _, f in futs if q == tp.partition)
                                          .get().offset)
                    batches.append((st.batches.data[i], st.batches.nbytes[i]))
                if n % 3 == 2:
                    p.abort_transaction()
                    written["aborted"] += sum(b for _, b in batches)
                    aborted_keys.update(k for k, _ in batches)
                else:
                    p.commit_transaction()
                    written["committed"] += sum(b for _, b in batches)
                    for part, value, f in futs:
                        committed[part].append((f.get().offset, value))
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    seen: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}

    def reader() -> None:
        try:
            log = txlog.connect(url)
            c = log.consumer(auto_offset_reset="earliest")
            c.assign(tps)
            c.seek_to_beginning()
            while True:
                finished = done.is_set()
                recs = c.poll(max_records=7)
                for r in recs:
                    seen[r.partition].append((r.offset, r.value))
                if finished and not recs:
                    ends = c.end_offsets(tps)
                    if all(c.position(tp) >= ends[tp] for tp in tps):
                        return
                if not recs:
                    time.sleep(0.005)
        except BaseException as exc:
            errors.append(exc)

    compactions = {"passes": 0, "segments": 0, "dropped": 0}

    def compactor() -> None:
        try:
            log = txlog.connect(url)
            while not done.is_set():
                rep = maintain(log, ["c"])
                assert not rep.failures, rep.failures  # (maintain reports, not raises)
                compactions["passes"] += 1
                compactions["segments"] += sum(p.segments_written for p in rep.partitions)
                compactions["dropped"] += sum(p.dropped_aborted_batches for p in rep.partitions)
                time.sleep(0.01)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f, daemon=True) for f in (producer, reader, compactor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    if errors:
        raise errors[0]
    assert compactions["segments"] > 0 and compactions["dropped"] > 0, compactions

    # The reader that ran during compaction saw exactly what the producer committed, at
    # the offsets the producer was given.
    assert seen == committed
    # Same read, without any compaction in flight: identical records at identical offsets.
    final_log = txlog.connect(url)
    for _ in range(3):  # finish compacting what the race left
        assert not maintain(final_log, ["c"]).failures
    assert read_all(final_log, "c") == seen
    assert sum(len(v) for v in seen.values()) == 24 * 6

    # Storage: once the deletion delay has passed, the aborted objects are gone and the
    # data shrank by at least the aborted bytes (merged segments also save per-file
    # overhead).  Nothing on disk is unreferenced.
    for tp in tps:
        purge(final_log, tp, now=now_ms() + delay_ms + 1)
    after = data_objects(root, "c")
    total_written = written["committed"] + written["aborted"]
    assert written["aborted"] > 0
    assert total_written - sum(after.values()) >= written["aborted"]
    assert not aborted_keys & set(after)
    referenced = set()
    for tp in tps:
        st = final_log.partition_log(tp).refresh()
        referenced |= {d for d in st.batches.data if d}
        assert all(s == COMMITTED for s in st.batches.status)
    assert set(after) == referenced
    assert read_all(txlog.connect(url), "c") == seen


def test_compaction_keeps_offsets_and_old_plans(tmp_path: Path) -> None:
    root = tmp_path / "root"
    log = txlog.connect(str(root))
    log.create_topic("k", config={"file.delete.delay.ms": 60_000})
    tp = TopicPartition("k", 0)
    p = log.producer(transactional_id="k-writer")
    p.init_transactions()
    for n in range(6):
        p.begin_transaction()
        p.send("k", f"r{n}".encode(), partition=0)
        p.flush()
        if n % 2:
            p.abort_transaction()
        else:
            p.commit_transaction()
    before = read_all(log, "k")[0]
    assert [v for _, v in before] == [b"r0", b"r2", b"r4"]
    # A reader mid-way and a reader holding a plan made before compaction.
    mid = log.consumer(auto_offset_reset="earliest")
    mid.assign([tp])
    assert [r.value for r in mid.poll(max_records=1)] == [b"r0"]
    old_log = txlog.connect(str(root))
    old_plog = old_log.partition_log(tp)
    old_spans, _ = old_plog.refresh().plan_read(0, None, READ_COMMITTED)

    st = log.partition_log(tp).refresh()
    assert sum(1 for s in st.batches.status if s == ABORTED) == 3
    assert plan_compaction(st, 1 << 30) == [(0, 6)]
    assert plan_compaction(st, 1) != [(0, 6)]  # tiny segments: merges stop at the bound
    rep = compact_partition(log, tp)
    assert (rep.compacted_batches, rep.dropped_aborted_batches, rep.segments_written) == (6, 3, 1)
    st = log.partition_log(tp).refresh()
    assert len({d for d in st.batches.data}) == 1 and len(st.batches) == 3

    assert read_all(txlog.connect(str(root)), "k")[0] == before  # offsets kept (sparse)
    assert [(r.offset, r.value) for r in mid.poll()] == before[1:]
    assert [t.column("value").to_pylist() for t in old_plog.read_spans(old_spans)] == [
        [b"r0"], [b"r2"], [b"r4"]]
    # Nothing is due yet: the old objects stay until file.delete.delay.ms has passed.
    assert purge(log, tp) == 0
    assert purge(log, tp, now=now_ms() + 61_000) == 6
    assert len(data_objects(root, "k")) == 1
    with pytest.raises(StorageError):
        old_plog.read_spans(old_spans)  # a plan older than the delay is not kept alive
    assert read_all(log, "k")[0] == before


# -- retention ------------------------------------------------------------------------------


def _produce_batches(log: txlog.Log, topic: str, n: int, tag: str) -> list[int]:
    p = log.producer()
    offsets = []
    for i in range(n):
        f = p.send(topic, f"{tag}{i}".encode(), partition=0)
        p.flush()
        offsets.append(f.get().offset)
    p.close()
    return offsets


def test_retention_by_time_keeps_old_plans_until_the_delay(tmp_path: Path) -> None:
    root = tmp_path / "root"
    log = txlog.connect(str(root))
    retention_ms, delay_ms = 10_000, 60_000
    log.create_topic("rt", config={"retention.ms": retention_ms,
                                   "file.delete.delay.ms": delay_ms})
    tp = TopicPartition("rt", 0)
    _produce_batches(log, "rt", 4, "old")
    boundary = now_ms()
    time.sleep(0.005)
    new_offsets = _produce_batches(log, "rt", 3, "new")

    reader_log = txlog.connect(str(root))
    plog = reader_log.partition_log(tp)
    spans, _ = plog.refresh().plan_read(0, None, READ_COMMITTED)  # planned before retention
    assert len(spans) == 7

    # "Now" is when the old batches are past retention.ms but the new ones are not.
    report = maintain(log, ["rt"], now=boundary + retention_ms + 1, compact=False)
    (pr,) = report.partitions
    assert pr.retained_from == new_offsets[0] and pr.objects_deleted == 0
    assert log.describe_topic("rt")["partition_info"][0]["log_start_offset"] == new_offsets[0]
    assert [v for _, v in read_all(log, "rt")[0]] == [b"new0", b"new1", b"new2"]
    # The reader that planned before still reads every span it planned.
    assert sum(t.num_rows for t in plog.read_spans(spans)) == 7
    assert len(data_objects(root, "rt")) == 7

    # Once the delay has passed, purge deletes the retained objects.
    assert purge(log, tp, now=now_ms() + delay_ms + 1) == 4
    assert len(data_objects(root, "rt")) == 3
    with pytest.raises(StorageError):
        plog.read_spans(spans)
    assert [v for _, v in read_all(txlog.connect(str(root)), "rt")[0]] == [
        b"new0", b"new1", b"new2"]


def test_retention_by_size(tmp_path: Path) -> None:
    root = tmp_path / "root"
    log = txlog.connect(str(root))
    log.create_topic("probe")
    _produce_batches(log, "probe", 8, "b")
    sizes = log.partition_log(TopicPartition("probe", 0)).refresh().batches.nbytes
    limit = sum(sizes[-3:]) + min(sizes) // 2  # room for the newest three batches
    log.create_topic("rs", config={"retention.bytes": limit, "file.delete.delay.ms": 50})
    tp = TopicPartition("rs", 0)
    offsets = _produce_batches(log, "rs", 8, "b")
    reader = txlog.connect(str(root)).partition_log(tp)
    spans, _ = reader.refresh().plan_read(0, None, READ_COMMITTED)  # planned before

    (pr,) = maintain(log, ["rs"], compact=False).partitions
    assert pr.retained_from == offsets[5] and pr.objects_deleted == 0
    st = log.partition_log(tp).refresh()
    assert st.log_start_offset == offsets[5] and st.size_bytes() <= limit
    assert [v for _, v in read_all(log, "rs")[0]] == [b"b5", b"b6", b"b7"]
    c = log.consumer()
    c.assign([tp])
    assert c.beginning_offsets([tp]) == {tp: offsets[5]}
    # The reader that planned before retention still reads all of its spans...
    assert sum(t.num_rows for t in reader.read_spans(spans)) == 8
    # ...until file.delete.delay.ms has passed and a purge ran.
    time.sleep(0.06)
    (pr,) = maintain(log, ["rs"], compact=False).partitions
    assert pr.retained_from is None and pr.objects_deleted == 5
    assert len(data_objects(root, "rs")) == 3
    with pytest.raises(StorageError):
        reader.read_spans(spans)
    assert sum(t.num_rows for t in reader.read_spans(spans[5:])) == 3


def test_maintain_reports_progress_and_is_idempotent(tmp_path: Path) -> None:
    log = txlog.connect(str(tmp_path / "root"))
    log.create_topic("a", partitions=2)
    log.create_topic("b")
    _produce_batches(log, "b", 2, "x")
    calls: list[tuple[int, int, str]] = []
    rep = maintain(log, ["a", "b"], progress=lambda i, n, what: calls.append((i, n, what)))
    assert calls == [(0, 3, "a-0"), (1, 3, "a-1"), (2, 3, "b-0"), (3, 3, "done")]
    assert [p.compacted_batches for p in rep.partitions] == [0, 0, 2]
    again: dict[str, Any] = maintain(log, ["a", "b"]).to_json()
    assert all(p["compacted_batches"] == 0 for p in again["partitions"])
    assert [v for _, v in read_all(log, "b")[0]] == [b"x0", b"x1"]


# -- purge under clock skew ---------------------------------------------------------------


def _skew(monkeypatch: pytest.MonkeyPatch, by_ms: int) -> None:
    """This process's wall clock reads ``by_ms`` off from now on (the store's does not)."""
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + by_ms * 1_000_000)
    monkeypatch.setattr(time, "time", lambda: (real() + by_ms * 1_000_000) / 1e9)


def _retained(tmp_path: Path) -> tuple[txlog.Log, TopicPartition, Path]:
    root = tmp_path / "root"
    log = txlog.connect(str(root))
    log.create_topic("rt", config={"retention.ms": 10_000, "file.delete.delay.ms": 60_000})
    _produce_batches(log, "rt", 3, "old")
    return log, TopicPartition("rt", 0), root


@pytest.mark.parametrize("skew_ms", [3_600_000, 120_000])
def test_a_purger_whose_clock_runs_ahead_deletes_nothing_early(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skew_ms: int) -> None:
    log, tp, root = _retained(tmp_path)
    assert apply_retention(log, tp, now=now_ms() + 20_000) is not None
    assert len(data_objects(root, "rt")) == 3
    _skew(monkeypatch, skew_ms)  # the delay (60 s) looks long past on this clock
    assert purge(txlog.connect(str(root)), tp) == 0
    assert len(data_objects(root, "rt")) == 3
    monkeypatch.undo()
    assert purge(log, tp, now=now_ms() + 61_000) == 3  # (an operator's explicit time)


def test_objects_dropped_by_a_client_whose_clock_runs_behind_stay_for_the_delay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, tp, root = _retained(tmp_path)
    _skew(monkeypatch, -120_000)  # stamps the due time two minutes early
    assert apply_retention(txlog.connect(str(root)), tp, now=now_ms() + 140_000) is not None
    monkeypatch.undo()
    assert purge(txlog.connect(str(root)), tp) == 0
    assert len(data_objects(root, "rt")) == 3
