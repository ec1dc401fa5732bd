"""Remote object stores (S3, GCS, Azure Blob) on their fsspec filesystems, and S3 also
through obstore (see obstore_s3.py for when each client serves).

The one atomic primitive, :meth:`RemoteStore.put_if_absent`, is a conditional create:
``fs.pipe_file(path, data, mode="create")``, which s3fs sends as ``If-None-Match: *``,
gcsfs as ``ifGenerationMatch=0`` and adlfs as ``If-None-Match: *``; obstore's
``put(mode="create")`` sends ``If-None-Match: *`` too.  There is never a fallback to
exists-then-write.

Outcomes of a conditional create and how they are settled:

* success: we created the object.
* "already exists" (``FileExistsError``; or, on SeaweedFS and other S3-compatible servers
  that answer 412 without a ``Condition`` element, s3fs's ``OSError(EINVAL, 'At least
  one of the pre-conditions you specified did not hold')``): *ambiguous*, because the
  client libraries retry a timed-out request on their own, and the retry is answered
  "already exists" when the first attempt had won.  Settled by reading the object back
  and comparing its bytes with ours.
* 409 ``ConditionalRequestConflict`` (a concurrent conditional write to the same key was
  in flight): our write was not applied; back off and retry.
* timeouts, dropped connections, 5xx: *ambiguous*, the request may or may not have been
  applied.  Settled by reading back: our bytes mean we won, other bytes mean we lost, no
  object means nothing landed, so the create is retried (a delayed duplicate of ours that
  lands later is itself conditional, so retrying is safe).

Settling by read-back needs every writer's payload for a key to be unique (txlog embeds a
writer token in every claimed object): two writers racing with identical bytes would both
be told they won.

Some S3-compatible servers ignore ``If-None-Match`` and overwrite: every writer would then
win its create.  So before a process first writes to a root (txlog.Log calls
:meth:`RemoteStore.check_atomic_create`), it probes the server: a second create of one
key must lose (:meth:`RemoteStore.probe_atomic_create`); a server that fails is refused
with AtomicCreateUnsupportedError.  A passing verdict is kept in a small object in the
root, one per endpoint (``_meta/atomic-create/``), so later processes read it instead of
probing.  The storage option ``txlog_probe_atomic_create: False`` skips the check, for a
server known to honour the condition where the probe cannot run.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import os
import random
import threading
import time
import uuid
from typing import Any
from urllib.parse import urlparse

from txlog import layout
from txlog.errors import (
    AtomicCreateUnsupportedError,
    ConfigError,
    ObjectNotFoundError,
    StorageError,
)
from txlog.storage import obstore_s3
from txlog.storage.base import ObjectStore, check_key

#: fsspec protocol for each backend.
_PROTOCOLS = {"s3": "s3", "gcs": "gcs", "azure": "abfs"}
_INSTALL_HINT = {"s3": "s3fs", "gcs": "gcsfs", "azure": "adlfs"}

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
_Keys = list[str]  # RemoteStore.list shadows the builtin inside the class body


def _shared_s3_session() -> Any:
    """One aiobotocore session per process (never inherited across fork)."""
    pid = os.getpid()
    session = _S3_SESSIONS.get(pid)
    if session is None:
        from aiobotocore.session import AioSession

        _S3_SESSIONS.clear()
        session = _S3_SESSIONS[pid] = AioSession()
    return session


#: The storage option that skips the atomic-create check (the escape hatch).
PROBE_OPTION = "txlog_probe_atomic_create"
#: Where a root keeps the verdicts of the check, one object per endpoint.
VERDICT_PREFIX = layout.ATOMIC_CREATE_VERDICT_PREFIX
# Verdicts of this process by store identity: "" passed, else the refusal's message.
_VERDICTS: dict[str, str] = {}
_VERDICT_LOCK = threading.Lock()

# Outcome classes of a failed conditional create.
_LOST = "lost"            # the server says an object exists (maybe ours, from a retry)
_CONFLICT = "conflict"    # 409: concurrent conditional write in flight; ours not applied
_AMBIGUOUS = "ambiguous"  # may or may not have been applied
_UNSUPPORTED = "unsupported"
_FATAL = "fatal"


def _client_error_info(exc: BaseException) -> tuple[str, int | None]:
    """(error code, HTTP status) of the botocore ClientError behind ``exc``, if any."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", "") or "")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return code, int(status) if status is not None else None
        # azure.core HttpResponseError and gcsfs HttpError carry a status directly.
        for attr in ("status_code", "status", "code"):
            value = getattr(cur, attr, None)
            if isinstance(value, int) and 100 <= value < 600:
                return "", value
        cur = cur.__cause__ or cur.__context__
    return "", None


