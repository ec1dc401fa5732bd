"""Exactly-once read-process-write with Spark: Kafka's consume-transform-produce loop.

    import spark_ext.exactly_once as eos
    eos.run(spark, path="s3://bucket/lake", source_topic="orders", sink_topic="totals",
            group_id="totals-job", transform=lambda df: df.where("value is not null"))
    eos.run(spark, path="s3://bucket/lake", source_topic="orders", sink_delta="/tables/orders",
            group_id="orders-delta", transform=lambda df: df.selectExpr("cast(value as string)"))

Each round reads the source topic from the group's committed offsets up to the last stable
offset (read_committed: aborted records are never seen), applies ``transform``, writes the
result to the sink topic, and commits the source offsets it read up to *in the same
transaction* as the output (``send_offsets_to_transaction``).  Output and progress become
visible together or not at all, so running the job again after a crash at any point
continues exactly where the last committed round ended: the sink holds each result once.

How concurrent and crashed runs are kept apart:

* every run of a group uses the same transactional.id (``eos-<group id>``), so a new run
  fences an older one and settles the transaction it left open (an open one is aborted; one
  that had decided to commit is completed);
* the commit (on the Spark driver, :func:`spark_ext.writer.commit_staged`) re-reads the
  group's committed offsets after ``init_transactions`` and commits nothing if they moved
  since the round was read: another run has processed that range.

Into a Delta table instead of a topic (``sink_delta="<path or table name>"``), each round
appends with Delta's ``txnAppId``/``txnVersion`` and then commits the source offsets in
txlog; a run that stopped between the two is settled from the table's own record (see
:func:`run_into_delta`).

``transform`` must be a function of its input only (no side effects outside Spark); it
sees Spark's Kafka columns (key, value, topic, partition, offset, timestamp,
timestampType, headers) or a typed topic's columns plus topic/partition/offset/timestamp,
and returns the sink's columns (see :mod:`spark_ext.writer`: a ``partition`` column picks
the sink partition explicitly; the sink topic always wins over a ``topic`` column).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import spark_ext
from spark_ext.write_options import SEND_OFFSETS_OPTION, SendOffsets
from txlog.errors import ConfigError, OffsetOutOfRangeError, ProducerFencedError
from txlog.names import validate_id, validate_topic
from txlog.records import TopicPartition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from txlog.log import Log


@dataclass
class Round:
    """One transaction of the loop: source offsets [start, end) per partition."""

    number: int
    start: dict[TopicPartition, int]
    end: dict[TopicPartition, int]
    committed: bool  # False: another run had already processed this range (nothing written)
    # Into Delta: the table already held this round (a run stopped before committing its
    # offsets); the offsets were committed from the table's record, nothing was written.
    settled: bool = False

    @property
    def offsets(self) -> int:
        return sum(self.end[tp] - self.start[tp] for tp in self.end)


@dataclass
class RunResult:
    transactional_id: str
    rounds: list[Round] = field(default_factory=list)

    @property
    def committed_rounds(self) -> int:
        return sum(1 for r in self.rounds if r.committed)


def transactional_id_for(group_id: str) -> str:
    """The transactional.id every run of ``group_id`` uses (so runs fence each other)."""
    return f"eos-{validate_id('group.id', group_id)}"


def _positions(lg: Log, source_topic: str, group_id: str, starting: str,
               ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """(where the group resumes, the last stable offset) per source partition."""
    c = lg.consumer(group_id=group_id, isolation_level="read_committed")
    tps = lg.partitions_for(source_topic)
    committed = c.committed(tps)
    begin = c.beginning_offsets(tps)
    lso = c.end_offsets(tps)
    start: dict[TopicPartition, int] = {}
    for tp in tps:
        off = committed[tp]
        if off is None:
            off = begin[tp] if starting == "earliest" else lso[tp]
        elif off < begin[tp]:
            raise OffsetOutOfRangeError(
                f"group {group_id!r} committed offset {off} for {tp.topic}-{tp.partition}, "
                f"but the log now starts at {begin[tp]} (retention or compaction removed "
                "records it has not processed)")
        start[tp] = off
    return start, lso


def _round_bounds(lg: Log, source_topic: str, group_id: str, starting: str,
                  max_records: int | None,
                  ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """(start, end) offsets of the next round per source partition: from where the group
    resumes to the last stable offset, at most ``max_records`` in all."""
    from spark_ext.read_plan import rate_limit

    start, lso = _positions(lg, source_topic, group_id, starting)
    end = dict(lso) if max_records is None else rate_limit(start, lso, max_records)
    return start, {tp: max(start[tp], off) for tp, off in end.items()}


def _read(spark: SparkSession, path: str, storage_options: Mapping[str, Any] | None,
          topic: str, start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int],
          native: bool) -> DataFrame:
    def enc(m: Mapping[TopicPartition, int]) -> str:
        return json.dumps({topic: {str(tp.partition): off for tp, off in sorted(m.items())}})

    opts: dict[str, str] = {"path": path, "topic": topic, "startingOffsets": enc(start),
                            "endingOffsets": enc(end), "isolation.level": "read_committed"}
    if storage_options:
        opts["storage_options"] = json.dumps(dict(storage_options))
    if native:
        import spark_ext

        return spark_ext.read(spark, options=opts, engine="auto")
    return spark.read.format("txlog").options(**opts).load()


def run(spark: SparkSession, *, path: str, source_topic: str, group_id: str,
        transform: Callable[[DataFrame], DataFrame], sink_topic: str | None = None,
        sink_delta: str | None = None, storage_options: Mapping[str, Any] | None = None,
        max_records_per_round: int | None = None, max_rounds: int | None = None,
        starting_offsets: str = "earliest", reader: str = "auto",
        on_round: Callable[[Round], None] | None = None) -> RunResult:
    """Process the source topic up to its current last stable offset, exactly once.

    ``max_records_per_round`` caps the offsets one transaction covers (spread over the
    partitions in proportion to their backlog, like Spark's maxOffsetsPerTrigger), so a
    large backlog is committed in several rounds and a crash loses at most one round of
    work.  ``max_rounds`` stops after that many rounds.  ``starting_offsets`` ("earliest"
    or "latest") applies to partitions the group never committed.  ``reader``: "native"
    scans with Spark's Parquet reader (Spark must reach the store: local paths, or Hadoop
    connectors configured), "source" uses ``format("txlog")`` (any store), "auto" picks
    native for local roots.  ``on_round`` is called after every round.

    ``sink_delta`` (instead of ``sink_topic``): a Delta table's path or catalog name; see
    :func:`run_into_delta` for how its rounds stay exactly-once.
    """
    import txlog

    if (sink_topic is None) == (sink_delta is None):
        raise ConfigError("give exactly one of sink_topic (a txlog topic) and sink_delta "
                          "(a Delta table's path or name)")
    validate_topic(source_topic)
    if starting_offsets not in ("earliest", "latest"):
        raise ConfigError(f"starting_offsets must be 'earliest' or 'latest', not "
                          f"{starting_offsets!r}")
    if reader not in ("auto", "native", "source"):
        raise ConfigError(f"reader must be 'auto', 'native' or 'source', not {reader!r}")
    if max_records_per_round is not None and max_records_per_round < 1:
        raise ConfigError("max_records_per_round must be at least 1")
    tid = transactional_id_for(group_id)
    lg = txlog.connect(path, dict(storage_options or {}))
    native = reader == "native" or (reader == "auto" and lg.store.local_files)
    if sink_delta is not None:
        return run_into_delta(
            spark, lg, path=path, source_topic=source_topic, sink_delta=sink_delta,
            group_id=group_id, transform=transform, storage_options=storage_options,
            max_records_per_round=max_records_per_round, max_rounds=max_rounds,
            starting_offsets=starting_offsets, native=native, on_round=on_round)
    assert sink_topic is not None
    validate_topic(sink_topic)
    lg.topic(sink_topic)  # fail early, before reading anything
    result = RunResult(tid)
    while max_rounds is None or len(result.rounds) < max_rounds:
        # Fence any earlier run of this group and settle what it left open, so the
        # committed offsets read next are final.
        p = lg.producer(transactional_id=tid)
        p.init_transactions()
        p.close()
        start, end = _round_bounds(lg, source_topic, group_id, starting_offsets,
                                   max_records_per_round)
        if all(end[tp] <= start[tp] for tp in end):
            break
        df = _read(spark, path, storage_options, source_topic, start, end, native)
        out = transform(df)
        send = SendOffsets(group_id, start, end)
        opts = {"topic": sink_topic, "transactional.id": tid,
                SEND_OFFSETS_OPTION: send.to_json()}
        if storage_options:
            opts["storage_options"] = json.dumps(dict(storage_options))
        # The JVM writer where Spark can write the store itself, else format("txlog").
        spark_ext.write(out, path, opts, engine="auto")
        after = lg.consumer(group_id=group_id).committed(list(end))
        rnd = Round(len(result.rounds) + 1, start, end,
                    committed=all(after[tp] == end[tp] for tp in end))
        result.rounds.append(rnd)
        if on_round is not None:
            on_round(rnd)
    return result


# -- rounds into a Delta table ----------------------------------------------------------------


def delta_app_id(group_id: str) -> str:
    """The Delta txnAppId (and txlog app id) of ``group_id``'s rounds into a Delta table."""
    return f"txlog-eos-{validate_id('group.id', group_id)}"


