"""Settings every client of a root must agree on, fixed when the root is created.

Two clients that hash one transactional.id over different numbers of state-log
partitions find its record in different places: neither fences the other and both
commit.  So the state-log and offsets-topic partition counts and the largest
transaction timeout are written into the root (``_meta/root.json``) by the first client
that needs them, and every client after reads them from there.  A client whose own
configuration sets one of them to something else is refused.

A root made before these were stored (it has topics or producer ids but no settings
object) is left as it is: its clients go on with their configuration, as they did.  A
default that changed since (the state log's partitions: 50 then) is the old one there,
so a client that sets nothing hashes its id where older clients of the root did.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from txlog import layout
from txlog.errors import ConfigError, CorruptObjectError, UnsupportedFormatError
from txlog.model import new_token
from txlog.records import now_ms
from txlog.storage.base import ObjectStore

KEY = layout.ROOT_SETTINGS_KEY
VERSION = 1
#: The settings and the range each must lie in (as configuration checks them).
SETTINGS: dict[str, tuple[int, int]] = {
    "transaction.state.log.num.partitions": (1, 100_000),
    "offsets.topic.num.partitions": (1, 100_000),
    "transaction.max.timeout.ms": (1, 2**31 - 1),
}
#: Defaults of the settings when no root stored them, for a root made back then.
BEFORE_STORED: dict[str, int] = {"transaction.state.log.num.partitions": 50}
#: Prefixes of which a root in use holds at least one object: topic metadata (the
#: offsets topic's too) and producer-id blocks.
_IN_USE = (layout.TOPIC_META_PREFIX, layout.TXN_PREFIX)


def encode(values: Mapping[str, int]) -> bytes:
    body = {"v": VERSION, "settings": {k: values[k] for k in SETTINGS},
            "created_ms": now_ms(), "token": new_token()}
    return json.dumps(body, sort_keys=True).encode()


def decode(raw: bytes, where: str) -> dict[str, int]:
    """The stored settings, each checked for type and range."""
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise CorruptObjectError(f"root settings {where} are not valid JSON") from None
    if not isinstance(d, dict) or type(d.get("v")) is not int:
        raise CorruptObjectError(f"root settings {where} have no format version")
    if d["v"] > VERSION:
        raise UnsupportedFormatError(
            f"root settings {where} have format version {d['v']}, newer than this txlog "
            f"reads ({VERSION}); upgrade txlog")
    settings = d.get("settings")
    if not isinstance(settings, dict):
        raise CorruptObjectError(f"root settings {where} hold no settings")
    out = {}
    for k, (lo, hi) in SETTINGS.items():
        v = settings.get(k)
        if type(v) is not int or not lo <= v <= hi:
            raise CorruptObjectError(
                f"root settings {where}: {k} is {v!r}, not an integer from {lo} to {hi}; "
                "the object is corrupt: restore it (every client of the root must agree)")
        out[k] = v
    return out


def resolve(store: ObjectStore, config: Mapping[str, Any],
            explicit: Collection[str]) -> dict[str, int]:
    """The root's settings: stored ones (written from ``config`` if the root is new).
    For a root made before they were stored, only the defaults of that time for the keys
    not in ``explicit``.  Raises ConfigError when a key in ``explicit`` (set by this
    client rather than defaulted) disagrees with the root."""
    where = f"{KEY} in {store.url}"
    raw = _get(store)
    if raw is None and any(store.list(prefix) for prefix in _IN_USE):
        # Look again: a client that stores settings writes them before anything else, so
        # a root that came into use since the read above has them by now.
        raw = _get(store)
        if raw is None:
            # An older root: nothing to compare with.
            return {k: v for k, v in BEFORE_STORED.items() if k not in explicit}
    if raw is None:
        mine = {k: int(config[k]) for k in SETTINGS}
        data = encode(mine)
        if store.put_if_absent(KEY, data):
            return mine
        raw = store.get(KEY)  # another client created the root first
    stored = decode(raw, where)
    conflicts = [k for k in SETTINGS if k in explicit and config[k] != stored[k]]
    if conflicts:
        raise ConfigError(
            "this client sets " + ", ".join(f"{k}={config[k]}" for k in conflicts)
            + f", but the root at {store.url} was created with "
            + ", ".join(f"{k}={stored[k]}" for k in conflicts)
            + "; these must agree across every client of a root (a transactional.id would "
            "hash differently): drop the setting, or use the root's value")
    return stored


def _get(store: ObjectStore) -> bytes | None:
    try:
        return store.get(KEY)
    except KeyError:
        return None
