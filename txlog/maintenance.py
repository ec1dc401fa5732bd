"""Maintenance of partition logs: retention, compaction, purging and checkpoints.

Every step appends an entry to the log (never rewrites one), so it is safe while
producers write and readers read.  Objects a step stops referencing are deleted only
after ``file.delete.delay.ms``, so readers and Spark scans holding older plans finish.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txlog import checksums, layout, shared_deletion
from txlog.batch_codec import encode_parquet
from txlog.errors import TxlogError
from txlog.fanout import fan_out
from txlog.model import COMPACT, PURGE, RETENTION
from txlog.partition_log import AppendSpec
from txlog.partition_state import VISIBLE, PartitionState, ReadSpan
from txlog.records import TopicPartition, now_ms, with_kafka_columns

if TYPE_CHECKING:
    from txlog.log import Log


@dataclass
class PartitionReport:
    topic: str
    partition: int
    retained_from: int | None = None
    compacted_batches: int = 0
    dropped_aborted_batches: int = 0
    segments_written: int = 0
    objects_deleted: int = 0
    #: Shared objects this partition's releases completed, and so deleted.
    shared_objects_deleted: int = 0
    expired_producers: int = 0
    checkpoint: str | None = None
    #: Why maintaining this partition stopped part-way (None: it did not).
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class MaintenanceReport:
    swept_transactions: list[str] = field(default_factory=list)
    partitions: list[PartitionReport] = field(default_factory=list)
    # transactional.ids forgotten after transactional.id.expiration.ms idle
    expired_transactional_ids: list[str] = field(default_factory=list)
    #: Every failure, one line each ("<what>: <error>"): the sweep, a topic, a partition.
    failures: list[str] = field(default_factory=list)
    #: Shared batch objects deleted once every partition holding them released them
    #: (by the partitions' purges, and by the pass that finishes what others left).
    shared_objects_deleted: int = 0
    #: What was left alone on purpose, one line each (a shared object whose footer
    #: cannot be trusted is never deleted).
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"swept_transactions": self.swept_transactions,
                "expired_transactional_ids": self.expired_transactional_ids,
                "partitions": [p.to_json() for p in self.partitions],
                "shared_objects_deleted": self.shared_objects_deleted,
                "warnings": self.warnings,
                "failures": self.failures}


def retention_offset(st: PartitionState, retention_ms: int, retention_bytes: int,
                     now: int) -> int:
    """Pure: the new log start offset that the retention settings ask for (never past
    the LSO, and always on a batch boundary)."""
    b = st.batches
    lso = st.last_stable_offset
    start = st.log_start_offset
    sizes = b.shares()  # a shared object's batches count their share of it
    total = sum(sizes)
    for i in range(len(b)):
        end = b.base_offset[i] + b.count[i]
        if end > lso:
            break
        too_old = retention_ms >= 0 and b.ts_max[i] < now - retention_ms \
            and b.append_ms[i] < now - retention_ms
        too_big = retention_bytes >= 0 and total > retention_bytes
        if not (too_old or too_big):
            break
        total -= sizes[i]
        # Runs of one compacted segment go together: the object is kept until all are.
        if i + 1 < len(b) and b.data[i + 1] == b.data[i] and b.base_offset[i + 1] < lso:
            continue
        start = max(start, end)
    return start


def apply_retention(txlog: Log, tp: TopicPartition, now: int | None = None) -> int | None:
    info = txlog.topic(tp.topic)
    r_ms = int(info.config.get("retention.ms", -1))
    r_bytes = int(info.config.get("retention.bytes", -1))
    if r_ms < 0 and r_bytes < 0:
        return None
    plog = txlog.partition_log(tp)
    st = plog.refresh()
    new_start = retention_offset(st, r_ms, r_bytes, now if now is not None else now_ms())
    if new_start <= st.log_start_offset:
        return None
    plog.append(AppendSpec(kind=RETENTION, count=0, log_start_offset=new_start,
                           extra=_delete_times(txlog, tp)))
    return new_start


def _delay(txlog: Log, tp: TopicPartition) -> int:
    return int(txlog.topic(tp.topic).config.get("file.delete.delay.ms",
                                                txlog.config["file.delete.delay.ms"]))


def expire_producers(st: PartitionState, expiration_ms: int, now: int) -> PartitionState:
    """Pure: ``st`` without the sequence state of producers that wrote nothing here for
    ``expiration_ms`` and have no transaction open here (Kafka's producer.id.expiration.ms,
    KIP-854), for the checkpoint: it would otherwise keep every producer id ever seen.
    A producer that comes back is told its id is unknown and starts afresh.

    The fence epochs stay: a zombie of an ended epoch (or a client rolling a decided
    commit forward long after) is refused only by them, however long it slept.  They
    are one pair of integers per transactional producer id that ever ended a
    transaction here, and a transactional producer id changes only when its
    transactional.id expires or its epochs run out."""
    if expiration_ms < 0:
        return st
    busy = {pid for pid, _ in st.open_txns}
    gone = {pid for pid, p in st.producers.items()
            if pid not in busy and p.last_ms < now - expiration_ms}
    if not gone:
        return st
    return replace(st, producers={k: v for k, v in st.producers.items() if k not in gone})


def plan_compaction(st: PartitionState, segment_bytes: int) -> list[tuple[int, int]]:
    """Pure: index ranges [i, j) of batches below the LSO worth merging into a segment.

    A range is worth it when it holds two or more objects, or any aborted/fenced data to
    drop.  Runs of an existing segment stay together.
    """
    b = st.batches
    sizes = b.shares()
    lso = st.last_stable_offset
    ranges: list[tuple[int, int]] = []
    i = 0
    n = len(b)
    while i < n and b.base_offset[i] + b.count[i] <= lso:
        j, size, objects, dead = i, 0, 0, False
        while j < n and b.base_offset[j] + b.count[j] <= lso:
            k = j
            while k + 1 < n and b.data[k + 1] == b.data[j]:
                k += 1  # the whole segment
            if k >= n or b.base_offset[k] + b.count[k] > lso:
                break
            unit = sum(sizes[j:k + 1])
            if objects and size + unit > segment_bytes:
                break
            size += unit
            objects += 1
            dead = dead or any(s not in VISIBLE for s in b.status[j:k + 1])
            j = k + 1
        if j == i:
            break
        if objects >= 2 or dead:
            ranges.append((i, j))
        i = j
    return ranges


def compact_partition(txlog: Log, tp: TopicPartition, report: PartitionReport | None = None,
                      ) -> PartitionReport:
    """Merge committed batches into segments; aborted and fenced data and markers go.
    Offsets are kept (they become sparse, as in Kafka)."""
    report = report or PartitionReport(tp.topic, tp.partition)
    plog = txlog.partition_log(tp)
    st = plog.refresh()
    seg_bytes = int(txlog.topic(tp.topic).config.get("segment.bytes",
                                                     txlog.config["segment.bytes"]))
    for i, j in plan_compaction(st, seg_bytes):
        b = st.batches
        start = b.base_offset[i]
        end = b.base_offset[j - 1] + b.count[j - 1]
        replaces = list(dict.fromkeys(b.data[i:j]))
        spans = [ReadSpan(b.data[k], b.base_offset[k], b.count[k], b.base_offset[k],
                          b.base_offset[k] + b.count[k], b.status[k], b.producer_id[k],
                          b.append_ms[k], b.row[k])
                 for k in range(i, j) if b.status[k] in VISIBLE]
        runs: list[list[int]] = []
        row = 0
        for k in range(i, j):
            if b.status[k] in VISIBLE:
                runs.append([b.base_offset[k], b.count[k], row, b.append_ms[k],
                             b.producer_id[k], b.status[k], b.epoch[k], b.ts_min[k],
                             b.ts_max[k]])
                row += b.count[k]
        dropped = sum(1 for k in range(i, j) if b.status[k] not in VISIBLE)
        tables = plog.read_spans(spans) if spans else []
        if txlog.topic(tp.topic).kafka_shaped and any(
                not t.schema.equals(tables[0].schema) for t in tables):
            # Kafka-shaped objects may leave out headers or timestamps (records.py): the
            # segment has them as nulls (readers give each run's append time).
            present = {c for t in tables for c in t.column_names}
            tables = [with_kafka_columns(t, sorted(present)) for t in tables]
        if tables:
            seg = pa.concat_tables(tables)
            body = encode_parquet(seg)
            key = layout.data_key(tp.topic, tp.partition,
                                  f"seg-{uuid.uuid4().hex}{checksums.tag(body)}")
            plog.store.put(key, body)
            nbytes = len(body)
        else:
            key, nbytes = "", 0
        plog.append(AppendSpec(kind=COMPACT, count=0, extra={
            "start": start, "end": end, "replaces": replaces, "segment": key,
            "nbytes": nbytes, "runs": runs, **_delete_times(txlog, tp)}))
        st = plog.state or st
        applied = key == "" or key in st.batches.data
        if applied:
            report.compacted_batches += j - i
            report.dropped_aborted_batches += dropped
            report.segments_written += 1 if key else 0
        elif key:
            plog.store.delete(key)  # lost a race; the range changed under us
        break  # indices moved: one range per pass keeps the plan simple and correct
    return report


def store_now_ms(txlog: Log) -> int:
    """The time deletions are due and purged by: the store's (a lower bound of it), so
    that no client's wall clock decides when an object a reader may still need is
    deleted; the wall clock where the store keeps no times."""
    store_now = txlog.coordinator.clock.now_ms()
    return store_now if store_now is not None else now_ms()


def _delete_times(txlog: Log, tp: TopicPartition) -> dict[str, int]:
    """The ``extra`` of an entry that drops objects: their deletion delay, and when they
    are due on the store's clock."""
    delay = _delay(txlog, tp)
    return {"delete_delay_ms": delay, "delete_due_ms": store_now_ms(txlog) + delay}


