"""What txlog's JVM connector asks its planner for Structured Streaming
(``io.txlog.spark.TxlogMicroBatchStream`` and ``TxlogStreamingWrite``), answered by the
same code as the Python data source's stream reader and writer: offsets, admission control
and the plan of each micro-batch come from :class:`spark_ext.reader.TxlogStreamReader`,
and each micro-batch's commit is :func:`spark_ext.writer.commit_staged` with the query's
app id and the batch id as its version.

Offsets travel as Kafka's JSON (``{"orders": {"0": 42}}``), the format the Python source
keeps in a checkpoint, so a query's checkpoint serves either path.  Requests:

``stream_open``    ``options``, ``declared`` -> ``schema``, ``kafka``, ``failOnDataLoss``,
                   ``maxOffsetsPerTrigger``, ``hadoopConf`` (the options checked as a
                   streaming query's)
``stream_initial`` ``options`` -> ``offset``: where a new query starts
``stream_target``  ``options`` -> ``offset``: where Trigger.AvailableNow stops
``stream_latest``  ``options``, ``start``, ``maxRows`` (or null), ``target`` (or null)
                   -> ``offset`` (this micro-batch's end), ``latest`` (the LSOs now)
``stream_plan``    ``options``, ``start``, ``end`` -> the ``scan`` answer's fields
``stream_write_check``  as ``stream_write_begin``, but nothing is begun: whether the JVM
                        writer takes the query's rows (asked when Spark plans a micro-batch's
                        write, which may never run)
``stream_write_begin``  as ``write_begin``, with the streaming write's options
``stream_write_commit`` ``staging``, ``staged``, ``queryId``, ``epoch`` -> committed
``writes_open``         -> ``writes``: writes begun and not yet committed or aborted
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from spark_ext import hadoop_conf, plan_file
from spark_ext.options import PLAN_LOCK, parse_read_options
from spark_ext.read_plan import cached_log, check_declared_schema, plan_shape
from txlog.errors import ConfigError

if TYPE_CHECKING:
    from spark_ext.reader import TxlogStreamReader


def _options(req: Mapping[str, Any]) -> dict[str, str]:
    from spark_ext.jvm_plan import _options as table_options

    return table_options(req)


def _reader(req: Mapping[str, Any]) -> TxlogStreamReader:
    """The Python source's stream reader for these options, on this process's cached Log
    (each request then reads only the log tails that are new since the last)."""
    from spark_ext.reader import TxlogStreamReader

    ro = parse_read_options(_options(req), streaming=True)
    log = cached_log(ro)
    with PLAN_LOCK:
        shape = plan_shape(log, ro)
    reader = TxlogStreamReader(ro, shape, shape.schema_json)
    reader._log = log
    return reader


def _offsets(req: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    raw = req.get(key)
    if raw is None:
        return None
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(f"a streaming offset is not a JSON object: {raw!r}; the query's "
                          "checkpoint holds offsets of another source")
    return value


def _dump(offsets: Mapping[str, Any]) -> str:
    return json.dumps(offsets, sort_keys=True, separators=(",", ":"))


def stream_open(req: Mapping[str, Any]) -> dict[str, Any]:
    reader = _reader(req)
    if req.get("declared"):
        from pyspark.sql.types import StructType

        check_declared_schema(StructType.fromJson(json.loads(req["declared"])), reader.shape)
    return {"schema": reader.shape.schema_json, "kafka": reader.shape.kafka_shaped,
            "failOnDataLoss": reader.ro.fail_on_data_loss,
            "maxOffsetsPerTrigger": reader.ro.max_offsets_per_trigger,
            "hadoopConf": hadoop_conf.for_store(reader.log.store).conf}


def stream_initial(req: Mapping[str, Any]) -> dict[str, Any]:
    reader = _reader(req)
    with PLAN_LOCK:
        return {"offset": _dump(reader.initialOffset())}


def stream_target(req: Mapping[str, Any]) -> dict[str, Any]:
    from spark_ext.read_plan import offsets_to_json

    reader = _reader(req)
    with PLAN_LOCK:
        reader.prepareForTriggerAvailableNow()
    assert reader._target is not None
    return {"offset": _dump(offsets_to_json(reader._target))}


def stream_latest(req: Mapping[str, Any]) -> dict[str, Any]:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

    from spark_ext.read_plan import offsets_from_json

    reader = _reader(req)
    start = _offsets(req, "start")
    if start is None:
        raise ConfigError("a stream_latest request needs the micro-batch's start offsets")
    target = _offsets(req, "target")
    if target is not None:
        reader._target = offsets_from_json(target)
    max_rows = req.get("maxRows")
    limit: ReadLimit = ReadAllAvailable() if max_rows is None else ReadMaxRows(int(max_rows))
    with PLAN_LOCK:
        end = reader.latestOffset(start, limit)
        latest = reader.reportLatestOffset()
    return {"offset": _dump(end), "latest": None if latest is None else _dump(latest)}


def stream_plan(req: Mapping[str, Any]) -> dict[str, Any]:
    reader = _reader(req)
    start, end = _offsets(req, "start"), _offsets(req, "end")
    if start is None or end is None:
        raise ConfigError("a stream_plan request needs the micro-batch's start and end")
    plan_file.check_format(req)
    with PLAN_LOCK:
        arrays, ids = reader.plan_arrays(start, end)
    where = hadoop_conf.for_store(reader.log.store)
    objects = arrays.objects()
    return {"planFile": plan_file.write(arrays, ids, where),
            "schema": reader.shape.schema_json, "kafka": reader.shape.kafka_shaped,
            "failOnDataLoss": reader.ro.fail_on_data_loss, "objects": objects,
            "objectsBeforePushdown": objects, "hadoopConf": where.conf}


def stream_write_begin(req: Mapping[str, Any]) -> dict[str, Any]:
    from spark_ext.jvm_plan import begin_write

    return begin_write(req, streaming=True)


def stream_write_check(req: Mapping[str, Any]) -> dict[str, Any]:
    """``stream_write_begin``'s answer, with the write it began forgotten at once: only a
    micro-batch that runs begins one, and its commit or abort ends it."""
    from spark_ext.jvm_plan import _WRITES, begin_write

    answer = begin_write(req, streaming=True)
    if "spec" in answer:
        _WRITES.pop(answer["spec"]["txlog.staging"], None)
    return answer


def writes_open(req: Mapping[str, Any]) -> dict[str, Any]:
    from spark_ext.jvm_plan import _WRITES

    return {"writes": len(_WRITES)}


def stream_write_commit(req: Mapping[str, Any]) -> dict[str, Any]:
    """One micro-batch, one transaction: committed under the app id ``stream-<query id>``
    (or the ``txnAppId`` option) with the batch id as its version, so a batch Spark
    replays after a crash commits nothing new (the Python source's writer does the same,
    and a checkpoint moves between the paths)."""
    from spark_ext.jvm_plan import begun, commit_write

    query_id, epoch = req.get("queryId"), req.get("epoch")
    if not isinstance(query_id, str) or not query_id or not isinstance(epoch, int):
        raise ConfigError(f"a streaming commit needs the query id and the batch id, not "
                          f"{query_id!r} and {epoch!r}")
    txn, wo, lg = begun(req)
    app_id = wo.app_id if wo.app_id is not None else f"stream-{query_id}"
    return commit_write(txn, wo, lg, str(req.get("staged") or ""), app_id=app_id,
                        app_version=epoch)


HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "stream_open": stream_open, "stream_initial": stream_initial,
    "stream_target": stream_target, "stream_latest": stream_latest,
    "stream_plan": stream_plan, "stream_write_check": stream_write_check,
    "stream_write_begin": stream_write_begin, "stream_write_commit": stream_write_commit,
    "writes_open": writes_open,
}
