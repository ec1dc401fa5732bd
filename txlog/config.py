"""Configuration: Kafka's names where they mean the same.

Precedence: built-in defaults < conf file (``TXLOG_CONF``, TOML) < environment
(``TXLOG_<KEY>`` with dots as underscores, e.g. ``TXLOG_TRANSACTION_TIMEOUT_MS``) < explicit
arguments.  Unknown keys are errors.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from typing import Any

from txlog.errors import ConfigError

# key -> (default, type, help)
DEFAULTS: dict[str, tuple[Any, type, str]] = {
    "transaction.timeout.ms": (60_000, int,
                               "abort a transaction that stays open longer than this"),
    "transaction.max.timeout.ms": (900_000, int,
                                   "the largest transaction.timeout.ms a producer may ask for"),
    "transactional.id.expiration.ms": (604_800_000, int,
                                       "forget a transactional.id idle this long"),
    "producer.id.expiration.ms": (86_400_000, int,
                                  "forget a producer's sequence state in a partition after "
                                  "this long without a write there"),
    "transaction.state.log.num.partitions": (4096, int, "state-log partitions (fixed per root)"),
    "offsets.topic.num.partitions": (10, int, "partitions of __consumer_offsets"),
    "num.partitions": (1, int, "default partitions of a new topic"),
    "batch.size": (1_048_576, int, "producer: flush a partition's batch at this many bytes"),
    "linger.ms": (5, int, "producer: flush a partition's batch this long after its first record"),
    "buffer.memory": (33_554_432, int, "producer: bytes of batches queued for writing before "
                                       "send() waits for the oldest (at least two batches)"),
    "enable.idempotence": (True, bool, "producer: per-partition sequence numbers"),
    "retries": (5, int, "producer: retries of an append whose outcome is unknown"),
    "append.parts": (True, bool, "producer: one log entry may append several batch objects "
                                 "(format version 2: set false while txlog before 0.2 "
                                 "still reads the topics)"),
    "commit.appends.batches": (True, bool, "producer: a commit names the batches no entry "
                                           "appended yet in PrepareCommit, and its COMMIT "
                                           "markers append them (format version 3: set "
                                           "false while txlog before 0.3 still reads the "
                                           "topics)"),
    "inline.batch.bytes": (16_384, int, "producer: a log entry carries a copy of each batch "
                                        "object it appends up to this size (at most 65536 "
                                        "in all), so that readers following the log need "
                                        "not fetch it (format version 4: 0 while txlog "
                                        "before 0.4 still reads the topics)"),
    "commit.inline.bytes": (65_536, int, "producer: a commit whose last batch objects are "
                                         "each within inline.batch.bytes and this in all "
                                         "carries their bytes in its PrepareCommit and is "
                                         "decided beside their uploads (state record "
                                         "version 3: 0 while txlog before 0.4 still "
                                         "reads the root)"),
    "batch.objects.shared": (True, bool, "producer: a step that writes batches of several "
                                         "partitions of a topic writes them as one shared "
                                         "object (entry format version 5: set false while "
                                         "txlog before 0.4 still reads the topics)"),
    "checkpoint.interval.batches": (1000, int, "write a partition checkpoint every N batches"),
    "retention.ms": (-1, int, "delete batches older than this (-1: keep forever)"),
    "retention.bytes": (-1, int, "delete oldest batches beyond this size (-1: no limit)"),
    "file.delete.delay.ms": (60_000, int,
                             "wait this long before deleting objects dropped by retention "
                             "or compaction, so readers holding older plans finish"),
    "segment.bytes": (134_217_728, int, "compaction: target size of a merged segment"),
    "max.poll.records": (500, int, "consumer: default records per poll"),
    "default.api.timeout.ms": (60_000, int, "consumer: how long committed() waits for "
                                            "offsets an open transaction holds (KIP-447)"),
    "max.request.size": (1_048_576, int, "producer: the largest record accepted, in bytes "
                                         "(key, value and headers)"),
    "message.max.bytes": (1_048_588, int, "the largest record producers write, in bytes, "
                                          "whatever their max.request.size"),
    "fetch.max.bytes": (52_428_800, int, "consumer: bytes one poll returns at most (one "
                                         "batch at least); batch objects declaring more "
                                         "than this and 64 times their stored size are "
                                         "refused"),
    "max.partition.fetch.bytes": (1_048_576, int, "consumer: bytes one poll returns per "
                                                  "partition at most (one batch at least)"),
    "socket.connection.setup.timeout.ms": (10_000, int,
                                           "give up connecting to the object store after "
                                           "this long"),
}
_INT32 = (1 << 31) - 1
_INT64 = (1 << 63) - 1
#: key -> (least, greatest) allowed value of an int key (Kafka's ranges where it has one).
RANGES: dict[str, tuple[int, int]] = {
    # (and at init_transactions against the root's transaction.max.timeout.ms, as Kafka's
    # coordinator does: InvalidTransactionTimeoutError)
    "transaction.timeout.ms": (1, _INT32),
    "transaction.max.timeout.ms": (1, _INT32),
    "transactional.id.expiration.ms": (1, _INT32),
    "producer.id.expiration.ms": (1, _INT32),
    "transaction.state.log.num.partitions": (1, 100_000),
    "offsets.topic.num.partitions": (1, 100_000),
    "num.partitions": (1, 100_000),
    "batch.size": (0, _INT32),
    "linger.ms": (0, _INT32),
    "buffer.memory": (1, _INT64),
    "retries": (0, _INT32),
    "inline.batch.bytes": (0, 65_536),
    "commit.inline.bytes": (0, 65_536),
    "checkpoint.interval.batches": (1, _INT32),
    "retention.ms": (-1, _INT64),
    "retention.bytes": (-1, _INT64),
    "file.delete.delay.ms": (0, _INT64),
    "segment.bytes": (14, _INT32),
    "max.poll.records": (1, _INT32),
    "default.api.timeout.ms": (0, _INT32),
    "max.request.size": (1, _INT32),
    "message.max.bytes": (0, _INT32),
    "fetch.max.bytes": (0, _INT32),
    "max.partition.fetch.bytes": (0, _INT32),
    "socket.connection.setup.timeout.ms": (1, _INT32),
}
#: TXLOG_CONF is read up to this many bytes: a conf file is a page of keys, and a path
#: such as /dev/zero must not be read forever.
MAX_CONF_BYTES = 1 << 20
# TXLOG_* variables that are not configuration keys.
NON_CONFIG_ENV = frozenset({"TXLOG_CONF", "TXLOG_ROOT", "TXLOG_STORAGE_OPTIONS", "TXLOG_DEBUG",
                            "TXLOG_CRASH_AT", "TXLOG_STOP_AT", "TXLOG_CACHE_DIR", "TXLOG_JARS_DIR",
                            "TXLOG_BENCH_TMP"})
TOPIC_KEYS = frozenset({"retention.ms", "retention.bytes", "segment.bytes",
                        "checkpoint.interval.batches", "file.delete.delay.ms"})


def coerce(key: str, value: Any) -> Any:
    """``value`` as configuration ``key`` takes it (checked: type and range)."""
    if key not in DEFAULTS:
        raise ConfigError(
            f"unknown configuration key {key!r}; known keys: {', '.join(sorted(DEFAULTS))}"
        )
    typ = DEFAULTS[key][1]
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        raise ConfigError(f"configuration {key!r} must be true or false, not {value!r}")
    lo, hi = RANGES.get(key, (-_INT64 - 1, _INT64))
    what = f"configuration {key!r} must be an integer from {lo} to {hi}"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        # A float is refused, not truncated: 1.5 (or 1e3 in TOML) is a typo for some int.
        raise ConfigError(f"{what}, not {_shown(value)}")
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        if not _INT_TEXT.fullmatch(text):
            raise ConfigError(f"{what}, not {_shown(value)}")
        value = int(text)
    if not lo <= value <= hi:
        raise ConfigError(f"{what}, not {_shown(value)}")
    return value


_INT_TEXT = re.compile(r"[+-]?[0-9]{1,20}")


def _shown(value: Any) -> str:
    """A bad value as an error shows it: short, whatever it is."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_config(explicit: Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if env is None else env
    cfg = {k: v[0] for k, v in DEFAULTS.items()}
    path = env.get("TXLOG_CONF")
    if path:
        data = _read_conf(path)
        for k, v in _flatten(data).items():
            cfg[k] = coerce(k, v)
    by_env = {k.replace(".", "_").upper(): k for k in DEFAULTS}
    for name, value in env.items():
        if name.startswith("TXLOG_") and name not in NON_CONFIG_ENV \
                and not name.startswith("TXLOG_TEST_"):  # the test suite's own settings
            key = by_env.get(name[len("TXLOG_"):])
            if key is None:
                raise ConfigError(f"unknown configuration variable {name}")
            cfg[key] = coerce(key, value)
    for k, v in (explicit or {}).items():
        key = normalize_key(k)
        cfg[key] = coerce(key, v)
    return cfg


def _read_conf(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONF_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read TXLOG_CONF file {path!r}: {exc}") from None
    if len(raw) > MAX_CONF_BYTES:
        raise ConfigError(f"TXLOG_CONF file {path!r} is larger than {MAX_CONF_BYTES} bytes; "
                          "point TXLOG_CONF at a txlog configuration file")
    try:
        return tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"TXLOG_CONF file {path!r} is not valid TOML: "
                          f"{' '.join(str(exc).split())[:200]}") from None


def normalize_key(key: str) -> str:
    """Accept Python-style names (``transaction_timeout_ms``) for dotted Kafka keys."""
    dotted = key.replace("_", ".")
    return dotted if key not in DEFAULTS and dotted in DEFAULTS else key


def topic_config(config: Mapping[str, Any] | None, base: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: base[k] for k in TOPIC_KEYS}
    for k, v in (config or {}).items():
        if k not in TOPIC_KEYS:
            raise ConfigError(
                f"{k!r} is not a topic configuration; topic keys: {', '.join(sorted(TOPIC_KEYS))}"
            )
        out[k] = coerce(k, v)
    return out


_coerce = coerce  # the name other modules imported first
