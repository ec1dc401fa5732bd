"""Validation of user-chosen names that become parts of object keys."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from txlog.errors import ConfigError, InvalidNameError

# fullmatch, not match with "$": "$" also matches before a final newline.
_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_ID = re.compile(r"[A-Za-z0-9._:@+=-]{1,249}")


def validate_topic(name: str) -> str:
    """Kafka's rules: letters, digits, '.', '_', '-', at most 249 chars, not '.' or '..'."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidNameError(
            f"invalid topic name {name!r}: use 1-249 letters, digits, '.', '_' or '-' "
            "(no '/', no '..')"
        )
    if name.startswith("__") and name not in INTERNAL_TOPICS:
        raise InvalidNameError(f"topic names starting with '__' are reserved: {name!r}")
    return name


def is_topic_name(name: str) -> bool:
    """Whether ``name`` is one a topic may have (internal topics included)."""
    try:
        validate_topic(name)
    except InvalidNameError:
        return False
    return True


def validate_id(kind: str, value: str) -> str:
    """transactional.id, group.id, txnAppId: safe to embed in JSON and object keys."""
    if not isinstance(value, str) or not _ID.fullmatch(value) or value in (".", ".."):
        raise InvalidNameError(
            f"invalid {kind} {value!r}: use 1-249 letters, digits or . _ : @ + = - "
            "(no '/', spaces or '..')"
        )
    return value


CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
INTERNAL_TOPICS = frozenset({CONSUMER_OFFSETS_TOPIC})


# Azure URLs name container@account in the host part; no other backend has an '@' there.
_AZURE_SCHEMES = frozenset({"abfs", "abfss", "az"})


def validate_root_url(url: str) -> str:
    """Refuse a root URL that carries credentials (``s3://KEY:SECRET@bucket``): they would
    be taken as part of the bucket name and shown wherever the URL is.  The error never
    repeats them."""
    if not isinstance(url, str) or not url:
        raise ConfigError(f"a txlog root is a path or URL string, not {type(url).__name__}")
    if "://" not in url:
        return url  # a plain path: '@' and ':' are ordinary characters in file names
    scheme = url.partition("://")[0].lower()
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        raise ConfigError(f"the {scheme}:// root URL cannot be parsed; check its host "
                          "part") from None
    userinfo, at, host = netloc.rpartition("@")
    if at and (scheme not in _AZURE_SCHEMES or ":" in userinfo or "@" in userinfo):
        raise ConfigError(
            f"the {scheme}:// root URL carries credentials before '@' (shown here as "
            f"{scheme}://***@{host}); txlog does not take them from URLs: pass them in "
            "storage_options (e.g. key and secret) or the backend's environment variables")
    return url
