"""The Spark writer: one Spark job (or one micro-batch) is one txlog transaction.

``df.write.format("txlog").option("path", root).option("topic", t).mode("append").save()``

How a write runs (Spark's Python data source API; docs/design.md "Spark"):

* The writer object is built once, in a Python worker on the driver side, when Spark plans
  the write.  Its ``__init__`` resolves the topic, checks the DataFrame's schema against it
  (a mismatch is a :class:`~txlog.errors.SchemaMismatchError` before any task runs) and
  picks a fresh *staging id*.  The object is then pickled to every task and to the worker
  that runs ``commit``/``abort``, so the id is known everywhere without coordination.
* Each task (:mod:`spark_ext.staging`) writes its rows, split per target partition, as
  Parquet objects under ``layout.staging_prefix(topic, staging id)`` and returns a
  :class:`TxlogCommitMessage` listing them.  Tasks never open a transaction, so a long job
  never holds any partition's last stable offset back.
* ``commit(messages)`` (driver side, messages of the successful attempts only, one per
  Spark partition) opens a transactional producer, appends every staged object with
  ``send_staged_many`` (each partition's in a deterministic order, different partitions
  at once; no data is copied), adds the app version or
  consumer offsets that ride along, and commits.  Staged objects no successful attempt
  reported (failed or speculative attempts) are deleted afterwards: the log never
  references them.
* ``abort(messages)`` deletes the staging folder.  If a commit had already started
  appending (Spark calls ``abort`` when ``commit`` raises), only the objects no message
  lists are deleted, since appended ones may belong to a transaction that completed.

Idempotent re-runs (Delta Lake's ``txnAppId``/``txnVersion``): the producer uses
``app_transactional_id(txnAppId)`` so that concurrent runs of one app fence each other and
a re-run settles whatever its crashed predecessor left open; after ``init_transactions``
a version at or below the committed one commits nothing (a warning says so).

Streaming (``writeStream.format("txlog")``): every micro-batch is one transaction with
``txnAppId = "stream-<query id>"`` (or the ``txnAppId`` option) and ``txnVersion =
batchId``.  Spark gives ``commit`` the batch id; the query id, which Spark keeps in the
checkpoint so that it survives restarts, reaches the tasks as the local property
``sql.streaming.queryId`` and travels to ``commit`` inside the commit messages.  A batch
replayed after a crash therefore commits nothing new.  (With an explicit ``txnAppId`` on
a stream, a new checkpoint restarts batch ids at 0: give it a new app id too, as Delta
Lake asks of idempotent ``foreachBatch`` writes.)

Options (case-insensitive):

* ``path`` (required): the txlog root; ``storage_options``: JSON of fsspec options;
* ``topic``: the target topic.  Without it, rows name their topic in a ``topic`` column
  (Kafka-shaped topics; as with Spark's Kafka sink the option wins over the column);
* ``partitioner``: ``default`` (Kafka's murmur2 of the key, sticky round robin per Arrow
  batch for rows without a key), ``murmur2`` (same) or ``roundrobin``; a ``partition``
  column picks partitions explicitly (nulls fall back to the partitioner);
* ``transactional.id``: default ``spark-<staging id>``, unique per job;
* ``txnAppId`` + ``txnVersion``: idempotent batch writes (above);
* ``transaction.timeout.ms``, ``maxFileBytes`` (staged object size, default 128 MiB).

Columns: Kafka-shaped topics take ``value`` (required; string or binary), ``key``,
``headers`` (array<struct<key: string, value: binary>>), ``timestamp``, and the routing
columns ``topic``/``partition``; ``offset`` and ``timestampType`` (what the reader adds) are
accepted and dropped.  Typed topics take their own columns (nullable ones may be missing)
plus ``topic``/``partition``; a ``timestamp`` or ``offset`` column is dropped.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from spark_ext import staging
from spark_ext.options import PLAN_LOCK, cached_log_for
from spark_ext.staging import StagedFile, StageSpec, TopicTarget
from spark_ext.write_options import (
    WriteOptions,
    parse_write_options,
)
from txlog import layout
from txlog.errors import ConfigError, SchemaMismatchError
from txlog.producer import StagedObject
from txlog.records import TopicPartition, now_ms

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from txlog.log import Log
    from txlog.producer import Producer

log = logging.getLogger("spark_ext.writer")

#: Name of the object a commit writes into the staging folder before its first append.
COMMIT_STARTED = "_commit-started.json"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


# -- commit messages -------------------------------------------------------------------------


@dataclass
class TxlogCommitMessage(WriterCommitMessage):
    """What one successful task staged (picklable; Spark carries it to the driver)."""

    txn: str  # staging id
    files: list[StagedFile]
    task: int = 0
    attempt: int = 0
    query_id: str | None = None  # streaming: the query's id (stable across restarts)
    batch_id: int | None = None


@dataclass
class CommitResult:
    """What a commit did; ``skipped`` says why nothing was committed (or is None)."""

    transactional_id: str
    files: int
    rows: int
    partitions: int
    skipped: str | None = None
    swept: int = 0


# -- building the stage spec (driver side) ------------------------------------------------


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _spec(wo: WriteOptions, schema: StructType, txn: str) -> StageSpec:
    """Resolve the target topic(s) and check the DataFrame's columns against them."""
    columns = [f.name for f in schema.fields]
    dup = {c for c in columns if columns.count(c) > 1}
    if dup:
        raise SchemaMismatchError(f"the DataFrame has duplicate columns {sorted(dup)}")
    arrow = _arrow_schema(schema)
    lg = wo.connect()
    targets: dict[str, TopicTarget] = {}
    if wo.topic is not None:
        info = lg.topic(wo.topic)
        t = TopicTarget(info.name, info.partitions, info.kafka_shaped, info.schema)
        staging.check_columns(columns, arrow, t)
        targets[info.name] = t
    else:
        if "topic" not in columns:
            raise ConfigError(
                "say where to write: set the 'topic' option, or give the DataFrame a "
                "'topic' column (Kafka-shaped topics)")
        # Rows name their topics; each is checked (and resolved) when a task meets it.
        # The columns must at least be Kafka-shaped.
        from txlog.records import KAFKA_SCHEMA

        staging.check_columns(columns, arrow, TopicTarget("<topic column>", 1, True,
                                                          KAFKA_SCHEMA))
    return StageSpec(url=wo.url, storage_options=wo.storage_options, txn=txn,
                     topic=wo.topic, targets=targets, columns=columns,
                     partitioner=wo.partitioner, file_bytes=wo.file_bytes)


