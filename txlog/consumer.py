"""The consumer: read_committed (default) or read_uncommitted reads of partition logs.

Planning picks batch objects from the partition's metadata (checkpoint plus tail);
reading is columnar (Arrow) and row objects are made only at the edge, in poll().
There is no group membership protocol: ``subscribe`` assigns every partition of the
topics to this consumer; the group id names whose committed offsets it uses.

As Kafka's consumer: a position outside [log start offset, high watermark] is reset by
``auto_offset_reset`` (``none`` raises OffsetOutOfRangeError), and ``committed()`` waits
while a transaction holds pending offsets of the group (KIP-447).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txlog.batch_rows import BatchRows, held_bytes
from txlog.config import coerce, normalize_key
from txlog.errors import (
    ConfigError,
    InvalidTxnStateError,
    OffsetOutOfRangeError,
    UnassignedPartitionError,
    UnstableOffsetCommitError,
)
from txlog.model import share
from txlog.names import validate_id
from txlog.offsets import encode_offset_commits, offsets_partition, read_committed_offsets
from txlog.partition_log import AppendSpec
from txlog.partition_state import (
    ISOLATION_LEVELS,
    READ_COMMITTED,
    PartitionState,
    ReadSpan,
)
from txlog.records import (
    Record,
    TopicPartition,
    now_ms,
    offset_range,
    table_to_records,
    with_append_time,
)
from txlog.resolve import resolve_or_read

if TYPE_CHECKING:
    from txlog.log import Log

_RESOLVE_EVERY_MS = 200
_CONSUMER_KEYS = ("max.poll.records", "default.api.timeout.ms", "fetch.max.bytes",
                  "max.partition.fetch.bytes")


def _stored_bytes(st: PartitionState, span: ReadSpan) -> int:
    """The stored bytes of the records ``span`` reads (its batch's share; a compacted
    segment counts once, at its first run; a shared object by its rows)."""
    b = st.batches
    i = bisect.bisect_left(b.base_offset, span.base_offset)
    if i == len(b) or b.base_offset[i] != span.base_offset or not b.count[i]:
        return 0
    own = share(b.nbytes[i], b.count[i], b.object_rows[i])
    return own * span.take // b.count[i]


class Consumer:
    def __init__(self, txlog: Log, *, group_id: str | None = None,
                 isolation_level: str = READ_COMMITTED, auto_offset_reset: str = "latest",
                 **config: Any) -> None:
        if isolation_level not in ISOLATION_LEVELS:
            raise ConfigError(
                f"isolation_level must be one of {ISOLATION_LEVELS}, not {isolation_level!r}")
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ConfigError(
                f"auto_offset_reset must be earliest, latest or none, not {auto_offset_reset!r}")
        options = {k: txlog.config[k] for k in _CONSUMER_KEYS}
        for k, v in config.items():
            key = normalize_key(k)
            if key not in _CONSUMER_KEYS:
                raise ConfigError(f"unknown consumer option {k!r}; consumer options: "
                                  f"{', '.join(sorted(_CONSUMER_KEYS))}")
            options[key] = coerce(key, v)
        self.max_poll_records = int(options["max.poll.records"])
        self.default_api_timeout_ms = int(options["default.api.timeout.ms"])
        self.fetch_max_bytes = int(options["fetch.max.bytes"])
        self.max_partition_fetch_bytes = int(options["max.partition.fetch.bytes"])
        self.log = txlog
        self.group_id = validate_id("group.id", group_id) if group_id is not None else None
        self.isolation_level = isolation_level
        self.auto_offset_reset = auto_offset_reset
        self._assignment: list[TopicPartition] = []
        self._subscription: set[str] = set()
        self._paused: set[TopicPartition] = set()
        self._positions: dict[TopicPartition, int] = {}
        self._next = 0
        self._last_resolve: dict[TopicPartition, float] = {}  # (monotonic s)
        self._closed = False

    # -- assignment -----------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        tps = [TopicPartition(*tp) for tp in partitions]
        for tp in tps:
            self.log.partition_log(tp)  # validates topic and partition
        self._assignment = tps
        self._subscription = set()
        self._positions = {tp: p for tp, p in self._positions.items() if tp in tps}
        self._paused &= set(tps)

    def subscribe(self, topics: Iterable[str]) -> None:
        """Assign every partition of ``topics`` (no group rebalancing protocol)."""
        if isinstance(topics, str):
            topics = [topics]
        topics = list(topics)
        self.assign([tp for t in topics for tp in self.log.partitions_for(t)])
        self._subscription = set(topics)

    def unsubscribe(self) -> None:
        self.assign([])

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def subscription(self) -> set[str]:
        """The topics given to subscribe() (empty after assign() or unsubscribe())."""
        return set(self._subscription)

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching from ``partitions`` until resume(); positions are kept."""
        tps = [TopicPartition(*tp) for tp in partitions]
        for tp in tps:
            self._require_assigned(tp, "pause()")
        self._paused.update(tps)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        tps = [TopicPartition(*tp) for tp in partitions]
        for tp in tps:
            self._require_assigned(tp, "resume()")
        self._paused.difference_update(tps)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def _require_assigned(self, tp: TopicPartition, what: str) -> None:
        if tp not in self._assignment:
            raise UnassignedPartitionError(
                f"{what}: partition {tp.topic}-{tp.partition} is not assigned to this "
                "consumer; assign() or subscribe() to it first")

    # -- positions ------------------------------------------------------------------------

    def _state(self, tp: TopicPartition, resolve: bool = True) -> PartitionState:
        if self.isolation_level == READ_COMMITTED and resolve:
            st = self.log.partition_log(tp).refresh()
            if st.open_txns:
                # Monotonic: a wall clock stepped back would stop the settling for as
                # long as the step, and an abandoned transaction would hold the reads.
                now = time.monotonic()
                last = self._last_resolve.get(tp)
                if last is None or now - last >= _RESOLVE_EVERY_MS / 1000:
                    self._last_resolve[tp] = now
                    st = resolve_or_read(self.log, tp)
            return st
        return self.log.partition_log(tp).refresh()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        tp = TopicPartition(*tp)
        if offset < 0:
            raise ConfigError(f"seek offset must be >= 0, not {offset}")
        self._require_assigned(tp, "seek()")
        self._positions[tp] = offset

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        for tp in self._assigned(partitions, "seek_to_beginning()"):
            self._positions[tp] = self._state(tp, resolve=False).log_start_offset

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Moves to the LSO under read_committed, the high watermark otherwise (Kafka)."""
        for tp in self._assigned(partitions, "seek_to_end()"):
            self._positions[tp] = self._state(tp).end_offset(self.isolation_level)

    def position(self, tp: TopicPartition) -> int:
        tp = TopicPartition(*tp)
        self._require_assigned(tp, "position()")
        if tp not in self._positions:
            self._init_position(tp)
        return self._positions[tp]

    def _assigned(self, partitions: Iterable[TopicPartition] | None,
                  what: str) -> list[TopicPartition]:
        tps = self._tps(partitions)
        for tp in tps:
            self._require_assigned(tp, what)
        return tps

    def _tps(self, partitions: Iterable[TopicPartition] | None) -> list[TopicPartition]:
        return [TopicPartition(*tp) for tp in partitions] if partitions is not None \
            else list(self._assignment)

    def _init_position(self, tp: TopicPartition) -> None:
        if self.group_id is not None:
            c = self.committed([tp])[tp]
            if c is not None:
                self._positions[tp] = c
                return
        if self.auto_offset_reset == "earliest":
            self.seek_to_beginning([tp])
        elif self.auto_offset_reset == "latest":
            self.seek_to_end([tp])
        else:
            raise OffsetOutOfRangeError(
                f"no committed offset for {tp} and auto_offset_reset='none'")

    def _reset_out_of_range(self, tp: TopicPartition, pos: int,
                            st: PartitionState) -> tuple[int, PartitionState]:
        """Kafka's OFFSET_OUT_OF_RANGE: a position past the high watermark (a seek, or a
        committed offset of a recreated topic) or below the log start (removed by
        retention) is reset by auto_offset_reset, or raises with 'none'."""
        lo, hi = st.log_start_offset, st.high_watermark
        if lo <= pos <= hi:
            return pos, st
        if self.auto_offset_reset == "none":
            raise OffsetOutOfRangeError(
                f"position {pos} of {tp.topic}-{tp.partition} is out of range (the log "
                f"holds offsets {lo} to {hi}) and auto_offset_reset='none'; seek() to a "
                "valid offset")
        new = lo if self.auto_offset_reset == "earliest" else st.end_offset(self.isolation_level)
        self._positions[tp] = new
        return new, st

    # -- fetching -----------------------------------------------------------------------

    def poll_arrow(self, max_records: int | None = None, timeout_ms: int = 0) -> pa.Table:
        """Up to ``max_records`` records as one Arrow table with topic/partition/offset
        columns added (typed topics: their columns; Kafka-shaped: key/value/headers/
        timestamp/timestampType, as Spark's Kafka source has them)."""
        tables = self._fetch(max_records, timeout_ms)
        if not tables:
            return pa.table({"topic": pa.array([], pa.string()),
                             "partition": pa.array([], pa.int32()),
                             "offset": pa.array([], pa.int64())})
        return pa.concat_tables([t for _, t, _ in tables], promote_options="permissive")

    def poll(self, max_records: int | None = None, timeout_ms: int = 0) -> list[Record]:
        """Up to ``max_records`` records, in offset order per partition."""
        out: list[Record] = []
        for tp, table, span_meta in self._fetch(max_records, timeout_ms):
            info = self.log.topic(tp.topic)
            data = table.drop_columns(["topic", "partition", "offset"])  # not timestampType
            for (row, first_offset), n, append_ms in span_meta:
                out.extend(table_to_records(data.slice(row, n), tp.topic, tp.partition,
                                            first_offset, kafka_shaped=info.kafka_shaped,
                                            append_ms=append_ms))
        return out

    def _fetch(self, max_records: int | None, timeout_ms: int) -> list[Any]:
        """(partition, table with topic/partition/offset columns, per-span metadata)."""
        if self._closed:
            raise InvalidTxnStateError("poll() on a closed consumer")
        if not self._assignment:
            raise InvalidTxnStateError("no partitions assigned: call assign() or subscribe()")
        budget = self.max_poll_records if max_records is None else max_records
        deadline = time.monotonic() + timeout_ms / 1000
        delay = 0.01
        slots = self._next_slots()
        while True:
            got = self._fetch_once(budget)
            if got or time.monotonic() >= deadline:
                return got
            if (now := self._next_slots()) != slots:
                # New entries, nothing readable yet (a transaction began here, or its
                # commit is on its way): its marker is due within a request or two, so
                # look again soon, not after the backoff an idle log built up.
                slots, delay = now, 0.01
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.2)

    def _next_slots(self) -> list[int]:
        """The next slot of each assigned partition as cached (no request)."""
        return [st.next_slot if (st := self.log.partition_log(tp).state) is not None else -1
                for tp in self._assignment]

    def _fetch_once(self, budget: int) -> list[Any]:
        out: list[Any] = []
        # Positions move only once every partition was fetched: a failure part-way must
        # not skip records that were read but never returned.
        moved: dict[TopicPartition, int] = {}
        n = len(self._assignment)
        room = self.fetch_max_bytes
        # The same limit on the decoded tables: records that compress well decode to
        # many times their stored size (at least one object is decoded per poll).
        decoded_room = self.fetch_max_bytes
        # Shared objects fetched this round: the other partitions in them read them here.
        kept: dict[str, BatchRows] = {}
        for i in range(n):
            if budget <= 0 or room <= 0 or decoded_room <= 0:
                break
            tp = self._assignment[(self._next + i) % n]
            if tp in self._paused:
                continue
            pos = self.position(tp)
            st = self._state(tp)
            pos, st = self._reset_out_of_range(tp, pos, st)
            spans, upper = st.plan_read(pos, None, self.isolation_level)
            if not spans:
                moved[tp] = max(pos, upper)
                continue
            plog = self.log.partition_log(tp)
            # Kafka's byte limits, on the batches' stored sizes as Kafka counts them:
            # max.partition.fetch.bytes here and fetch.max.bytes in all, with at least one
            # batch per poll so that it makes progress.
            limit = min(room, self.max_partition_fetch_bytes)
            take: list[ReadSpan] = []
            total = size = 0
            for s in spans:
                if total >= budget:
                    break
                nbytes = _stored_bytes(st, s)
                if size + nbytes > limit and (take or out):
                    break
                if total + s.take > budget:
                    from dataclasses import replace

                    s = replace(s, stop=s.start + (budget - total))
                take.append(s)
                total += s.take
                size += nbytes
            if not take:
                break
            tables = plog.read_spans(take, max_decoded=min(decoded_room,
                                                           self.max_partition_fetch_bytes),
                                     kept=kept)
            if len(tables) < len(take):
                take = take[:len(tables)]
                total = sum(s.take for s in take)
                size = sum(_stored_bytes(st, s) for s in take)
            room -= size
            decoded_room -= held_bytes(tables)
            kafka = self.log.topic(tp.topic).kafka_shaped
            meta, row = [], 0
            pieces, offsets = [], []
            for s, t in zip(take, tables, strict=True):
                if kafka:  # objects may leave out headers and timestamps (records.py)
                    t = with_append_time(t, s.append_ms)
                pieces.append(t)
                offsets.append(offset_range(s.start, t.num_rows))
                meta.append(((row, s.start), t.num_rows, s.append_ms))
                row += t.num_rows
            table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
            # Whole columns at once: lists of Python values per span took a third to
            # nearly half of a read of thousand-record batches.
            table = table.append_column("topic", pa.repeat(pa.scalar(tp.topic, pa.string()),
                                                           row))
            table = table.append_column("partition", pa.repeat(pa.scalar(tp.partition,
                                                                         pa.int32()), row))
            table = table.append_column("offset", pa.chunked_array(offsets, pa.int64()))
            consumed_all = len(take) == len(spans) and take[-1].stop == spans[-1].stop
            moved[tp] = upper if consumed_all else take[-1].stop
            out.append((tp, table, meta))
            budget -= total
        self._positions.update(moved)
        self._next = (self._next + 1) % max(1, n)
        return out

    # -- offsets -------------------------------------------------------------------------

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit offsets for the group (outside any transaction): the positions by default."""
        if self.group_id is None:
            raise InvalidTxnStateError("commit() needs a group_id")
        if offsets is None:
            offsets = {tp: self._positions[tp] for tp in self._assignment
                       if tp in self._positions}
        if not offsets:
            return
        otp = offsets_partition(self.log, self.group_id)
        plog = self.log.partition_log(otp)
        table = encode_offset_commits(self.group_id, offsets)
        key, nbytes = plog.write_data(table)
        plog.append(AppendSpec(kind="data", count=table.num_rows, data=key, nbytes=nbytes,
                               ts_min=now_ms(), ts_max=now_ms()))

    def committed(self, partitions: Iterable[TopicPartition], *,
                  timeout: float | None = None) -> dict[TopicPartition, int | None]:
        """The group's committed offsets.  While an open transaction holds offsets of the
        group for one of ``partitions`` (KIP-447), waits for it to commit or abort (or
        time out), up to ``timeout`` seconds (default: default.api.timeout.ms), then
        raises the retriable UnstableOffsetCommitError: the stale offset would make a
        second worker process the same records again."""
        if self.group_id is None:
            raise InvalidTxnStateError("committed() needs a group_id")
        tps = [TopicPartition(*tp) for tp in partitions]
        wait_s = self.default_api_timeout_ms / 1000 if timeout is None else timeout
        deadline = time.monotonic() + wait_s
        delay = 0.02
        while True:
            try:
                return read_committed_offsets(self.log, self.group_id, tps,
                                              require_stable=True)
            except UnstableOffsetCommitError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                if self.log.coordinator.clock.writes_refused:
                    # Only a writer can settle an expired or decided transaction.
                    raise UnstableOffsetCommitError(
                        f"{exc}; this client cannot write to {self.log.url} (read-only "
                        "access), so it cannot settle that transaction: call again later, "
                        "or run `txlog maintain` with write access") from None
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.5)

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._state(tp, resolve=False).log_start_offset
                for tp in self._tps(partitions)}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The LSO under read_committed, the high watermark under read_uncommitted."""
        return {tp: self._state(tp).end_offset(self.isolation_level)
                for tp in self._tps(partitions)}

    def last_stable_offset(self, tp: TopicPartition) -> int:
        return self._state(TopicPartition(*tp)).last_stable_offset

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int],
                          ) -> dict[TopicPartition, int | None]:
        """Earliest offset whose batch's max timestamp is >= the given ms (per partition)."""
        out: dict[TopicPartition, int | None] = {}
        for tp, ts in timestamps.items():
            tp = TopicPartition(*tp)
            st = self._state(tp)
            b = st.batches
            end = st.end_offset(self.isolation_level)
            found = None
            for i in range(len(b)):
                if b.base_offset[i] >= end:
                    break
                if b.base_offset[i] + b.count[i] <= st.log_start_offset:
                    continue
                # A batch's ts_max takes in the append time of records without a
                # timestamp of their own (AppendSpec.untimed).
                visible = self.isolation_level != READ_COMMITTED or b.status[i] in (0, 1)
                if visible and b.ts_max[i] >= ts:
                    found = self._first_at_or_after(tp, st, i, ts)
                    if found is not None:
                        break
            out[tp] = found
        return out

    def _first_at_or_after(self, tp: TopicPartition, st: PartitionState, i: int,
                           ts: int) -> int | None:
        b = st.batches
        info = self.log.topic(tp.topic)
        if not info.kafka_shaped:
            return max(b.base_offset[i], st.log_start_offset)
        from txlog.partition_state import ReadSpan

        span = ReadSpan(b.data[i], b.base_offset[i], b.count[i], b.base_offset[i],
                        b.base_offset[i] + b.count[i], b.status[i], b.producer_id[i],
                        b.append_ms[i], b.row[i])  # its run's rows, in a compacted segment
        t = self.log.partition_log(tp).read_span(span, ["timestamp"])
        t = with_append_time(t, b.append_ms[i])
        for j, v in enumerate(t.column("timestamp").cast(pa.int64()).to_pylist()):
            if v >= ts and b.base_offset[i] + j >= st.log_start_offset:
                return b.base_offset[i] + j
        return None

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
