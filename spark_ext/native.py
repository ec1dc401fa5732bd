"""The planned scans (``spark_ext.read(..., engine=...)``): plan on the driver once, at the
call, and scan without Python workers.

A Python data source hands every row to the JVM through Arrow from a Python worker; on
large scans that costs more than ``spark.read.parquet`` (docs/benchmarks.md).  :func:`read`
hands the plan to txlog's JVM source (:mod:`spark_ext.jvm_scan`) when a JDK can build
it.  Otherwise (``engine="sql"``) this module's SQL engine runs: batch objects are plain
Parquet files without offset columns, so the same plan the Python source makes
(:func:`spark_ext.read_plan.plan_batch`) can be handed to Spark as a list of files:

* ``spark.read.parquet(*files)`` with the topic's stored schema (no inference); above a
  few dozen files, their directories with a ``pathGlobFilter`` naming the files;
* the hidden ``_metadata.file_name`` / ``_metadata.row_index`` columns identify each row;
* a perfect hash of the file names (:mod:`spark_ext.perfect_hash`, evaluated with
  Spark's own ``hash()``) finds each row's slice in literal arrays: ``offset =
  base_offset + row_index``, the topic/partition/timestamp columns, and (only for
  slices trimmed by the read's offsets) the row range to keep;
* files holding several slices (compacted segments) or sharing a name with another
  planned file fall back to a broadcast join with the slice table.

Column pruning works as for any Parquet scan.  Spark opens the files itself, so it must
reach the store (local paths always; S3/GCS/Azure need the Hadoop connector and
credentials configured in Spark; ``storage_options`` only configures txlog's own planning).
"""

from __future__ import annotations

import re
import string
import uuid
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from spark_ext import hadoop_conf, perfect_hash
from spark_ext.options import PLAN_LOCK, options_from_kwargs, parse_read_options
from spark_ext.read_plan import BatchPlan, FileSlice, OutputShape, cached_log, plan_batch
from txlog.errors import ConfigError

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


ENGINES = ("auto", "jvm", "sql")


def read(spark: SparkSession, path: str | None = None, options: dict[str, Any] | None = None,
         *, engine: str = "auto", **kwargs: Any) -> DataFrame:
    """``spark.read.format("txlog")`` semantics and columns, scanned natively: by txlog's
    JVM source (:mod:`spark_ext.jvm_scan`) when ``engine`` is ``jvm``, or ``auto`` and a
    JDK can build it; else (``sql``) by Spark's Parquet source and SQL expressions."""
    if engine not in ENGINES:
        raise ConfigError(f"engine={engine!r} is not one of {', '.join(ENGINES)}")
    opts = options_from_kwargs(options, **kwargs)
    if path is not None:
        opts["path"] = path
    ro = parse_read_options(opts, streaming=False)
    log = cached_log(ro)
    with PLAN_LOCK:
        plan = plan_batch(ro, log)
    if len(plan.arrays):
        where = hadoop_conf.prepare(spark, log.store)
        check_spark_can_open(spark, where.path(plan.arrays.key[0].as_py()))
    if engine != "sql" and len(plan.arrays):
        from spark_ext import jvm_scan

        try:
            return jvm_scan.plan_to_dataframe(spark, log.store, plan, plan.group_ids(ro),
                                              fail_on_data_loss=ro.fail_on_data_loss)
        except jvm_scan.JvmScanUnavailable as exc:
            if engine == "jvm":
                raise ConfigError(f"the JVM scan is unavailable: {exc}. Install a JDK 17+ "
                                  "(javac), or pass engine='sql'") from None
            _warn_once(f"txlog: JVM scan unavailable ({exc}); using the SQL scan")
    return plan_to_dataframe(spark, log.store, plan, fail_on_data_loss=ro.fail_on_data_loss)


