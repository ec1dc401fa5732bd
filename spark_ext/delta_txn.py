"""A round's Delta commit through delta-spark's transaction API, from the Spark driver.

An append with the ``txnAppId``/``txnVersion`` write options makes delta-spark 4.4 look
the app's version up in the snapshot's full state, a Spark job over the table's log on
every write.  The checksum file Delta writes with each version lists the same records
(``setTransactions``), so a round here:

1. opens a transaction on the table's newest snapshot and reads the app's version from
   that snapshot's checksum (from its full state only when no checksum lists them);
2. registers the app id as read by the transaction, as Delta's own lookup does: Delta's
   conflict checker then fails the commit if a commit recording the same app id won
   since the snapshot (a concurrent run of the same round writes nothing);
3. writes the data files and commits them with the app's ``SetTransaction`` and txlog's
   userMetadata as one WRITE (append) commit.

Where that API is not there (another delta-spark version), the table does not exist yet,
is given by catalog name, or the round's columns differ from the table's (Delta's own
schema checks apply), the round goes through the DataFrame writer with ``txnAppId``/
``txnVersion`` instead; the log says which path each round took.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: The exception Delta raises when a commit recording the same app id won first (the
#: public class extends the internal one).
CONFLICT = ("io.delta.exceptions.ConcurrentTransactionException",
            "org.apache.spark.sql.delta.ConcurrentTransactionException")


@dataclass
class RoundTxn:
    """The table's newest snapshot as a round sees it, with an open Delta transaction
    (``txn`` None: the round writes through the DataFrame writer)."""

    location: str | None  # None: a named table that does not exist yet
    table_version: int  # -1: no table yet
    txn_version: int | None  # the app's highest txnVersion in the snapshot; None: never
    txn: Any = None  # the JVM OptimisticTransaction
    schema: str | None = None  # the table's schema (Spark's JSON) when txn is set
    why_not: str = ""  # why the round does not commit through the transaction API


def _jvm(spark: SparkSession) -> Any:
    return spark._jvm  # type: ignore[attr-defined]


def checksum_versions(entries: list[tuple[Any, Any]]) -> dict[str, int] | None:
    """app id -> version from a checksum's SetTransaction records; None when they are not
    well-formed (an app twice, a version that is not a non-negative integer)."""
    out: dict[str, int] = {}
    for app, version in entries:
        if not isinstance(app, str) or type(version) is not int or version < 0 \
                or app in out:
            return None
        out[app] = version
    return out


def _from_checksum(snapshot: Any) -> dict[str, int] | None:
    """The snapshot's SetTransaction records from its checksum (None: not listed there)."""
    checksum = snapshot.checksumOpt()
    if not checksum.isDefined():
        return None
    listed = checksum.get().setTransactions()
    if not listed.isDefined():
        return None
    entries = []
    it = listed.get().iterator()
    while it.hasNext():
        st = it.next()
        entries.append((st.appId(), st.version()))
    return checksum_versions(entries)


def open_round(spark: SparkSession, table: str, app_id: str) -> RoundTxn:
    """The table's newest snapshot, the app's version in it and, where possible, a Delta
    transaction on it that the round commits through (see the module's description)."""
    from spark_ext import delta as sd

    if not sd.is_path(table):
        rec = sd.app_record(spark, table, app_id)
        return RoundTxn(rec.location, rec.table_version, rec.txn_version,
                        why_not="the table is given by catalog name")
    try:
        delta_log = _jvm(spark).org.apache.spark.sql.delta.DeltaLog.forTable(
            spark._jsparkSession, table)  # type: ignore[attr-defined]
        txn = delta_log.startTransaction()
        snapshot = txn.snapshot()
        version = int(snapshot.version())
    except Exception as exc:  # py4j: no such class or method in this delta-spark
        rec = sd.app_record(spark, table, app_id)
        return RoundTxn(rec.location, rec.table_version, rec.txn_version,
                        why_not=f"delta-spark's transaction API is not available ({exc})")
    if version < 0:
        return RoundTxn(table, -1, None, why_not="the table does not exist yet")
    found: int | None
    try:
        versions = _from_checksum(snapshot)
        if versions is not None:
            # What Delta's own lookup records, so a winning commit of the app conflicts.
            txn.readTxn().addOne(app_id)
            found = versions.get(app_id)
        else:
            raise LookupError("no checksum lists the snapshot's SetTransaction records")
    except Exception as exc:
        log.info("Delta table %s version %d: app versions from the snapshot's state (%s)",
                 table, version, exc)
        held = int(txn.txnVersion(app_id))  # Delta's lookup: registers the app id as read
        found = None if held < 0 else held
    return RoundTxn(table, version, found, txn=txn, schema=str(snapshot.schema().json()))


