"""Delta Lake with txlog: sessions with delta-spark, a table's idempotent-write record, and
the Delta-to-topic job.

    import spark_ext.delta as sd
    spark = sd.local_session("job")                     # delta-spark's jars from .jars/
    sd.to_txlog(spark, table="/data/orders", path="s3://bucket/lake", topic="orders-out")

Delta's idempotent writes (``txnAppId``/``txnVersion`` write options) record, in the same
commit as the data, the highest version each application id wrote; a write whose version
is not above it is skipped.  :func:`spark_ext.exactly_once.run` with ``sink_delta=`` builds
its rounds on that record (see there); :func:`to_txlog` is the other direction: it writes
what a Delta table holds at version V to a topic with txlog's ``txnAppId`` = the table and
``txnVersion`` = V, so running it again at the same version commits nothing.

Sessions get delta-spark through ``spark.jars`` (local jar files, fetched once by the
set-up into ``.jars/``): nothing is downloaded when a session starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txlog.errors import ConfigError, TxlogError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_ext.writer import CommitResult

REPO = Path(__file__).resolve().parents[1]
#: The jars a Delta session needs besides pyspark's own (names as scripts/jars.txt lists them).
DELTA_ARTIFACTS = ("delta-spark_2.13", "delta-storage")
EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
#: The key of txlog's entry in a Delta commit's userMetadata.
META_KEY = "txlog"


class DeltaSinkStateError(TxlogError):
    """A Delta table's idempotent-write record and txlog's committed offsets disagree in a
    way no crash can cause (the table was replaced, or the group's offsets were reset)."""


# -- sessions -----------------------------------------------------------------------------


def delta_jars(jars_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """The delta-spark jar files listed in scripts/jars.txt, from ``jars_dir`` (default: the
    ``TXLOG_JARS_DIR`` environment variable, else this checkout's ``.jars``)."""
    where = Path(jars_dir or os.environ.get("TXLOG_JARS_DIR") or REPO / ".jars")
    listed: dict[str, str] = {}
    jars_txt = REPO / "scripts" / "jars.txt"
    if jars_txt.exists():
        for line in jars_txt.read_text().splitlines():
            coord = line.split("#", 1)[0].split()
            if coord:
                _, artifact, version = coord[0].split(":")
                listed[artifact] = f"{artifact}-{version}.jar"
    found = []
    for artifact in DELTA_ARTIFACTS:
        name = listed.get(artifact)
        jar = where / name if name else None
        if jar is None or not jar.exists():
            raise ConfigError(
                f"delta-spark's jar {name or artifact} is not in {where}: run "
                "scripts/bootstrap.sh (it fetches the jars scripts/jars.txt lists), or set "
                "TXLOG_JARS_DIR to a directory holding them")
        found.append(str(jar))
    return found


def session_conf(*, jars_dir: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Spark settings for a session with Delta Lake (local jars, Delta's SQL extension and
    catalog).  They take effect only when the session (its JVM) starts."""
    return {"spark.jars": ",".join(delta_jars(jars_dir)), "spark.sql.extensions": EXTENSION,
            "spark.sql.catalog.spark_catalog": CATALOG}


def local_session(app_name: str, *, jars_dir: str | os.PathLike[str] | None = None,
                  **conf: str) -> SparkSession:
    """:func:`spark_ext.local_session` with Delta Lake: format("delta") and txlog."""
    import spark_ext

    # Delta rebuilds a table's state (which every txnAppId write checks) in 50 partitions
    # by default, sized for clusters; local[2] has two cores.
    local = {"spark.databricks.delta.snapshotPartitions": "2"}
    return spark_ext.local_session(app_name,
                                   **{**session_conf(jars_dir=jars_dir), **local, **conf})


# -- a table's record ---------------------------------------------------------------------


def is_path(table: str) -> bool:
    """A table given by location (a path or URL) rather than by catalog name."""
    return "/" in table or ":" in table


def table_location(spark: SparkSession, table: str) -> str | None:
    """The table's storage location, or None when a named table does not exist yet."""
    if is_path(table):
        return table
    if not spark.catalog.tableExists(table):
        return None
    return str(spark.sql(f"DESCRIBE DETAIL {table}").first()["location"])  # type: ignore[index]


@dataclass(frozen=True)
class AppRecord:
    """What the newest snapshot of a Delta table says about one app id."""

    location: str | None  # None: a named table that does not exist yet
    table_version: int  # the snapshot's version; -1: no table yet
    txn_version: int | None  # the highest txnVersion the app committed; None: never


def _jvm(spark: SparkSession) -> Any:
    return spark._jvm  # type: ignore[attr-defined]


def app_record(spark: SparkSession, table: str, app_id: str) -> AppRecord:
    """The table's version and ``app_id``'s highest txnVersion in a fresh snapshot.

    Delta computes the snapshot's state for this (a Spark job over the table's log), as
    its own check of an idempotent write does: a write that starts from the same
    snapshot (no commit in between) finds the state computed and does not compute it
    again, so a round pays for it once."""
    loc = table_location(spark, table)
    if loc is None:
        return AppRecord(None, -1, None)
    snapshot = _jvm(spark).org.apache.spark.sql.delta.DeltaLog.forTableWithSnapshot(
        spark._jsparkSession, loc)._2()  # type: ignore[attr-defined]
    version = int(snapshot.version())
    if version < 0:
        return AppRecord(loc, -1, None)
    held = snapshot.transactions().get(app_id)
    return AppRecord(loc, version, int(held.get()) if held.isDefined() else None)


def txn_version(spark: SparkSession, table: str, app_id: str) -> int | None:
    """The highest txnVersion ``app_id`` committed to the table (None: never, or no table),
    from a fresh snapshot of its log."""
    return app_record(spark, table, app_id).txn_version


def round_committed_after(spark: SparkSession, location: str, app_id: str, number: int,
                          after: int) -> dict[str, Any] | None:
    """txlog's userMetadata of the commit in which ``app_id`` wrote round ``number``,
    looked for in the table's commits after version ``after`` (None: not among them).

    It reads those commit files through the table's log (no Spark job); a commit's
    CommitInfo comes first in its file, so usually one action per commit is looked at."""
    log = _jvm(spark).org.apache.spark.sql.delta.DeltaLog.forTable(
        spark._jsparkSession, location)  # type: ignore[attr-defined]
    no_catalog_table = getattr(log, "getChanges$default$2")()
    commits = log.getChanges(after + 1, no_catalog_table, False)
    while commits.hasNext():
        actions = commits.next()._2().iterator()
        while actions.hasNext():
            doc = json.loads(actions.next().json())
            info = doc.get("commitInfo")
            if info is None:
                continue
            meta = parse_user_metadata(info.get("userMetadata"))
            if meta is not None and meta["app"] == app_id and meta["round"] == number:
                return meta
            break  # one CommitInfo per commit: this commit is not the round's
    return None


def _history_metadata(spark: SparkSession, loc: str, app_id: str, limit: int | None,
                      ) -> tuple[dict[int, dict[str, Any]], bool]:
    """txlog's userMetadata of ``app_id``'s commits among the newest ``limit`` (None: all)
    by round, and whether that was the whole history."""
    from delta.tables import DeltaTable

    dt = DeltaTable.forPath(spark, loc)
    rows = (dt.history(limit) if limit else dt.history()).select("userMetadata").collect()
    found: dict[int, dict[str, Any]] = {}
    for row in rows:
        meta = parse_user_metadata(row["userMetadata"])
        if meta is not None and meta["app"] == app_id:
            found.setdefault(meta["round"], meta)
    return found, limit is None or len(rows) < limit


#: Commits of the history looked at first: the job's own commit is nearly always among them.
RECENT = 16


def find_commit_metadata(spark: SparkSession, table: str, app_id: str, version: int,
                         ) -> dict[str, Any] | None:
    """txlog's userMetadata of the commit in which ``app_id`` wrote ``version`` (newest
    commits first; None when the table's history no longer holds it)."""
    loc = table_location(spark, table)
    if loc is None:
        return None
    for limit in (RECENT, None):
        rounds, whole = _history_metadata(spark, loc, app_id, limit)
        if version in rounds:
            return rounds[version]
        if whole:
            break
    return None


def parse_user_metadata(text: str | None) -> dict[str, Any] | None:
    """txlog's entry in a commit's userMetadata, validated (None when absent or not ours)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    meta = doc.get(META_KEY) if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("app"), str) \
            or not isinstance(meta.get("round"), int) or isinstance(meta["round"], bool):
        return None
    for key in ("start", "end"):
        offs = meta.get(key)
        if not isinstance(offs, dict) or not all(
                isinstance(k, str) and k.isdigit() and type(v) is int and v >= 0
                for k, v in offs.items()):
            raise DeltaSinkStateError(
                f"the Delta commit of {meta['app']!r} round {meta['round']} has a malformed "
                f"{key!r} in its userMetadata ({offs!r}); the table's log was edited or "
                "written by something else: inspect it before running the job again")
    return meta


def user_metadata(**meta: Any) -> str:
    return json.dumps({META_KEY: meta}, sort_keys=True, separators=(",", ":"))


def write_idempotent(df: DataFrame, table: str, *, app_id: str, version: int,
                     metadata: str) -> None:
    """Append ``df`` to the Delta table unless ``app_id`` already wrote ``version`` there
    (Delta then skips the write and keeps the table as it is)."""
    w = (df.write.format("delta").mode("append").option("txnAppId", app_id)
         .option("txnVersion", str(version)).option("userMetadata", metadata))
    if is_path(table):
        w.save(table)
    else:
        w.saveAsTable(table)


# -- Delta -> txlog ---------------------------------------------------------------------


@dataclass
class ExportResult:
    app_id: str
    version: int  # the Delta version read up to
    from_version: int | None  # change data feed from this version on; None: the whole table
    commit: CommitResult | None  # what the txlog write committed (skipped when done before)


def default_records(df: DataFrame) -> DataFrame:
    """Rows -> Kafka records: no key, the row as a JSON object in the value."""
    from pyspark.sql import functions as F

    return df.select(F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns])).alias("value"))


def to_txlog(spark: SparkSession, *, table: str, path: str, topic: str,
             changes_from: int | str | None = None, version: int | None = None,
             app_id: str | None = None,
             to_records: Callable[[DataFrame], DataFrame] = default_records,
             storage_options: Mapping[str, Any] | None = None) -> ExportResult:
    """Write what the Delta ``table`` holds at ``version`` (default: its latest) to the
    txlog topic, in one transaction with ``txnAppId`` = ``app_id`` (default: the table's
    Delta id) and ``txnVersion`` = that version: running it again for the same version
    commits nothing, and a version not above the last one exported is refused by txlog.

    ``changes_from``: None writes the whole table as of ``version``; an int writes its
    change data feed (``_change_type``, ``_commit_version``, ``_commit_timestamp`` columns
    included) from that version through ``version``; ``"next"`` starts after the version
    this app id last exported (version 0 the first time): an incremental export, which
    commits nothing if another export of the app committed in the meantime (it would
    repeat changes that one wrote; run it again to continue after it).  The table needs
    ``delta.enableChangeDataFeed`` for the change feed.  ``to_records`` turns
    rows into the topic's columns (key, value, optional partition)."""
    import spark_ext
    import txlog
    from spark_ext.write_options import AFTER_VERSION_OPTION
    from spark_ext.writer import _pause_point
    from txlog.app_versions import committed_app_version

    loc = table_location(spark, table)
    if loc is None:
        raise ConfigError(f"Delta table {table!r} does not exist")
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{loc}`").first()
    assert detail is not None
    app = app_id or f"delta-{detail['id']}"
    latest = spark.sql(f"DESCRIBE HISTORY delta.`{loc}` LIMIT 1").first()
    assert latest is not None
    upto = int(latest["version"]) if version is None else version
    reader = spark.read.format("delta")
    start: int | None = None
    if changes_from is None:
        df = reader.option("versionAsOf", upto).load(loc)
    else:
        if changes_from == "next":
            lg = txlog.connect(path, dict(storage_options or {}))
            done = committed_app_version(lg, app)
            start = 0 if done is None else done + 1
        elif isinstance(changes_from, int) and not isinstance(changes_from, bool):
            start = changes_from
        else:
            raise ConfigError(f"changes_from must be None, a version or 'next', not "
                              f"{changes_from!r}")
        if start > upto:  # nothing new since the last export
            return ExportResult(app, upto, start, None)
        df = (reader.option("readChangeFeed", "true").option("startingVersion", start)
              .option("endingVersion", upto).load(loc))
    opts: dict[str, Any] = {"topic": topic, "txnAppId": app, "txnVersion": str(upto)}
    if changes_from == "next":
        # Commit only if the app still stands where this export started: a concurrent
        # export of the same app that committed first has written some of these changes.
        assert start is not None
        opts[AFTER_VERSION_OPTION] = str(start - 1)
    if storage_options:
        opts["storage_options"] = json.dumps(dict(storage_options))
    _pause_point("export-before-write")
    result = spark_ext.write(to_records(df), path, opts, engine="auto")
    return ExportResult(app, upto, start, result)