def check_spark_can_open(spark: SparkSession, url: str, *, who: str = "spark_ext.read opens",
                         instead: str = "read with format('txlog'), which reads") -> None:
    """Raise ConfigError now, not from a task later, when Spark's Hadoop has no filesystem
    for the store's scheme (``s3://`` without an S3 connector, say): both engines open
    the objects with Spark's own filesystems, not with txlog's store."""
    scheme = url.split("://", 1)[0] if "://" in url else "file"
    if scheme == "file":
        return
    try:
        jvm = spark.sparkContext._jvm
        conf = spark._jsparkSession.sessionState().newHadoopConf()
    except Exception:  # Spark Connect: nothing to ask on the client; the tasks will tell
        return
    assert jvm is not None
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, conf)
    except Exception as exc:
        try:  # py4j's error: the Java exception's own message, not its stack trace
            cause = str(exc.java_exception.toString())  # type: ignore[attr-defined]
        except Exception:
            cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        try:
            version: str | None = str(jvm.org.apache.hadoop.util.VersionInfo.getVersion())
        except Exception:
            version = None
        hint = hadoop_conf.missing_filesystem_hint(scheme, version)
        raise ConfigError(
            f"{who} the batch objects with Spark's own Hadoop filesystems, "
            f"and this Spark has none for {scheme}:// ({cause[:200]}). To use them, {hint}; "
            f"or {instead} through txlog's own store.") from None


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    import warnings

    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


#: Up to this many files are given to Spark one by one (see ``_scan``).
MAX_EXPLICIT_FILES = 32
#: Up to this many, their directories are listed with a glob naming them; above it, the
#: files are picked with a ``_metadata.file_name`` filter.
MAX_GLOB_FILES = 2_000
#: Up to this many files, each row's slice is looked up (perfect hash, literal arrays);
#: above it, the driver's hashing and the plan's literals grow past what a broadcast
#: join costs.
MAX_LOOKUP_FILES = 20_000
_LISTING_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"


def _scan(spark: SparkSession, store: ObjectStore, shape: OutputShape, keys: list[str],
          names: dict[str, str], fail_on_data_loss: bool = True,
          ) -> tuple[DataFrame, str | None]:
    """The Parquet scan of the planned files, and the SQL condition on ``_metadata`` that
    picks them out of it when it cannot pick them itself.

    Up to ``MAX_EXPLICIT_FILES`` files are named one by one (the driver looks each
    up).  Up to ``MAX_GLOB_FILES``, their directories are listed
    with a ``pathGlobFilter`` naming them, which costs nothing per row.  Above that the
    glob costs more than it saves (Spark's glob handling grows with pattern length times
    files listed) and the rows are picked by file name, at the cost of a struct per row.
    Either way files with the same name in other planned directories are scanned too."""
    hidden = [k for k in keys if k.rsplit("/", 1)[-1].startswith(("_", "."))]
    if hidden:
        from txlog.errors import StorageError

        raise StorageError(
            f"batch object {hidden[0]!r} has a name Spark's file reader ignores (it starts "
            "with '_' or '.'); read with format('txlog') instead of spark_ext.read")
    where = hadoop_conf.prepare(spark, store)
    reader = spark.read.schema(stored_spark_schema(shape))
    if not fail_on_data_loss:  # objects deleted since planning are skipped, as elsewhere
        reader = reader.option("ignoreMissingFiles", "true")
    if len(keys) <= MAX_EXPLICIT_FILES:
        return _parquet(spark, reader, [where.path(k) for k in keys]), None
    dirs = [where.path(d) for d in sorted({k.rsplit("/", 1)[0] for k in keys})]
    if len(keys) <= MAX_GLOB_FILES:
        glob = glob_of(k.rsplit("/", 1)[-1] for k in keys)
        return _parquet(spark, reader.option("pathGlobFilter", glob), dirs), None
    # Spark also prunes files with this condition before opening any.
    picked = ", ".join(_sql_string(n) for n in sorted(set(names.values())))
    return _parquet(spark, reader, dirs), f"_metadata.file_name IN ({picked})"


def _glob_escape(name: str) -> str:
    """``name`` as a literal inside a Hadoop glob alternation."""
    return re.sub(r"([\\*?\[\]{},])", r"\\\1", name)


