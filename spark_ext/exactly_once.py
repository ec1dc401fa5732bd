"""Exactly-once read-process-write with Spark: Kafka's consume-transform-produce loop.

    import spark_ext.exactly_once as eos
    eos.run(spark, path="s3://bucket/lake", source_topic="orders", sink_topic="totals",
            group_id="totals-job", transform=lambda df: df.where("value is not null"))

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
from spark_ext.writer import SEND_OFFSETS_OPTION, SendOffsets
from txlog.errors import ConfigError, OffsetOutOfRangeError
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

        return spark_ext.read(spark, options=opts)
    return spark.read.format("txlog").options(**opts).load()


def run(spark: SparkSession, *, path: str, source_topic: str, sink_topic: str, group_id: str,
        transform: Callable[[DataFrame], DataFrame],
        storage_options: Mapping[str, Any] | None = None,
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
    """
    import txlog
    from spark_ext.read_plan import rate_limit

    validate_topic(source_topic)
    validate_topic(sink_topic)
    if starting_offsets not in ("earliest", "latest"):
        raise ConfigError(f"starting_offsets must be 'earliest' or 'latest', not "
                          f"{starting_offsets!r}")
    if reader not in ("auto", "native", "source"):
        raise ConfigError(f"reader must be 'auto', 'native' or 'source', not {reader!r}")
    if max_records_per_round is not None and max_records_per_round < 1:
        raise ConfigError("max_records_per_round must be at least 1")
    tid = transactional_id_for(group_id)
    lg = txlog.connect(path, dict(storage_options or {}))
    lg.topic(sink_topic)  # fail early, before reading anything
    native = reader == "native" or (reader == "auto" and lg.store.local_files)
    result = RunResult(tid)
    while max_rounds is None or len(result.rounds) < max_rounds:
        # Fence any earlier run of this group and settle what it left open, so the
        # committed offsets read next are final.
        p = lg.producer(transactional_id=tid)
        p.init_transactions()
        p.close()
        start, lso = _positions(lg, source_topic, group_id, starting_offsets)
        end = dict(lso) if max_records_per_round is None else \
            rate_limit(start, lso, max_records_per_round)
        end = {tp: max(start[tp], off) for tp, off in end.items()}
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
        spark_ext.write(out, path, opts)
        after = lg.consumer(group_id=group_id).committed(list(end))
        rnd = Round(len(result.rounds) + 1, start, end,
                    committed=all(after[tp] == end[tp] for tp in end))
        result.rounds.append(rnd)
        if on_round is not None:
            on_round(rnd)
    return result
