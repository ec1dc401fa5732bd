"""Options of the txlog writer (``df.write.format("txlog")`` and ``writeStream``): their
names, the internal ones :mod:`spark_ext.exactly_once` and :mod:`spark_ext.delta` pass, and
their parsing into :class:`WriteOptions` (each checked, with an error that names it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_ext import staging
from spark_ext.options import (
    check_known,
    parse_int,
    parse_json_object,
    parse_path,
    parse_storage_options,
    parse_topic,
)
from txlog.errors import ConfigError
from txlog.names import validate_id
from txlog.records import TopicPartition

if TYPE_CHECKING:
    from txlog.log import Log

#: Write options (canonical spelling; matched case-insensitively).
WRITE_OPTIONS = (
    "path", "storage_options", "topic", "transactional.id", "partitioner",
    "txnAppId", "txnVersion", "transaction.timeout.ms", "maxFileBytes", "txlog.sendOffsets",
    "txlog.txnAfterVersion",
)
#: Internal option of :mod:`spark_ext.exactly_once`: consumer offsets to commit with the data.
SEND_OFFSETS_OPTION = "txlog.sendOffsets"
#: Internal option of incremental exports (:func:`spark_ext.delta.to_txlog`): the txnAppId's
#: committed version the data was read after (-1: none); any other commits nothing.
AFTER_VERSION_OPTION = "txlog.txnAfterVersion"
#: Options Spark itself adds to streaming writes.
STREAM_EXTRA_OPTIONS = ("checkpointLocation", "queryName", "outputMode")

_WRITE_HINTS = {
    "kafka.": "txlog writes to object storage, not to Kafka brokers: kafka.* client "
              "settings have no meaning here.",
}





@dataclass(frozen=True)
class SendOffsets:
    """Consumer offsets committed inside the write's transaction (read-process-write).

    ``start`` is what the group must have committed when the transaction begins (else a
    concurrent or earlier run already processed this range and the write is skipped);
    ``end`` is committed with the data."""

    group: str
    start: dict[TopicPartition, int]
    end: dict[TopicPartition, int]

    def to_json(self) -> str:
        def enc(m: Mapping[TopicPartition, int]) -> list[list[Any]]:
            return [[tp.topic, tp.partition, off] for tp, off in sorted(m.items())]

        return json.dumps({"group": self.group, "start": enc(self.start),
                           "end": enc(self.end)})

    @staticmethod
    def from_json(raw: str, option: str) -> SendOffsets:
        d = parse_json_object(raw, option, '{"group": "g", "start": [["t", 0, 5]], "end": '
                                           '[["t", 0, 9]]}')
        try:
            group = validate_id("group.id", str(d["group"]))
            start = {TopicPartition(str(t), int(p)): int(o) for t, p, o in d["start"]}
            end = {TopicPartition(str(t), int(p)): int(o) for t, p, o in d["end"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"option {option!r} is malformed ({exc})") from None
        return SendOffsets(group, start, end)


@dataclass(frozen=True)
class WriteOptions:
    url: str
    storage_options: dict[str, Any]
    topic: str | None
    transactional_id: str | None
    partitioner: str
    app_id: str | None
    app_version: int | None
    producer_config: dict[str, Any] = field(default_factory=dict)
    file_bytes: int = staging.DEFAULT_FILE_BYTES
    send_offsets: SendOffsets | None = None
    # With app_id: the app's committed version this write's data follows (-1: none).
    app_after: int | None = None

    def connect(self) -> Log:
        from txlog.log import connect

        return connect(self.url, self.storage_options)


def _id_option(opts: Mapping[str, Any], name: str) -> str | None:
    if not opts.get(name):
        return None
    try:
        return validate_id(name, opts[name].strip())
    except Exception as exc:
        raise ConfigError(f"option {name!r}: {exc}") from None


def parse_write_options(options: Mapping[str, Any], *, streaming: bool) -> WriteOptions:
    known = WRITE_OPTIONS + (STREAM_EXTRA_OPTIONS if streaming else ())
    opts = check_known(options, known, "txlog writer", _WRITE_HINTS)
    url = parse_path(opts)
    topic = parse_topic(opts["topic"], "topic") if opts.get("topic") else None
    tid = _id_option(opts, "transactional.id")
    app_id = _id_option(opts, "txnAppId")
    version = None
    if "txnVersion" in opts:
        if streaming:
            raise ConfigError(
                "option 'txnVersion' is for batch writes: a streaming write uses the "
                "micro-batch id as the version")
        version = parse_int(opts["txnVersion"], "txnVersion", minimum=0)
    if not streaming and (app_id is None) != (version is None):
        raise ConfigError("options 'txnAppId' and 'txnVersion' go together: set both or neither")
    if app_id is not None and tid is not None:
        raise ConfigError(
            "option 'transactional.id' cannot be combined with 'txnAppId': the writer uses "
            "a transactional.id derived from the app id so that runs of one app fence "
            "each other")
    send = None
    if opts.get(SEND_OFFSETS_OPTION):
        send = SendOffsets.from_json(opts[SEND_OFFSETS_OPTION], SEND_OFFSETS_OPTION)
        if app_id is not None:
            raise ConfigError(f"option {SEND_OFFSETS_OPTION!r} cannot be combined with txnAppId")
    after = None
    if opts.get(AFTER_VERSION_OPTION):
        if app_id is None or version is None:
            raise ConfigError(f"option {AFTER_VERSION_OPTION!r} needs txnAppId and txnVersion")
        after = parse_int(opts[AFTER_VERSION_OPTION], AFTER_VERSION_OPTION, minimum=-1)
        if after >= version:
            raise ConfigError(f"option {AFTER_VERSION_OPTION!r} ({after}) must be below "
                              f"txnVersion ({version})")
    cfg: dict[str, Any] = {}
    if "transaction.timeout.ms" in opts:
        cfg["transaction.timeout.ms"] = parse_int(
            opts["transaction.timeout.ms"], "transaction.timeout.ms", minimum=1)
    file_bytes = staging.DEFAULT_FILE_BYTES
    if "maxFileBytes" in opts:
        file_bytes = parse_int(opts["maxFileBytes"], "maxFileBytes", minimum=1)
    return WriteOptions(
        url=url, storage_options=parse_storage_options(opts), topic=topic,
        transactional_id=tid,
        partitioner=staging.validate_partitioner(opts.get("partitioner", "default")),
        app_id=app_id, app_version=version, producer_config=cfg, file_bytes=file_bytes,
        send_offsets=send, app_after=after)
