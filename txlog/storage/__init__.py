"""Object stores: ``open_store(url, storage_options)`` picks the backend from the URL."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

from txlog.errors import AtomicCreateUnsupportedError, ConfigError
from txlog.storage.base import ObjectStore, RequestCounter, check_key
from txlog.storage.local import LocalStore
from txlog.storage.memory import MemoryStore

__all__ = ["LocalStore", "MemoryStore", "ObjectStore", "RequestCounter", "check_key", "open_store"]

# Backends whose create-only-if-absent is atomic (docs/design.md, "The one atomic primitive").
REMOTE_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "abfs": "azure",
                  "abfss": "azure", "az": "azure"}


def open_store(url: str, storage_options: dict[str, Any] | None = None, *,
               create: bool = True, connect_timeout_ms: int | None = None) -> ObjectStore:
    """Open the store at ``url``: a plain path, file://, memory://, s3://, gs://, abfs://.

    ``create=False`` refuses a local root that does not exist instead of making its
    directory (commands that only read must not create a mistyped root).
    ``connect_timeout_ms`` bounds how long a remote store retries a server it cannot
    connect to.  Any other scheme is refused: txlog needs an atomic create-if-absent
    and will never fall back to check-then-write.
    """
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        path = parsed.path if scheme == "file" else url
        if scheme == "file" and parsed.netloc:
            path = "/" + parsed.netloc + parsed.path
        return LocalStore(url, os.path.abspath(os.path.expanduser(path)), create=create,
                          **_local_options(url, storage_options))
    if scheme == "memory":
        return MemoryStore(url, (parsed.netloc + parsed.path).strip("/") or "default")
    if scheme in REMOTE_SCHEMES:
        from txlog.storage.remote import RemoteStore

        store = RemoteStore(url, REMOTE_SCHEMES[scheme], dict(storage_options or {}))
        if connect_timeout_ms is not None:
            store.connect_timeout_s = connect_timeout_ms / 1000
        return store
    raise AtomicCreateUnsupportedError(
        f"backend {scheme!r} (from {url!r}) has no atomic create-if-absent that txlog can "
        "rely on; use a local path, s3://, gs://, abfs:// or memory:// (tests only)"
    )


def _local_options(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    opts = dict(storage_options or {})
    unknown = sorted(set(opts) - {"fsync"})
    if unknown:
        raise ConfigError(
            f"storage option(s) {', '.join(map(repr, unknown))} do not apply to the local "
            f"store at {url!r}; it takes only 'fsync' (default True)")
    if "fsync" in opts and not isinstance(opts["fsync"], bool):
        raise ConfigError(f"storage option 'fsync' must be True or False, not {opts['fsync']!r}")
    return opts
