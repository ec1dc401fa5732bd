"""A store that wraps another and passes every request to it through one hook, the base
of the test stores that act on requests (fault injection, request timelines)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from txlog.storage.base import Names, ObjectStore

_T = TypeVar("_T")


class DelegatingStore(ObjectStore):
    """Wraps ``inner``: each request goes through :meth:`_call` with its kind and key;
    what is not a request (paths, the filesystem, the probe) goes straight to ``inner``.
    The store's capabilities and request counter are the inner store's."""

    #: The kind :meth:`size` is passed to :meth:`_call` as.
    size_kind = "size"

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner.url)
        self.inner = inner
        self.backend = inner.backend
        # Callers pick strategies (e.g. parallel reads) by the capabilities.
        self.local_requests = inner.local_requests
        self.local_files = inner.local_files
        self.writes_buffers = inner.writes_buffers
        self.counter = inner.counter

    def _call(self, kind: str, key: str, fn: Callable[..., _T], *args: Any) -> _T:
        """Make one request, ``fn(*args)``, of ``kind`` on ``key``."""
        return fn(*args)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return bool(self._call("put_if_absent", key, self.inner.put_if_absent, key, data))

    def probe_atomic_create(self) -> None:
        self.inner.probe_atomic_create()

    def put(self, key: str, data: bytes) -> None:
        self._call("put", key, self.inner.put, key, data)

    def put_new(self, key: str, data: bytes | memoryview) -> None:
        self._call("put", key, self.inner.put_new, key, data)

    def get(self, key: str) -> bytes:
        return bytes(self._call("get", key, self.inner.get, key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return bytes(self._call("get_range", key, self.inner.get_range, key, start, end))

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        return list(self._call("list", prefix, self.inner.list, prefix, start_after))

    def list_children(self, prefix: str) -> Names:
        return list(self._call("list", prefix, self.inner.list_children, prefix))

    def delete(self, key: str) -> None:
        self._call("delete", key, self.inner.delete, key)

    def size(self, key: str) -> int:
        return int(self._call(self.size_kind, key, self.inner.size, key))

    def full_path(self, key: str) -> str:
        return self.inner.full_path(key)

    def fsspec(self) -> Any:
        return self.inner.fsspec()

    def fs_path(self, key: str) -> str:
        return self.inner.fs_path(key)
