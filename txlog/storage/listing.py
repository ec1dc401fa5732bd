"""Keys, bounds and pages of a remote store's listings (pure): which prefixes and listed
keys txlog can have written, a StartAfter that filer-backed S3 servers honour exactly, and
when a ListObjectsV2 page leads to the next one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txlog.errors import IncompleteListingError
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


def next_page_token(page: Mapping[str, Any], seen: set[str], *, where: str) -> str | None:
    """The continuation token to request the page after this ListObjectsV2 ``page`` with,
    or None when it was the last; ``seen`` holds the tokens followed so far (this adds
    the one it returns).

    A page that says it is truncated but names no next token, or names one already
    followed, raises IncompleteListingError: ending there would pass off part of the
    listing as all of it (a sweep or retention pass would misjudge the objects it did not
    see), and following a repeated token could list the same pages forever.
    """
    if not page.get("IsTruncated"):
        return None
    token = page.get("NextContinuationToken")
    if not isinstance(token, str) or not token:
        raise IncompleteListingError(
            f"listing {where} stopped after page {len(seen) + 1}: the server said more "
            "keys follow (IsTruncated) but sent no NextContinuationToken, so the rest "
            "cannot be listed; txlog acts on no partial listing. Retry; if it recurs, "
            "the S3-compatible server's paging is faulty: upgrade or report it")
    if token in seen:
        raise IncompleteListingError(
            f"listing {where} went back to a page already read: page {len(seen) + 1} "
            "named a NextContinuationToken the server had sent before, so following it "
            "would list the same keys again; txlog acts on no partial listing. Retry; "
            "if it recurs, the S3-compatible server's paging is faulty: upgrade or "
            "report it")
    seen.add(token)
    return token
