"""S3 requests through obstore (Rust's object_store crate), the fast path of the s3 backend.

A transaction is a chain of dependent conditional creates, so per-request overhead is its
cost, and obstore's is a fraction of s3fs's (docs/benchmarks.md).  delta-rs talks to S3
through the same crate.

s3fs stays for everything obstore does not cover here: storage options that have no
obstore equivalent (server-side encryption, requester pays, profiles, ...), AWS buckets
whose region is not configured (s3fs looks it up), and forked children.  obstore runs a
tokio runtime that does not survive ``fork()``: a child of a process that already made an
obstore request hangs on its first one, so such children use s3fs.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Any
from urllib.parse import urlsplit

# s3fs options that only tune s3fs's own caching or upload sizes: they change no request
# semantics, so obstore may serve a store that sets them.
_S3FS_TUNING = frozenset({
    "use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache",
    "default_block_size", "default_fill_cache", "default_cache_type", "max_concurrency",
    "fixed_upload_size", "cache_regions", "retries",
})
_CLIENT_KWARGS = frozenset({"endpoint_url", "region_name", "verify"})
# AWS_* variables that botocore and object_store read alike (or that only name where
# botocore finds its configuration).  obstore also reads every other AWS_* variable
# (AWS_ENDPOINT_URL, AWS_CONDITIONAL_PUT, ...), some with other meanings than botocore's:
# when one is set, s3fs serves the store, so that the environment means what it did.
_SHARED_ENV = frozenset({
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
    "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE", "AWS_SDK_LOAD_CONFIG", "AWS_PAGER",
    "AWS_DEFAULT_OUTPUT", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE",
})

#: The pid of the process whose obstore runtime has started (inherited by forked children).
_RUNTIME_PID: int | None = None

_STATUS = re.compile(r"status code: (\d{3})")


def usable_here() -> bool:
    """False in a forked child of a process that already made an obstore request."""
    return _RUNTIME_PID is None or os.getpid() == _RUNTIME_PID


def store_kwargs(options: dict[str, Any]) -> dict[str, Any] | None:
    """obstore ``S3Store`` arguments equivalent to these s3fs storage options, or None when
    some option has no equivalent (the store then uses s3fs)."""
    client_kwargs = dict(options.get("client_kwargs") or {})
    known = _S3FS_TUNING | {"key", "secret", "token", "anon", "endpoint_url", "client_kwargs",
                            "username", "password"}
    if set(options) - known or set(client_kwargs) - _CLIENT_KWARGS:
        return None
    key = options.get("key", options.get("username"))
    secret = options.get("secret", options.get("password"))
    endpoint = options.get("endpoint_url") or client_kwargs.get("endpoint_url")
    env = {v for v in os.environ if v.startswith("AWS_")}
    if str(endpoint or "").startswith("http://"):
        env.discard("AWS_CA_BUNDLE")  # certificates play no part in plain HTTP
    if env - _SHARED_ENV:
        return None
    if "AWS_SESSION_TOKEN" in env and key is not None and not options.get("token"):
        return None  # obstore would send the environment's token with the given key
    region = (client_kwargs.get("region_name") or os.environ.get("AWS_REGION")
              or os.environ.get("AWS_DEFAULT_REGION"))
    if not endpoint and not region:
        return None  # an AWS bucket in a region only s3fs would look up
    kwargs: dict[str, Any] = {"region": region or "us-east-1"}
    client: dict[str, Any] = {}
    if endpoint:
        kwargs["endpoint"] = str(endpoint).rstrip("/")
        kwargs["virtual_hosted_style_request"] = False
        if str(endpoint).startswith("http://"):
            client["allow_http"] = True
    verify = client_kwargs.get("verify", True)
    if verify is False:
        client["allow_invalid_certificates"] = True
    elif isinstance(verify, str):
        return None  # a CA bundle path: leave certificate handling to botocore
    if options.get("anon"):
        kwargs["skip_signature"] = True
    elif key is not None or secret is not None:
        if key is None or secret is None:
            return None
        kwargs["access_key_id"] = str(key)
        kwargs["secret_access_key"] = str(secret)
        if options.get("token"):
            kwargs["token"] = str(options["token"])
    else:
        kwargs["credential_provider"] = _BotocoreCredentials()
    if client:
        kwargs["client_options"] = client
    kwargs["unsigned_payload"] = payload_needs_no_signature(endpoint)
    return kwargs


def payload_needs_no_signature(endpoint: str | None) -> bool:
    """Whether requests may say UNSIGNED-PAYLOAD instead of the body's SHA-256.

    The AWS SDKs sign payloads only over plain HTTP, where the signature is what protects
    the body on the network; over HTTPS, TLS does.  A loopback endpoint never crosses a
    network either.  Skipping the hash saves a SHA-256 pass over every body on the client
    and another on the server (which checks it), on the path of every transaction."""
    if not endpoint:
        return True  # AWS's own endpoints, over HTTPS
    url = urlsplit(str(endpoint))
    if url.scheme == "https":
        return True
    host = (url.hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: it may resolve anywhere


class _BotocoreCredentials:
    """Credentials from botocore's chain (environment, profiles, SSO, instance roles), the
    same ones s3fs would use; obstore calls this again when they expire."""

    def __call__(self) -> dict[str, Any]:
        import botocore.session

        creds = botocore.session.get_session().get_credentials()
        if creds is None:
            from txlog.errors import ConfigError

            raise ConfigError("no AWS credentials found: set key/secret storage options, "
                              "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or a profile")
        frozen = creds.get_frozen_credentials()
        expiry = getattr(creds, "_expiry_time", None)
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token, "expires_at": expiry}


def _request(fn: Any) -> Any:
    """Marks this process's obstore runtime as started (see usable_here), and turns
    obstore's own NotFoundError, which some requests raise instead of FileNotFoundError,
    into FileNotFoundError."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from obstore.exceptions import NotFoundError

        global _RUNTIME_PID
        _RUNTIME_PID = os.getpid()
        try:
            return fn(*args, **kwargs)
        except NotFoundError as exc:
            raise FileNotFoundError(str(exc)) from exc

    return wrapper


