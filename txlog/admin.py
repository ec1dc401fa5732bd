"""Admin queries and actions behind ``txlog transactions`` and ``txlog groups``.

Everything here reads the same objects clients read (partition logs, the transaction
state log, ``__consumer_offsets``) and returns plain dicts, so the CLI can print them as
tables or JSON.  The few actions (abort, reset offsets) go through the coordinator's
own protocol, never around it:

* aborting a transactional.id fences its producer and aborts, exactly as a newer
  instance's ``init_transactions()`` would (PrepareAbort, markers, CompleteAbort with the
  epoch bumped), so the live producer, if any, gets ``ProducerFencedError``;
* aborting one (producer id, epoch) on one partition writes the ABORT marker that
  :meth:`Coordinator.resolve_open` would write, after checking with the state log that
  the transaction really is over (a transaction still Ongoing is fenced and aborted as
  a whole; one in PrepareCommit is rolled forward, never aborted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txlog.coordinator import max_transaction_timeout_ms as max_transaction_timeout
from txlog.errors import (
    GroupIdNotFoundError,
    InvalidTxnStateError,
    TransactionalIdNotFoundError,
    UnknownTopicError,
)
from txlog.names import CONSUMER_OFFSETS_TOPIC, validate_id
from txlog.offsets import decode_offset_key, decode_offset_value, offset_record_where
from txlog.partition_state import READ_COMMITTED, STATUS_NAMES, PartitionState
from txlog.records import TopicPartition, now_ms
from txlog.txn_state import (
    COMMITTED,
    COMPLETE,
    ONGOING,
    PREPARING,
    TxnRecord,
)

if TYPE_CHECKING:
    from txlog.log import Log

#: A state-log entry in Prepare* longer than this is reported as stuck (a live
#: coordinator finishes the markers in well under a second).
DEFAULT_PREPARE_GRACE_MS = 30_000

#: Groups used internally for txnAppId/txnVersion (see txlog.app_versions).
INTERNAL_GROUP_PREFIXES = ("txnapp:",)


# -- transactions ------------------------------------------------------------------------


def _record_json(rec: TxnRecord, now: int) -> dict[str, Any]:
    open_ = rec.state not in COMPLETE and rec.state != "Dead"
    return {
        "transactional_id": rec.txn_id,
        "producer_id": rec.producer_id,
        "producer_epoch": rec.epoch,
        "state": rec.state,
        "timeout_ms": rec.timeout_ms,
        "txn_start_ms": rec.txn_start_ms if open_ else None,
        "duration_ms": now - rec.txn_start_ms if open_ and rec.txn_start_ms else None,
        "last_update_ms": rec.last_update_ms,
        "partitions": [f"{t}-{p}" for t, p in rec.partitions],
        "last_abort_reason": rec.abort_reason or None,
    }


def list_transactions(txlog: Log, *, states: Iterable[str] | None = None,
                      now: int | None = None) -> list[dict[str, Any]]:
    """Every transactional.id the state log knows, sorted by id (optionally by state)."""
    now = now_ms() if now is None else now
    want = set(states) if states else None
    recs = sorted(txlog.coordinator.state_log.all_records(), key=lambda r: r.txn_id)
    return [_record_json(r, now) for r in recs if want is None or r.state in want]


def get_record(txlog: Log, txn_id: str) -> TxnRecord:
    rec = txlog.coordinator.record(txn_id)
    if rec is None:
        raise TransactionalIdNotFoundError(
            f"no transactional.id {txn_id!r} in {txlog.url}; `txlog transactions list` shows "
            "the known ones")
    return rec


def describe_transaction(txlog: Log, txn_id: str, *, now: int | None = None,
                         ) -> dict[str, Any]:
    return _record_json(get_record(txlog, txn_id), now_ms() if now is None else now)


def describe_producers(txlog: Log, tp: TopicPartition) -> list[dict[str, Any]]:
    """Kafka's DescribeProducers: the producers a partition remembers and their open
    transaction, if any (CurrentTransactionStartOffset)."""
    st = txlog.partition_log(tp).refresh()
    txn_ids: dict[int, str] = {}
    b = st.batches
    for pid, tid in zip(b.producer_id, b.txn_id, strict=True):
        if tid:
            txn_ids[pid] = tid
    pids = set(st.producers) | {pid for pid, _ in st.open_txns}
    out = []
    for pid in sorted(pids):
        p = st.producers.get(pid)
        opened = [t for (q, _), t in st.open_txns.items() if q == pid]
        txn = min(opened, key=lambda t: t.first_offset) if opened else None
        epoch = max(([p.epoch] if p else []) + [t.epoch for t in opened])
        out.append({
            "producer_id": pid,
            "producer_epoch": epoch,
            "last_sequence": p.last_seq if p else -1,
            "last_timestamp_ms": p.last_ms if p else (txn.first_append_ms if txn else None),
            "current_txn_start_offset": txn.first_offset if txn else -1,
            "transactional_id": (txn.txn_id if txn else None) or txn_ids.get(pid),
        })
    return out


def _tps(txlog: Log, topics: Iterable[str] | None, partition: int | None,
         ) -> list[TopicPartition]:
    names = list(topics) if topics else txlog.list_topics(internal=True)
    tps = [tp for t in names for tp in txlog.partitions_for(t)]
    if partition is not None:
        tps = [tp for tp in tps if tp.partition == partition]
        if not tps:
            raise UnknownTopicError(f"no partition {partition} in topics {names}")
    return tps


def find_hanging(txlog: Log, *, topics: Iterable[str] | None = None,
                 partition: int | None = None,
                 max_transaction_timeout_ms: int | None = None,
                 prepare_grace_ms: int = DEFAULT_PREPARE_GRACE_MS,
                 now: int | None = None) -> list[dict[str, Any]]:
    """Transactions that hold (or may hold) a partition's LSO and will not end by themselves
    soon.  Each result has a ``kind``:

    * ``hanging``: open on a partition and in the state log for longer than
      ``max_transaction_timeout_ms`` (default: the root's transaction.max.timeout.ms,
      which no transaction's timeout may exceed), or past its own
      ``transaction.timeout.ms``;
    * ``orphaned``: open on a partition, but the state log has no such transaction (the
      transactional.id moved on to another epoch, or never registered the partition), so
      no marker will ever come from its producer;
    * ``stuck-prepare``: a state-log entry in PrepareCommit/PrepareAbort for longer than
      ``prepare_grace_ms`` (its coordinator died between the decision and the markers,
      or before CompleteCommit).

    Read-only: it writes nothing.  ``txlog transactions abort`` ends what it finds.
    """
    now = now_ms() if now is None else now
    if max_transaction_timeout_ms is None:
        max_transaction_timeout_ms = max_transaction_timeout(txlog)
    coord = txlog.coordinator
    records: dict[str, TxnRecord | None] = {}
    out: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    tps = _tps(txlog, topics, partition)
    scope = {(tp.topic, tp.partition) for tp in tps}
    for tp in tps:
        # The partition is read before the state log (as resolve_open requires): a marker
        # written before the state log moved on is already visible here.
        st = txlog.partition_log(tp).refresh()
        for txn in sorted(st.open_txns.values(), key=lambda t: t.first_offset):
            tid = txn.txn_id
            if tid and tid not in records:
                records[tid] = coord.record(tid)
            rec = records.get(tid) if tid else None
            age = now - txn.first_append_ms
            kind, reason = None, ""
            if rec is None:
                kind, reason = "orphaned", (
                    "the state log has no record of its transactional.id" if tid
                    else "the batch carries no transactional.id")
            elif (rec.producer_id, rec.epoch) != (txn.producer_id, txn.epoch):
                kind, reason = "orphaned", (
                    f"the transactional.id moved on (now producer {rec.producer_id} epoch "
                    f"{rec.epoch}, {rec.state}) without a marker here")
            elif rec.state in PREPARING:
                if now - rec.last_update_ms > prepare_grace_ms:
                    kind, reason = "stuck-prepare", (
                        f"{rec.state} for {_fmt_ms(now - rec.last_update_ms)}; markers "
                        "were never finished")
            elif rec.state == ONGOING:
                if (tp.topic, tp.partition) not in rec.partitions:
                    kind, reason = "orphaned", (
                        "the transaction never registered this partition")
                elif rec.expired(now):
                    kind, reason = "hanging", (
                        f"past its transaction.timeout.ms ({rec.timeout_ms} ms); the next "
                        "reader or `txlog maintain` aborts it")
                elif age > max_transaction_timeout_ms:
                    kind, reason = "hanging", (
                        f"open for {_fmt_ms(age)}, longer than the maximum transaction "
                        f"timeout ({_fmt_ms(max_transaction_timeout_ms)})")
            else:
                kind, reason = "orphaned", (
                    f"the state log says {rec.state} for this epoch but the partition has "
                    "no marker")
            if kind is None:
                continue
            seen.add((txn.producer_id, txn.epoch))
            out.append({
                "kind": kind, "topic": tp.topic, "partition": tp.partition,
                "producer_id": txn.producer_id, "producer_epoch": txn.epoch,
                "transactional_id": tid, "start_offset": txn.first_offset,
                "start_ms": txn.first_append_ms, "duration_ms": age,
                "state": rec.state if rec is not None else None, "reason": reason,
            })
    scoped = topics is not None or partition is not None
    for rec in sorted(coord.state_log.all_records(), key=lambda r: r.txn_id):
        if (rec.producer_id, rec.epoch) in seen:
            continue
        if scoped and not scope.intersection(rec.partitions):
            continue  # the caller asked about other partitions
        kind, reason = None, ""
        if rec.state in PREPARING and now - rec.last_update_ms > prepare_grace_ms:
            kind, reason = "stuck-prepare", (
                f"{rec.state} for {_fmt_ms(now - rec.last_update_ms)}; its markers or "
                "Complete* were never finished")
        elif rec.state == ONGOING and (
                rec.expired(now) or now - rec.txn_start_ms > max_transaction_timeout_ms):
            kind, reason = "hanging", (
                f"open for {_fmt_ms(now - rec.txn_start_ms)} in the state log "
                "(no data on the partitions scanned)")
        if kind is None:
            continue
        out.append({
            "kind": kind, "topic": None, "partition": None,
            "producer_id": rec.producer_id, "producer_epoch": rec.epoch,
            "transactional_id": rec.txn_id, "start_offset": None,
            "start_ms": rec.txn_start_ms, "duration_ms": now - rec.txn_start_ms,
            "state": rec.state, "reason": reason,
            "partitions": [f"{t}-{p}" for t, p in rec.partitions],
        })
    return out


def abort_transaction(txlog: Log, txn_id: str, *, reason: str = "admin") -> dict[str, Any]:
    """End ``txn_id``'s open transaction: fence its producer and abort (as a newer
    instance's init_transactions() would), or roll a Prepare* forward to its decision."""
    end = txlog.coordinator.abort_open(txn_id, reason=reason)
    if not end.rolled_forward:
        action = "aborted (producer fenced)"
    elif end.outcome == COMMITTED:
        action = "committed (rolled PrepareCommit forward; the decision was already made)"
    else:
        action = "aborted (rolled PrepareAbort forward)"
    partitions = end.prep.partitions if end.prep is not None else ()
    return {"transactional_id": txn_id, "producer_id": end.producer_id,
            "producer_epoch": end.epoch, "action": action,
            "partitions": [f"{t}-{p}" for t, p in partitions]}


def abort_partition_txn(txlog: Log, tp: TopicPartition, *, producer_id: int | None = None,
                        producer_epoch: int | None = None, start_offset: int | None = None,
                        ) -> dict[str, Any]:
    """End the open transaction (producer_id, producer_epoch) on one partition, or the one
    starting at ``start_offset``: kafka-transactions.sh abort --topic --partition."""
    plog = txlog.partition_log(tp)
    st = plog.refresh()
    found = [t for t in st.open_txns.values()
             if (t.first_offset == start_offset if start_offset is not None
                 else (t.producer_id, t.epoch) == (producer_id, producer_epoch))]
    if len(found) > 1:
        # A BEGIN entry takes no offset: transactions opened one after another by BEGIN
        # entries share a start offset (Kafka's never do).
        raise InvalidTxnStateError(
            f"{len(found)} open transactions of {tp.topic}-{tp.partition} start at offset "
            f"{start_offset}: " + ", ".join(f"producer {t.producer_id} epoch {t.epoch}"
                                            for t in found)
            + "; name one with --producer-id and --producer-epoch")
    txn = found[0] if found else None
    if txn is None:
        what = (f"starting at offset {start_offset}" if start_offset is not None
                else f"of producer {producer_id} epoch {producer_epoch}")
        opened = ", ".join(f"producer {t.producer_id} epoch {t.epoch} at offset "
                           f"{t.first_offset}" for t in st.open_txns.values())
        raise InvalidTxnStateError(
            f"{tp.topic}-{tp.partition} has no open transaction {what}"
            + (f"; open here: {opened}" if opened else "; nothing is open here"))
    lso_before = st.last_stable_offset
    coord = txlog.coordinator
    rec = coord.record(txn.txn_id) if txn.txn_id else None
    action = "aborted on this partition (ABORT marker written)"
    if rec is not None and (rec.producer_id, rec.epoch) == (txn.producer_id, txn.epoch) \
            and rec.state not in COMPLETE:
        # The transaction is still alive in the state log: end it as a whole, through the
        # coordinator, so every partition it registered gets its marker.
        res = abort_transaction(txlog, rec.txn_id)
        action = f"transaction {rec.txn_id!r} {res['action']}"
    st = plog.refresh()
    if (txn.producer_id, txn.epoch) in st.open_txns:
        coord.write_marker(tp, txn.producer_id, txn.epoch, commit=False)
        st = plog.refresh()
    return {"topic": tp.topic, "partition": tp.partition, "producer_id": txn.producer_id,
            "producer_epoch": txn.epoch, "transactional_id": txn.txn_id,
            "start_offset": txn.first_offset, "action": action,
            "lso_before": lso_before, "lso_after": st.last_stable_offset}


# -- topics --------------------------------------------------------------------------------


def describe_partitions(txlog: Log, topic: str) -> list[dict[str, Any]]:
    """Per partition: offsets, LSO, batches by status, open transactions, size."""
    rows = []
    for tp in txlog.partitions_for(topic):
        st = txlog.partition_log(tp).refresh()
        by_status: dict[str, int] = {}
        for s in st.batches.status:
            by_status[STATUS_NAMES[s]] = by_status.get(STATUS_NAMES[s], 0) + 1
        rows.append({
            "topic": topic, "partition": tp.partition,
            "log_start_offset": st.log_start_offset, "high_watermark": st.high_watermark,
            "last_stable_offset": st.last_stable_offset,
            "lso_lag": st.high_watermark - st.last_stable_offset,
            "batches": len(st.batches), "batches_by_status": by_status,
            "objects": len({d for d in st.batches.data if d}),
            "open_transactions": len(st.open_txns), "size_bytes": st.size_bytes(),
            "pending_deletes": len(st.pending_deletes),
            "last_append_ms": st.last_append_ms or None,
        })
    return rows


# -- consumer groups -----------------------------------------------------------------------


def _offsets_topic_exists(txlog: Log) -> bool:
    return CONSUMER_OFFSETS_TOPIC in txlog.list_topics(internal=True)


def all_committed_offsets(txlog: Log) -> dict[str, dict[TopicPartition, int]]:
    """Every group's latest committed offset per partition (read_committed: offsets sent
    inside a transaction count only once it commits)."""
    out: dict[str, dict[TopicPartition, int]] = {}
    if not _offsets_topic_exists(txlog):
        return out
    for otp in txlog.partitions_for(CONSUMER_OFFSETS_TOPIC):
        plog = txlog.partition_log(otp)
        st = plog.refresh()
        spans, _ = st.plan_read(st.log_start_offset, None, READ_COMMITTED)
        if not spans:
            continue
        for span, table in zip(spans, plog.read_spans(spans, ["key", "value"]), strict=True):
            for i, (k, v) in enumerate(zip(table.column("key").to_pylist(),
                                           table.column("value").to_pylist(), strict=True)):
                where = offset_record_where(otp, span.start + i)
                group, tp = decode_offset_key(k, where)
                out.setdefault(group, {})[tp] = decode_offset_value(v, where)
    return out


def list_groups(txlog: Log, *, include_internal: bool = False) -> list[dict[str, Any]]:
    rows = []
    for group, offs in sorted(all_committed_offsets(txlog).items()):
        if not include_internal and group.startswith(INTERNAL_GROUP_PREFIXES):
            continue
        rows.append({"group": group, "topics": sorted({tp.topic for tp in offs}),
                     "partitions": len(offs)})
    return rows


def _end_state(txlog: Log, tp: TopicPartition) -> PartitionState | None:
    try:
        return txlog.partition_log(tp).refresh()
    except UnknownTopicError:
        return None


def describe_group(txlog: Log, group: str) -> list[dict[str, Any]]:
    """Per partition the group committed: its offset, the LSO (the log end offset a
    read_committed consumer sees) and the lag between them."""
    validate_id("group.id", group)
    offs = all_committed_offsets(txlog).get(group)
    if not offs:
        raise GroupIdNotFoundError(
            f"consumer group {group!r} has no committed offsets in {txlog.url}; "
            "`txlog groups list` shows the groups")
    rows = []
    for tp in sorted(offs):
        st = _end_state(txlog, tp)
        lso = st.last_stable_offset if st is not None else None
        rows.append({"group": group, "topic": tp.topic, "partition": tp.partition,
                     "current_offset": offs[tp], "log_end_offset": lso,
                     "lag": max(0, lso - offs[tp]) if lso is not None else None})
    return rows


@dataclass(frozen=True)
class ResetSpec:
    """Where reset-offsets moves each partition: exactly one of the fields is set."""

    to_earliest: bool = False
    to_latest: bool = False
    to_offset: int | None = None
    shift_by: int | None = None


def reset_offsets(txlog: Log, group: str, tps: list[TopicPartition] | None, spec: ResetSpec,
                  *, execute: bool = False) -> list[dict[str, Any]]:
    """Plan (and with ``execute`` commit) new offsets for ``group``.  ``tps`` None means
    every partition the group has committed.  Targets are clamped to
    [log start offset, LSO], as Kafka clamps to the valid range."""
    validate_id("group.id", group)
    current = all_committed_offsets(txlog).get(group, {})
    if tps is None:
        if not current:
            raise GroupIdNotFoundError(
                f"consumer group {group!r} has no committed offsets; name the topics "
                "with --topic")
        tps = sorted(current)
    rows, new = [], {}
    for tp in tps:
        st = txlog.partition_log(tp).refresh()
        lo, hi = st.log_start_offset, st.last_stable_offset
        cur = current.get(tp)
        if spec.to_earliest:
            target = lo
        elif spec.to_latest:
            target = hi
        elif spec.to_offset is not None:
            target = spec.to_offset
        elif spec.shift_by is not None:
            target = (cur if cur is not None else lo) + spec.shift_by
        else:
            raise InvalidTxnStateError("reset-offsets needs a target")
        target = min(max(target, lo), hi)
        new[tp] = target
        rows.append({"group": group, "topic": tp.topic, "partition": tp.partition,
                     "current_offset": cur, "new_offset": target})
    if execute and new:
        consumer = txlog.consumer(group_id=group)
        try:
            consumer.commit(new)
        finally:
            consumer.close()
    return rows


# -- formatting helpers shared with the CLI --------------------------------------------------


def _fmt_ms(ms: int | float) -> str:
    """Human duration: 950ms, 12.5s, 7m03s, 2h05m, 3d04h."""
    ms = int(ms)
    if ms < 0:
        return f"-{_fmt_ms(-ms)}"
    if ms < 1000:
        return f"{ms}ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


fmt_duration = _fmt_ms