def run_into_delta(spark: SparkSession, lg: Log, *, path: str, source_topic: str,
                   sink_delta: str, group_id: str, transform: Callable[[DataFrame], DataFrame],
                   storage_options: Mapping[str, Any] | None,
                   max_records_per_round: int | None, max_rounds: int | None,
                   starting_offsets: str, native: bool,
                   on_round: Callable[[Round], None] | None) -> RunResult:
    """The loop of :func:`run` into a Delta table: round n appends to the table and
    records, in the same Delta commit, the app id :func:`delta_app_id` at version n
    (Delta's SetTransaction, as ``txnAppId``/``txnVersion`` do; its source range in the
    commit's userMetadata; see :mod:`spark_ext.delta_txn`), then commits the source
    offsets together with "round n done" (txlog's app version) in one txlog transaction.

    Round n starts where the group's offsets are and compares the table's record for the
    app id with the last round whose offsets were committed:

    * equal: nothing pending; read, write round n, commit its offsets;
    * one ahead: a run stopped between the Delta commit and the offset commit; the table's
      commit says which range it covered, so those offsets are committed and nothing is
      written (the round is ``settled``);
    * anything else cannot come from a crash (the table was replaced, or the group's
      offsets reset): :class:`spark_ext.delta.DeltaSinkStateError`.

    Each run of the group fences the earlier ones (transactional.id ``eos-<group>``), and
    a round that another run's round n beat to the table (Delta skipped its write, or its
    commit conflicted and wrote nothing) commits the range that the table's round n
    holds, not its own, so the two cannot disagree.
    """
    from spark_ext import delta as sd
    from spark_ext import delta_txn as dtx
    from spark_ext.writer import _pause_point
    from txlog.app_versions import committed_app_version

    tid = transactional_id_for(group_id)
    app = delta_app_id(group_id)
    result = RunResult(tid)
    while max_rounds is None or len(result.rounds) < max_rounds:
        p = lg.producer(transactional_id=tid)
        try:
            # Fence earlier runs and settle what they left open: the offsets and the
            # round count read next are final for this run.
            p.init_transactions()
            done = committed_app_version(lg, app) or 0
            start, end = _round_bounds(lg, source_topic, group_id, starting_offsets,
                                       max_records_per_round)
            if all(end[tp] <= start[tp] for tp in end):
                # Nothing to read, so no round is pending either (a round written to the
                # table but not committed here covers offsets from the group's position).
                break
            # One fresh snapshot of the table: its version, the app's record and the
            # Delta transaction the round commits through.
            record = dtx.open_round(spark, sink_delta, app)
            in_table = record.txn_version or 0
            number = len(result.rounds) + 1
            if in_table == done + 1:
                end = _range_in_table(spark, lg, sink_delta, app, in_table, group_id,
                                      source_topic, start)
                _commit_round(p, group_id, app, in_table, end)
                rnd = Round(number, start, end, committed=True, settled=True)
            elif in_table != done:
                raise sd.DeltaSinkStateError(
                    f"Delta table {sink_delta!r} holds round {in_table} of {app!r}, but "
                    f"group {group_id!r} committed the offsets of round {done}: the table "
                    "was replaced or the group's offsets were reset. Use a new group id "
                    "(and a new table) to start over")
            else:
                df = _read(spark, path, storage_options, source_topic, start, end, native)
                meta = sd.user_metadata(app=app, round=done + 1, group=group_id,
                                        topic=source_topic, start=_by_partition(start),
                                        end=_by_partition(end))
                _pause_point("delta-before-write")
                written = dtx.write_round(spark, record, transform(df), sink_delta,
                                          app_id=app, version=done + 1, metadata=meta)
                _pause_point("delta-after-write")
                if written is not None:
                    held_meta = sd.parse_user_metadata(meta)
                else:
                    # Another run may have written this round first (Delta skipped the
                    # write, or its commit lost to that run's).  If that run also
                    # committed the round's offsets, it has taken over the group.
                    now_done = committed_app_version(lg, app) or 0
                    if now_done > done:
                        raise ProducerFencedError(
                            f"another run of group {group_id!r} committed round {now_done} "
                            f"of {app!r} while this run was writing round {done + 1}: this "
                            "run wrote nothing to the Delta table and stops; run the job "
                            "again to continue after it")
                    # Otherwise commit the range the table's round holds, found among
                    # the commits after the snapshot.
                    location = record.location or sd.table_location(spark, sink_delta)
                    held_meta = None if location is None else sd.round_committed_after(
                        spark, location, app, done + 1, record.table_version)
                held = _range_in_table(spark, lg, sink_delta, app, done + 1, group_id,
                                       source_topic, start, held_meta)
                _commit_round(p, group_id, app, done + 1, held)
                rnd = Round(number, start, held, committed=held == end)
        finally:
            p.close()
        _pause_point("delta-after-round")
        result.rounds.append(rnd)
        if on_round is not None:
            on_round(rnd)
    return result


