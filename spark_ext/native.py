"""The native path: plan on the driver, scan with Spark's own Parquet reader.

A Python data source hands every row to the JVM through Arrow from a Python worker; on
large scans that costs 1.4-1.8x against ``spark.read.parquet`` (DESIGN.md).  Batch objects
are plain Parquet files without offset columns, so the same plan the Python source makes
(:func:`spark_ext.read_plan.plan_batch`) can be handed to Spark as a list of files:

* ``spark.read.parquet(*files)`` with the topic's stored schema (no inference);
* the hidden ``_metadata.file_name`` / ``_metadata.row_index`` columns identify each row;
* a broadcast join with the (small) table of planned slices keeps rows
  ``skip <= row_index < skip + take`` of each file and derives
  ``offset = base_offset + row_index`` and the topic/partition/timestamp columns.

Column pruning works as for any Parquet scan.  Spark opens the files itself, so it must
reach the store (local paths always; S3/GCS/Azure need the Hadoop connector and
credentials configured in Spark; ``storage_options`` only configures txlog's own planning).
"""

from __future__ import annotations

import re
import string
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

from spark_ext.options import PLAN_LOCK, options_from_kwargs, parse_read_options
from spark_ext.read_plan import BatchPlan, OutputShape, cached_log, plan_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from txlog.storage import ObjectStore

# Characters java.net.URI leaves unquoted in a path (RFC 2396 unreserved + path punctuation);
# Spark reports _metadata.file_name / file_path URI-encoded this way.
_URI_SAFE = set(string.ascii_letters + string.digits + "-_.!~*'()" + ";:@&=+$,/")
_URI_PLAIN = re.compile("[" + re.escape("".join(sorted(_URI_SAFE))) + "]*")


def uri_quote(s: str) -> str:
    """Quote ``s`` as java.net.URI quotes a path (non-ASCII characters are left as they are)."""
    if _URI_PLAIN.fullmatch(s):
        return s
    out = []
    for ch in s:
        if ch in _URI_SAFE or (ord(ch) > 127 and not ch.isspace()):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode())
    return "".join(out)


