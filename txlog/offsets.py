"""Consumer-group offsets, stored in the internal topic ``__consumer_offsets``.

A commit is a data batch in the group's offsets partition: inside a transaction
(``send_offsets_to_transaction``) it becomes visible only if the transaction commits,
because readers see it through read_committed like any other batch.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa

from txlog.errors import ConfigError, CorruptObjectError, UnstableOffsetCommitError
from txlog.names import CONSUMER_OFFSETS_TOPIC
from txlog.partition_state import OPEN, READ_UNCOMMITTED, VISIBLE
from txlog.records import TopicPartition, kafka_table, now_ms

if TYPE_CHECKING:
    from txlog.log import Log


def offsets_partition(txlog: Log, group_id: str) -> TopicPartition:
    n = txlog.topic(CONSUMER_OFFSETS_TOPIC).partitions
    return TopicPartition(CONSUMER_OFFSETS_TOPIC, zlib.crc32(group_id.encode()) % n)


def _key(group_id: str, tp: TopicPartition) -> bytes:
    return json.dumps([group_id, tp.topic, tp.partition], separators=(",", ":")).encode()


def encode_offset_commits(group_id: str, offsets: Mapping[TopicPartition, int]) -> pa.Table:
    now = now_ms()
    rows = []
    for tp, off in offsets.items():
        tp = TopicPartition(*tp)
        if not isinstance(off, int) or isinstance(off, bool) or off < 0:
            raise ConfigError(f"offset for {tp} must be a non-negative int, not {off!r}")
        rows.append((_key(group_id, tp), json.dumps({"offset": off}).encode(), None, now))
    return kafka_table(rows)


def offset_record_where(tp: TopicPartition, offset: int) -> str:
    return f"{tp.topic}-{tp.partition} offset {offset}"


def decode_offset_key(key: object, where: str) -> tuple[str, TopicPartition]:
    """The (group, partition) an offsets record's key names; anything else is corrupt
    (any writer of the root can put records there)."""
    try:
        group, topic, partition = json.loads(key)  # type: ignore[arg-type]
        if not (isinstance(group, str) and isinstance(topic, str)
                and type(partition) is int and 0 <= partition < 2**31):
            raise ValueError("expected [group, topic, partition]")
    except (TypeError, ValueError, RecursionError) as exc:
        raise CorruptObjectError(
            f"consumer offsets record {where} has a malformed key ({exc}); txlog writes "
            "these records itself: a client wrote this one") from None
    return group, TopicPartition(topic, partition)


def decode_offset_value(value: object, where: str) -> int:
    """The offset an offsets record's value holds; anything else is corrupt."""
    try:
        d = json.loads(value)  # type: ignore[arg-type]
        off = d["offset"] if isinstance(d, dict) else None
        if type(off) is not int or not 0 <= off < 2**63:
            raise ValueError("expected {\"offset\": a non-negative 64-bit int}")
    except (TypeError, ValueError, KeyError, RecursionError) as exc:
        raise CorruptObjectError(
            f"consumer offsets record {where} has a malformed value ({exc}); txlog writes "
            "these records itself: a client wrote this one") from None
    return off


def read_committed_offsets(txlog: Log, group_id: str, tps: Iterable[TopicPartition], *,
                           require_stable: bool = False) -> dict[TopicPartition, int | None]:
    """Latest committed offset per partition: scans the group's offsets partition from its
    newest visible batch backwards and stops once every asked partition is found.

    ``require_stable`` (KIP-447): raise UnstableOffsetCommitError while an open
    transaction holds offsets of the group for an asked partition, instead of answering
    with the offset that transaction is about to replace."""
    wanted = {TopicPartition(*tp): _key(group_id, TopicPartition(*tp)) for tp in tps}
    out: dict[TopicPartition, int | None] = dict.fromkeys(wanted)
    if not wanted:
        return out
    otp = offsets_partition(txlog, group_id)
    plog = txlog.partition_log(otp)
    from txlog.resolve import resolve_or_read

    st = resolve_or_read(txlog, otp)
    # Every committed batch counts, also those above the LSO: another group's transaction
    # still open in this offsets partition must not hide this group's later commits (a
    # restarted consume-transform-produce client would process its input twice).
    spans, _ = st.plan_read(st.log_start_offset, None, READ_UNCOMMITTED)
    by_key = {v: k for k, v in wanted.items()}
    if require_stable:
        for span in (s for s in spans if s.status == OPEN):
            keys = plog.read_span(span, ["key"]).column("key").to_pylist()
            held = sorted({f"{tp.topic}-{tp.partition}" for k in keys
                           if (tp := by_key.get(k)) is not None})
            if held:
                raise UnstableOffsetCommitError(
                    f"group {group_id!r}: an open transaction (producer {span.producer_id}) "
                    f"holds offsets for {', '.join(held)}; call committed() again once it "
                    "commits or aborts")
    spans = [s for s in spans if s.status in VISIBLE]
    missing = set(wanted)
    for span in reversed(spans):
        table = plog.read_span(span, ["key", "value"])
        keys = table.column("key").to_pylist()
        values = table.column("value").to_pylist()
        for i in range(len(keys) - 1, -1, -1):
            tp = by_key.get(keys[i])
            if tp is not None and tp in missing:
                out[tp] = decode_offset_value(
                    values[i], offset_record_where(otp, span.start + i))
                missing.discard(tp)
        if not missing:
            break
    return out
