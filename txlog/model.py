"""Log entries: the JSON objects that claim the slots of a partition log.

An entry describes one appended batch (a data batch referencing an immutable Parquet
object, or a control marker) and claims slot ``slot`` with put-if-absent.  Offsets are
dense: an entry's ``base_offset`` is its predecessor's ``base_offset + count``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from txlog import checksums, layout
from txlog.errors import CorruptObjectError, UnsupportedFormatError
from txlog.unique import unique

#: The newest entry format this txlog reads.  Version 2 adds DATA entries of several batch
#: objects (``extra["parts"]``, see PARTS), version 3 BEGIN entries and COMMIT markers
#: that carry their transaction's last batch objects (see MARKER_PARTS_VERSION), version 4
#: entries that carry copies of small batch objects (see INLINE_VERSION), version 5
#: entries naming batches inside shared objects (see SHARED_VERSION); every other
#: entry is still written as version 1, so older readers keep reading logs that hold none
#: (and refuse those that do, instead of misreading them).
FORMAT_VERSION = 5
PARTS_VERSION = 2
#: A COMMIT marker with ``extra["parts"]``: the batch objects its transaction's
#: PrepareCommit named but no entry appended yet (txn_state.TxnRecord.pending), appended
#: at offsets [base_offset, base_offset + count - 1) and committed by the marker at the
#: entry's last offset, in one put-if-absent.
MARKER_PARTS_VERSION = 3
#: BEGIN (version 3): a transaction's first entry in a partition when its first batches
#: there are left to the COMMIT marker.  It claims no offset but opens the transaction
#: there, as a first DATA entry would: it holds the LSO, and a reader that meets it rolls
#: a decided transaction forward (so the marker's batches never wait for the producer).
#: ``extra`` key of a DATA entry that carries several batch objects, one after another:
#: a list of ``[key, count, nbytes, ts_min, ts_max]``; the entry's ``data`` is the
#: first key and its count, nbytes and timestamps cover them all.  One put-if-absent then
#: appends every object a producer wrote meanwhile, instead of one each.  A part of 7,
#: ``[key, count, nbytes, ts_min, ts_max, row, object_rows]``, is a batch inside a shared
#: object (see SHARED_VERSION).
PARTS = "parts"
#: Entries with a part of 7 elements: a batch that is rows [row, row + count) of a shared
#: object (layout.shared_key) holding ``object_rows`` rows, the batches of several
#: partitions of one topic that one producer step wrote; ``nbytes`` is the whole
#: object's stored size.  A shared object is always named through parts, even alone.
SHARED_VERSION = 5
#: The length of a part naming its own object, and of one naming a shared object's rows.
PART_LEN = 5
SHARED_PART_LEN = 7
#: A DATA entry or a COMMIT marker with ``inline``: ``{key: base64}``, a copy of some of
#: the batch objects it appends (each named by the entry, with a checksum in its key).  A
#: reader that reads the entry then has their bytes without a request of its own; the
#: objects are written first all the same, and everything else (checkpoints, compaction,
#: Spark) reads them.
INLINE_VERSION = 4
#: The most object bytes one entry carries inline (a reader refuses more as corrupt).
INLINE_MAX_BYTES = 65_536
#: The most bytes (as Arrow holds them) a row group of a batch object is written with: a
#: Parquet reader holds a row group's stored columns while it reads them, so a reader of
#: an object of any size holds about this much (the JVM scan reads smaller objects whole).
ROW_GROUP_BYTES = 8 << 20

# Entry kinds.
DATA = "data"
COMMIT = "commit"
ABORT = "abort"
RETENTION = "retention"  # advances the log start offset
COMPACT = "compact"  # replaces a range of batches by runs of one merged segment
PURGE = "purge"  # records that objects pending deletion were deleted
BEGIN = "begin"  # opens a transaction in the partition (see MARKER_PARTS_VERSION)
KINDS = frozenset({DATA, COMMIT, ABORT, RETENTION, COMPACT, PURGE, BEGIN})
CONTROL_KINDS = frozenset({COMMIT, ABORT})

NO_PRODUCER = -1
NO_SEQUENCE = -1


def new_token() -> str:
    """A writer token: makes each claimed object's bytes unique to its writer."""
    return unique()


