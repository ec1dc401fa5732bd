"""``txlog.connect(url) -> Log``: topics, partition logs, producers and consumers of a root."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txlog import layout, root_settings
from txlog.config import DEFAULTS, TOPIC_KEYS, load_config, normalize_key, topic_config
from txlog.errors import CorruptObjectError, StorageError, TopicExistsError, UnknownTopicError
from txlog.fanout import fan_out
from txlog.model import new_token
from txlog.names import (
    CONSUMER_OFFSETS_TOPIC,
    INTERNAL_TOPICS,
    is_topic_name,
    validate_root_url,
    validate_topic,
)
from txlog.partition_log import PartitionLog
from txlog.records import KAFKA_SCHEMA, TopicPartition, now_ms, schema_from_json, schema_to_json
from txlog.storage import ObjectStore, open_store

if TYPE_CHECKING:
    from txlog.consumer import Consumer
    from txlog.coordinator import Coordinator
    from txlog.partition_state import PartitionState
    from txlog.producer import Producer


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int
    schema: pa.Schema
    kafka_shaped: bool
    config: dict[str, Any] = field(default_factory=dict)
    created_ms: int = 0
    topic_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"v": 1, "name": self.name, "partitions": self.partitions,
                "kafka_shaped": self.kafka_shaped,
                "schema": None if self.kafka_shaped else schema_to_json(self.schema),
                "config": self.config, "created_ms": self.created_ms, "id": self.topic_id}

    @staticmethod
    def from_json(raw: bytes, where: str, name: str | None = None) -> TopicInfo:
        """Decode stored topic metadata with the rules create_topic() applies (a root
        others write to may hold anything); ``name``: the topic it must describe."""
        try:
            d = json.loads(raw)
            if not isinstance(d, dict):
                raise TypeError("not a JSON object")
            if not isinstance(d.get("v", 0), int) or d.get("v", 0) > 1:
                from txlog.errors import UnsupportedFormatError

                raise UnsupportedFormatError(
                    f"topic metadata {where} has a newer format version; upgrade txlog")
            info_name = validate_topic(d["name"])
            if name is not None and info_name != name:
                raise ValueError(f"it describes topic {info_name!r}, not {name!r}")
            partitions = d["partitions"]
            if type(partitions) is not int or not 1 <= partitions <= MAX_PARTITIONS:
                raise ValueError(f"partitions {partitions!r} is not an integer from 1 to "
                                 f"{MAX_PARTITIONS}")
            kafka = d["kafka_shaped"]
            if not isinstance(kafka, bool):
                raise TypeError(f"kafka_shaped {kafka!r} is not true or false")
            schema = KAFKA_SCHEMA if kafka else schema_from_json(d["schema"])
            config = d.get("config") or {}
            if not isinstance(config, dict):
                raise TypeError("config is not an object")
            created, topic_id = d.get("created_ms", 0), d.get("id", "")
            if type(created) is not int or not isinstance(topic_id, str):
                raise TypeError("created_ms or id has the wrong type")
            # Each stored setting checked as create_topic() checks it; one missing (older
            # metadata) still means whatever it meant before.
            checked = topic_config(config, _TOPIC_DEFAULTS)
            return TopicInfo(info_name, partitions, schema, kafka,
                             {k: checked[k] for k in config}, created, topic_id)
        except CorruptObjectError:
            raise
        except Exception as exc:
            raise CorruptObjectError(
                f"topic metadata {where} cannot be decoded ({type(exc).__name__}: {exc})"
            ) from None


#: The most partitions a topic may have (create_topic's bound, and stored metadata's).
MAX_PARTITIONS = 100_000


_TOPIC_DEFAULTS = {k: DEFAULTS[k][0] for k in TOPIC_KEYS}


class Log:
    """A txlog root: every topic, the transaction state log and consumer offsets under one URL.

    Cheap to create; holds caches of partition states.  Pickling keeps only what is needed
    to rebuild it (URL, storage options, config), so it can travel to Spark workers.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *,
                 create: bool = True, **config: Any) -> None:
        self.url = validate_root_url(url)
        self.storage_options = dict(storage_options or {})
        self._explicit_config = dict(config)
        self.config = load_config(config)
        self.store: ObjectStore = open_store(
            url, self.storage_options, create=create,
            connect_timeout_ms=self.config["socket.connection.setup.timeout.ms"])
        self._lock = threading.RLock()
        self._topics: dict[str, TopicInfo] = {}
        self._partitions: dict[TopicPartition, PartitionLog] = {}
        self._coordinator: Coordinator | None = None
        self._settings_known = False
        self._store_checked = False

    def __getstate__(self) -> dict[str, Any]:
        state = {"url": self.url, "storage_options": self.storage_options,
                 "config": self._explicit_config}
        if self._settings_known:  # (a Spark task need not read them again)
            state["root_settings"] = {k: self.config[k] for k in root_settings.SETTINGS}
        return state

    def __setstate__(self, s: dict[str, Any]) -> None:
        self.__init__(s["url"], s["storage_options"], **s["config"])  # type: ignore[misc]
        if s.get("root_settings"):
            self.config.update(s["root_settings"])
            self._settings_known = True

    def root_settings(self) -> dict[str, int]:
        """The settings every client of this root must agree on (see
        :mod:`txlog.root_settings`), read from the root (written there by the first
        client of a new root) on first use; ``self.config`` then holds them."""
        with self._lock:
            if not self._store_checked:
                # Every writing client passes here first: a server whose create is not
                # atomic is refused before anything is claimed on it.
                self.store.check_atomic_create()
                self._store_checked = True
            if not self._settings_known:
                explicit = {normalize_key(k) for k in self._explicit_config} | {
                    k for k in root_settings.SETTINGS if self.config[k] != DEFAULTS[k][0]}
                self.config.update(root_settings.resolve(self.store, self.config, explicit))
                self._settings_known = True
            return {k: self.config[k] for k in root_settings.SETTINGS}

    def __repr__(self) -> str:
        return f"Log({self.url!r})"

    # -- topics ----------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int | None = None,
                     schema: pa.Schema | None = None,
                     config: dict[str, Any] | None = None) -> TopicInfo:
        validate_topic(name)
        _refuse_internal(name, "create")
        n = self.config["num.partitions"] if partitions is None else partitions
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_PARTITIONS:
            from txlog.errors import ConfigError

            raise ConfigError(
                f"partitions must be an integer from 1 to {MAX_PARTITIONS}, not {n!r}")
        if schema is not None and not isinstance(schema, pa.Schema):
            from txlog.errors import SchemaMismatchError

            raise SchemaMismatchError(f"schema must be a pyarrow.Schema, not {type(schema)}")
        if schema is not None:
            reserved = {"topic", "partition", "offset", "timestamp"} & set(schema.names)
            if reserved:
                from txlog.errors import SchemaMismatchError

                raise SchemaMismatchError(
                    f"typed topic columns may not be named {sorted(reserved)}: readers add "
                    "them"
                )
        self.root_settings()  # (a new root gets its settings with its first topic)
        info = TopicInfo(name, n, schema if schema is not None else KAFKA_SCHEMA,
                         schema is None, topic_config(config, self.config), now_ms(),
                         uuid.uuid4().hex)
        body = dict(info.to_json(), token=new_token())
        if not self.store.put_if_absent(layout.topic_meta(name),
                                        json.dumps(body, sort_keys=True).encode()):
            raise TopicExistsError(
                f"topic {name!r} already exists in {self.url}; use describe_topic() to see "
                "it or delete_topic() first"
            )
        with self._lock:
            self._topics[name] = info
        return info

    def cached_topic(self, name: str) -> TopicInfo | None:
        """The topic's description if this Log has read it already, else None (no request)."""
        return self._topics.get(name)

    def topic(self, name: str) -> TopicInfo:
        # No lock to read: a dict lookup is atomic, and producers call this per record.
        info = self._topics.get(name)
        if info is not None:
            return info
        if name == CONSUMER_OFFSETS_TOPIC:
            return self._offsets_topic()
        try:
            raw = self.store.get(layout.topic_meta(name))
        except KeyError:
            known = self.list_topics()
            raise UnknownTopicError(
                f"unknown topic {name!r} in {self.url}"
                + (f"; topics here: {', '.join(known)}" if known else "; no topics exist yet")
                + ". Create it with create_topic() or `txlog topics create`."
            ) from None
        info = TopicInfo.from_json(raw, layout.topic_meta(name), name)
        with self._lock:
            self._topics[name] = info
        return info

    def _offsets_topic(self) -> TopicInfo:
        key = layout.topic_meta(CONSUMER_OFFSETS_TOPIC)
        try:
            info = TopicInfo.from_json(self.store.get(key), key, CONSUMER_OFFSETS_TOPIC)
        except KeyError:
            n = self.root_settings()["offsets.topic.num.partitions"]
            info = TopicInfo(CONSUMER_OFFSETS_TOPIC, n, KAFKA_SCHEMA, True,
                             topic_config(None, self.config), now_ms(), uuid.uuid4().hex)
            body = dict(info.to_json(), token=new_token())
            if not self.store.put_if_absent(key, json.dumps(body, sort_keys=True).encode()):
                info = TopicInfo.from_json(self.store.get(key), key, CONSUMER_OFFSETS_TOPIC)
        with self._lock:
            self._topics[CONSUMER_OFFSETS_TOPIC] = info
        return info

    def list_topics(self, *, internal: bool = False) -> list[str]:
        keys = self.store.list(layout.TOPIC_META_PREFIX)
        names = [k[len(layout.TOPIC_META_PREFIX):-len(".json")] for k in keys
                 if k.endswith(".json")]
        # An object whose name is no topic name was not written by txlog: not a topic.
        return sorted(n for n in names if (internal or n not in INTERNAL_TOPICS)
                      and is_topic_name(n))

    def describe_topic(self, name: str) -> dict[str, Any]:
        """The topic's metadata and, per partition, the offsets a reader would see: a
        decided transaction holding the LSO is rolled forward and an expired one aborted
        first, as any reader does (so the LSO shown is the one a consumer gets).  With
        read-only access that cannot be done: the LSO is then shown as last written."""
        from txlog.resolve import resolve_lso

        info = self.topic(name)
        parts = []
        for p in range(info.partitions):
            tp = TopicPartition(name, p)
            try:
                st = resolve_lso(self, tp)
            except (StorageError, OSError) as exc:
                log.warning("describe %s: could not settle what holds its LSO (%s); "
                            "showing it as last written", tp, exc)
                st = self.partition_log(tp).refresh()
            parts.append({
                "partition": p, "log_start_offset": st.log_start_offset,
                "high_watermark": st.high_watermark,
                "last_stable_offset": st.last_stable_offset, "batches": len(st.batches),
                "open_transactions": len(st.open_txns), "size_bytes": st.size_bytes(),
            })
        return {"name": name, "partitions": info.partitions,
                "kafka_shaped": info.kafka_shaped,
                "schema": str(info.schema), "config": info.config,
                "created_ms": info.created_ms, "partition_info": parts}

    def delete_topic(self, name: str) -> None:
        _refuse_internal(name, "delete")
        info = self.topic(name)
        # Metadata first: new readers stop finding the topic before its objects go.
        self.store.delete(layout.topic_meta(name))
        self.store.delete_prefix(layout.topic_root(name))
        with self._lock:
            self._topics.pop(name, None)
            for tp in [tp for tp in self._partitions if tp.topic == name]:
                del self._partitions[tp]
        del info

    def partitions_for(self, topic: str) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for p in range(self.topic(topic).partitions)]

    def refresh_partitions(self, tps: list[TopicPartition]) -> list[PartitionState]:
        """The current state of each partition (checkpoint, then the new tail).  On a
        remote store they load in parallel: one after the other, each costs several
        sequential round trips."""
        plogs = [self.partition_log(tp) for tp in tps]
        if len(plogs) < 2 or self.store.local_requests:
            return [pl.refresh() for pl in plogs]
        return fan_out(PartitionLog.refresh, plogs)

    def partition_log(self, tp: TopicPartition) -> PartitionLog:
        with self._lock:
            plog = self._partitions.get(tp)
            if plog is None:
                info = self.topic(tp.topic)
                if not 0 <= tp.partition < info.partitions:
                    raise UnknownTopicError(
                        f"topic {tp.topic!r} has partitions 0..{info.partitions - 1}, "
                        f"not {tp.partition}"
                    )
                plog = PartitionLog(self.store, tp.topic, tp.partition,
                                    checkpoint_interval=int(
                                        info.config.get("checkpoint.interval.batches",
                                                        self.config["checkpoint.interval.batches"])),
                                    fetch_max_bytes=self.config["fetch.max.bytes"])
                self._partitions[tp] = plog
            return plog

    # -- clients ---------------------------------------------------------------------------

    @property
    def coordinator(self) -> Coordinator:
        with self._lock:
            if self._coordinator is None:
                from txlog.coordinator import Coordinator

                self.root_settings()
                self._coordinator = Coordinator(self)
            return self._coordinator

    def producer(self, *, transactional_id: str | None = None, **config: Any) -> Producer:
        from txlog.producer import Producer

        self.root_settings()
        return Producer(self, transactional_id=transactional_id, **config)

    def consumer(self, *, group_id: str | None = None,
                 isolation_level: str = "read_committed", **config: Any) -> Consumer:
        from txlog.consumer import Consumer

        return Consumer(self, group_id=group_id, isolation_level=isolation_level, **config)

    def metrics(self, *, refresh: bool = False, topics: list[str] | None = None,
                ) -> dict[str, Any]:
        """Store requests and bytes, transaction latencies, open transactions and LSO lag
        per partition (see :mod:`txlog.metrics`)."""
        from txlog.metrics import log_metrics

        return log_metrics(self, refresh=refresh, topics=topics)


def _refuse_internal(name: str, what: str) -> None:
    if name in INTERNAL_TOPICS:
        from txlog.errors import InvalidTopicError

        raise InvalidTopicError(
            f"cannot {what} internal topic {name!r}: txlog manages it (consumer offsets "
            "are written by commit() and send_offsets_to_transaction())")


def connect(url: str, storage_options: dict[str, Any] | None = None, *, create: bool = True,
            **config: Any) -> Log:
    """Open the txlog root at ``url`` (a path, file://, s3://, gs://, abfs:// or memory://).
    With ``create=False`` a local root that does not exist is an error (RootNotFoundError)
    instead of a new empty directory."""
    return Log(url, storage_options, create=create, **config)