def purge(txlog: Log, tp: TopicPartition, now: int | None = None, *,
          report: PartitionReport | None = None) -> int:
    """Delete objects whose deletion delay has passed (on the store's clock), then record
    it in the log; a shared object is released instead, and deleted by the release that
    completes it.  ``now`` (a test's or an operator's choice) replaces the store's time."""
    plog = txlog.partition_log(tp)
    st = plog.refresh()
    if not st.pending_deletes:
        return 0
    now = now if now is not None else store_now_ms(txlog)
    due = [(d, k) for d, k in st.pending_deletes if d <= now]
    if not due:
        return 0
    referenced = set(st.batches.data)
    shared = []
    for _, k in due:
        if k in referenced:
            continue
        if shared_deletion.is_shared(tp.topic, k):
            shared.append(k)  # other partitions may still need it: released, not deleted
        else:
            plog.store.delete(k)
    if shared:
        partitions = txlog.topic(tp.topic).partitions

        def release(key: str) -> str:
            return shared_deletion.release(plog.store, tp.topic, key, tp.partition,
                                           partitions=partitions)

        # A release is several requests: on a remote store, the objects side by side.
        remote = len(shared) > 1 and not plog.store.local_requests
        outcomes = fan_out(release, shared) if remote else [release(k) for k in shared]
        if report is not None:
            report.shared_objects_deleted += outcomes.count(shared_deletion.DELETED)
    plog.append(AppendSpec(kind=PURGE, count=0, extra={"purged_until_ms": max(d for d, _ in due)}))
    return len(due)


