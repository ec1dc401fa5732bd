"""The check that a remote store's server honours conditional creates.

Some S3-compatible servers ignore ``If-None-Match`` and overwrite: every writer would then
win its create, and txlog's guarantees would be void.  So before a process first writes
to a root (txlog.Log calls ``RemoteStore.check_atomic_create``), it probes the server: a
second create of one key must lose; a server that fails is refused with
AtomicCreateUnsupportedError.  A passing verdict is kept in a small object in the root,
one per endpoint (``_meta/atomic-create/``), so later processes read it instead of
probing.  The storage option ``txlog_probe_atomic_create: False`` skips the check, for a
server known to honour the condition where the probe cannot run.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable

from txlog import layout
from txlog.errors import AtomicCreateUnsupportedError, StorageError
from txlog.storage.base import ObjectStore
from txlog.storage.remote_location import PROBE_OPTION

#: Where a root keeps the verdicts of the check, one object per endpoint.
VERDICT_PREFIX = layout.ATOMIC_CREATE_VERDICT_PREFIX
# Verdicts of this process by store identity: "" passed, else the refusal's message.
_VERDICTS: dict[str, str] = {}
_VERDICT_LOCK = threading.Lock()


def verdict_key(identity: str) -> str:
    """The key of the verdict for the store named ``identity`` (its URL and endpoint)."""
    # One per endpoint: a proxy in front of the same bucket may behave otherwise.
    return f"{VERDICT_PREFIX}{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"


def check(store: ObjectStore, *, identity: str, endpoint: str,
          probe: Callable[[], None]) -> None:
    """Once per store identity and process: the verdict stored in the root, else
    ``probe()`` (whose passing verdict is then stored); raises
    AtomicCreateUnsupportedError if it failed."""
    with _VERDICT_LOCK:
        known = _VERDICTS.get(identity)
        if known is None:
            known = _stored_verdict(store, identity)
            if known is None:
                try:
                    probe()
                except AtomicCreateUnsupportedError as exc:
                    _VERDICTS[identity] = str(exc)
                    raise
                known = ""
                body = {"v": 1, "verdict": "atomic", "checked_ms": int(time.time() * 1000),
                        "endpoint": endpoint}
                try:
                    store.put(verdict_key(identity), json.dumps(body).encode())
                except StorageError:
                    pass  # (read-only elsewhere: the next process probes again)
            _VERDICTS[identity] = known
    if known:
        raise AtomicCreateUnsupportedError(known)


def _stored_verdict(store: ObjectStore, identity: str) -> str | None:
    """"" when the root holds a passing verdict for this endpoint, else None."""
    try:
        d = json.loads(store.get(verdict_key(identity)))
    except (KeyError, ValueError, UnicodeDecodeError):
        return None
    ok = isinstance(d, dict) and d.get("v") == 1 and d.get("verdict") == "atomic"
    return "" if ok else None


def probe(create: Callable[[str, bytes], bool], delete: Callable[[str], None], *,
          where: str) -> None:
    """Create a probe object twice through ``create`` (a conditional create); refuse a
    server (``where`` names it) on which the second create also wins."""
    key = f"_probe/{uuid.uuid4().hex}"
    first = f"txlog atomic-create probe {key} writer 1".encode()
    second = f"txlog atomic-create probe {key} writer 2".encode()
    try:
        if not create(key, first):
            raise AtomicCreateUnsupportedError(
                f"{where}: a conditional create of the fresh probe key {key!r} did not "
                "succeed"
            )
        if create(key, second):
            raise AtomicCreateUnsupportedError(
                f"{where} ignores conditional creates "
                "(If-None-Match: *): a second create of the same key also succeeded. "
                "txlog needs an atomic create-if-absent; use a server that supports it "
                f"(storage option {PROBE_OPTION}=False skips this check, for a server "
                "known to honour the condition that this probe misjudges)"
            )
    finally:
        try:
            delete(key)
        except StorageError:
            pass