def new_staging_id() -> str:
    """Time-ordered and unique: ``<ms>-<uuid>`` (the time lets a sweeper judge age)."""
    return f"{now_ms():013d}-{uuid.uuid4().hex}"


# -- the driver-side transaction ------------------------------------------------------------


def _pause_point(point: str) -> None:
    """Test hook: with TXLOG_TEST_PAUSE_DIR/TXLOG_TEST_PAUSE_AT set, stop at ``point`` (after
    passing it TXLOG_TEST_PAUSE_SKIP times) and wait there until the test kills this process
    or creates ``<dir>/resume``.  Unset, it costs one environment lookup."""
    at = os.environ.get("TXLOG_TEST_PAUSE_AT")
    d = os.environ.get("TXLOG_TEST_PAUSE_DIR")
    if not at or not d or at != point:
        return
    os.makedirs(d, exist_ok=True)
    skip = int(os.environ.get("TXLOG_TEST_PAUSE_SKIP", "0") or 0)
    passed = [n for n in os.listdir(d) if n.startswith(f"{point}.passed.")]
    if len(passed) < skip:
        with open(os.path.join(d, f"{point}.passed.{len(passed)}"), "w") as f:
            f.write(str(os.getpid()))
        return
    tmp = os.path.join(d, f".paused.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(json.dumps({"point": point, "pid": os.getpid()}))
    os.replace(tmp, os.path.join(d, "paused"))
    while not os.path.exists(os.path.join(d, "resume")):
        time.sleep(0.02)


def _fail_point(topic: str | None, attempt: int) -> None:
    """Test hook: TXLOG_TEST_FAIL_STAGED="topic:first,other:always" fails a task right after
    it staged its files (every first attempt, or every attempt) for that topic."""
    raw = os.environ.get("TXLOG_TEST_FAIL_STAGED")
    if not raw or topic is None:
        return
    for item in raw.split(","):
        t, _, mode = item.strip().partition(":")
        if t == topic and (mode == "always" or (mode == "first" and attempt == 0)):
            raise RuntimeError(
                f"TXLOG_TEST_FAIL_STAGED: task attempt {attempt} fails after staging")


def _say(msg: str) -> None:
    """Warnings from the driver-side worker that runs commit(): Spark shows that worker's
    stderr on the driver's console (and its log), so print there; log too when logging is
    configured."""
    if logging.getLogger().handlers:
        log.warning("%s", msg)
    print(f"txlog WARNING: {msg}", file=sys.stderr, flush=True)


def _staging_prefixes(lg: Log, topics: Iterable[str], txns: Iterable[str]) -> list[str]:
    return sorted({layout.staging_prefix(t, x) for t in topics for x in txns})


def _list_staged(lg: Log, prefixes: Iterable[str]) -> list[str]:
    out: list[str] = []
    for p in prefixes:
        out.extend(lg.store.list(p))
    return out


def _delete_quietly(lg: Log, keys: Iterable[str]) -> int:
    n = 0
    for k in keys:
        try:
            lg.store.delete(k)
            n += 1
        except Exception as exc:  # a leftover costs only space; a sweeper removes it
            log.warning("could not delete staged object %s: %s", k, exc)
    return n


def sweep(lg: Log, prefixes: Iterable[str], keep: Iterable[str] = ()) -> int:
    """Delete every object under ``prefixes`` except ``keep`` (staged files the log
    references).  Returns how many were deleted."""
    keep_set = set(keep)
    try:
        keys = _list_staged(lg, prefixes)
    except Exception as exc:
        log.warning("could not list staging folders %s: %s", list(prefixes), exc)
        return 0
    return _delete_quietly(lg, [k for k in keys if k not in keep_set])


def commit_staged(wo: WriteOptions, files: list[StagedFile], txns: Iterable[str],
                  topics: Iterable[str], *, app_id: str | None = None,
                  app_version: int | None = None,
                  transactional_id: str | None = None, lg: Log | None = None) -> CommitResult:
    """Append the staged ``files`` to their partitions and commit, in one transaction.

    ``txns``/``topics`` name the staging folders to sweep afterwards.  With ``app_id``,
    a version not above the committed one commits nothing; with ``wo.send_offsets``, so
    does a group whose committed offsets moved since the data was read.
    """
    from txlog.app_versions import app_transactional_id, committed_app_version
    from txlog.offsets import read_committed_offsets

    if lg is None:
        # Spark reuses its commit worker: a cached Log reads only the entries appended
        # since its last commit, where a fresh one replays each partition's tail.  Its
        # partition states are shared with planning in the same process.
        with PLAN_LOCK:
            return commit_staged(
                wo, files, txns, topics, app_id=app_id, app_version=app_version,
                transactional_id=transactional_id,
                lg=cached_log_for(wo.url, wo.storage_options,
                                  sorted({f.topic for f in files} | set(topics))))
    order = sorted(files, key=lambda f: (f.topic, f.partition, f.task, f.seq, f.key))
    prefixes = _staging_prefixes(lg, set(topics) | {f.topic for f in files}, txns)
    if app_id is not None:
        tid = app_transactional_id(app_id)
    elif transactional_id is not None:
        tid = transactional_id
    elif wo.transactional_id is not None:
        tid = wo.transactional_id
    else:
        tid = f"spark-{next(iter(sorted(txns)), uuid.uuid4().hex)}"
    rows = sum(f.rows for f in order)
    nparts = len({(f.topic, f.partition) for f in order})
    result = CommitResult(tid, len(order), rows, nparts)
    if not order and app_id is None and wo.send_offsets is None:
        result.skipped = "no rows: nothing to commit"
        result.swept = sweep(lg, prefixes)  # failed attempts may have staged files
        return result

    producer: Producer = lg.producer(transactional_id=tid, **wo.producer_config)
    producer.init_transactions()  # fences earlier runs and settles what they left open
    skipped = None
    if app_id is not None and app_version is not None:
        done = committed_app_version(lg, app_id)
        if done is not None and done >= app_version:
            skipped = (f"txnAppId {app_id!r} already committed version {done}; this write "
                       f"(version {app_version}) commits nothing ({rows} rows discarded)")
        elif wo.app_after is not None and (-1 if done is None else done) != wo.app_after:
            # Another run committed versions this write read as new: committing would
            # repeat them.
            skipped = (f"txnAppId {app_id!r} committed version {done} after this write read "
                       f"the versions following {wo.app_after}: another run exported "
                       f"them; this write (version {app_version}) commits nothing ({rows} "
                       "rows discarded). Run it again to continue after that run")
    if skipped is None and wo.send_offsets is not None:
        so = wo.send_offsets
        now = read_committed_offsets(lg, so.group, list(so.start))
        moved = {tp: off for tp, off in now.items()
                 if off is not None and off != so.start[tp]}
        if moved:
            skipped = (f"group {so.group!r} committed offsets {_fmt(moved)} since this batch "
                       f"was read from {_fmt(so.start)}: another run already processed it; "
                       "this write commits nothing")
    if skipped is not None:
        producer.close()
        result.skipped = skipped
        result.swept = sweep(lg, prefixes)
        _say(skipped)
        return result

    # Tell a later abort() that appends may have happened: it must then keep listed files.
    # A transactional.id made up for this job alone may be settled by abort() at once.
    own = app_id is None and transactional_id is None and wo.transactional_id is None
    marker = json.dumps({"transactional_id": tid, "own": own, "ms": now_ms()}).encode()
    for p in _staging_prefixes(lg, {f.topic for f in order}, txns):
        lg.store.put(p + COMMIT_STARTED, marker)
    tps = sorted({TopicPartition(f.topic, f.partition) for f in order})
    # Load them all at once (in parallel on remote stores): the appends below then find
    # them loaded instead of each paying its round trips in turn.
    lg.refresh_partitions(tps)
    producer.begin_transaction()
    try:
        # It registers every partition in one state-log write first.
        producer.send_staged_many([
            StagedObject(TopicPartition(f.topic, f.partition), f.key, f.rows, f.nbytes,
                         f.ts_min, f.ts_max, f.untimed) for f in order])
        if app_id is not None and app_version is not None:
            producer.send_app_version(app_id, app_version)
        if wo.send_offsets is not None:
            producer.send_offsets_to_transaction(wo.send_offsets.end, wo.send_offsets.group)
        _pause_point("before-commit")
        producer.commit_transaction()
    except BaseException:
        try:
            producer.abort_transaction()
        except Exception as exc:
            log.warning("abort after a failed commit of %s also failed: %s", tid, exc)
        raise
    # Wait for the markers: when the job returns, a read from any process sees the rows
    # without first rolling the commit forward itself.
    producer.close()
    _pause_point("after-commit")
    result.swept = sweep(lg, prefixes, keep={f.key for f in order})
    log.info("txlog: committed %d rows in %d files to %d partitions (transactional.id %s)",
             rows, len(order), nparts, tid)
    return result


def abort_staged(wo: WriteOptions, messages: Iterable[TxlogCommitMessage | None],
                 txns: Iterable[str], topics: Iterable[str] | None) -> int:
    """Delete what a failed job staged.  If its commit had started appending, keep every
    object a message lists (it may be part of a completed transaction)."""
    lg = wo.connect()
    msgs = [m for m in messages if m is not None]
    listed = {f.key for m in msgs for f in m.files}
    if topics is None:  # rows named their topics: look in every topic's staging folder
        topics = set(lg.list_topics()) | {f.topic for m in msgs for f in m.files}
    prefixes = _staging_prefixes(lg, topics, txns)
    markers = []
    for p in prefixes:
        try:
            markers.append(json.loads(lg.store.get(p + COMMIT_STARTED)))
        except KeyError:
            continue
    if not markers:
        return sweep(lg, prefixes)
    # The commit started appending.  If the transactional.id was this job's own, settle
    # its transaction now (an open one is aborted, a decided commit completed) rather than
    # leaving it to hold the last stable offset until it times out.  A shared id (txnAppId,
    # an explicit transactional.id) is left alone: that could fence a newer run.
    for m in markers:
        if m.get("own"):
            try:
                settle = lg.producer(transactional_id=str(m["transactional_id"]))
                settle.init_transactions()
                settle.close()
            except Exception as exc:
                log.warning("could not settle transaction %s: %s", m["transactional_id"], exc)
            break
    keep = listed | {p + COMMIT_STARTED for p in prefixes}
    return sweep(lg, prefixes, keep=keep)


def _fmt(m: Mapping[TopicPartition, int | None]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}={off}" for tp, off in sorted(m.items()))


# -- the writers -----------------------------------------------------------------------------


def _stage_task(spec: StageSpec, iterator: Iterator[pa.RecordBatch]) -> tuple[list[StagedFile],
                                                                                int, int]:
    task, attempt_id, attempt = staging.task_identity()
    files = staging.stage(spec, iterator, task=task, attempt_id=attempt_id, attempt=attempt)
    _fail_point(spec.topic, attempt)
    return files, task, attempt


def sweep_staging(lg: Log, topic: str, *, older_than_ms: int = 24 * 3600 * 1000) -> int:
    """Maintenance: delete staged objects of ``topic`` that no batch of its log references,
    in staging folders older than ``older_than_ms``.

    Needed only after a driver died in the middle of a commit (its staging folder was never
    swept) or a straggling task attempt wrote after its job finished.  Folders are dated by
    their staging id, so recent writes are never touched.  Returns how many were deleted.
    """
    root = layout.staging_prefix(topic, "x")[: -len("x/")]
    cutoff = now_ms() - older_than_ms
    keys = lg.store.list(root)
    old = []
    for k in keys:
        folder = k[len(root):].split("/", 1)[0]
        try:
            born = int(folder.split("-", 1)[0])
        except ValueError:
            continue
        if born < cutoff:
            old.append(k)
    if not old:
        return 0
    referenced: set[str] = set()
    for tp in lg.partitions_for(topic):
        referenced.update(lg.partition_log(tp).refresh().batches.data)
    return _delete_quietly(lg, [k for k in old if k not in referenced])


class TxlogBatchWriter(DataSourceArrowWriter):
    """``df.write.format("txlog")``: one job, one transaction."""

    def __init__(self, options: Mapping[str, Any], schema: StructType,
                 overwrite: bool = False) -> None:
        if overwrite:
            raise ConfigError(
                "txlog topics are append-only logs: use mode('append') (overwrite would "
                "have to delete committed records)")
        self.options = parse_write_options(options, streaming=False)
        self.txn = new_staging_id()
        self.spec = _spec(self.options, schema, self.txn)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxlogCommitMessage:
        files, task, attempt = _stage_task(self.spec, iterator)
        return TxlogCommitMessage(self.txn, files, task, attempt)

    def _topics(self) -> list[str] | None:
        return [self.spec.topic] if self.spec.topic is not None else None

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        msgs = [m for m in messages if isinstance(m, TxlogCommitMessage)]
        files = [f for m in msgs for f in m.files]
        topics = self._topics()
        if topics is None:
            lg = self.options.connect()
            topics = lg.list_topics()
        commit_staged(self.options, files, [self.txn], topics,
                      app_id=self.options.app_id, app_version=self.options.app_version)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        msgs = [m if isinstance(m, TxlogCommitMessage) else None for m in messages]
        abort_staged(self.options, msgs, [self.txn], self._topics())


class TxlogStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("txlog")``: each micro-batch is one transaction, idempotent on
    (query id, batch id).

    Spark builds a new writer for every micro-batch on the task side (so the staging id is
    fresh per batch run) and another one in the worker that calls ``commit``; that one
    learns the staging id and the query id from the commit messages.
    """

    def __init__(self, options: Mapping[str, Any], schema: StructType,
                 overwrite: bool = False) -> None:
        self.options = parse_write_options(options, streaming=True)
        self.txn = new_staging_id()
        self.spec = _spec(self.options, schema, self.txn)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxlogCommitMessage:
        from pyspark import TaskContext

        tc = TaskContext.get()
        query_id = tc.getLocalProperty(QUERY_ID_PROPERTY) if tc is not None else None
        batch = tc.getLocalProperty(BATCH_ID_PROPERTY) if tc is not None else None
        files, task, attempt = _stage_task(self.spec, iterator)
        return TxlogCommitMessage(self.txn, files, task, attempt, query_id,
                                  int(batch) if batch is not None else None)

    def _app_id(self, msgs: list[TxlogCommitMessage]) -> str | None:
        if self.options.app_id is not None:
            return self.options.app_id
        ids = {m.query_id for m in msgs if m.query_id}
        if len(ids) > 1:
            raise ConfigError(f"commit messages of one micro-batch name several queries: {ids}")
        return f"stream-{ids.pop()}" if ids else None

    def commit(self, messages: list[WriterCommitMessage | None],  # type: ignore[override]
               batchId: int) -> None:
        msgs = [m for m in messages if isinstance(m, TxlogCommitMessage)]
        files = [f for m in msgs for f in m.files]
        txns = sorted({m.txn for m in msgs})
        app_id = self._app_id(msgs)
        if app_id is None:
            if files:
                raise ConfigError(
                    "the streaming query id did not reach the txlog writer's tasks; set "
                    "the 'txnAppId' option to make micro-batches idempotent")
            return  # nothing was written: nothing to make idempotent
        topics = [self.spec.topic] if self.spec.topic is not None else \
            sorted({f.topic for f in files})
        commit_staged(self.options, files, txns, topics, app_id=app_id, app_version=batchId)

    def abort(self, messages: list[WriterCommitMessage | None],  # type: ignore[override]
              batchId: int) -> None:
        msgs = [m if isinstance(m, TxlogCommitMessage) else None for m in messages]
        txns = sorted({m.txn for m in msgs if m is not None})
        if txns:  # without a message the staging id is unknown: a sweeper removes leftovers
            abort_staged(self.options, msgs, txns,
                         [self.spec.topic] if self.spec.topic is not None else None)