def glob_of(names: Iterable[str]) -> str:
    """A Hadoop glob matching exactly ``names``, as a trie of nested alternations: Java's
    regex tries the branches of an alternation one by one, so a flat ``{a,b,...}`` of
    100,000 names would cost each listed file 100,000 comparisons."""
    return _trie(sorted(set(names)))


def _trie(names: list[str]) -> str:
    if len(names) == 1:
        return _glob_escape(names[0])
    first, last = names[0], names[-1]  # sorted: their common prefix is everyone's
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    prefix = first[:n]
    groups: dict[str, list[str]] = {}
    for name in names:
        rest = name[n:]
        groups.setdefault(rest[:1], []).append(rest)
    branches = []
    for head, members in groups.items():
        # Only one name can equal the prefix: its branch is the empty alternative.
        branches.append("" if not head else _trie(members))
    return _glob_escape(prefix) + "{" + ",".join(branches) + "}"


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


def plan_to_dataframe(spark: SparkSession, store: ObjectStore, plan: BatchPlan, *,
                      fail_on_data_loss: bool = True) -> DataFrame:
    """The planned slices as one DataFrame.

    Built from a few SQL strings with the plan inline as literals: every py4j call is a
    round trip to the JVM (``F.col``, each Column operator, each list element,
    ``createDataFrame``), and on a busy driver the few hundred calls of a DataFrame-API
    build cost more than scanning small topics."""
    shape = plan.shape
    out_schema = shape.spark_schema()
    if not plan.slices:
        return spark.createDataFrame([], out_schema)

    keys = sorted({s.key for s in plan.slices})
    names = {k: uri_quote(k.rsplit("/", 1)[-1]) for k in keys}
    scan, pick = _scan(spark, store, shape, keys, names, fail_on_data_loss)
    looked_up = _looked_up(scan if pick is None else scan.where(pick), shape, plan.slices,
                           names)
    if looked_up is not None:
        return looked_up
    view = f"txlog_native_{uuid.uuid4().hex}"
    # A view hides the hidden _metadata column: expose it as an ordinary one first.
    scan.selectExpr("*", "_metadata").createOrReplaceTempView(view)
    try:
        source = view if pick is None else f"{view} WHERE {pick}"
        # The analysed plan holds the view's plan: dropping the view keeps the DataFrame.
        return spark.sql(_join_sql(shape, plan.slices, names, source))
    finally:
        spark.catalog.dropTempView(view)