def _fields(schema_json: str) -> list[tuple[str, Any]]:
    """Top-level (name, type) pairs of a Spark schema's JSON, nullability left out (Delta
    keeps its table's columns nullable, whatever the frame says)."""
    def strip(t: Any) -> Any:
        if isinstance(t, dict):
            return {k: strip(v) for k, v in t.items()
                    if k not in ("nullable", "containsNull", "valueContainsNull", "metadata")}
        if isinstance(t, list):
            return [strip(v) for v in t]
        return t

    doc = json.loads(schema_json)
    return [(f["name"], strip(f["type"])) for f in doc.get("fields", [])]


def same_columns(table_schema: str, frame_schema: str) -> bool:
    """The frame has exactly the table's columns, in order, with the same types."""
    return _fields(table_schema) == _fields(frame_schema)


def write_round(spark: SparkSession, rt: RoundTxn, df: DataFrame, table: str, *,
                app_id: str, version: int, metadata: str) -> int | None:
    """Append ``df`` to the table as round ``version`` of ``app_id``; the commit's version,
    or None when the round went through the DataFrame writer (Delta may have skipped it)
    or another commit recording ``app_id`` won (nothing written)."""
    from spark_ext import delta as sd

    why_not = rt.why_not
    if rt.txn is not None and rt.schema is not None \
            and not same_columns(rt.schema, df.schema.json()):
        why_not = "the round's columns differ from the table's"
    if rt.txn is None or why_not:
        log.info("Delta round %d of %s into %s: through the DataFrame writer (%s)",
                 version, app_id, table, why_not)
        sd.write_idempotent(df, table, app_id=app_id, version=version, metadata=metadata)
        return None
    try:
        op, set_txn = _commit_parts(spark, app_id=app_id, version=version,
                                    metadata=metadata)
    except Exception as exc:  # py4j: another delta-spark's classes; nothing written yet
        log.info("Delta round %d of %s into %s: through the DataFrame writer (delta-spark's "
                 "WRITE operation is not the one expected: %s)", version, app_id, table,
                 _first_line(exc))
        sd.write_idempotent(df, table, app_id=app_id, version=version, metadata=metadata)
        return None
    from spark_ext.writer import _pause_point

    files = rt.txn.writeFiles(df._jdf)
    _pause_point("delta-before-commit")
    try:
        committed = int(rt.txn.commit(files.appended(set_txn), op))
    except Exception as exc:
        if _is_conflict(exc):
            log.info("Delta round %d of %s into %s: another commit of the app won "
                     "(%s); nothing written", version, app_id, table, _first_line(exc))
            return None
        raise
    log.info("Delta round %d of %s into %s: version %d through Delta's transaction API",
             version, app_id, table, committed)
    return committed


def _commit_parts(spark: SparkSession, *, app_id: str, version: int, metadata: str,
                  ) -> tuple[Any, Any]:
    """The commit's WRITE (append) operation, carrying txlog's userMetadata, and the app's
    SetTransaction, as delta-spark's JVM objects."""
    jvm = _jvm(spark)
    delta = jvm.org.apache.spark.sql.delta
    none = jvm.scala.Option.empty()
    op = getattr(delta, "DeltaOperations$Write")(
        jvm.org.apache.spark.sql.SaveMode.Append, none, none,
        jvm.scala.Option.apply(metadata), none, none, none, none, none)
    now = jvm.scala.Option.apply(int(time.time() * 1000))
    return op, delta.actions.SetTransaction(app_id, version, now)


def _is_conflict(exc: Exception) -> bool:
    java = getattr(exc, "java_exception", None)
    if java is None:
        return False
    try:
        cls = java.getClass()
        while cls is not None:
            if str(cls.getName()) in CONFLICT:
                return True
            cls = cls.getSuperclass()
    except Exception:
        return False
    return False


def _first_line(exc: Exception) -> str:
    text = str(getattr(exc, "java_exception", None) or exc)
    return text.splitlines()[0][:300] if text else type(exc).__name__
