"""Options of the ``txlog`` Spark data source, parsed once and shared by reader and writer.

Option names follow Spark's Kafka source where the meaning is the same.  Spark hands a
Python data source its options in a case-insensitive dict (keys lowercased), so every
lookup here is case-insensitive and errors name the option as users spell it.

Every problem is a :class:`txlog.errors.ConfigError` naming the option, raised while the
query is analysed (``load()``/``start()``), before any Spark job runs.

The generic helpers (:func:`check_known`, :func:`parse_path`, :func:`parse_storage_options`,
:func:`parse_topic`, :func:`parse_bool`, :func:`parse_int`, :func:`connect_from_options`)
are for the writer as well.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from txlog.errors import ConfigError, InvalidNameError
from txlog.names import validate_topic
from txlog.partition_state import ISOLATION_LEVELS, READ_COMMITTED

if TYPE_CHECKING:
    from txlog.log import Log

#: Options every txlog reader and writer takes.
COMMON_OPTIONS = ("path", "storage_options")

EARLIEST = -2
LATEST = -1

#: Read options (canonical spelling).  Keys are matched case-insensitively.
READ_OPTIONS = (
    *COMMON_OPTIONS,
    "topic", "subscribe", "subscribePattern", "assign",
    "startingOffsets", "endingOffsets",
    "startingTimestamp", "endingTimestamp",
    "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "isolation.level", "kafka.isolation.level",
    "maxOffsetsPerTrigger", "failOnDataLoss", "includeHeaders",
    "minPartitions", "maxPartitionBytes",
)

#: Read options that only make sense in one kind of query.
BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")

DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024


def _canon_map(names: Iterable[str]) -> dict[str, str]:
    return {n.lower(): n for n in names}


def _lower(options: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in options.items():
        if not isinstance(k, str):
            raise ConfigError(f"option names must be strings, not {k!r}")
        out[k.lower()] = v
    return out


def check_known(options: Mapping[str, Any], known: Iterable[str], what: str,
                hints: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return ``options`` keyed by canonical name; raise naming any unknown option.

    ``what`` names the role in messages ("txlog reader"); ``hints`` maps lowercased option
    names (or prefixes ending in '.') to an extra sentence explaining a likely mistake.
    """
    canon = _canon_map(known)
    out: dict[str, str] = {}
    unknown = []
    for k, v in _lower(options).items():
        if k in canon:
            if v is None:
                raise ConfigError(f"option {canon[k]!r} of the {what} has no value")
            out[canon[k]] = str(v)
        else:
            unknown.append(k)
    if unknown:
        k = sorted(unknown)[0]
        hint = ""
        for h, text in (hints or {}).items():
            if k == h or (h.endswith(".") and k.startswith(h)):
                hint = " " + text
                break
        raise ConfigError(
            f"unknown option {k!r} for the {what}.{hint} Known options: "
            f"{', '.join(sorted(canon.values(), key=str.lower))}"
        )
    return out


def parse_path(opts: Mapping[str, str]) -> str:
    url = opts.get("path")
    if not url or not url.strip():
        raise ConfigError(
            "option 'path' is required: the txlog root URL, e.g. "
            ".option('path', 's3://bucket/lake') or .load('/data/lake')"
        )
    return url.strip()


