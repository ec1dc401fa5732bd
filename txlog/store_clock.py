"""The object store's clock: how long ago the store wrote an object, judged on the store's
own time, so that no client's wall clock decides when a transaction has timed out.

Kafka judges transaction timeouts on one coordinator's clock.  Without a broker the one
clock every client shares is the store's: it stamps each object it writes.  A client
measures the store's current time by writing a probe object and reading its stamp, and
carries that forward on its own monotonic clock, which no wall-clock shift moves.  Every
figure here is a lower bound of the true age: a transaction is never judged older than it
is, whatever the clients' clocks say.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from txlog import layout
from txlog.errors import StorageError
from txlog.model import new_token
from txlog.storage.create_outcome import write_refused

if TYPE_CHECKING:
    from txlog.storage.base import ObjectStore

log = logging.getLogger(__name__)

#: Re-measure the store's time after this long (monotonic clocks drift by parts per
#: million, so this only bounds how long a stale measurement is used).
REFRESH_S = 60.0
PROBE_PREFIX = layout.CLOCK_PROBE_PREFIX
#: Stamps with no sub-second part (S3's Last-Modified) may be up to this much late.
SECOND = 1000
TICK = 20
_MAX_CACHED = 10_000


def stamp_ms(info: dict[str, Any]) -> int | None:
    """The modification time in an fsspec ``info()`` answer, in ms since the epoch."""
    # S3 (s3fs), Azure (adlfs), GCS (gcsfs), local and memory file systems, in that order.
    for name in ("LastModified", "last_modified", "updated", "mtime", "created"):
        v = info.get(name)
        if v is None:
            continue
        if isinstance(v, datetime.datetime):
            if v.tzinfo is None:
                v = v.replace(tzinfo=datetime.UTC)
            return int(v.timestamp() * 1000)
        if isinstance(v, str):
            try:
                d = datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError:
                continue
            if d.tzinfo is None:
                d = d.replace(tzinfo=datetime.UTC)
            return int(d.timestamp() * 1000)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return int(v * 1000)
    return None


def resolution_ms(stamp: int) -> int:
    """How much later than ``stamp`` the write may have happened: a whole-second stamp is
    taken to be truncated to the second (1 in 1000 finer stamps is misjudged, which only
    makes the age smaller); a finer one is a file system's, which stamps to its clock tick."""
    return SECOND if stamp % SECOND == 0 else TICK


def age_lower_bound_ms(*, probe_stamp: int, probe_mono: float, now_mono: float,
                       written_stamp: int) -> int:
    """Pure: a lower bound of how long ago (in the store's time) an object stamped
    ``written_stamp`` was written, given a probe stamped ``probe_stamp`` whose write had
    returned at monotonic time ``probe_mono`` (seconds), now being ``now_mono``.

    The probe's stamp is no later than the store's time when the probe's write returned,
    so the store's time now is at least ``probe_stamp + (now_mono - probe_mono)``; the
    object was written at most its stamp's resolution after its stamp."""
    store_now_low = probe_stamp + int((now_mono - probe_mono) * 1000)
    return store_now_low - (written_stamp + resolution_ms(written_stamp))


class StoreClock:
    """Ages of objects on the store's clock, for one store (thread-safe)."""

    def __init__(self, store: ObjectStore, *, mono: Any = time.monotonic) -> None:
        self.store = store
        self._mono = mono
        self._lock = threading.Lock()
        self._probe: tuple[int, float] | None = None  # (stamp, monotonic after the write)
        self._stamps: dict[str, int] = {}
        # When a write to the store was last refused (monotonic): for REFRESH_S after it
        # no probe is written, so a read-only client does not try once per check.
        self._refused_at: float | None = None

    def note_refused(self) -> None:
        """Record that this client's write to the store was refused just now (read-only
        access: see create_outcome.write_refused)."""
        with self._lock:
            self._refused_at = self._mono()

    @property
    def writes_refused(self) -> bool:
        """Whether a write to the store was refused in the last REFRESH_S: this client
        can then neither measure the store's time nor settle a transaction."""
        with self._lock:
            at = self._refused_at
        return at is not None and self._mono() - at < REFRESH_S

    def _stamp(self, key: str) -> int | None:
        try:
            fs = self.store.fsspec()
            info = fs.info(self.store.fs_path(key))
        except (NotImplementedError, ImportError, FileNotFoundError, KeyError):
            return None  # no stamps here: the caller falls back to watching
        except OSError as exc:
            raise StorageError(f"cannot read the store's time of {key!r}: {exc}") from exc
        return stamp_ms(info) if isinstance(info, dict) else None

    def _measure(self) -> tuple[int, float] | None:
        key = f"{PROBE_PREFIX}{new_token()}"
        self.store.put(key, b"")
        try:
            after = self._mono()
            stamp = self._stamp(key)
        finally:
            self.store.delete(key)
        return None if stamp is None else (stamp, after)

    def age_ms(self, key: str) -> int | None:
        """A lower bound of the age of the (immutable) object ``key`` on the store's clock,
        or None when the store gives no modification times (or ``key`` is gone)."""
        with self._lock:
            written = self._stamps.get(key)
            probe = self._probe
        if written is None:
            written = self._stamp(key)
            if written is None:
                return None
            with self._lock:
                if len(self._stamps) >= _MAX_CACHED:
                    self._stamps.clear()
                self._stamps[key] = written
        probe = self._current_probe(probe)
        if probe is None:
            return None
        return age_lower_bound_ms(probe_stamp=probe[0], probe_mono=probe[1],
                                  now_mono=self._mono(), written_stamp=written)

    def now_ms(self) -> int | None:
        """A lower bound of the store's time now (ms since the epoch), or None when the
        store gives no modification times or this client cannot write its probe."""
        with self._lock:
            probe = self._probe
        probe = self._current_probe(probe)
        if probe is None:
            return None
        return probe[0] + int((self._mono() - probe[1]) * 1000)

    def _current_probe(self, probe: tuple[int, float] | None) -> tuple[int, float] | None:
        """``probe``, or a new measurement when there is none or it is REFRESH_S old."""
        if probe is not None and self._mono() - probe[1] <= REFRESH_S:
            return probe
        if self.writes_refused:
            return None  # (as below, without trying again so soon)
        try:
            probe = self._measure()
        except (StorageError, OSError) as exc:
            # (read-only access, or the store refuses writes for now): the caller
            # falls back to watching, which is as safe, only slower to abort.
            log.debug("cannot measure the store's time on %s: %s", self.store, exc)
            if write_refused(exc):
                self.note_refused()
            return None
        if probe is not None:
            with self._lock:
                self._probe = probe
        return probe