def _by_partition(offsets: Mapping[TopicPartition, int]) -> dict[str, int]:
    return {str(tp.partition): off for tp, off in sorted(offsets.items())}


def _range_in_table(spark: SparkSession, lg: Log, table: str, app: str, number: int,
                    group_id: str, topic: str, start: Mapping[TopicPartition, int],
                    meta: dict[str, Any] | None = None) -> dict[TopicPartition, int]:
    """The source offsets round ``number`` of ``app`` wrote up to, from the table's commit
    (its userMetadata, when already read), checked against where the group stands."""
    from spark_ext import delta as sd

    if meta is None:
        meta = sd.find_commit_metadata(spark, table, app, number)
    if meta is None:
        raise sd.DeltaSinkStateError(
            f"Delta table {table!r} records round {number} of {app!r}, but its history no "
            "longer holds that commit's source range (log retention removed it?): the "
            f"offsets of group {group_id!r} cannot be settled; set them by hand to where "
            "the table's data ends")
    committed = lg.consumer(group_id=group_id).committed(list(start))
    ends: dict[TopicPartition, int] = {}
    for tp in start:
        lo, hi = meta["start"].get(str(tp.partition)), meta["end"].get(str(tp.partition))
        if meta.get("topic") != topic or lo is None or hi is None or hi < lo or (
                committed[tp] is not None and lo != committed[tp]):
            raise sd.DeltaSinkStateError(
                f"Delta table {table!r} round {number} of {app!r} covers {meta!r}, which "
                f"does not start where group {group_id!r} stands on {topic} ({dict(start)})")
        ends[tp] = hi
    return ends


def _commit_round(p: Any, group_id: str, app: str, number: int,
                  end: Mapping[TopicPartition, int]) -> None:
    """The round's source offsets and its number, in one txlog transaction."""
    from spark_ext.writer import _pause_point

    p.begin_transaction()
    p.send_offsets_to_transaction(dict(end), group_id)
    _pause_point("delta-in-offset-commit")
    p.send_app_version(app, number)
    p.commit_transaction()