def parse_storage_options(opts: Mapping[str, str]) -> dict[str, Any]:
    raw = opts.get("storage_options")
    if raw is None or raw.strip() == "":
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(
            f"option 'storage_options' must be a JSON object of fsspec options, e.g. "
            f"'{{\"anon\": false}}'; it is not valid JSON ({exc})"
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(
            f"option 'storage_options' must be a JSON object, not {type(value).__name__}")
    return value


def parse_topic(value: str, option: str) -> str:
    """A topic name given in ``option``: Kafka's naming rules, errors naming the option."""
    try:
        return validate_topic(value.strip())
    except InvalidNameError as exc:
        raise ConfigError(f"option {option!r}: {exc}") from None


def parse_topic_list(value: str, option: str) -> list[str]:
    names = [t.strip() for t in value.split(",") if t.strip()]
    if not names:
        raise ConfigError(f"option {option!r} names no topic; give a comma-separated list")
    topics = []
    for t in names:
        t = parse_topic(t, option)
        if t not in topics:
            topics.append(t)
    return topics


def parse_bool(value: str, option: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {option!r} must be true or false, not {value!r}")


def parse_int(value: str, option: str, *, minimum: int | None = None) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise ConfigError(f"option {option!r} must be an integer, not {value!r}") from None
    if minimum is not None and n < minimum:
        raise ConfigError(f"option {option!r} must be at least {minimum}, not {n}")
    return n


def parse_json_object(value: str, option: str, example: str) -> dict[str, Any]:
    try:
        d = json.loads(value)
    except ValueError as exc:
        raise ConfigError(
            f"option {option!r} is not valid JSON ({exc}); expected e.g. {example}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"option {option!r} must be a JSON object like {example}")
    return d


_LOGS: dict[tuple[str, str], Log] = {}
_LOGS_LOCK = threading.Lock()
_MAX_CACHED_LOGS = 16


def connect_from_options(url: str, storage_options: Mapping[str, Any], *,
                         cached: bool = False) -> Log:
    """Open the txlog root (in whichever process calls it: driver, planner or executor).

    ``cached=True`` reuses one Log per (url, storage_options) in this process, so planning
    again only reads each partition's new tail; callers that refresh partition states
    through it must hold :data:`PLAN_LOCK`.
    """
    import txlog

    if not cached:
        return txlog.connect(url, dict(storage_options))
    key = (url, json.dumps(storage_options, sort_keys=True, default=str))
    with _LOGS_LOCK:
        log = _LOGS.get(key)
        if log is None:
            if len(_LOGS) >= _MAX_CACHED_LOGS:
                _forget_checks(_LOGS.pop(next(iter(_LOGS))))
            log = _LOGS[key] = txlog.connect(url, dict(storage_options))
        return log


#: How long a topic's identity, once checked against the store, is taken as current by a
#: request that allows it (a scan planned right after its query's schema request).
TOPIC_CHECK_REUSE_SECONDS = 2.0
#: When each cached Log's topics were last checked: (id(log), topic) -> time.monotonic().
_CHECKED: dict[tuple[int, str], float] = {}


def cached_log_for(url: str, storage_options: Mapping[str, Any], topics: Iterable[str], *,
                   reuse_check: bool = False) -> Log:
    """This process's cached Log for the root, replaced when one of ``topics`` was
    deleted and recreated since it was cached (its cached partition states would point
    past the new topic's end).

    Each topic's metadata is read once to check that: not for a topic the Log has not
    read yet (it reads it fresh when asked), nor, with ``reuse_check``, for one checked
    less than :data:`TOPIC_CHECK_REUSE_SECONDS` ago (a query's schema request checks, and
    its scan follows at once: one request for both, on a remote store)."""
    from txlog import layout

    log = connect_from_options(url, storage_options, cached=True)
    now = time.monotonic()
    for name in topics:
        checked = _CHECKED.get((id(log), name))
        if reuse_check and checked is not None and now - checked < TOPIC_CHECK_REUSE_SECONDS:
            continue
        known = log.cached_topic(name)
        if known is None:
            # Nothing cached can be stale: log.topic() reads the metadata afresh.
            _CHECKED[(id(log), name)] = now
            continue
        try:
            current = json.loads(log.store.get(layout.topic_meta(name))).get("id")
        except (KeyError, ValueError):
            continue  # unknown or unreadable: log.topic() reports it
        if current != known.topic_id:
            forget_cached_log(log)
            return cached_log_for(url, storage_options, topics, reuse_check=reuse_check)
        _CHECKED[(id(log), name)] = now
    return log


def forget_cached_log(log: Log) -> None:
    with _LOGS_LOCK:
        for k, v in list(_LOGS.items()):
            if v is log:
                del _LOGS[k]
        _forget_checks(log)


def _forget_checks(log: Log) -> None:
    for key in list(_CHECKED):
        if key[0] == id(log):
            _CHECKED.pop(key, None)


#: Serialises planning through cached Logs (partition states are not thread-safe).
PLAN_LOCK = threading.RLock()


# --- offsets specs -------------------------------------------------------------------------

#: {topic: {partition: offset-or-ms}} from a JSON option, with -2/-1 for earliest/latest.
PartitionMap = dict[str, dict[int, int]]


def parse_partition_map(value: str, option: str, *, allow_special: bool) -> PartitionMap:
    example = '{"orders": {"0": 23, "1": -2}}' if allow_special else \
        '{"orders": {"0": 1700000000000}}'
    d = parse_json_object(value, option, example)
    out: PartitionMap = {}
    for topic, parts in d.items():
        topic = parse_topic(str(topic), option)
        if not isinstance(parts, dict):
            raise ConfigError(
                f"option {option!r}: topic {topic!r} must map to an object of "
                f"partition -> value, e.g. {example}")
        m: dict[int, int] = {}
        for p, off in parts.items():
            try:
                pn = int(p)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"option {option!r}: partition {p!r} of topic {topic!r} is not an "
                    "integer") from None
            if pn < 0:
                raise ConfigError(f"option {option!r}: partition {pn} of {topic!r} is negative")
            if isinstance(off, bool) or not isinstance(off, int):
                raise ConfigError(
                    f"option {option!r}: value for {topic}-{pn} must be an integer, "
                    f"not {off!r}")
            low = EARLIEST if allow_special else 0
            if off < low:
                raise ConfigError(
                    f"option {option!r}: value {off} for {topic}-{pn} is invalid"
                    + (" (offsets are >= 0, or -2 = earliest, -1 = latest)"
                       if allow_special else " (timestamps are milliseconds >= 0)"))
            m[pn] = off
        out[topic] = m
    return out


@dataclass(frozen=True)
class OffsetSpec:
    """Where a read starts or ends: ``kind`` is earliest, latest, offsets or timestamp."""

    kind: str
    offsets: PartitionMap = field(default_factory=dict)  # kind == "offsets"
    timestamp: int | None = None                          # kind == "timestamp", all tps
    timestamps: PartitionMap = field(default_factory=dict)  # kind == "timestamp", per tp
    option: str = ""

    def describe(self) -> str:
        return self.option or self.kind


def _offset_spec(value: str, option: str) -> OffsetSpec:
    v = value.strip()
    if v.lower() == "earliest":
        return OffsetSpec("earliest", option=option)
    if v.lower() == "latest":
        return OffsetSpec("latest", option=option)
    if v.startswith("{"):
        return OffsetSpec("offsets", offsets=parse_partition_map(v, option, allow_special=True),
                          option=option)
    raise ConfigError(
        f"option {option!r} must be 'earliest', 'latest' or JSON like "
        f"'{{\"orders\": {{\"0\": 23, \"1\": -2}}}}' (-2 = earliest, -1 = latest), "
        f"not {value!r}")


@dataclass(frozen=True)
class ReadOptions:
    url: str
    storage_options: dict[str, Any]
    #: exactly one of topics (topic/subscribe), pattern (subscribePattern), assign is set
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    starting: OffsetSpec | None = None  # None: the query's default (batch earliest, stream latest)
    ending: OffsetSpec | None = None    # None: latest
    timestamp_strategy: str = "error"
    isolation: str = READ_COMMITTED
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = True
    min_partitions: int | None = None
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    given: tuple[str, ...] = ()  # canonical names of the options the user set

    def connect(self, *, cached: bool = False) -> Log:
        return connect_from_options(self.url, self.storage_options, cached=cached)

    def subscription(self) -> str:
        if self.assign is not None:
            return "assign"
        if self.pattern is not None:
            return "subscribePattern"
        return "topic/subscribe"


_READ_HINTS = {
    "kafka.": "txlog talks to object storage, not to Kafka brokers: kafka.* client settings "
              "have no meaning here (only kafka.isolation.level is accepted).",
    "paths": "Give one txlog root in 'path'; topics are chosen with topic/subscribe/assign.",
    "groupidprefix": "txlog's Spark source tracks offsets in the query checkpoint, not in "
                     "a consumer group.",
    "kafka.group.id": "txlog's Spark source tracks offsets in the query checkpoint.",
}


def parse_read_options(options: Mapping[str, Any], *, streaming: bool | None = None,
                       ) -> ReadOptions:
    """Validate the options of ``spark.read``/``readStream.format("txlog")``.

    ``streaming`` is None when the kind of query is not known yet (``DataSource.schema()``):
    checks that depend on it run again when the reader is created.
    """
    opts = check_known(options, READ_OPTIONS, "txlog reader", _READ_HINTS)
    url = parse_path(opts)
    storage_options = parse_storage_options(opts)

    chosen = [k for k in ("topic", "subscribe", "subscribePattern", "assign") if k in opts]
    if len(chosen) != 1:
        raise ConfigError(
            "give exactly one of the options 'topic', 'subscribe' (comma-separated topics), "
            "'subscribePattern' (regex) or 'assign' (JSON like '{\"orders\": [0, 1]}')"
            + (f"; got {', '.join(repr(c) for c in chosen)}" if chosen else "")
        )
    topics: tuple[str, ...] = ()
    pattern = None
    assign = None
    how = chosen[0]
    if how in ("topic", "subscribe"):
        topics = tuple(parse_topic_list(opts[how], how))
        if how == "topic" and len(topics) != 1:
            raise ConfigError("option 'topic' takes one topic; use 'subscribe' for several")
    elif how == "subscribePattern":
        import re

        pattern = opts[how]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(
                f"option 'subscribePattern' is not a valid regex ({exc}): {pattern!r}"
            ) from None
    else:
        d = parse_json_object(opts[how], "assign", '{"orders": [0, 1]}')
        assign = {}
        for t, parts in d.items():
            t = parse_topic(str(t), "assign")
            if not isinstance(parts, list) or not parts or not all(
                    isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts):
                raise ConfigError(
                    f"option 'assign': topic {t!r} must map to a non-empty list of "
                    f"partition numbers, e.g. {{\"{t}\": [0, 1]}}, not {parts!r}")
            assign[t] = tuple(sorted(set(parts)))

    isolation = READ_COMMITTED
    iso_keys = [k for k in ("isolation.level", "kafka.isolation.level") if k in opts]
    if len(iso_keys) == 2 and opts[iso_keys[0]] != opts[iso_keys[1]]:
        raise ConfigError("options 'isolation.level' and 'kafka.isolation.level' disagree")
    if iso_keys:
        isolation = opts[iso_keys[0]].strip().lower()
        if isolation not in ISOLATION_LEVELS:
            raise ConfigError(
                f"option {iso_keys[0]!r} must be read_committed or read_uncommitted, not "
                f"{opts[iso_keys[0]]!r}")

    starting = None
    if "startingTimestamp" in opts:
        starting = OffsetSpec("timestamp", timestamp=parse_int(
            opts["startingTimestamp"], "startingTimestamp", minimum=0),
            option="startingTimestamp")
    elif "startingOffsetsByTimestamp" in opts:
        starting = OffsetSpec("timestamp", timestamps=parse_partition_map(
            opts["startingOffsetsByTimestamp"], "startingOffsetsByTimestamp",
            allow_special=False), option="startingOffsetsByTimestamp")
    elif "startingOffsets" in opts:
        starting = _offset_spec(opts["startingOffsets"], "startingOffsets")
    ending = None
    if "endingTimestamp" in opts:
        ending = OffsetSpec("timestamp", timestamp=parse_int(
            opts["endingTimestamp"], "endingTimestamp", minimum=0), option="endingTimestamp")
    elif "endingOffsetsByTimestamp" in opts:
        ending = OffsetSpec("timestamp", timestamps=parse_partition_map(
            opts["endingOffsetsByTimestamp"], "endingOffsetsByTimestamp",
            allow_special=False), option="endingOffsetsByTimestamp")
    elif "endingOffsets" in opts:
        ending = _offset_spec(opts["endingOffsets"], "endingOffsets")

    strategy = opts.get("startingOffsetsByTimestampStrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise ConfigError(
            "option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', not "
            f"{opts['startingOffsetsByTimestampStrategy']!r}")

    max_offsets = None
    if "maxOffsetsPerTrigger" in opts:
        max_offsets = parse_int(opts["maxOffsetsPerTrigger"], "maxOffsetsPerTrigger", minimum=1)
    min_parts = None
    if "minPartitions" in opts:
        min_parts = parse_int(opts["minPartitions"], "minPartitions", minimum=1)
    max_bytes = DEFAULT_MAX_PARTITION_BYTES
    if "maxPartitionBytes" in opts:
        max_bytes = parse_int(opts["maxPartitionBytes"], "maxPartitionBytes", minimum=1)

    ro = ReadOptions(
        url=url, storage_options=storage_options, topics=topics, pattern=pattern,
        assign=assign, starting=starting, ending=ending, timestamp_strategy=strategy,
        isolation=isolation, max_offsets_per_trigger=max_offsets,
        fail_on_data_loss=parse_bool(opts.get("failOnDataLoss", "true"), "failOnDataLoss"),
        include_headers=parse_bool(opts.get("includeHeaders", "true"), "includeHeaders"),
        min_partitions=min_parts, max_partition_bytes=max_bytes, given=tuple(sorted(opts)),
    )
    if streaming is not None:
        check_query_kind(ro, streaming)
    return ro


def check_query_kind(ro: ReadOptions, streaming: bool) -> None:
    """Options valid only for batch or only for streaming queries (as Kafka's source)."""
    if streaming:
        for k in BATCH_ONLY:
            if k in ro.given:
                raise ConfigError(
                    f"option {k!r} is for batch queries (spark.read); a streaming query "
                    "reads up to the last stable offset at each trigger")
        return
    st, en = ro.starting, ro.ending
    if st is not None and st.kind == "latest":
        raise ConfigError(
            "option 'startingOffsets' = 'latest' is not allowed in batch queries (it reads "
            "nothing); use 'earliest' or specific offsets")
    if st is not None and st.kind == "offsets" and any(
            o == LATEST for m in st.offsets.values() for o in m.values()):
        raise ConfigError(
            "option 'startingOffsets': -1 (latest) is not allowed in batch queries")
    if en is not None and en.kind == "earliest":
        raise ConfigError(
            "option 'endingOffsets' = 'earliest' is not allowed in batch queries (it reads "
            "nothing); use 'latest' or specific offsets")
    if en is not None and en.kind == "offsets" and any(
            o == EARLIEST for m in en.offsets.values() for o in m.values()):
        raise ConfigError(
            "option 'endingOffsets': -2 (earliest) is not allowed in batch queries")


def options_from_kwargs(options: Mapping[str, Any] | None = None, *,
                        known: Iterable[str] = READ_OPTIONS, **kwargs: Any) -> dict[str, str]:
    """Python-call options (``spark_ext.read(spark, isolation_level=..., storage_options={})``)
    as the string options Spark would pass.  ``x_y`` keywords map to dotted names where a
    dotted option in ``known`` exists (``isolation_level`` -> ``isolation.level``)."""
    merged: dict[str, Any] = dict(options or {})
    dotted = {n.replace(".", "_").lower(): n for n in known if "." in n}
    for k, v in kwargs.items():
        merged[dotted.get(k.lower(), k)] = v
    out: dict[str, str] = {}
    for k, v in merged.items():
        if v is None:
            continue
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, (dict, list)):
            out[k] = json.dumps(v)
        else:
            out[k] = str(v)
    return out
