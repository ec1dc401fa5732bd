"""The object-store contract that the whole of txlog rests on.

Only :meth:`ObjectStore.put_if_absent` must be atomic; everything else (plain put of a
uniquely named object, get, ranged get, ordered list, delete) needs no atomicity.
Keys are '/'-separated paths relative to the store's root and never start with '/' or '.'.
"""

from __future__ import annotations

import abc
import threading
from collections import Counter
from typing import Any

from txlog.errors import InvalidNameError


def check_key(key: str) -> str:
    """Reject keys that could escape the store root or collide with temp files."""
    if not key or key.startswith(("/", ".")) or "\\" in key or "\x00" in key:
        raise InvalidNameError(f"invalid object key {key!r}: keys are relative '/'-paths")
    for part in key.split("/"):
        if part in ("", ".", "..") or part.startswith("."):
            raise InvalidNameError(f"invalid object key {key!r}: empty, '.' or '..' segment")
    return key


class RequestCounter:
    """Thread-safe counts of object-store requests and bytes, by kind (for metrics/benches)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def add(self, kind: str, nbytes: int = 0) -> None:
        with self._lock:
            self.requests[kind] += 1
            if nbytes:
                self.bytes[kind] += nbytes

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": dict(self.requests), "bytes": dict(self.bytes)}

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.bytes.clear()

    def total(self) -> int:
        with self._lock:
            return sum(self.requests.values())


#: Names one level below a prefix (ObjectStore.list shadows the builtin in its class).
Names = list[str]


class ObjectStore(abc.ABC):
    """An object store rooted at ``url``.  Picklable: Spark ships it to worker processes."""

    #: The backend's name as users know it ("local", "memory", "s3", "gcs", "azure").
    backend: str = "abstract"
    #: Capabilities callers choose their strategy by (never by the backend's name).
    #: ``local_requests``: a request is a call on this machine (a disk, memory), not a
    #: network round trip, so spreading requests over threads does not pay.
    local_requests: bool = False
    #: ``local_files``: every object is a file on this machine, at :meth:`full_path`,
    #: that another engine (pyarrow, Spark) can open directly.
    local_files: bool = False
    #: ``writes_buffers``: :meth:`put_new` takes any bytes-like object (a memoryview of
    #: an Arrow buffer), so a batch object is written without a copy into bytes.
    writes_buffers: bool = False

    def __init__(self, url: str) -> None:
        self.url = url
        self.counter = RequestCounter()

    @property
    def identity(self) -> str:
        """The location, spelled the same however the URL was (in-process registries
        key on it: two Logs on one directory must meet each other's work)."""
        return self.url

    # -- the one atomic primitive ------------------------------------------------------

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` only if no object exists there, atomically.

        Returns True exactly when this call created the object.  Callers make ``data``
        unique per writer (txlog embeds a writer token), so that an ambiguous outcome (a
        retried request answered "already exists" although the first attempt won) can be
        settled by reading the object back and comparing bytes.
        """

    def check_atomic_create(self) -> None:
        """Before a process first writes to this root: raise AtomicCreateUnsupportedError
        if the backend's create-if-absent is not atomic (a remote store probes once per
        root and process, see atomic_check.py).  Nothing to check by default."""
        return None

    def probe_atomic_create(self) -> None:
        """Check that the backend really creates only-if-absent; raise if it does not.

        Raises AtomicCreateUnsupportedError when a server silently ignores the
        condition (e.g. an S3-compatible server ignoring ``If-None-Match``).  Backends
        whose create is atomic by construction (local, memory) need no probe.
        """
        return None

    # -- everything else needs no atomicity ------------------------------------------

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write ``key`` (overwriting).  Readers never see a partial object."""

    def put_new(self, key: str, data: bytes | memoryview) -> None:
        """Write a fresh, uniquely named object that nothing reads until a later write
        names it (a batch object before its log entry): complete once this returns, but
        a store may show part of it before, or leave part of it if the writer is killed.
        ``data`` is bytes unless the store declares ``writes_buffers``.  By default,
        :meth:`put`."""
        self.put(key, data if isinstance(data, bytes) else bytes(data))

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """Read a whole object; raise ObjectNotFoundError if it is missing."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Read bytes [start, end) of an object."""

    @abc.abstractmethod
    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        """All keys under ``prefix`` (recursively), sorted, strictly after ``start_after``."""

    def list_children(self, prefix: str) -> Names:
        """The names one level below ``prefix`` (which ends in '/'), sorted, once each:
        the next path component of every key under it.  This default lists every key;
        stores with a delimiter listing (a directory read, S3's ``Delimiter``) override
        it, so that finding the few used names under a prefix does not cost a listing of
        all their history."""
        n = len(prefix)
        return sorted({k[n:].split("/", 1)[0] for k in self.list(prefix)})

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key``; deleting a missing object is not an error."""

    @abc.abstractmethod
    def size(self, key: str) -> int:
        """Size in bytes of an object; raise ObjectNotFoundError if it is missing."""

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except KeyError:
            return False
        return True

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many were deleted."""
        keys = self.list(prefix)
        for k in keys:
            self.delete(k)
        return len(keys)

    # -- for readers that hand paths to other engines (pyarrow, Spark) -----------------

    @abc.abstractmethod
    def full_path(self, key: str) -> str:
        """The URL of ``key`` as another engine (Spark, pyarrow) would open it."""

    def fsspec(self) -> Any:
        """An fsspec filesystem over this store (paths from :meth:`fs_path`)."""
        raise NotImplementedError

    def fs_path(self, key: str) -> str:
        """The path of ``key`` inside :meth:`fsspec`'s filesystem."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