def _select(shape: OutputShape, topic: str, partition: str, base: str, append_ms: str,
            ) -> list[str]:
    """The output columns from the scan's columns (``d.``, with ``d._t_row``) and the SQL
    of the row's slice values."""
    append_ts = f"timestamp_millis({append_ms})"
    by_name: dict[str, str] = {
        "topic": topic, "partition": f"CAST({partition} AS INT)",
        "offset": f"CAST(d._t_row + {base} AS BIGINT)",
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
    return [f"{by_name[f.name]} AS {_ident(f.name)}" for f in shape.spark_schema().fields]


def _data_columns(shape: OutputShape) -> str:
    return ", ".join(_ident(c) for c in shape.data_columns)


def one_slice_per_file(slices: list[FileSlice]) -> dict[str, FileSlice] | None:
    """One slice per file, adjacent runs of a compacted segment that share a base merged;
    None when some file still needs two (rows between them are not to be read, or a
    shared object's rows of several partitions)."""
    by_key: dict[str, FileSlice] = {}
    for s in sorted(slices, key=lambda s: (s.key, s.skip)):
        prev = by_key.get(s.key)
        if prev is None:
            by_key[s.key] = s
        elif (prev.base_offset == s.base_offset and prev.skip + prev.take == s.skip
              and (prev.topic, prev.partition) == (s.topic, s.partition)):
            by_key[s.key] = prev._replace(take=prev.take + s.take, nbytes=prev.nbytes + s.nbytes)
        else:
            return None
    return by_key


def _looked_up(scan: DataFrame, shape: OutputShape, slices: list[FileSlice],
               names: dict[str, str]) -> DataFrame | None:
    """The scan with each row's slice found by a perfect hash of its file name (see
    :mod:`spark_ext.perfect_hash`), or None when that cannot tell the files apart."""
    one = one_slice_per_file(slices)
    if one is None or len(one) > MAX_LOOKUP_FILES or len(set(names.values())) != len(names):
        return None
    if any(n != k.rsplit("/", 1)[-1] for k, n in names.items()):
        # Spark reports such names URI-encoded: a name spelled differently here would
        # hash to another file's slot (wrong offsets, not a missing row).  txlog's own
        # object names never need quoting; others take the join.
        return None
    keys = sorted(one)
    table = perfect_hash.build([names[k] for k in keys])
    if table is None:
        return None
    at: list[FileSlice | None] = [None] * table.slots
    for k, slot in zip(keys, table.slot, strict=True):
        at[slot] = one[k]

    def lookup(values: list[int], element_type: str = "bigint") -> str:
        if len(set(values)) == 1:
            return f"CAST({values[0]} AS {element_type})"
        return f"get({perfect_hash.sql_array(values, element_type)}, d._t_slot)"

    fill = next(s for s in at if s is not None)
    filled = [s or fill for s in at]
    topics = sorted({s.topic for s in filled})
    index = {t: i for i, t in enumerate(topics)}
    topic = lookup([index[s.topic] for s in filled], "int")
    if len(topics) == 1:
        topic = _sql_string(topics[0])
    else:
        topic = f"get(array({', '.join(map(_sql_string, topics))}), {topic})"
    part = lookup([s.partition for s in filled], "int")
    base = lookup([s.base_offset for s in filled])
    append_ms = lookup([s.append_ms for s in filled])
    hashed = scan.selectExpr(*[_ident(c) for c in shape.data_columns],
                             "_metadata.row_index AS _t_row",
                             "hash(_metadata.file_name) AS _t_h")
    d = hashed.selectExpr("*", f"{table.sql_slot('_t_h')} AS _t_slot").alias("d")
    if not all(s.whole for s in one.values()):
        # Only reads that cut a batch pay for this filter.  Empty slots read no rows
        # (lo = hi = 0).
        lo = perfect_hash.sql_array([s.skip if s else 0 for s in at])
        hi = perfect_hash.sql_array([s.skip + s.take if s else 0 for s in at])
        d = d.where(f"d._t_row >= get({lo}, d._t_slot) AND d._t_row < get({hi}, d._t_slot)")
    return d.selectExpr(*_select(shape, topic, part, base, append_ms))


def _join_sql(shape: OutputShape, slices: list[FileSlice], names: dict[str, str],
              source: str) -> str:
    """The scan broadcast-joined with the slice table (a file may hold several slices)."""
    ambiguous = any(n > 1 for n in Counter(names.values()).values())
    quoted_keys = {k: "/" + uri_quote(k) for k in names} if ambiguous else dict.fromkeys(names, "")
    rows = ", ".join(
        f"({_sql_string(names[s.key])}, {_sql_string(quoted_keys[s.key])}, "
        f"{_sql_string(s.topic)}, {int(s.partition)}, {int(s.base_offset)}L, {int(s.skip)}L, "
        f"{int(s.skip + s.take)}L, {int(s.append_ms)}L)" for s in slices)
    spans = (f"(VALUES {rows}) AS s(_t_name, _t_key, _t_topic, _t_part, _t_base, _t_lo, "
             "_t_hi, _t_append_ms)")
    data = (f"(SELECT {_data_columns(shape)}, _metadata.file_name AS _t_fname, "
            f"_metadata.file_path AS _t_fpath, _metadata.row_index AS _t_row "
            f"FROM {source}) AS d")
    cond = "d._t_fname = s._t_name AND d._t_row >= s._t_lo AND d._t_row < s._t_hi"
    if ambiguous:  # two planned files share a name: match the whole key too
        cond += " AND endswith(d._t_fpath, s._t_key)"
    select = ", ".join(_select(shape, "s._t_topic", "s._t_part", "s._t_base", "s._t_append_ms"))
    return f"SELECT /*+ BROADCAST(s) */ {select} FROM {data} JOIN {spans} ON {cond}"
