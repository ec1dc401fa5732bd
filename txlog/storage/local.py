"""Local-disk store.  Atomic create is a hard link of a fully written, fsynced temp file.

``fsync=False`` (storage option ``{"fsync": False}``) skips the fsyncs: creates stay
atomic and a killed process loses nothing (the page cache survives it), but a power loss
or kernel crash may lose the newest objects.  That is the durability of delta-rs's and
Kafka's defaults on one machine; the default here is to fsync.

fsspec's local ``mode="create"`` and ``open("xb")`` are not safe here: the first checks
then writes, the second makes a half-written file visible under the final name.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from txlog.errors import ObjectNotFoundError, StorageError
from txlog.storage.base import ObjectStore, check_key
from txlog.unique import unique

_TMP_PREFIX = ".tmp-"
_MAX_KNOWN_DIRS = 10_000
_Keys = list[str]  # the class's list() method shadows the builtin inside its body


class LocalStore(ObjectStore):
    backend = "local"

    def __init__(self, url: str, root: str, *, fsync: bool = True) -> None:
        super().__init__(url)
        self.root = os.path.abspath(root)
        self.fsync = fsync
        self._dirs: set[str] = set()  # directories known to exist
        os.makedirs(self.root, exist_ok=True)
        self._identity = "file://" + os.path.realpath(self.root)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "root": self.root, "fsync": self.fsync}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["root"],  # type: ignore[misc]
                      fsync=state.get("fsync", True))

    @property
    def identity(self) -> str:
        return self._identity

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    def _ensure_dir(self, directory: str) -> None:
        """Create ``directory`` and any missing parents; with fsync on, sync the parent
        of each one created so the new names survive a power loss with what is in them."""
        missing = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for m in reversed(missing):
            try:
                os.mkdir(m)
            except FileExistsError:
                pass
            if self.fsync:
                self._fsync_dir(os.path.dirname(m))
        if len(self._dirs) > _MAX_KNOWN_DIRS:
            self._dirs.clear()
        self._dirs.add(directory)

    def _write_temp(self, final: str, data: bytes) -> str:
        directory = os.path.dirname(final)
        if directory not in self._dirs:  # one stat per directory, not per write
            self._ensure_dir(directory)
        tmp = os.path.join(directory, f"{_TMP_PREFIX}{unique()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:  # deleted since we saw it (a topic or staging sweep)
            self._dirs.discard(directory)
            self._ensure_dir(directory)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    @staticmethod
    def _fsync_dir(directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        final = self._path(key)
        tmp = self._write_temp(final, data)
        try:
            os.link(tmp, final)
        except FileExistsError:
            won = False
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise StorageError(
                    f"the local filesystem under {self.root} does not support hard links, "
                    "which txlog needs for atomic create; use a local disk (ext4, xfs, apfs)"
                ) from exc
            raise
        else:
            won = True
        finally:
            os.unlink(tmp)
        self.counter.add("put_if_absent", len(data))
        if won and self.fsync:
            self._fsync_dir(os.path.dirname(final))
        return won

    def put(self, key: str, data: bytes) -> None:
        final = self._path(key)
        tmp = self._write_temp(final, data)
        os.replace(tmp, final)
        self.counter.add("put", len(data))
        if self.fsync:
            # The rename must be durable before anything refers to the object: a log entry
            # that survives a power loss must not name a batch object that did not.
            self._fsync_dir(os.path.dirname(final))

    def get(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ObjectNotFoundError(f"object {key!r} not found in {self.url}") from None
        self.counter.add("get", len(data))
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                data = f.read(max(0, end - start))
        except FileNotFoundError:
            raise ObjectNotFoundError(f"object {key!r} not found in {self.url}") from None
        self.counter.add("get_range", len(data))
        return data

    def size(self, key: str) -> int:
        try:
            n = os.stat(self._path(key)).st_size
        except FileNotFoundError:
            raise ObjectNotFoundError(f"object {key!r} not found in {self.url}") from None
        self.counter.add("head")
        return n

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        self.counter.add("delete")

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        """Walk only the directories that can hold keys after ``start_after``.

        Log entries live in bucketed directories, so a tail listing skips whole
        directories of history instead of reading their names.
        """
        self.counter.add("list")
        # The directory holding the prefix, and the name filter inside it.
        if prefix and not prefix.endswith("/"):
            base_key, _, name_prefix = prefix.rpartition("/")
        else:
            base_key, name_prefix = prefix.rstrip("/"), ""
        base = os.path.join(self.root, *base_key.split("/")) if base_key else self.root
        out: list[str] = []
        self._walk(base, base_key, name_prefix, start_after, out)
        out.sort()
        return out

    def _walk(
        self, directory: str, dir_key: str, name_prefix: str, start_after: str | None,
        out: _Keys,
    ) -> None:
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            name = entry.name
            if name.startswith(".") or not name.startswith(name_prefix):
                continue
            key = f"{dir_key}/{name}" if dir_key else name
            if entry.is_dir(follow_symlinks=False):
                # Prune a subtree whose every key sorts at or before start_after.
                if start_after is not None and key + "/" < start_after \
                        and not start_after.startswith(key + "/"):
                    continue
                self._walk(entry.path, key, "", start_after, out)
            elif start_after is None or key > start_after:
                out.append(key)

    def full_path(self, key: str) -> str:
        return "file://" + self._path(key)

    def fsspec(self) -> Any:
        import fsspec

        return fsspec.filesystem("file")

    def fs_path(self, key: str) -> str:
        return self._path(key)
