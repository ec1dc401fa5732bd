"""What txlog's JVM connector asks its planner (``io.txlog.spark.Planner``), answered with
txlog's own Python planning and commit code: the JVM decides nothing a read returns or a
write commits.

Each request is a JSON object with an ``op``; each answer a JSON object, or
``{"error": {"type": "txlog.errors.ConfigError", "message": ...}}``:

``schema``       ``options`` -> ``schema`` (Spark's JSON), ``kafka`` (bool)
``scan``         ``options``, ``filters`` (:mod:`spark_ext.pushdown`), ``declared`` (a
                 user's schema, checked), ``planFormat`` (the plan format the JVM reads,
                 checked) -> ``planFile`` (:mod:`spark_ext.plan_file`, deleted by its reader),
                 ``schema``, ``kafka``, ``failOnDataLoss``, ``objects``,
                 ``objectsBeforePushdown``
``write_begin``  ``options``, ``schema`` -> ``spec`` (StagedWriteProvider's ``txlog.*``
                 settings), or ``fallback`` saying why the Python data source writes
``write_commit`` ``staging``, ``staged`` (StagedWriter's lines) -> what was committed
``write_abort``  ``staging`` -> ``swept``
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

from spark_ext import hadoop_conf, plan_file, pushdown
from spark_ext.options import PLAN_LOCK, cached_log_for, parse_read_options
from spark_ext.read_plan import cached_log, check_declared_schema, plan_batch, plan_shape
from txlog import layout
from txlog.errors import ConfigError, SchemaMismatchError

#: Writes begun and not yet committed or aborted: staging id -> (options, log).
_WRITES: dict[str, tuple[Any, Any]] = {}


def _options(req: Mapping[str, Any]) -> dict[str, str]:
    opts = req.get("options")
    if not isinstance(opts, dict) or not all(isinstance(v, str) for v in opts.values()):
        raise ConfigError(f"a planner request's options are not a map of strings: {opts!r}")
    # A catalog table (CREATE TABLE ... USING txlog OPTIONS (...)) hands its options as
    # "option.<name>" among the table's own properties, which are not txlog options.
    out: dict[str, str] = {}
    for k, v in opts.items():
        if k.lower().startswith("option."):
            out[k[len("option."):]] = v
    for k, v in opts.items():
        if not k.lower().startswith("option.") and k.lower() not in _SPARK_PROPERTIES:
            out.setdefault(k, v)
    if "path" not in {k.lower() for k in out} and opts.get("location"):
        out["path"] = opts["location"]
    return out


#: Keys Spark's catalog puts among a table's options (CREATE TABLE ... USING txlog).
_SPARK_PROPERTIES = {"provider", "owner", "location", "external", "is_managed_location",
                     "comment", "transient_lastddltime"}


def schema(req: Mapping[str, Any]) -> dict[str, Any]:
    ro = parse_read_options(_options(req))
    log = cached_log(ro)
    with PLAN_LOCK:
        shape = plan_shape(log, ro)
    return {"schema": shape.schema_json, "kafka": shape.kafka_shaped}


def scan(req: Mapping[str, Any]) -> dict[str, Any]:
    plan_file.check_format(req)
    ro = parse_read_options(_options(req), streaming=False)
    # A query's schema request, sent just before, has checked the topics against the store.
    log = cached_log(ro, reuse_check=True)
    bounds = pushdown.bounds_from_filters(req.get("filters") or [])
    plan = plan_batch(ro, log, bounds=bounds)
    if req.get("declared"):
        from pyspark.sql.types import StructType

        check_declared_schema(StructType.fromJson(json.loads(req["declared"])), plan.shape)
    before = plan_batch(ro, log).arrays.objects() if req.get("filters") else None
    objects = plan.arrays.objects()
    where = hadoop_conf.for_store(log.store)
    ids = plan.group_ids(ro, parallelism=_parallelism(req))
    return {"planFile": plan_file.write(plan.arrays, ids, where),
            "schema": plan.shape.schema_json, "kafka": plan.shape.kafka_shaped,
            "failOnDataLoss": ro.fail_on_data_loss, "objects": objects,
            "objectsBeforePushdown": objects if before is None else before,
            "hadoopConf": where.conf}


def _parallelism(req: Mapping[str, Any]) -> int | None:
    """The query's Spark default parallelism, as the connector sends it (None: not sent)."""
    value = req.get("parallelism")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"a scan request's parallelism must be a positive integer, "
                          f"not {value!r}; the connector jar and txlog differ in version: "
                          f"reinstall them together")
    return value


def write_begin(req: Mapping[str, Any]) -> dict[str, Any]:
    return begin_write(req, streaming=False)