class ObstoreS3:
    """The requests of :class:`txlog.storage.remote.RemoteStore` on one bucket.  Keys are
    full keys inside the bucket; errors are obstore's, for the caller to classify."""

    def __init__(self, bucket: str, kwargs: dict[str, Any]) -> None:
        import obstore
        from obstore.store import S3Store

        self._ob = obstore
        self._store = S3Store(bucket, **kwargs)

    @_request
    def create(self, key: str, data: bytes) -> None:
        # One PUT with If-None-Match: *; a multipart upload has no create-only mode.
        self._ob.put(self._store, key, data, mode="create", use_multipart=False)

    @_request
    def put(self, key: str, data: bytes) -> None:
        self._ob.put(self._store, key, data)

    @_request
    def get(self, key: str) -> bytes:
        return bytes(self._ob.get(self._store, key).bytes())

    @_request
    def get_range(self, key: str, start: int, end: int) -> bytes:
        return bytes(self._ob.get_range(self._store, key, start=start, end=end))

    @_request
    def size(self, key: str) -> int:
        return int(self._ob.head(self._store, key)["size"])

    @_request
    def delete(self, key: str) -> None:
        self._ob.delete(self._store, key)

    @_request
    def list(self, folder: str, start_after: str | None, *,
             limit: int) -> list[tuple[str, int]] | None:
        """(key, size) of every object under ``folder`` ('' or a path without the trailing
        '/'), sorted by the server, after ``start_after`` (sent as StartAfter); None once
        the listing reaches ``limit`` keys (the rest is not fetched)."""
        try:
            stream = self._ob.list(self._store, folder or None, offset=start_after)
        except ValueError:
            # No valid key looks like this bound ('a//b'): list from the folder's start
            # (the caller filters by start_after itself).
            stream = self._ob.list(self._store, folder or None)
        out: list[tuple[str, int]] = []
        for batch in stream:
            out.extend((meta["path"], int(meta["size"])) for meta in batch)
            if len(out) >= limit:
                return None
        return out


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an obstore error reports, if any."""
    m = _STATUS.search(str(exc))
    return int(m.group(1)) if m else None


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, FileNotFoundError)


def create_outcome(exc: BaseException) -> str:
    """How a failed conditional create through obstore is settled: one of 'lost',
    'conflict', 'ambiguous', 'unsupported', 'fatal' (see create_outcome.py)."""
    from obstore import exceptions as ox

    status = http_status(exc)
    if status == 409:
        # object_store reports a 409 ConditionalRequestConflict as AlreadyExistsError,
        # but the write was not applied and nothing may exist: retry it.
        return "conflict"
    if isinstance(exc, (ox.AlreadyExistsError, ox.PreconditionError)):
        return "lost"
    if isinstance(exc, (ox.NotSupportedError, NotImplementedError)):
        return "unsupported"
    if isinstance(exc, (ox.PermissionDeniedError, ox.UnauthenticatedError,
                        ox.InvalidPathError, FileNotFoundError)):
        return "fatal"
    if status == 412:
        return "lost"
    if status == 501:
        return "unsupported"
    if status is not None and (300 <= status < 400 or (400 <= status < 500 and status != 408)):
        return "fatal"  # a redirect means a wrong region or endpoint; no retry mends it
    text = str(exc).lower()
    if "builder error" in text or "redirect" in text:
        return "fatal"  # the client could not even send the request
    # 5xx, timeouts, dropped connections, retries exhausted: it may have landed.
    return "ambiguous"