def _is_network_error(exc: BaseException) -> bool:
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    try:
        from botocore.exceptions import HTTPClientError, ResponseParserError

        if isinstance(exc, (HTTPClientError, ResponseParserError)):
            return True
    except ImportError:  # pragma: no cover - botocore comes with s3fs
        pass
    try:
        import aiohttp

        if isinstance(exc, aiohttp.ClientError):
            return True
    except ImportError:  # pragma: no cover
        pass
    try:
        from fsspec.exceptions import FSTimeoutError

        if isinstance(exc, FSTimeoutError):
            return True
    except ImportError:  # pragma: no cover
        pass
    return False


def classify_create_error(exc: BaseException) -> str:
    """How a failed conditional create is settled (see the module docstring)."""
    if isinstance(exc, FileExistsError):
        return _LOST
    code, status = _client_error_info(exc)
    if code == "PreconditionFailed" or status == 412:
        return _LOST
    if code == "ConditionalRequestConflict" or status == 409:
        return _CONFLICT
    if code == "NotImplemented" or status == 501:
        return _UNSUPPORTED
    if code in ("InternalError", "SlowDown", "ServiceUnavailable", "RequestTimeout") or (
        status is not None and (status >= 500 or status == 408)
    ):
        return _AMBIGUOUS
    if _is_network_error(exc):
        return _AMBIGUOUS
    if isinstance(exc, (PermissionError, FileNotFoundError, IsADirectoryError)):
        return _FATAL
    if isinstance(exc, OSError):
        message = str(exc).lower().replace("-", "")
        if exc.errno == errno.EINVAL and "precondition" in message:
            return _LOST
        if "conditionalrequestconflict" in message.replace(" ", ""):
            return _CONFLICT
        if exc.errno == errno.ENOSYS:
            return _UNSUPPORTED
        if status is not None and 400 <= status < 500:
            return _FATAL
        # Unknown I/O trouble: it may have been applied; settle by reading back.
        return _AMBIGUOUS
    return _FATAL


