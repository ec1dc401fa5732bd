"""Opening paths under a local root without following a symbolic link anywhere below it.

A root others can write to may hold a link (``topics/t -> /home/x``) that would send
txlog's writes, reads and deletes outside the root.  Every open below the root goes
through :func:`open_beneath`: one ``openat2`` with ``RESOLVE_NO_SYMLINKS`` where Linux
has it, else one ``openat`` with ``O_NOFOLLOW`` per path component.  The root itself may
be a link (it is resolved once, when the store opens).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat

from txlog.errors import LinkInRootError

_O_DIRECTORY_FLAG = getattr(os, "O_DIRECTORY", 0)
_O_DIR = os.O_RDONLY | _O_DIRECTORY_FLAG
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
#: openat2's number where the kernel's table is the common one (5.6 and later).
_SYS_OPENAT2 = 437 if platform.system() == "Linux" and platform.machine() in (
    "x86_64", "aarch64", "arm64", "riscv64") else None


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_syscall = None
if _SYS_OPENAT2 is not None:
    try:
        _syscall = ctypes.CDLL(None, use_errno=True).syscall
        _syscall.restype = ctypes.c_long
    except (OSError, AttributeError):  # pragma: no cover - a libc without syscall()
        _syscall = None

#: False once openat2 turned out missing (an older kernel, or a sandbox refusing it).
use_openat2 = _syscall is not None


def _openat2(path: str, flags: int, mode: int) -> int:
    # (openat2 refuses a mode unless the call may create a file)
    tmpfile = getattr(os, "O_TMPFILE", 0)  # (which includes O_DIRECTORY's bit)
    creates = flags & os.O_CREAT or (tmpfile and flags & tmpfile == tmpfile)
    how = _OpenHow(flags | _O_CLOEXEC, mode if creates else 0,
                   _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    assert _syscall is not None and _SYS_OPENAT2 is not None
    # Every argument a full register wide: syscall() is variadic.
    fd = _syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_long(_AT_FDCWD),
                  ctypes.c_char_p(os.fsencode(path)), ctypes.byref(how),
                  ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def open_beneath(root: str, parts: list[str], flags: int, mode: int = 0o644, *,
                 create_dirs: bool = False, fsync_dirs: bool = False) -> int:
    """Open ``root/parts...`` (``flags`` for the last part; ``parts`` empty: the root)
    following no link below ``root``; with ``create_dirs``, make missing directories on
    the way (each made one synced in its parent when ``fsync_dirs``).

    Raises LinkInRootError where a component is a link, FileNotFoundError where one is
    missing (and not made), NotADirectoryError where a file stands in for a directory.
    """
    global use_openat2
    if not parts:
        return os.open(root, _O_DIR)
    if use_openat2 and not create_dirs:
        try:
            return _openat2(os.path.join(root, *parts), flags, mode)
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.EPERM):
                use_openat2 = False  # (seccomp sandboxes answer EPERM) walk from now on
            elif exc.errno == errno.ELOOP:
                raise _link_error(root, parts) from None
            else:
                raise
    return _walk(root, parts, flags, mode, create_dirs=create_dirs, fsync_dirs=fsync_dirs)


def _walk(root: str, parts: list[str], flags: int, mode: int, *, create_dirs: bool,
          fsync_dirs: bool) -> int:
    fd = os.open(root, _O_DIR)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                nxt = os.open(part, (flags if last else _O_DIR) | _O_NOFOLLOW, mode,
                              dir_fd=fd)
            except FileNotFoundError:
                if not create_dirs or (last and not flags & _O_DIRECTORY_FLAG):
                    raise
                try:
                    os.mkdir(part, dir_fd=fd)
                except FileExistsError:
                    pass
                else:
                    if fsync_dirs:
                        os.fsync(fd)
                nxt = os.open(part, (flags if last else _O_DIR) | _O_NOFOLLOW, mode,
                              dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) and _is_link(
                        fd, part):
                    raise _link_error(root, parts[: i + 1]) from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _link_error(root: str, parts: list[str]) -> LinkInRootError:
    return LinkInRootError(
        f"{os.path.join(root, *parts)} is, or passes through, a symbolic link inside the "
        "txlog root; txlog never follows links in a root (they could send its writes, "
        "reads and deletes elsewhere). Remove the link, or move the real directory there")
