"""Validation of user-chosen names that become parts of object keys."""

from __future__ import annotations

import re

from txlog.errors import InvalidNameError

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_ID = re.compile(r"^[A-Za-z0-9._:@+=-]{1,249}$")


def validate_topic(name: str) -> str:
    """Kafka's rules: letters, digits, '.', '_', '-', at most 249 chars, not '.' or '..'."""
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise InvalidNameError(
            f"invalid topic name {name!r}: use 1-249 letters, digits, '.', '_' or '-' "
            "(no '/', no '..')"
        )
    if name.startswith("__") and name not in INTERNAL_TOPICS:
        raise InvalidNameError(f"topic names starting with '__' are reserved: {name!r}")
    return name


def validate_id(kind: str, value: str) -> str:
    """transactional.id, group.id, txnAppId: safe to embed in JSON and object keys."""
    if not isinstance(value, str) or not _ID.match(value) or value in (".", ".."):
        raise InvalidNameError(
            f"invalid {kind} {value!r}: use 1-249 letters, digits or . _ : @ + = - "
            "(no '/', spaces or '..')"
        )
    return value


CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
INTERNAL_TOPICS = frozenset({CONSUMER_OFFSETS_TOPIC})