class RemoteStore(ObjectStore):
    """An object store on S3, GCS or Azure Blob, rooted at ``bucket/path`` from the URL.

    ``storage_options`` go to the fsspec filesystem unchanged (for S3, e.g. ``key``,
    ``secret``, ``client_kwargs={"endpoint_url": ...}``).  Picklable: only the url,
    backend and options travel; the filesystem is rebuilt lazily in the receiving process.
    """

    #: Attempts of a conditional create before giving up (each ambiguous or 409 outcome
    #: costs one), and the backoff between them (seconds, doubled each time, jittered).
    retry_attempts = 10
    retry_base_delay = 0.05
    retry_max_delay = 2.0
    #: How long a call retries a server it cannot connect to (txlog's configuration
    #: socket.connection.setup.timeout.ms sets it; a Log rebuilt from a pickle sets it
    #: again): a mistyped endpoint or a server that is down fails in seconds, not after
    #: every attempt's own retries.
    connect_timeout_s = 10.0

    @property
    def identity(self) -> str:
        """The URL plus the endpoint or account when one is set: two S3-compatible servers
        can each hold a bucket of the same name."""
        return self._url_prefix + (f" at {self._endpoint}" if self._endpoint else "")

    def __init__(self, url: str, backend: str, storage_options: dict[str, Any]) -> None:
        super().__init__(url)
        if backend not in _PROTOCOLS:
            raise AtomicCreateUnsupportedError(
                f"backend {backend!r} (from {url!r}) is not a remote backend txlog supports; "
                "use s3://, gs:// or abfs://"
            )
        self.backend = backend
        self.storage_options = dict(storage_options)
        parsed = urlparse(url)
        self._scheme = parsed.scheme
        netloc, path = parsed.netloc, parsed.path.strip("/")
        bucket = netloc
        options = dict(self.storage_options)
        if backend == "azure" and "@" in netloc:
            # abfs://container@account.dfs.core.windows.net/path
            bucket, _, host = netloc.partition("@")
            options.setdefault("account_name", host.split(".")[0])
        if not bucket:
            raise ConfigError(f"store URL {url!r} names no bucket/container")
        self._url_prefix = f"{parsed.scheme}://{netloc}" + (f"/{path}" if path else "")
        client_kwargs = options.get("client_kwargs") or {}
        endpoint = (options.get("endpoint_url") or client_kwargs.get("endpoint_url")
                    or options.get("account_url") or options.get("account_name") or "")
        self._endpoint = str(endpoint).rstrip("/").lower()
        self.bucket = bucket
        #: Key prefix inside the bucket ("" or "some/path/").
        self.prefix = f"{path}/" if path else ""
        self.root = f"{bucket}/{path}" if path else bucket
        options.pop("txlog_client", None)  # txlog's own; see _pick_client
        probe = options.pop(PROBE_OPTION, True)
        if not isinstance(probe, bool):
            raise ConfigError(f"storage option {PROBE_OPTION!r} must be True or False, "
                              f"not {probe!r}")
        #: False once this store's root is known to refuse a second create (or the
        #: storage options say not to check).
        self._probe_pending = probe
        # Listings must always be fresh; never share an instance (or its event-loop-bound
        # session) with another store, thread pool or forked process.
        options.setdefault("use_listings_cache", False)
        options["skip_instance_cache"] = True
        self._fs_options = options
        self._fs: Any = None
        self._fs_pid: int | None = None
        self._ob: obstore_s3.ObstoreS3 | None = None
        self._ob_pid: int | None = None
        self._ob_kwargs = _pick_client(url, backend, self.storage_options)
        self._rng = random.Random()
        try:
            import fsspec

            fsspec.get_filesystem_class(_PROTOCOLS[backend])
        except (ImportError, ValueError) as exc:
            raise StorageError(
                f"the {backend} backend needs the {_INSTALL_HINT[backend]} package "
                f"(pip install 'txlog[{backend}]'): {exc}"
            ) from exc

    # -- pickling: Spark ships stores to worker processes ------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "backend": self.backend,
                "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["backend"], state["storage_options"])  # type: ignore[misc]

    # -- the filesystem ----------------------------------------------------------------

    def fsspec(self) -> Any:
        """The fsspec filesystem, built on first use (and again in a forked child)."""
        if self._fs is None or self._fs_pid != os.getpid():
            import fsspec

            options = dict(self._fs_options)
            if self.backend == "s3" and set(options) <= _S3_CLIENT_OPTIONS:
                options["session"] = _shared_s3_session()
            self._fs = fsspec.filesystem(_PROTOCOLS[self.backend], **options)
            self._fs_pid = os.getpid()
        return self._fs

    def fast(self) -> obstore_s3.ObstoreS3 | None:
        """obstore's client for this S3 store, or None where s3fs serves it (see
        obstore_s3's docstring for when)."""
        if self._ob_kwargs is None or not obstore_s3.usable_here():
            return None
        if self._ob is None or self._ob_pid != os.getpid():
            self._ob = obstore_s3.ObstoreS3(self.bucket, self._ob_kwargs)
            self._ob_pid = os.getpid()
        return self._ob

    def fs_path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def full_path(self, key: str) -> str:
        return f"{self._url_prefix}/{check_key(key)}"

    def _where(self, key: str) -> str:
        return f"{key!r} in {self.url}"

    def _fail(self, op: str, key: str, exc: BaseException) -> StorageError:
        return StorageError(f"{op} of {self._where(key)} failed: {exc!r}")

    def _backoff(self, attempt: int) -> None:
        delay = min(self.retry_max_delay, self.retry_base_delay * (2 ** (attempt - 1)))
        time.sleep(delay * self._rng.uniform(0.5, 1.0))

    # -- the one atomic primitive ------------------------------------------------------

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Conditional create, every doubtful outcome settled by reading back.

        Returns True exactly when the object at ``key`` holds ``data`` because of this
        call.  Callers must make ``data`` unique per writer (see the module docstring).
        """
        return self._put_if_absent(key, data)

    def _put_if_absent(self, key: str, data: bytes) -> bool:
        path = self.fs_path(key)
        data = bytes(data)
        fast = self.fast()
        fs: Any = None if fast is not None else self.fsspec()
        last: BaseException | None = None
        deadline = time.monotonic() + self.connect_timeout_s
        for attempt in range(1, self.retry_attempts + 1):
            self.counter.add("put_if_absent", len(data))
            try:
                if fast is not None:
                    fast.create(self.prefix + key, data)
                else:
                    fs.pipe_file(path, data, mode="create")
            except Exception as exc:
                last = exc
                kind = _outcome(exc, fast)
                self._check_reachable(exc, deadline)
            else:
                return True
            if kind == _UNSUPPORTED:
                raise AtomicCreateUnsupportedError(
                    f"backend {self.backend!r} at {self.url} refused a conditional create "
                    f"(If-None-Match / ifGenerationMatch): {last!r}; txlog needs an atomic "
                    "create-if-absent and will not fall back to check-then-write"
                ) from last
            if kind == _FATAL:
                raise self._fail("conditional create", key, last) from last
            if kind == _CONFLICT:
                self._backoff(attempt)
                continue
            current = self._read_back(key, path, deadline)
            if current is not None:
                return current == data
            if kind == _LOST:
                # The server saw an object there, and it has gone since: not ours.
                return False
            # Ambiguous and nothing there: our request did not land (yet).  A late
            # duplicate is conditional too, so a retry cannot clobber anything.
            self._backoff(attempt)
        raise StorageError(
            f"could not settle a conditional create of {self._where(key)} after "
            f"{self.retry_attempts} attempts; last error: {last!r}"
        ) from last

    def _check_reachable(self, exc: BaseException, deadline: float) -> None:
        """Give up once the server could not be reached for connect_timeout_s."""
        if time.monotonic() >= deadline and _unreachable(exc):
            raise StorageError(
                f"cannot connect to the {self.backend} store {self.identity}: no connection "
                f"for {self.connect_timeout_s:g} s ({' '.join(repr(exc).split())[:300]}); "
                "check the URL, the endpoint and that the server is up (the limit is "
                "socket.connection.setup.timeout.ms)") from exc

    def _read_back(self, key: str, path: str, deadline: float) -> bytes | None:
        """The object's bytes, or None if absent; retries transient read errors."""
        fast = self.fast()
        fs: Any = None if fast is not None else self.fsspec()
        last: BaseException | None = None
        for attempt in range(1, self.retry_attempts + 1):
            try:
                data: bytes = fast.get(self.prefix + key) if fast is not None \
                    else fs.cat_file(path)
            except FileNotFoundError:
                self.counter.add("get")
                return None
            except Exception as exc:
                self.counter.add("get")
                last = exc
                if _outcome(exc, fast) in (_FATAL, _UNSUPPORTED):
                    break
                self._check_reachable(exc, deadline)
                self._backoff(attempt)
                continue
            self.counter.add("get", len(data))
            return data
        raise StorageError(
            f"could not read back {self._where(key)} to settle a conditional create: "
            f"{last!r}"
        ) from last

    # -- everything else needs no atomicity ------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        path = self.fs_path(key)
        self.counter.add("put", len(data))
        fast = self.fast()
        try:
            if fast is not None:
                fast.put(self.prefix + key, bytes(data))
            else:
                self.fsspec().pipe_file(path, bytes(data))
        except Exception as exc:
            raise self._fail("put", key, exc) from exc

    def get(self, key: str) -> bytes:
        path = self.fs_path(key)
        fast = self.fast()
        try:
            data: bytes = fast.get(self.prefix + key) if fast is not None \
                else self.fsspec().cat_file(path)
        except FileNotFoundError:
            self.counter.add("get")
            raise ObjectNotFoundError(f"object {self._where(key)} not found") from None
        except Exception as exc:
            self.counter.add("get")
            # (the client retried already: an unreachable server is said as such)
            self._check_reachable(exc, deadline=0.0)
            raise self._fail("get", key, exc) from exc
        self.counter.add("get", len(data))
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < 0:
            raise ValueError(f"get_range needs non-negative offsets, got [{start}, {end})")
        if end <= start:
            # An inverted HTTP Range is ignored by servers (whole object back).
            self.size(key)
            return b""
        path = self.fs_path(key)
        fast = self.fast()
        try:
            data: bytes = fast.get_range(self.prefix + key, start, end) if fast is not None \
                else self.fsspec().cat_file(path, start=start, end=end)
        except FileNotFoundError:
            self.counter.add("get_range")
            raise ObjectNotFoundError(f"object {self._where(key)} not found") from None
        except Exception as exc:
            self.counter.add("get_range")
            code, status = _client_error_info(exc)
            status = status or obstore_s3.http_status(exc)
            text = str(exc).lower()
            if status == 416 or code == "InvalidRange" or "invalidrange" in text \
                    or "range is not satisfiable" in text:
                self.size(key)  # raises if missing; else the range starts past the end
                return b""
            raise self._fail("ranged get", key, exc) from exc
        self.counter.add("get_range", len(data))
        return data

    def size(self, key: str) -> int:
        path = self.fs_path(key)
        self.counter.add("head")
        fast = self.fast()
        if fast is not None:
            try:
                return int(fast.size(self.prefix + key))
            except FileNotFoundError:
                raise ObjectNotFoundError(f"object {self._where(key)} not found") from None
            except Exception as exc:
                raise self._fail("size", key, exc) from exc
        fs = self.fsspec()
        try:
            if self.backend == "s3":
                # One HEAD; s3fs's info() would list the "directory" on a miss.
                out = fs.call_s3("head_object", Bucket=self.bucket, Key=self.prefix + key)
                return int(out["ContentLength"])
            info = fs.info(path)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"object {self._where(key)} not found") from None
        except Exception as exc:
            raise self._fail("size", key, exc) from exc
        if info.get("type") != "file":
            raise ObjectNotFoundError(f"object {self._where(key)} not found (a directory)")
        return int(info["size"])

    def delete(self, key: str) -> None:
        path = self.fs_path(key)
        self.counter.add("delete")
        fast = self.fast()
        try:
            if fast is not None:
                fast.delete(self.prefix + key)
            else:
                self.fsspec().rm_file(path)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._fail("delete", key, exc) from exc

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        if not _viable_prefix(prefix):
            # No valid key starts with it ('/', 'a//', 'a/.'); servers would normalise
            # such a prefix into a different one.
            self.counter.add("list")
            return []
        if self.backend == "s3":
            keys = self._list_s3(prefix, start_after)
        else:
            keys = self._list_find(prefix, start_after)
        keys = [k for k in keys if _is_listable(k)]
        keys.sort()
        return keys

    def _list_s3(self, prefix: str, start_after: str | None) -> _Keys:
        """ListObjectsV2 with StartAfter: a tail listing skips history server-side."""
        fs = self.fsspec()
        full_prefix = self.prefix + prefix
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix}
        if start_after is not None:
            full_after = self.prefix + start_after
            if not full_after.startswith(full_prefix) and full_after > full_prefix:
                self.counter.add("list")  # nothing under the prefix sorts after it
                return []
            server_after = server_start_after(full_prefix, full_after)
            if server_after:
                kwargs["StartAfter"] = server_after
        n = len(self.prefix)
        out: _Keys = []
        fast = self.fast()
        if fast is not None:
            found = self._list_obstore(fast, prefix, full_prefix, kwargs.get("StartAfter"))
            if found is not None:
                return [k[n:] for k in found if start_after is None or k[n:] > start_after]
        while True:
            self.counter.add("list")
            try:
                page = fs.call_s3("list_objects_v2", **kwargs)
            except Exception as exc:
                raise self._fail("list", prefix, exc) from exc
            for obj in page.get("Contents", ()):
                k = obj["Key"][n:]
                if start_after is None or k > start_after:
                    out.append(k)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return out
            kwargs.pop("StartAfter", None)
            kwargs["ContinuationToken"] = token

    def _list_obstore(self, fast: obstore_s3.ObstoreS3, prefix: str, full_prefix: str,
                      after: str | None) -> _Keys | None:
        """Full keys under ``full_prefix`` through obstore, or None where only s3fs can
        answer exactly (the caller then lists through s3fs)."""
        from obstore.exceptions import InvalidPathError

        # obstore drops a trailing '/', which could leave a bare directory name (the
        # SeaweedFS trap of server_start_after): cut further until none is left.
        while after and after.endswith("/"):
            after = after.rstrip("/")[:-1]
        self.counter.add("list")
        try:
            # obstore lists whole folders: list the prefix's folder, keep what matches.
            found = fast.list(full_prefix.rpartition("/")[0], after or None)
        except InvalidPathError:
            return None  # a foreign key obstore cannot represent (e.g. a control char)
        except Exception as exc:
            raise self._fail("list", prefix, exc) from exc
        if any(size == 0 for _, size in found):
            # A folder marker ('a/b/', zero bytes) comes back from obstore as 'a/b',
            # indistinguishable from an empty object; txlog writes no empty objects.
            return None
        return [k for k, _ in found if k.startswith(full_prefix)]

    def _list_find(self, prefix: str, start_after: str | None) -> _Keys:
        fs = self.fsspec()
        base_key = prefix.rpartition("/")[0]
        base = f"{self.root}/{base_key}" if base_key else self.root
        self.counter.add("list")
        try:
            found = fs.find(base)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._fail("list", prefix, exc) from exc
        root = self.root + "/"
        out = []
        for p in found:
            p = p.split("://", 1)[-1]
            if not p.startswith(root):
                continue
            k = p[len(root):]
            if k.startswith(prefix) and (start_after is None or k > start_after):
                out.append(k)
        return out

    # -- configuration check ---------------------------------------------------------

    def _verdict_key(self) -> str:
        # One per endpoint: a proxy in front of the same bucket may behave otherwise.
        return f"{VERDICT_PREFIX}{hashlib.sha256(self.identity.encode()).hexdigest()[:32]}.json"

    def check_atomic_create(self) -> None:
        """Once per root and process: the stored verdict, else the probe (whose passing
        verdict is then stored); raises AtomicCreateUnsupportedError if it failed."""
        if not self._probe_pending:
            return
        with _VERDICT_LOCK:
            known = _VERDICTS.get(self.identity)
            if known is None:
                known = self._stored_verdict()
                if known is None:
                    try:
                        self.probe_atomic_create()
                    except AtomicCreateUnsupportedError as exc:
                        _VERDICTS[self.identity] = str(exc)
                        raise
                    known = ""
                    body = {"v": 1, "verdict": "atomic", "checked_ms": int(time.time() * 1000),
                            "endpoint": self._endpoint}
                    try:
                        self.put(self._verdict_key(), json.dumps(body).encode())
                    except StorageError:
                        pass  # (read-only elsewhere: the next process probes again)
                _VERDICTS[self.identity] = known
        if known:
            raise AtomicCreateUnsupportedError(known)
        self._probe_pending = False

    def _stored_verdict(self) -> str | None:
        """"" when the root holds a passing verdict for this endpoint, else None."""
        try:
            d = json.loads(self.get(self._verdict_key()))
        except (KeyError, ValueError, UnicodeDecodeError):
            return None
        ok = isinstance(d, dict) and d.get("v") == 1 and d.get("verdict") == "atomic"
        return "" if ok else None

    def probe_atomic_create(self) -> None:
        """Create a probe object twice; refuse a server where the second create also wins.

        Some S3-compatible servers silently ignore ``If-None-Match``; on those every
        writer would "win" and txlog's guarantees would be void.
        """
        key = f"_probe/{uuid.uuid4().hex}"
        first = f"txlog atomic-create probe {key} writer 1".encode()
        second = f"txlog atomic-create probe {key} writer 2".encode()
        try:
            if not self._put_if_absent(key, first):
                raise AtomicCreateUnsupportedError(
                    f"backend {self.backend!r} at {self.url}: a conditional create of the "
                    f"fresh probe key {key!r} did not succeed"
                )
            if self._put_if_absent(key, second):
                raise AtomicCreateUnsupportedError(
                    f"backend {self.backend!r} at {self.url} ignores conditional creates "
                    "(If-None-Match: *): a second create of the same key also succeeded. "
                    "txlog needs an atomic create-if-absent; use a server that supports it "
                    f"(storage option {PROBE_OPTION}=False skips this check, for a server "
                    "known to honour the condition that this probe misjudges)"
                )
        finally:
            try:
                self.delete(key)
            except StorageError:
                pass