def stored_spark_schema(shape: OutputShape) -> StructType:
    """The Spark schema of the batch objects' columns that the read needs."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    fields = []
    for name in shape.data_columns:
        f = shape.stored_schema.field(name)
        fields.append(StructField(f.name, from_arrow_type(f.type, prefer_timestamp_ntz=True),
                                  f.nullable))
    return StructType(fields)


def read(spark: SparkSession, path: str | None = None, options: dict[str, Any] | None = None,
         **kwargs: Any) -> DataFrame:
    """``spark.read.format("txlog")`` semantics and columns, scanned natively."""
    opts = options_from_kwargs(options, **kwargs)
    if path is not None:
        opts["path"] = path
    ro = parse_read_options(opts, streaming=False)
    log = cached_log(ro)
    with PLAN_LOCK:
        plan = plan_batch(ro, log)
    return plan_to_dataframe(spark, log.store, plan)


#: Up to this many files are given to Spark one by one; above it, their directories are
#: listed instead and the files picked with a ``_metadata.file_name`` filter, which Spark
#: applies as a file-pruning filter before any file is opened.
MAX_EXPLICIT_FILES = 32
_LISTING_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"


def _scan(spark: SparkSession, store: ObjectStore, shape: OutputShape, keys: list[str],
          names: dict[str, str]) -> tuple[DataFrame, str | None]:
    """The Parquet scan of the planned files, and (when their directories are listed
    instead of the files given one by one) the SQL condition that picks them."""
    hidden = [k for k in keys if names[k].startswith(("_", "."))]
    if hidden:
        from txlog.errors import StorageError

        raise StorageError(
            f"batch object {hidden[0]!r} has a name Spark's file reader ignores (it starts "
            "with '_' or '.'); read with format('txlog') instead of spark_ext.read")
    reader = spark.read.schema(stored_spark_schema(shape))
    explicit = len(keys) <= MAX_EXPLICIT_FILES
    paths = [store.full_path(k) for k in keys] if explicit else \
        [store.full_path(d) for d in sorted({k.rsplit("/", 1)[0] for k in keys})]
    df = _parquet(spark, reader, paths)
    if explicit:
        return df, None
    # Spark applies this as a file-pruning filter before any file is opened.
    listed_sql = ", ".join(_sql_string(n) for n in sorted(set(names.values())))
    return df, f"_metadata.file_name IN ({listed_sql})"


def _parquet(spark: SparkSession, reader: Any, paths: list[str]) -> DataFrame:
    """``reader.parquet(*paths)``, listed on the driver: above Spark's threshold (32 paths)
    it would start a listing job with one tiny task per path."""
    if len(paths) <= 32:
        return reader.parquet(*paths)  # type: ignore[no-any-return]
    old = spark.conf.get(_LISTING_THRESHOLD, None)
    spark.conf.set(_LISTING_THRESHOLD, str(len(paths) + 1))
    try:
        return reader.parquet(*paths)  # type: ignore[no-any-return]
    finally:
        if old is None:
            spark.conf.unset(_LISTING_THRESHOLD)
        else:
            spark.conf.set(_LISTING_THRESHOLD, old)


def _sql_string(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def plan_to_dataframe(spark: SparkSession, store: ObjectStore, plan: BatchPlan) -> DataFrame:
    """The planned slices as one DataFrame.

    Built as one SQL statement over a temporary view of the scan, with the slice table
    inline (``VALUES``): every py4j call is a round trip to the JVM (``F.col``, each
    Column operator, each list element, ``createDataFrame``), and on a busy driver the
    few hundred calls of a DataFrame-API build cost more than scanning small topics."""
    shape = plan.shape
    out_schema = shape.spark_schema()
    if not plan.slices:
        return spark.createDataFrame([], out_schema)

    keys = sorted({s.key for s in plan.slices})
    names = {k: uri_quote(k.rsplit("/", 1)[-1]) for k in keys}
    ambiguous = any(n > 1 for n in Counter(names.values()).values())
    quoted_keys = {k: "/" + uri_quote(k) for k in keys} if ambiguous else dict.fromkeys(keys, "")
    rows = ", ".join(
        f"({_sql_string(names[s.key])}, {_sql_string(quoted_keys[s.key])}, "
        f"{_sql_string(s.topic)}, {int(s.partition)}, {int(s.base_offset)}L, {int(s.skip)}L, "
        f"{int(s.skip + s.take)}L, {int(s.append_ms)}L)" for s in plan.slices)
    spans = (f"(VALUES {rows}) AS s(_t_name, _t_key, _t_topic, _t_part, _t_base, _t_lo, "
             "_t_hi, _t_append_ms)")

    scan, where = _scan(spark, store, shape, keys, names)
    view = f"txlog_native_{uuid.uuid4().hex}"
    data_cols = ", ".join(_ident(c) for c in shape.data_columns)
    data = (f"(SELECT {data_cols}, _metadata.file_name AS _t_fname, "
            f"_metadata.file_path AS _t_fpath, _metadata.row_index AS _t_row FROM {view}"
            + (f" WHERE {where}" if where else "") + ") AS d")
    cond = "d._t_fname = s._t_name AND d._t_row >= s._t_lo AND d._t_row < s._t_hi"
    if ambiguous:  # two planned files share a name: match the whole key too
        cond += " AND endswith(d._t_fpath, s._t_key)"

    offset = "d._t_row + s._t_base"
    append_ts = "timestamp_millis(s._t_append_ms)"
    by_name: dict[str, str] = {
        "topic": "s._t_topic", "partition": "CAST(s._t_part AS INT)",
        "offset": f"CAST({offset} AS BIGINT)",
    }
    if shape.kafka_shaped:
        by_name.update({
            "key": "d.key", "value": "d.value", "headers": "d.headers",
            "timestamp": f"coalesce(d.`timestamp`, {append_ts})",
            "timestampType": "CAST(CASE WHEN d.`timestamp` IS NULL THEN 1 ELSE 0 END AS INT)",
        })
    else:
        by_name.update({c: "d." + _ident(c) for c in shape.data_columns
                        if c not in by_name and c != "timestamp"})
        by_name["timestamp"] = append_ts
    select = ", ".join(f"{by_name[f.name]} AS {_ident(f.name)}" for f in out_schema.fields)

    # A view hides the hidden _metadata column: expose it as an ordinary one first.
    scan.selectExpr("*", "_metadata").createOrReplaceTempView(view)
    try:
        # The analysed plan holds the view's plan: dropping the view keeps the DataFrame.
        return spark.sql(f"SELECT /*+ BROADCAST(s) */ {select} FROM "
                         f"{data} JOIN {spans} ON {cond}")
    finally:
        spark.catalog.dropTempView(view)
