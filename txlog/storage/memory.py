"""In-memory store for tests, on fsspec's memory filesystem.

fsspec's memory ``open("xb")`` checks then creates, so a process-wide lock makes the
create atomic among threads.  The store is per process: a pickled copy in another process
sees that process's memory, so Spark tests use the local store instead.
"""

from __future__ import annotations

import threading
from typing import Any

from txlog.errors import ObjectNotFoundError
from txlog.storage.base import ObjectStore, check_key

_LOCK = threading.RLock()


class MemoryStore(ObjectStore):
    backend = "memory"
    local_requests = True

    def __init__(self, url: str, root: str) -> None:
        super().__init__(url)
        import fsspec

        self.root = "/" + root.strip("/")
        self._fs = fsspec.filesystem("memory")

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "root": self.root}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["root"])  # type: ignore[misc]

    def _path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        self.counter.add("put_if_absent", len(data))
        with _LOCK:
            try:
                with self._fs.open(path, "xb") as f:
                    f.write(data)
            except FileExistsError:
                return False
        return True

    def put(self, key: str, data: bytes) -> None:
        self.counter.add("put", len(data))
        with _LOCK:
            self._fs.pipe_file(self._path(key), data)

    def get(self, key: str) -> bytes:
        try:
            with _LOCK:
                data: bytes = self._fs.cat_file(self._path(key))
        except FileNotFoundError:
            raise ObjectNotFoundError(f"object {key!r} not found in {self.url}") from None
        self.counter.add("get", len(data))
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.get(key)[start:end]

    def size(self, key: str) -> int:
        self.counter.add("head")
        try:
            with _LOCK:
                return int(self._fs.size(self._path(key)))
        except FileNotFoundError:
            raise ObjectNotFoundError(f"object {key!r} not found in {self.url}") from None

    def delete(self, key: str) -> None:
        self.counter.add("delete")
        with _LOCK:
            try:
                self._fs.rm_file(self._path(key))
            except FileNotFoundError:
                pass

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        self.counter.add("list")
        base = self.root + "/"
        with _LOCK:
            keys = [p[len(base):] for p in self._fs.store if p.startswith(base + prefix)]
        keys.sort()
        if start_after is not None:
            keys = [k for k in keys if k > start_after]
        return keys

    def full_path(self, key: str) -> str:
        return "memory://" + self._path(key)

    def fsspec(self) -> Any:
        return self._fs

    def fs_path(self, key: str) -> str:
        return self._path(key)
