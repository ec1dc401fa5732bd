"""Where a remote store is and how its clients are built: the bucket, key prefix and
endpoint a URL names, the fsspec options made from the storage options, one shared
aiobotocore session per process, and the choice between obstore and fsspec for S3."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from txlog.errors import AtomicCreateUnsupportedError, ConfigError, StorageError
from txlog.storage import obstore_s3

#: fsspec protocol for each backend.
PROTOCOLS = {"s3": "s3", "gcs": "gcs", "azure": "abfs"}
_INSTALL_HINT = {"s3": "s3fs", "gcs": "gcsfs", "azure": "adlfs"}
#: The storage option that skips the atomic-create check (the escape hatch).
PROBE_OPTION = "txlog_probe_atomic_create"

# s3fs options that do not reach the botocore session: when only these are given, every
# store of a process shares one AioSession (its parsed service models make new clients
# cheap; Spark builds a store per task).
_S3_CLIENT_OPTIONS = frozenset({
    "anon", "endpoint_url", "key", "secret", "token", "use_ssl", "client_kwargs",
    "requester_pays", "default_block_size", "default_fill_cache", "default_cache_type",
    "version_aware", "config_kwargs", "username", "password", "cache_regions",
    "max_concurrency", "use_listings_cache", "listings_expiry_time", "max_paths",
    "skip_instance_cache", "s3_additional_kwargs", "fixed_upload_size", "retries",
})
_S3_SESSIONS: dict[int, Any] = {}


@dataclass(frozen=True)
class RemoteLocation:
    """What a store URL and its storage options name."""

    bucket: str
    #: Key prefix inside the bucket ("" or "some/path/").
    prefix: str
    #: ``bucket/path`` as fsspec names it.
    root: str
    #: ``scheme://netloc/path`` of the root, for full URLs of keys.
    url_prefix: str
    #: The endpoint or account, lower-cased ("" when none is set).
    endpoint: str
    #: The options the fsspec filesystem is built with.
    fs_options: dict[str, Any]
    #: Whether the atomic-create check is to run (the storage option PROBE_OPTION).
    probe: bool


def locate(url: str, backend: str, storage_options: dict[str, Any]) -> RemoteLocation:
    """The location ``url`` names on ``backend``; raises on a backend or URL txlog cannot
    use, or an invalid PROBE_OPTION."""
    if backend not in PROTOCOLS:
        raise AtomicCreateUnsupportedError(
            f"backend {backend!r} (from {url!r}) is not a remote backend txlog supports; "
            "use s3://, gs:// or abfs://"
        )
    parsed = urlparse(url)
    netloc, path = parsed.netloc, parsed.path.strip("/")
    bucket = netloc
    options = dict(storage_options)
    if backend == "azure" and "@" in netloc:
        # abfs://container@account.dfs.core.windows.net/path
        bucket, _, host = netloc.partition("@")
        options.setdefault("account_name", host.split(".")[0])
    if not bucket:
        raise ConfigError(f"store URL {url!r} names no bucket/container")
    client_kwargs = options.get("client_kwargs") or {}
    endpoint = (options.get("endpoint_url") or client_kwargs.get("endpoint_url")
                or options.get("account_url") or options.get("account_name") or "")
    options.pop("txlog_client", None)  # txlog's own; see pick_client
    probe = options.pop(PROBE_OPTION, True)
    if not isinstance(probe, bool):
        raise ConfigError(f"storage option {PROBE_OPTION!r} must be True or False, "
                          f"not {probe!r}")
    # Listings must always be fresh; never share an instance (or its event-loop-bound
    # session) with another store, thread pool or forked process.
    options.setdefault("use_listings_cache", False)
    options["skip_instance_cache"] = True
    return RemoteLocation(
        bucket=bucket, prefix=f"{path}/" if path else "",
        root=f"{bucket}/{path}" if path else bucket,
        url_prefix=f"{parsed.scheme}://{netloc}" + (f"/{path}" if path else ""),
        endpoint=str(endpoint).rstrip("/").lower(), fs_options=options, probe=probe)


def check_client_installed(backend: str) -> None:
    """Raise StorageError naming the package to install when fsspec cannot serve
    ``backend``."""
    try:
        import fsspec

        fsspec.get_filesystem_class(PROTOCOLS[backend])
    except (ImportError, ValueError) as exc:
        raise StorageError(
            f"the {backend} backend needs the {_INSTALL_HINT[backend]} package "
            f"(pip install 'txlog[{backend}]'): {exc}"
        ) from exc


def filesystem(backend: str, fs_options: dict[str, Any]) -> Any:
    """A new fsspec filesystem for ``backend``."""
    import fsspec

    options = dict(fs_options)
    if backend == "s3" and set(options) <= _S3_CLIENT_OPTIONS:
        options["session"] = _shared_s3_session()
    return fsspec.filesystem(PROTOCOLS[backend], **options)


def _shared_s3_session() -> Any:
    """One aiobotocore session per process (never inherited across fork)."""
    pid = os.getpid()
    session = _S3_SESSIONS.get(pid)
    if session is None:
        from aiobotocore.session import AioSession

        _S3_SESSIONS.clear()
        session = _S3_SESSIONS[pid] = AioSession()
    return session


def pick_client(url: str, backend: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """obstore's store arguments when obstore serves this store, else None (s3fs/gcsfs/
    adlfs).  The storage option ``txlog_client`` picks: "auto" (default: obstore for S3
    when it is installed and the options allow), "obstore" (an error if it cannot) or
    "s3fs"."""
    choice = options.get("txlog_client", "auto")
    if choice not in ("auto", "obstore", "s3fs"):
        raise ConfigError(f"storage option 'txlog_client' must be 'auto', 'obstore' or "
                          f"'s3fs', not {choice!r}")
    if choice == "s3fs" or backend != "s3":
        if choice == "obstore":
            raise ConfigError(f"storage option txlog_client='obstore' applies to s3:// "
                              f"stores only, not {url!r}")
        return None
    rest = {k: v for k, v in options.items() if k not in ("txlog_client", PROBE_OPTION)}
    kwargs = obstore_s3.store_kwargs(rest) if importlib.util.find_spec("obstore") else None
    if kwargs is None and choice == "obstore":
        raise ConfigError(
            f"storage option txlog_client='obstore' cannot serve {url!r}: "
            + ("obstore is not installed (pip install obstore)"
               if not importlib.util.find_spec("obstore") else
               "its storage options have no obstore equivalent, or no region is set "
               "(client_kwargs.region_name or AWS_REGION); use 'auto' or 's3fs'"))
    return kwargs