@dataclass(slots=True)
class Entry:
    slot: int
    kind: str
    base_offset: int
    count: int
    producer_id: int = NO_PRODUCER
    epoch: int = 0
    base_sequence: int = NO_SEQUENCE
    transactional: bool = False
    txn_id: str | None = None
    data: str | None = None  # object key of the Parquet batch, relative to the store root
    nbytes: int = 0
    ts_min: int = 0
    ts_max: int = 0
    append_ms: int = 0
    log_start_offset: int | None = None  # RETENTION only
    extra: dict[str, Any] | None = None  # kind-specific payload (COMPACT, PURGE, RETENTION)
    token: str = field(default_factory=new_token)
    inline: dict[str, str] | None = None  # DATA, COMMIT: object key -> base64 (INLINE_VERSION)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count

    @property
    def delete_due_ms(self) -> int:
        """When the objects a RETENTION or COMPACT entry drops may be deleted: the store's
        time its writer stamped (``delete_due_ms``), else its own append time plus the
        delay (entries of writers that stamped none, whose wall clock then decides)."""
        x = self.extra or {}
        due = x.get("delete_due_ms")
        if type(due) is int and due >= 0:
            return due
        return self.append_ms + int(x.get("delete_delay_ms", 0))

    def marker_data(self) -> Entry:
        """The data part of a COMMIT marker that carries batches (MARKER_PARTS_VERSION):
        a transactional DATA entry of the same parts, at the marker entry's first offsets."""
        return Entry(slot=self.slot, kind=DATA, base_offset=self.base_offset,
                     count=self.count - 1, producer_id=self.producer_id, epoch=self.epoch,
                     base_sequence=self.base_sequence, transactional=True,
                     txn_id=self.txn_id, data=self.data, nbytes=self.nbytes,
                     ts_min=self.ts_min, ts_max=self.ts_max, append_ms=self.append_ms,
                     extra=self.extra, token=self.token)

    def encode(self) -> bytes:
        # A shallow dict, not asdict(): asdict deep-copies every value, and this runs for
        # every appended batch.  json.dumps copies nothing anyway.
        d = {f: getattr(self, f) for f in _FIELD_NAMES}
        if self.inline is None:
            del d["inline"]  # (older versions have no such field)
            d["v"] = MARKER_PARTS_VERSION if self.kind == BEGIN else 1 if self.extra is None \
                else PARTS_VERSION if self.kind == DATA else \
                MARKER_PARTS_VERSION if self.kind == COMMIT else 1
        else:
            d["v"] = INLINE_VERSION
        if self.extra is not None and self.kind in (DATA, COMMIT) and any(
                isinstance(p, list) and len(p) == SHARED_PART_LEN
                for p in self.extra.get(PARTS) or ()):
            d["v"] = SHARED_VERSION
        return json.dumps(d, separators=(",", ":"), sort_keys=True).encode()


_FIELD_NAMES = tuple(Entry.__dataclass_fields__)
_FIELDS = set(_FIELD_NAMES)


def decode_entry(raw: bytes, where: str) -> Entry:
    """Decode an entry object; ``where`` names it in errors."""
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptObjectError(
            f"log entry {where} is not valid JSON ({exc}); it may be truncated or corrupt. "
            "Restore it from a backup or remove the partition's tail after it."
        ) from None
    if not isinstance(d, dict):
        raise CorruptObjectError(f"log entry {where} is not a JSON object")
    v = d.pop("v", None)
    if not isinstance(v, int):
        raise CorruptObjectError(f"log entry {where} has no format version")
    if v > FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"log entry {where} has format version {v}, newer than this txlog reads "
            f"({FORMAT_VERSION}); upgrade txlog"
        )
    try:
        kwargs: dict[str, Any] = {k: d[k] for k in d if k in _FIELDS}
        e = Entry(**kwargs)
    except TypeError as exc:
        raise CorruptObjectError(f"log entry {where} is missing fields: {exc}") from None
    if (
        not isinstance(e.kind, str)
        or e.kind not in KINDS
        or not _valid_types(e)
        or not isinstance(e.slot, int)
        or not isinstance(e.base_offset, int)
        or not isinstance(e.count, int)
        or not 0 <= e.count < 2**31  # Kafka's record count is an int32
        or not 0 <= e.base_offset < 2**63 - e.count  # offsets are int64
        or (e.kind == DATA and not isinstance(e.data, str))
        or (e.extra is None and e.data is not None and layout.is_shared(e.data))
        or (e.extra is not None and not isinstance(e.extra, dict))
        or (e.kind == COMPACT and not _valid_compaction(e.extra))
        or (e.kind == DATA and e.extra is not None and not _valid_parts(e, v))
        or (e.kind == COMMIT and e.extra is not None and not _valid_parts(e, v, markers=1))
        or (e.kind == BEGIN and (e.count != 0 or e.producer_id < 0 or not e.transactional))
        or (e.inline is not None and (v < INLINE_VERSION or not _valid_inline(e)))
    ):
        raise CorruptObjectError(f"log entry {where} has invalid field values")
    return e


