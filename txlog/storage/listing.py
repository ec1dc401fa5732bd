"""Keys and bounds of a remote store's listings (pure): which prefixes and listed keys
txlog can have written, and a StartAfter that filer-backed S3 servers honour exactly."""

from __future__ import annotations

from txlog.storage.base import check_key


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


def viable_prefix(prefix: str) -> bool:
    """Whether some valid key starts with ``prefix`` (exactly when ``prefix + 'x'`` is one)."""
    if not prefix:
        return True
    try:
        check_key(prefix + "x")
    except ValueError:
        return False
    return True


def is_listable(key: str) -> bool:
    """Skip directory markers and keys txlog could never have written."""
    if not key or key.endswith("/"):
        return False
    try:
        check_key(key)
    except ValueError:
        return False
    return True