_UNREACHABLE_TYPES = ("EndpointConnectionError", "ConnectTimeoutError", "ConnectTimeout",
                      "ClientConnectorError", "ServerTimeoutError", "NewConnectionError")
_UNREACHABLE_TEXT = ("connection refused", "error sending request", "tcp connect error",
                     "dns error", "failed to lookup address", "could not connect",
                     "name or service not known", "connect timeout")


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it wraps) says the server could not be reached."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (ConnectionRefusedError, ConnectionAbortedError)) \
                or type(e).__name__ in _UNREACHABLE_TYPES:
            return True
        text = str(e).lower()
        if any(t in text for t in _UNREACHABLE_TEXT):
            return True
        e = e.__cause__ or e.__context__
    return False


def _outcome(exc: BaseException, fast: obstore_s3.ObstoreS3 | None) -> str:
    """How a failed conditional create is settled, by the client that raised it."""
    return obstore_s3.create_outcome(exc) if fast is not None else classify_create_error(exc)


def _pick_client(url: str, backend: str, options: dict[str, Any]) -> dict[str, Any] | None:
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


def server_start_after(prefix: str, start_after: str) -> str | None:
    """A StartAfter for ListObjectsV2 that filer-backed S3 servers also honour exactly.

    SeaweedFS stores objects in a directory tree and resumes a listing "after entry name
    X" in each directory, comparing a directory by its bare name ``d`` rather than as
    ``d/``.  So a StartAfter equal to a directory's path (``log/000000``), or one in
    which such a name is followed by a character sorting below ``/`` (``log-x`` when
    ``log/`` exists), silently skips that whole directory.  This returns a bound at or
    before ``start_after`` that cannot trigger it: the path is cut within the first
    component holding a character below ``/`` (or within the last component), one
    character before that point.  The caller filters ``key > start_after`` itself; the
    cost is a few extra entries (``.../00000000123`` for ``.../000000001234.json``).
    Returns None when no bound is needed.
    """
    base = prefix[: prefix.rfind("/") + 1]  # the deepest directory the prefix names
    if not start_after.startswith(base):
        # Either every key under the prefix sorts after start_after (no bound needed) or
        # none does (the caller checks that case).
        return None
    parts = start_after[len(base):].split("/")
    for i, part in enumerate(parts):
        below = next((j for j, ch in enumerate(part) if ch < "/"), None)
        if below is None and i < len(parts) - 1:
            continue  # a plain directory component: safe to resume inside it
        cut = len(part) if below is None else below
        bound = base + "".join(p + "/" for p in parts[:i]) + part[: max(cut - 1, 0)]
        return bound or None
    return None  # pragma: no cover - the loop always returns at the last part


def _viable_prefix(prefix: str) -> bool:
    """Whether some valid key starts with ``prefix`` (exactly when ``prefix + 'x'`` is one)."""
    if not prefix:
        return True
    try:
        check_key(prefix + "x")
    except ValueError:
        return False
    return True


def _is_listable(key: str) -> bool:
    """Skip directory markers and keys txlog could never have written."""
    if not key or key.endswith("/"):
        return False
    try:
        check_key(key)
    except ValueError:
        return False
    return True