def named_objects(e: Entry) -> list[str]:
    """Every object key ``e`` names (its batch objects, a compaction's segment)."""
    keys = [e.data] if e.data else []
    if e.extra is not None:
        parts = e.extra.get(PARTS)
        if isinstance(parts, list):
            keys.extend(p[0] for p in parts if isinstance(p, list) and p
                        and isinstance(p[0], str))
        if e.kind == COMPACT and isinstance(e.extra.get("segment"), str):
            keys.append(e.extra["segment"])
    return keys


_INT_FIELDS = ("slot", "base_offset", "count", "producer_id", "epoch", "base_sequence",
               "nbytes", "ts_min", "ts_max", "append_ms")


def _valid_types(e: Entry) -> bool:
    """Every field has its declared type (replay must never meet a string epoch)."""
    return (all(type(getattr(e, f)) is int for f in _INT_FIELDS)
            and isinstance(e.transactional, bool)
            and (e.txn_id is None or isinstance(e.txn_id, str))
            and (e.data is None or isinstance(e.data, str))
            and (e.log_start_offset is None or type(e.log_start_offset) is int)
            and isinstance(e.token, str))


def _valid_parts(e: Entry, version: int, markers: int = 0) -> bool:
    """A DATA entry's parts (or a COMMIT marker's, ``markers`` = 1): the first is
    ``data``, the counts add up to ``count`` (less the marker's own offset); replay takes
    each as a batch of its own."""
    assert e.extra is not None
    parts = e.extra.get(PARTS)
    if set(e.extra) != {PARTS} or not isinstance(parts, list) or not parts:
        return False
    for p in parts:
        if not (isinstance(p, list) and len(p) in (PART_LEN, SHARED_PART_LEN)
                and isinstance(p[0], str) and p[0]
                and all(type(v) is int for v in p[1:]) and p[1] > 0 and p[2] >= 0):
            return False
        if len(p) == SHARED_PART_LEN:
            if version < SHARED_VERSION or not valid_shared_part(p):
                return False
        elif layout.is_shared(p[0]):
            return False  # a shared object's batch is always rows named by a part of 7
    return bool(parts[0][0] == e.data and sum(p[1] for p in parts) + markers == e.count)


def share(nbytes: int, count: int, object_rows: int) -> int:
    """The stored bytes a batch counts (retention.bytes, sizes, estimates): of a shared
    object of ``object_rows`` rows, its share by rows (at least 1 of a non-empty object),
    so that a partition never counts another's bytes; of its own object (``object_rows``
    0), the whole size."""
    if object_rows <= 0:
        return nbytes
    return max(1 if nbytes else 0, nbytes * count // object_rows)


def valid_shared_part(p: list[Any]) -> bool:
    """A part of 7 (ints checked already): its rows lie inside a shared object's."""
    _, count, _, _, _, row, object_rows = p
    return bool(layout.is_shared(p[0]) and row >= 0 and row + count <= object_rows)


def _object_sizes(e: Entry) -> dict[str, int]:
    """The stored size of each batch object ``e`` appends."""
    parts = e.extra.get(PARTS) if e.extra is not None else None
    if isinstance(parts, list):
        return {p[0]: p[2] for p in parts}
    return {e.data: e.nbytes} if e.data else {}


def _valid_inline(e: Entry) -> bool:
    """An entry's inline copies: of objects it appends whose keys carry a checksum (the
    bytes are checked against it when read), each of its part's size once decoded, and
    no more than INLINE_MAX_BYTES in all.  The base64 itself is checked when read."""
    x = e.inline
    if e.kind not in (DATA, COMMIT) or not isinstance(x, dict) or not x:
        return False
    sizes = _object_sizes(e)
    total = 0
    for key, text in x.items():
        size = sizes.get(key)
        if size is None or checksums.expected(key) is None or not isinstance(text, str) \
                or layout.is_shared(key) \
                or len(text) != 4 * ((size + 2) // 3):
            return False
        total += size
    return total <= INLINE_MAX_BYTES


def _valid_compaction(x: Any) -> bool:
    if not isinstance(x, dict):
        return False
    try:
        return (isinstance(x["segment"], str) and isinstance(x["replaces"], list)
                and all(isinstance(r, list) and len(r) == 9
                        and all(isinstance(v, int) for v in r) for r in x["runs"])
                and int(x["start"]) <= int(x["end"]))
    except (KeyError, TypeError, ValueError):
        return False