def begin_write(req: Mapping[str, Any], *, streaming: bool) -> dict[str, Any]:
    """A write's staging folder and the JVM writer's settings, or why it cannot take it."""
    from pyspark.sql.types import StructType

    from spark_ext.jvm_write import _unsupported
    from spark_ext.staging import TopicTarget, check_columns
    from spark_ext.write_options import parse_write_options
    from spark_ext.writer import _arrow_schema, new_staging_id

    wo = parse_write_options(_options(req), streaming=streaming)
    spark_schema = StructType.fromJson(json.loads(req["schema"]))
    columns = [f.name for f in spark_schema.fields]
    dup = {c for c in columns if columns.count(c) > 1}
    if dup:
        raise SchemaMismatchError(f"the DataFrame has duplicate columns {sorted(dup)}")
    lg = cached_log_for(wo.url, wo.storage_options, [wo.topic] if wo.topic else [])
    if wo.topic is not None:
        # The Python writer's checks, with its errors, before any task runs.
        info = lg.topic(wo.topic)
        check_columns(columns, _arrow_schema(spark_schema),
                      TopicTarget(info.name, info.partitions, info.kafka_shaped, info.schema))
    why = _unsupported(SimpleNamespace(schema=spark_schema), wo, lg)  # type: ignore[arg-type]
    if why is not None:
        return {"fallback": why}
    assert wo.topic is not None
    txn = new_staging_id()
    prefix = layout.staging_prefix(wo.topic, txn)
    _WRITES[txn] = (wo, lg)
    # Spark's filesystem for the root (s3a:// for s3://), told what storage_options tell
    # txlog's store.
    where = hadoop_conf.for_store(lg.store)
    return {"spec": {
        "txlog.topic": wo.topic,
        "txlog.partitions": str(lg.topic(wo.topic).partitions),
        "txlog.staging": txn,
        "txlog.prefixUrl": where.path(prefix),
        "txlog.prefixKey": prefix,
        "txlog.partitioner": wo.partitioner,
        "txlog.fileBytes": str(wo.file_bytes),
        "txlog.fsync": str(bool(getattr(lg.store, "fsync", True))).lower()},
        "hadoopConf": where.conf}


def begun(req: Mapping[str, Any]) -> tuple[str, Any, Any]:
    txn = req.get("staging")
    if not isinstance(txn, str) or txn not in _WRITES:
        raise ConfigError(f"no write {txn!r} was begun in this planner (restarted?); "
                          "run the write again")
    wo, lg = _WRITES.pop(txn)
    return txn, wo, lg


def write_commit(req: Mapping[str, Any]) -> dict[str, Any]:
    txn, wo, lg = begun(req)
    return commit_write(txn, wo, lg, str(req.get("staged") or ""), app_id=wo.app_id,
                        app_version=wo.app_version)


def commit_write(txn: str, wo: Any, lg: Any, staged: str, *, app_id: str | None,
                 app_version: int | None) -> dict[str, Any]:
    """Append a begun write's staged objects and commit them in one transaction."""
    from spark_ext.jvm_write import parse_staged
    from spark_ext.writer import TxlogCommitMessage, abort_staged, commit_staged

    files = parse_staged(staged)
    try:
        with PLAN_LOCK:  # the cached Log's partition states are shared with planning
            result = commit_staged(wo, files, [txn], [wo.topic], app_id=app_id,
                                   app_version=app_version, lg=lg)
    except BaseException:
        # As for a failed format("txlog") commit: settle this write's own transaction
        # if it had started appending, and sweep what it did not list.
        abort_staged(wo, [TxlogCommitMessage(txn, files, 0, 0)], [txn], [wo.topic])
        raise
    return {"committed": asdict(result)}


def write_abort(req: Mapping[str, Any]) -> dict[str, Any]:
    from spark_ext.writer import sweep

    if req.get("staging") not in _WRITES:
        # Spark aborts a write whose commit failed: write_commit has settled it already.
        return {"swept": 0}
    txn, wo, lg = begun(req)
    return {"swept": sweep(lg, [layout.staging_prefix(wo.topic, txn)])}


HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "schema": schema, "scan": scan, "write_begin": write_begin,
    "write_commit": write_commit, "write_abort": write_abort,
    "ping": lambda req: {"pong": True},
}

# Streaming queries' requests; that module builds on the helpers above.
from spark_ext import jvm_stream  # noqa: E402

HANDLERS.update(jvm_stream.HANDLERS)


def answer(req: Any) -> dict[str, Any]:
    """The answer to one request; errors become ``{"error": ...}``."""
    try:
        if not isinstance(req, dict) or req.get("op") not in HANDLERS:
            raise ConfigError(f"the planner has no request {req!r}")
        return HANDLERS[req["op"]](req)
    except Exception as exc:
        cls = type(exc)
        return {"error": {"type": f"{cls.__module__}.{cls.__qualname__}", "message": str(exc)}}
