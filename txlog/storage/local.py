"""Local-disk store.  Atomic create is a hard link of a fully written, fsynced temp file.

Writes go through an open descriptor of their directory (``openat``, ``linkat``,
``fsync`` of the directory): each system call gives up the GIL and, while another thread
runs Python, waits up to the 5 ms switch interval to get it back, so the calls a write
makes are most of its time under load.  Data is written with ``O_DSYNC`` instead of a
separate ``fsync``, for the same reason.

``fsync=False`` (storage option ``{"fsync": False}``) skips the fsyncs: creates stay
atomic and a killed process loses nothing (the page cache survives it), but a power loss
or kernel crash may lose the newest objects.  That is the durability of delta-rs's and
Kafka's defaults on one machine; the default here is to fsync.

fsspec's local ``mode="create"`` and ``open("xb")`` are not safe here: the first checks
then writes, the second makes a half-written file visible under the final name.

No open, create, delete or listing follows a symbolic link below the root (see
beneath.py): a link there raises LinkInRootError instead of sending txlog elsewhere.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from txlog.errors import ObjectNotFoundError, StorageError
from txlog.storage.base import Names, ObjectStore, check_key
from txlog.storage.beneath import open_beneath
from txlog.unique import unique

_TMP_PREFIX = ".tmp-"
_MAX_KNOWN_DIRS = 10_000
#: Directory descriptors a store keeps open (one per partition's data or log folder in
#: use); past it, the least recently used idle one is closed for each new one.
_MAX_DIR_FDS = 128
#: Relative opens, links and renames (POSIX): without them, the path-based calls below.
_AT = {os.open, os.link, os.unlink, os.rename} <= os.supports_dir_fd  # (os.replace: as rename)
_O_DSYNC = getattr(os, "O_DSYNC", 0)
_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_READ = os.O_RDONLY | _O_NOFOLLOW
_T = TypeVar("_T")
_Keys = list[str]  # the class's list() method shadows the builtin inside its body


class LocalStore(ObjectStore):
    backend = "local"
    local_requests = True
    local_files = True
    writes_buffers = True

    def __init__(self, url: str, root: str, *, fsync: bool = True, create: bool = True,
                 ) -> None:
        super().__init__(url)
        self.root = os.path.abspath(root)
        self.fsync = fsync
        self._dirs: set[str] = set()  # directories known to exist
        if create:
            os.makedirs(self.root, exist_ok=True)
        elif not os.path.isdir(self.root):
            from txlog.errors import RootNotFoundError

            raise RootNotFoundError(
                f"no txlog root at {url}: the directory {self.root} does not exist; check "
                "the path (txlog creates a root when something is first written to it)")
        # Opens below the root start here: a link naming the root itself is the user's.
        self._real = os.path.realpath(self.root)
        # (a plain function: a bound method would keep the store alive from its finalizer)
        self._dir_fds = _DirFds(functools.partial(_open_dir, self._real, self.root))
        # Atomic creates through unnamed files (see _link_unnamed) where Linux has them.
        self._unnamed = _AT and hasattr(os, "O_TMPFILE")
        weakref.finalize(self, self._dir_fds.close_all)
        self._identity = "file://" + self._real

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

    def _parts(self, path: str) -> list[str]:
        return _parts(self.root, path)

    def _open_key(self, key: str) -> int:
        """A descriptor of the object at ``key`` for reading (no link followed)."""
        try:
            return open_beneath(self._real, check_key(key).split("/"), _O_READ)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(f"object {key!r} not found in {self.url}") from None

    def _ensure_dir(self, directory: str) -> None:
        """Create ``directory`` and any missing parents, following no link; with fsync
        on, sync the parent of each one created so the new names survive a power loss
        with what is in them."""
        if _AT:
            os.close(open_beneath(self._real, self._parts(directory), _O_DIR,
                                  create_dirs=True, fsync_dirs=self.fsync))
        else:
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

    def _write_temp(self, final: str, data: bytes | memoryview) -> str:
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
            self._write_all(fd, data, dsync=False)
        finally:
            os.close(fd)
        return tmp

    def _write_all(self, fd: int, data: bytes | memoryview, *, dsync: bool) -> None:
        """Write ``data`` to ``fd``; with fsync on, durable when this returns (``dsync``:
        the file was opened with O_DSYNC, so only a file of no bytes needs an fsync)."""
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if self.fsync and not (dsync and data):
            os.fsync(fd)

    @staticmethod
    def _fsync_dir(directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        final = self._path(key)
        if _AT:
            directory, name = os.path.split(final)
            # (a lost create syncs nothing: nothing of it stays)
            won = self._at(directory, lambda d: self._link_new(d, name, data),
                           sync=lambda won: won)
        else:
            won = self._put_if_absent_by_path(final, data)
        self.counter.add("put_if_absent", len(data))
        return won

    def _link_new(self, d: int, name: str, data: bytes) -> bool:
        if self._unnamed:
            won = self._link_unnamed(d, name, data)
            if won is not None:
                return won
        tmp = f"{_TMP_PREFIX}{unique()}"
        self._create(d, tmp, data)
        try:
            os.link(tmp, name, src_dir_fd=d, dst_dir_fd=d)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno == errno.ENOENT and os.fstat(d).st_nlink == 0:
                raise _DirGone from None  # removed since the create: nothing was linked
            self._refuse_without_links(exc)
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):  # (gone with its directory)
                os.unlink(tmp, dir_fd=d)
        return True

    def _link_unnamed(self, d: int, name: str, data: bytes) -> bool | None:
        """The create as an unnamed file (Linux ``O_TMPFILE``) linked to ``name`` once
        written: one system call fewer than a temp file's, and a writer killed half way
        leaves nothing behind.  None if the filesystem cannot (then never tried again)."""
        try:
            fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | (_O_DSYNC if self.fsync else 0),
                         0o644, dir_fd=d)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOTSUP):
                self._unnamed = False
                return None
            if exc.errno == errno.ENOENT or os.fstat(d).st_nlink == 0:
                raise _DirGone from None  # (ext4 refuses a removed directory with EPERM)
            raise
        try:
            self._write_all(fd, data, dsync=bool(_O_DSYNC))
            try:
                os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=d, follow_symlinks=True)
            except FileExistsError:
                return False
            except OSError as exc:
                # Nothing is linked yet on any of these paths: trying again is safe.
                if exc.errno == errno.ENOENT and os.fstat(d).st_nlink == 0:
                    raise _DirGone from None  # (tmpfs opens in a removed directory)
                if exc.errno in (errno.ENOENT, errno.EACCES, errno.EXDEV):
                    # No /proc here, or a sandbox denies it: named temp files from now on.
                    self._unnamed = False
                    return None
                self._refuse_without_links(exc)
                raise
            return True
        finally:
            os.close(fd)

    def _put_if_absent_by_path(self, final: str, data: bytes) -> bool:
        tmp = self._write_temp(final, data)
        try:
            os.link(tmp, final)
        except FileExistsError:
            won = False
        except OSError as exc:
            self._refuse_without_links(exc)
            raise
        else:
            won = True
        finally:
            os.unlink(tmp)
        if won and self.fsync:
            self._fsync_dir(os.path.dirname(final))
        return won

    def _refuse_without_links(self, exc: OSError) -> None:
        """Raise what a failed link means when the filesystem has no hard links (the
        caller raises any other failure as it is)."""
        if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise StorageError(
                f"the local filesystem under {self.root} does not support hard links, "
                "which txlog needs for atomic create; use a local disk (ext4, xfs, apfs)"
            ) from exc

    def put(self, key: str, data: bytes | memoryview) -> None:
        final = self._path(key)
        if _AT:
            directory, name = os.path.split(final)
            self._at(directory, lambda d: self._replace(d, name, data))
        else:
            tmp = self._write_temp(final, data)
            os.replace(tmp, final)
            if self.fsync:
                # The rename must be durable before anything refers to the object: a log
                # entry that survives a power loss must not name a batch object that did
                # not.
                self._fsync_dir(os.path.dirname(final))
        self.counter.add("put", len(data))

    def _replace(self, d: int, name: str, data: bytes | memoryview) -> None:
        tmp = f"{_TMP_PREFIX}{unique()}"
        self._create(d, tmp, data)
        os.replace(tmp, name, src_dir_fd=d, dst_dir_fd=d)  # (as os.rename: see _AT)

    def put_new(self, key: str, data: bytes | memoryview) -> None:
        """Written in place, without a temp file and a rename: nothing reads the object
        before a later write names it (a killed writer may leave part of one, which
        nothing names)."""
        if not _AT:
            self.put(key, data)
            return
        directory, name = os.path.split(self._path(key))

        def create(d: int) -> None:
            try:
                self._create(d, name, data)
            except FileExistsError:
                # Not a fresh key after all: overwrite whole, as put() does.
                self._replace(d, name, data)

        self._at(directory, create)
        self.counter.add("put", len(data))

    def _create(self, d: int, name: str, data: bytes | memoryview) -> None:
        """Create ``name`` (which must not exist) in directory ``d`` with ``data``, its
        data durable with fsync on (its name only once the directory is synced)."""
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | (
                _O_DSYNC if self.fsync else 0), 0o644, dir_fd=d)
        except FileNotFoundError:
            raise _DirGone from None
        try:
            try:
                self._write_all(fd, data, dsync=bool(_O_DSYNC))
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):  # (a partial object nothing will name)
                os.unlink(name, dir_fd=d)
            raise

    def _at(self, directory: str, write: Callable[[int], _T],
            sync: Callable[[_T], bool] = lambda _: True) -> _T:
        """``write(fd)`` with an open descriptor of ``directory`` (made, parents and all,
        if missing), then, with fsync on and where ``sync(result)``, sync the directory.

        The descriptor is kept between writes, so the directory it names may no longer
        be the one at the path: one removed (the create finds it gone) or moved away by
        someone else (a stat after the write finds another one there).  Then the write is
        made again in the directory now at the path: what went to the old one, nothing
        reads (a create that won its link there did not win it at the path)."""
        for _ in range(3):
            try:
                h = self._dir_fds.acquire(directory)
            except FileNotFoundError:
                self._ensure_dir(directory)
                h = self._dir_fds.acquire(directory)
            try:
                try:
                    result = write(h.fd)
                except _DirGone:
                    self._dir_fds.forget(directory)
                    continue
                try:
                    st = os.stat(directory, follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if st is None or (st.st_dev, st.st_ino) != h.ident:
                    self._dir_fds.forget(directory)
                    continue
                if self.fsync and sync(result):
                    os.fsync(h.fd)
                return result
            finally:
                self._dir_fds.release(h)
        raise StorageError(
            f"directory {directory} keeps being removed or replaced while txlog writes into "
            "it; stop whatever moves it, then retry")

    def get(self, key: str) -> bytes:
        with open(self._open_key(key), "rb") as f:
            data = f.read()
        self.counter.add("get", len(data))
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with open(self._open_key(key), "rb") as f:
            f.seek(start)
            data = f.read(max(0, end - start))
        self.counter.add("get_range", len(data))
        return data

    def size(self, key: str) -> int:
        fd = self._open_key(key)
        try:
            n = os.fstat(fd).st_size
        finally:
            os.close(fd)
        self.counter.add("head")
        return n

    def delete(self, key: str) -> None:
        """Unlinks the name in its directory (a link there goes, never what it names);
        a directory on the way that is a link raises LinkInRootError."""
        parts = check_key(key).split("/")
        if _AT:
            try:
                d = open_beneath(self._real, parts[:-1], _O_DIR)
            except (FileNotFoundError, NotADirectoryError):
                d = -1
            if d >= 0:
                try:
                    os.unlink(parts[-1], dir_fd=d)
                except FileNotFoundError:
                    pass
                finally:
                    os.close(d)
        else:
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
        try:
            base = open_beneath(self._real, base_key.split("/") if base_key else [], _O_DIR)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out: list[str] = []
        self._walk(base, base_key, name_prefix, start_after, out)
        out.sort()
        return out

    def list_children(self, prefix: str) -> Names:
        """One directory read: a prefix ending in '/' is a directory here."""
        self.counter.add("list")
        base_key = prefix.rstrip("/")
        try:
            base = open_beneath(self._real, base_key.split("/") if base_key else [], _O_DIR)
        except (FileNotFoundError, NotADirectoryError):
            return []
        try:
            return sorted(e.name for e in os.scandir(base) if not e.name.startswith("."))
        finally:
            os.close(base)

    def _walk(
        self, directory: int, dir_key: str, name_prefix: str, start_after: str | None,
        out: _Keys,
    ) -> None:
        """Lists the directory open as ``directory`` (and closes it); a link in it is
        listed as a key, never followed."""
        try:
            for entry in list(os.scandir(directory)):
                name = entry.name
                if name.startswith(".") or not name.startswith(name_prefix):
                    continue
                key = f"{dir_key}/{name}" if dir_key else name
                if entry.is_dir(follow_symlinks=False):
                    # Prune a subtree whose every key sorts at or before start_after.
                    if start_after is not None and key + "/" < start_after \
                            and not start_after.startswith(key + "/"):
                        continue
                    try:
                        sub = os.open(name, _O_DIR | _O_NOFOLLOW, dir_fd=directory)
                    except OSError:
                        continue  # removed, or replaced by a link or a file, since the scan
                    self._walk(sub, key, "", start_after, out)
                elif start_after is None or key > start_after:
                    out.append(key)
        finally:
            os.close(directory)

    def full_path(self, key: str) -> str:
        return "file://" + self._path(key)

    def fsspec(self) -> Any:
        import fsspec

        return fsspec.filesystem("file")

    def fs_path(self, key: str) -> str:
        return self._path(key)


def _parts(root: str, path: str) -> list[str]:
    """The components of ``path`` (a key's path or a directory of one) below ``root``."""
    rel = os.path.relpath(path, root)
    return [] if rel == "." else rel.split(os.sep)


def _open_dir(real_root: str, root: str, directory: str) -> int:
    return open_beneath(real_root, _parts(root, directory), _O_DIR)


class _DirGone(Exception):
    """A create found its directory removed (its kept descriptor names a deleted one)."""


class _DirFd:
    __slots__ = ("dead", "fd", "ident", "users")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        st = os.fstat(fd)
        self.ident = (st.st_dev, st.st_ino)  # which directory, to notice another at the path
        self.users = 1
        self.dead = False  # closed by its last user


class _DirFds:
    """Open directory descriptors by path, shared by a store's threads, the least
    recently used closed past _MAX_DIR_FDS.  One is closed only once no write uses it:
    its number may be reused by the next open at once."""

    def __init__(self, opener: Callable[[str], int]) -> None:
        self._opener = opener
        self._lock = threading.Lock()
        self._open: collections.OrderedDict[str, _DirFd] = collections.OrderedDict()
        _ALL.add(self)

    def acquire(self, path: str) -> _DirFd:
        """The descriptor of ``path`` (FileNotFoundError if there is no such directory);
        give it back with release()."""
        with self._lock:
            h = self._open.get(path)
            if h is not None:
                h.users += 1
                self._open.move_to_end(path)
                return h
        fd = self._opener(path)
        try:
            h = _DirFd(fd)
        except BaseException:
            os.close(fd)
            raise
        idle = None
        with self._lock:
            if path in self._open:
                h.dead = True  # another thread opened it meanwhile: this one is the caller's
            else:
                if len(self._open) >= _MAX_DIR_FDS:
                    # One out for one in (the least recently used idle one), so no single
                    # write closes many.
                    for p, other in self._open.items():
                        if other.users == 0:
                            idle = self._open.pop(p)
                            break
                if len(self._open) < _MAX_DIR_FDS:
                    self._open[path] = h
                else:
                    h.dead = True  # every kept one is in use: this one is the caller's
        if idle is not None:
            os.close(idle.fd)
        return h

    def release(self, h: _DirFd) -> None:
        with self._lock:
            h.users -= 1
            close = h.dead and h.users == 0
        if close:
            os.close(h.fd)

    def forget(self, path: str) -> None:
        """The directory kept for ``path`` is not the one there any more: hand it out no
        more (closed by its last user)."""
        with self._lock:
            h = self._open.pop(path, None)
            if h is None:
                return
            h.dead = True
            close = h.users == 0
        if close:
            os.close(h.fd)

    def close_all(self) -> None:
        with self._lock:
            idle = [h for h in self._open.values() if h.users == 0]
            for h in self._open.values():
                h.dead = True
            self._open.clear()
        for h in idle:
            os.close(h.fd)

    def after_fork(self) -> None:
        # A parent thread may have held the lock, and its writes never end here: the
        # child closes its copies of the descriptors and starts afresh.
        self._lock = threading.Lock()
        inherited, self._open = self._open, collections.OrderedDict()
        for h in inherited.values():
            with contextlib.suppress(OSError):
                os.close(h.fd)


_ALL: weakref.WeakSet[_DirFds] = weakref.WeakSet()


def _after_fork() -> None:
    for fds in list(_ALL):
        fds.after_fork()


os.register_at_fork(after_in_child=_after_fork)
