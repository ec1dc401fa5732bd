"""The connector jar's build identity: a digest of its Java sources, which every build
writes into the jar. Standard library only, so that the packaging hook (setup.py) can load
this file by its path without the runtime's dependencies."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

#: The Java sources of the connector.
SOURCES = Path(__file__).resolve().parent / "java"
#: Where a build puts the digest of the sources it was built from, inside the jar.
DIGEST_RESOURCE = "io/txlog/spark/build-digest.txt"


def source_digest(sources: Path = SOURCES) -> str:
    """A digest of the ``.java`` files under ``sources`` (their paths and bytes): the build's
    identity, whichever Spark it was compiled against (one jar serves Spark 4.2 and 4.3)."""
    h = hashlib.sha256()
    for src in sorted(sources.rglob("*.java")):
        h.update(src.relative_to(sources).as_posix().encode())
        h.update(src.read_bytes())
    return h.hexdigest()[:16]


def jar_digest(path: Path) -> str | None:
    """The digest written into the jar at ``path``, or None where it has none (missing,
    not a jar, or not built by txlog's build)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.read(DIGEST_RESOURCE).decode().strip()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