def maintain(txlog: Log, topics: list[str] | None = None, *, compact: bool = True,
             progress: Callable[[int, int, str], None] | None = None,
             now: int | None = None) -> MaintenanceReport:
    """The whole sweep: finish or abort stuck transactions, forget idle transactional.ids,
    then per partition retention, compaction, purge of expired objects and a fresh
    checkpoint.  One bad object or partition does not stop the others: each failure is in
    ``report.failures`` (and the partition's ``error``), and the command line exits
    non-zero when there is one."""
    from txlog.resolve import resolve_lso

    report = MaintenanceReport()
    try:
        report.swept_transactions = txlog.coordinator.sweep()
    except TxlogError as exc:
        report.failures.append(f"transaction sweep: {_one_line(exc)}")
    try:
        report.expired_transactional_ids = txlog.coordinator.expire_transactional_ids(now)
    except TxlogError as exc:
        report.failures.append(f"transactional.id expiration: {_one_line(exc)}")
    names = topics if topics is not None else txlog.list_topics(internal=True)
    tps = []
    found = []
    for t in names:
        try:
            tps += txlog.partitions_for(t)
            found.append(t)
        except TxlogError as exc:
            report.failures.append(f"topic {t}: {_one_line(exc)}")
    for n, tp in enumerate(tps):
        if progress:
            progress(n, len(tps), f"{tp.topic}-{tp.partition}")
        pr = PartitionReport(tp.topic, tp.partition)
        try:
            resolve_lso(txlog, tp)
            pr.retained_from = apply_retention(txlog, tp, now)
            if compact:
                compact_partition(txlog, tp, pr)
            pr.objects_deleted = purge(txlog, tp, now, report=pr)
            plog = txlog.partition_log(tp)
            st = plog.refresh()
            kept = expire_producers(st, int(txlog.config["producer.id.expiration.ms"]),
                                    now if now is not None else now_ms())
            pr.expired_producers = len(st.producers) - len(kept.producers)
            pr.checkpoint = plog.write_checkpoint(kept)
        except TxlogError as exc:
            pr.error = _one_line(exc)
            report.failures.append(f"{tp.topic}-{tp.partition}: {pr.error}")
        report.partitions.append(pr)
        report.shared_objects_deleted += pr.shared_objects_deleted
    for t in found:
        _collect_shared(txlog, t, [tp for tp in tps if tp.topic == t], report)
    if progress:
        progress(len(tps), len(tps), "done")
    return report


def _collect_shared(txlog: Log, topic: str, tps: list[TopicPartition],
                    report: MaintenanceReport) -> None:
    """Delete the shared objects of ``topic`` that every partition holding them
    released, where a releaser was killed or raced before it could."""
    prefix = layout.shared_prefix(topic)
    holders: dict[str, set[int]] = {}
    for tp in tps:
        st = txlog.partition_log(tp).state  # as maintenance just left it
        if st is not None:
            for k in {*st.batches.data, *(k for _, k in st.pending_deletes)}:
                if k.startswith(prefix):
                    holders.setdefault(k, set()).add(tp.partition)
    try:
        done = shared_deletion.collect_topic(txlog.store, topic,
                                             partitions=txlog.topic(topic).partitions,
                                             holders=holders)
    except TxlogError as exc:
        report.failures.append(f"topic {topic} shared objects: {_one_line(exc)}")
        return
    report.shared_objects_deleted += done.deleted
    report.warnings += done.warnings
    report.failures += done.failures


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
