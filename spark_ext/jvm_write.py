"""The JVM write started from Python: ``spark_ext.write(df, path, topic=..., engine="jvm")``,
one txlog transaction per call, returning what it committed.

``df.write.format("txlog")`` is a Python data source: every row crosses from the JVM to
a Python worker as Arrow before it is routed and encoded, and that crossing alone costs
about as much as Spark's whole Parquet write. Here the tasks run txlog's JVM writer
(``io.txlog.spark.StagedWriteProvider``, built with the JVM scan, see
:mod:`spark_ext.jvm_scan`): it routes each row to its partition (the ``partition``
column, else Kafka's murmur2 of the key, else a sticky partition) and writes one
Parquet object per partition with Spark's own Parquet writer into the write's staging
folder. When the job has returned, the driver appends the staged objects and commits
them in one transaction with the same code as ``format("txlog")``
(:func:`spark_ext.writer.commit_staged`): the same exactly-once options
(``txnAppId``/``txnVersion``, ``transactional.id``), the same fencing, the same sweep.

Writes the JVM writer does not take (a ``topic`` column, typed topics, other column
types), and any write where no JDK can build the jar, go through ``format("txlog")``
with ``engine="auto"``.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from spark_ext import hadoop_conf, jvm_scan
from spark_ext.native import _warn_once, check_spark_can_open
from spark_ext.options import PLAN_LOCK, cached_log_for, options_from_kwargs
from spark_ext.staging import READER_ONLY_COLUMNS, ROUTING_COLUMNS, StagedFile
from spark_ext.write_options import (
    WRITE_OPTIONS,
    WriteOptions,
    parse_write_options,
)
from spark_ext.writer import (
    CommitResult,
    TxlogCommitMessage,
    abort_staged,
    commit_staged,
    new_staging_id,
    sweep,
)
from txlog import layout
from txlog.errors import ConfigError, SchemaMismatchError, UnknownTopicError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from txlog.log import Log

PROVIDER = "io.txlog.spark.StagedWriteProvider"
log = logging.getLogger(__name__)
ENGINES = ("auto", "jvm", "python")


def write(df: DataFrame, path: str | None = None, options: dict[str, Any] | None = None,
          *, engine: str = "auto", **kwargs: Any) -> CommitResult | None:
    """Append ``df`` to a topic in one transaction; returns what was committed (None when
    the write went through ``format("txlog")``, which reports nothing back)."""
    if engine not in ENGINES:
        raise ConfigError(f"engine={engine!r} is not one of {', '.join(ENGINES)}")
    opts = options_from_kwargs(options, known=WRITE_OPTIONS, **kwargs)
    if path is not None:
        opts["path"] = path
    wo = parse_write_options(opts, streaming=False)
    # This process's cached Log for the root: the commit then reads only what was
    # appended since the last write instead of opening every partition again.
    lg = cached_log_for(wo.url, wo.storage_options, [wo.topic] if wo.topic else [])
    why = None if engine == "python" else _unsupported(df, wo, lg)
    if why is None and engine != "python":
        try:
            where = hadoop_conf.prepare(df.sparkSession, lg.store)
            check_spark_can_open(df.sparkSession, where.path("x"),
                                 who="spark_ext.write writes",
                                 instead="write with format('txlog'), which writes")
        except ConfigError as exc:
            why = str(exc)
    if why is None and engine != "python":
        try:
            jvm_scan.ensure_loaded(df.sparkSession)
        except jvm_scan.JvmScanUnavailable as exc:
            why = f"the JVM writer is unavailable: {exc}"
            if engine == "auto":
                _warn_once(f"spark_ext.write: {why}; writing with format('txlog')")
    if engine == "jvm" and why is not None:
        raise ConfigError(f"spark_ext.write(engine='jvm'): {why}; use engine='auto' or "
                          "'python'")
    if engine == "python" or why is not None:
        writer = df.write.format("txlog").mode("append")
        for k, v in opts.items():
            writer = writer.option(k, v)
        writer.save()
        return None
    return _write_jvm(df, wo, lg)


def _unsupported(df: DataFrame, wo: WriteOptions, lg: Log) -> str | None:
    """Why the JVM writer cannot take this write (None: it can)."""
    from pyspark.sql.types import BinaryType, IntegralType, StringType, TimestampType

    if wo.topic is None:
        return "the rows name their topics (a 'topic' column, no 'topic' option)"
    if not lg.topic(wo.topic).kafka_shaped:
        return f"topic {wo.topic!r} is typed"
    fields = {f.name: f.dataType for f in df.schema.fields}
    # The topic option wins over a topic column, and the reader's own columns are
    # dropped, as in format("txlog").
    known = {"key", "value", "timestamp", "partition", *ROUTING_COLUMNS, *READER_ONLY_COLUMNS}
    if "headers" in fields:
        # Spark's header keys may be null where txlog's may not: format("txlog") checks.
        return "the rows have headers"
    unknown = sorted(set(fields) - known)
    if unknown or "value" not in fields:
        return f"the columns are {sorted(fields)}"
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], (BinaryType, StringType)):
            return f"column {name!r} is {fields[name].simpleString()}"
    if "timestamp" in fields and not isinstance(fields["timestamp"], TimestampType):
        return f"column 'timestamp' is {fields['timestamp'].simpleString()}"
    if "partition" in fields and not isinstance(fields["partition"], IntegralType):
        raise SchemaMismatchError(
            f"the 'partition' column must be an integer type, not "
            f"{fields['partition'].simpleString()}")
    return None


def _projected(df: DataFrame) -> DataFrame:
    """The columns the JVM writer takes, in its order: key, value, timestamp when the
    DataFrame has one, then partition. Strings stay strings (the writer stores
    their UTF-8 bytes, as a cast to binary would, without a cast per row)."""
    from pyspark.sql.types import LongType

    types = {f.name: f.dataType for f in df.schema.fields}
    exprs = ["`key`" if "key" in types else "CAST(NULL AS BINARY) AS `key`", "`value`"]
    if "timestamp" in types:
        exprs.append("`timestamp`")
    if "partition" in types:  # longs are range-checked as longs, in the writer
        exprs.append("`partition`" if isinstance(types["partition"], LongType)
                     else "CAST(`partition` AS INT) AS `partition`")
    if exprs == [f"`{c}`" for c in df.columns]:
        return df  # already in shape: analysing a projection costs time on every write
    return df.selectExpr(*exprs)


def _write_jvm(df: DataFrame, wo: WriteOptions, lg: Log) -> CommitResult:
    assert wo.topic is not None
    info = lg.topic(wo.topic)
    txn = new_staging_id()
    prefix = layout.staging_prefix(wo.topic, txn)
    writer = _projected(df).write.format(PROVIDER).mode("append").options(**{
        "txlog.topic": wo.topic,
        "txlog.partitions": str(info.partitions),
        "txlog.staging": txn,
        # The folder's Hadoop URL (s3a:// for an S3 root, its settings applied).
        "txlog.prefixUrl": hadoop_conf.prepare(df.sparkSession, lg.store).path(prefix),
        "txlog.prefixKey": prefix,
        "txlog.partitioner": wo.partitioner,
        "txlog.fileBytes": str(wo.file_bytes),
        # a local store's own setting: sync each object before the commit
        "txlog.fsync": str(bool(getattr(lg.store, "fsync", True))).lower()})
    jvm = df.sparkSession.sparkContext._jvm
    assert jvm is not None
    try:
        writer.save()
    except BaseException as exc:
        jvm.io.txlog.spark.StagedWrites.take(txn)
        sweep(lg, [prefix])  # nothing was appended: every staged object goes
        bad = re.search(r"txlog: (topic '[^']*' has partitions [^\n]*?column\))", str(exc))
        if bad:
            raise UnknownTopicError(bad.group(1)) from None
        raise
    reported = jvm.io.txlog.spark.StagedWrites.take(txn)
    files = parse_staged(reported or "")
    try:
        with PLAN_LOCK:  # the cached Log's partition states are shared with planning
            return commit_staged(wo, files, [txn], [wo.topic], app_id=wo.app_id,
                                 app_version=wo.app_version, lg=lg)
    except BaseException:
        # As Spark aborts a format("txlog") job whose commit failed: settle this write's
        # own transaction if it had started appending, and sweep what it did not list.
        try:
            abort_staged(wo, [TxlogCommitMessage(txn, files, 0, 0)], [txn], [wo.topic])
        except Exception as exc:  # the commit's own error is the one to report
            log.warning("could not clean up after the failed commit of %s: %s", txn, exc)
        raise


def parse_staged(text: str) -> list[StagedFile]:
    """The JVM writer's report: one staged object per line (see StagedWriter.closeFile)."""
    files = []
    for line in text.splitlines():
        topic, part, key, rows, nbytes, lo, hi, task, seq, untimed = line.split("\t")
        files.append(StagedFile(topic, int(part), key, int(rows), int(nbytes),
                                int(lo) if lo else None, int(hi) if hi else None,
                                int(task), int(seq), untimed == "1"))
    return files
