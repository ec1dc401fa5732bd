"""The transaction coordinator's state machine, pure: states, valid previous states, and
transitions as values (records).  No I/O: the coordinator persists each new record in the
state log before it takes effect.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

from txlog import checksums, layout
from txlog.errors import (
    CorruptObjectError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    UnsupportedFormatError,
)
from txlog.model import valid_shared_part

EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
# Written by maintenance for a transactional.id idle past transactional.id.expiration.ms:
# the state log then forgets the id, and its next init_transactions() gets a new producer
# id.  (Kafka's PrepareEpochFence is not a state here: fencing an open transaction bumps
# no epoch of its own, it persists PrepareAbort with abort_reason "fenced" at once.)
DEAD = "Dead"

# Kafka's TransactionState.validPreviousStates, and Ongoing after PrepareCommit.
VALID_PREVIOUS: dict[str, frozenset[str]] = {
    EMPTY: frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT}),
    # From PrepareCommit too: a commit whose markers are all written completes in the
    # same state-log write that registers the next transaction's first partitions
    # (Coordinator.complete_into_next); the record then names the commit in prev_*.
    ONGOING: frozenset({ONGOING, EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT, PREPARE_COMMIT}),
    # From Empty and Complete* too: a commit whose partitions are not registered yet
    # registers them in its PrepareCommit (one state-log write, no Ongoing record).
    PREPARE_COMMIT: frozenset({ONGOING, EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT}),
    PREPARE_ABORT: frozenset({ONGOING}),
    COMPLETE_COMMIT: frozenset({PREPARE_COMMIT}),
    COMPLETE_ABORT: frozenset({PREPARE_ABORT}),
    DEAD: frozenset({EMPTY, COMPLETE_ABORT, COMPLETE_COMMIT}),
}
STATES = frozenset(VALID_PREVIOUS)
PREPARING = frozenset({PREPARE_COMMIT, PREPARE_ABORT})
COMPLETE = frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT})

MAX_EPOCH = 32_766  # Kafka's epochs are shorts; the last one is reserved
#: Version 2: a PrepareCommit that names batch objects still to append (``pending``); every
#: other record is still written as version 1.  An older txlog must refuse it: rolling
#: the commit forward without appending them would commit the transaction without them.
#: Version 3: a PrepareCommit that also carries the bytes of pending objects that may not
#: be durable yet (``inline``).  An older txlog must refuse it: rolling the commit forward
#: without writing them first would name objects that do not exist.
#: Version 4: a PrepareCommit whose pending batches include rows of shared objects
#: (parts of 8, see PendingPart).  An older txlog must refuse it: it would append them as
#: whole objects.
RECORD_VERSION = 4
PENDING_VERSION = 2
INLINE_VERSION = 3
SHARED_VERSION = 4

#: A batch object to append: key, count, nbytes, ts_min, ts_max (None: no record has a
#: timestamp of its own), untimed (some record has none); a batch in a shared object
#: adds its first row and the object's rows (model.SHARED_VERSION).
PendingPart = tuple[Any, ...]


class PendingAppend(NamedTuple):
    """Batch objects of a deciding transaction that no entry appended yet: its COMMIT
    marker to ``topic``/``partition`` appends them (model.MARKER_PARTS_VERSION), with
    the producer's next sequence number there."""

    topic: str
    partition: int
    base_sequence: int
    parts: tuple[PendingPart, ...]


@dataclass(frozen=True)
class TxnRecord:
    """The coordinator's view of one transactional.id (Kafka's TransactionMetadata).

    ``epoch`` is the producer's current epoch.  In Ongoing and Prepare* states it names the
    open transaction, whose markers carry (producer_id, epoch).  Every transaction end
    persists Complete* with the epoch bumped (or, for a commit, the next transaction's
    Ongoing record does, naming the commit in prev_*), so late writes of the ended
    transaction can never join the next one (KIP-890).
    """

    txn_id: str
    producer_id: int
    epoch: int
    state: str
    timeout_ms: int
    partitions: tuple[tuple[str, int], ...] = ()
    txn_start_ms: int = 0
    last_update_ms: int = 0
    # The (producer id, epoch) the previous transaction ended with, for retried EndTxn.
    prev_producer_id: int = -1
    prev_epoch: int = -1
    # Why the last transaction was aborted: "client", "timeout" or "fenced".
    abort_reason: str = ""
    # How the transaction named by prev_* ended ("commit" or "abort"; "" in records
    # written before txlog kept it).  An Ongoing record straight after PrepareCommit
    # completed that commit itself.
    prev_outcome: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # PrepareCommit only: the batch objects its markers append (see PendingAppend).  The
    # decision then needs no DATA entry before it: the objects are durable, and whoever
    # rolls the commit forward appends them with the markers.
    pending: tuple[PendingAppend, ...] = ()
    # PrepareCommit only: base64 copies of pending objects (key -> text) written beside
    # the decision, not before it.  Whoever rolls the commit forward writes each one
    # (checked against the CRC-32 its key names) before a marker names it.
    inline: tuple[tuple[str, str], ...] = ()
    # The state-log slot whose record began the open transaction: the store's stamp on
    # that object is when the transaction began on the store's clock (store_clock.py).
    # Set by the state log as it writes the record; -1 if unknown (older records).
    start_slot: int = field(default=-1, compare=False)

    def transition(self, state: str, **changes: Any) -> TxnRecord:
        if state not in STATES:
            raise InvalidTxnStateError(f"unknown transaction state {state!r}")
        if self.state not in VALID_PREVIOUS[state]:
            raise InvalidTxnStateError(
                f"transaction {self.txn_id!r} cannot go from {self.state} to {state}"
            )
        changes.setdefault("pending", ())  # named by one PrepareCommit record, never kept
        changes.setdefault("inline", ())  # (likewise)
        if (changes["pending"] or changes["inline"]) and state != PREPARE_COMMIT:
            raise InvalidTxnStateError(f"{state} cannot name batch objects to append")
        return replace(self, state=state, **changes)

    def expired(self, now_ms: int) -> bool:
        """Past the timeout by the wall clock ``now_ms`` (a display and a first filter
        only: the coordinator decides on the store's clock)."""
        return self.state == ONGOING and now_ms > self.txn_start_ms + self.timeout_ms

    def begins_transaction_after(self, prev: TxnRecord | None) -> bool:
        """True if this record opens a transaction that ``prev`` did not have open."""
        return self.state == ONGOING and (
            prev is None or prev.state != ONGOING
            or (prev.producer_id, prev.epoch) != (self.producer_id, self.epoch))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["partitions"] = [list(p) for p in self.partitions]
        inline = d.pop("inline")
        if self.pending:
            d["pending"] = [[a.topic, a.partition, a.base_sequence, [list(p) for p in a.parts]]
                            for a in self.pending]
            d["v"] = PENDING_VERSION
            if inline:
                d["inline"] = {k: text for k, text in inline}
                d["v"] = INLINE_VERSION
            if any(len(p) > 6 for a in self.pending for p in a.parts):
                d["v"] = SHARED_VERSION
        else:
            del d["pending"]  # (version 1 records, as txlog before 0.3 reads them)
            d["v"] = 1
        return d

    @staticmethod
    def from_json(d: dict[str, Any], where: str) -> TxnRecord:
        if not isinstance(d, dict):
            raise CorruptObjectError(f"transaction record in {where} is not a JSON object")
        v = d.get("v")
        if not isinstance(v, int):
            raise CorruptObjectError(f"transaction record in {where} has no format version")
        if v > RECORD_VERSION:
            raise UnsupportedFormatError(
                f"transaction record in {where} has version {v}, newer than this txlog reads; "
                "upgrade txlog"
            )
        try:
            rec = TxnRecord(
                txn_id=str(d["txn_id"]), producer_id=int(d["producer_id"]),
                epoch=int(d["epoch"]), state=str(d["state"]), timeout_ms=int(d["timeout_ms"]),
                partitions=tuple((str(t), int(p)) for t, p in d["partitions"]),
                txn_start_ms=int(d["txn_start_ms"]), last_update_ms=int(d["last_update_ms"]),
                prev_producer_id=int(d.get("prev_producer_id", -1)),
                prev_epoch=int(d.get("prev_epoch", -1)),
                abort_reason=str(d.get("abort_reason", "")),
                prev_outcome=str(d.get("prev_outcome", "")),
                extra=dict(d.get("extra") or {}),
                pending=_pending_of(d.get("pending") or []),
                inline=_inline_of(d.get("inline") or {}),
                start_slot=int(d.get("start_slot", -1)),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise CorruptObjectError(f"transaction record in {where} is invalid: {exc}") from None
        if rec.state not in STATES:
            raise CorruptObjectError(f"transaction record in {where} has state {rec.state!r}")
        if rec.pending and rec.state != PREPARE_COMMIT:
            raise CorruptObjectError(
                f"transaction record in {where} is {rec.state} but names batch objects to "
                "append (only PrepareCommit does)")
        if v < SHARED_VERSION and any(len(p) > 6 for a in rec.pending for p in a.parts):
            raise CorruptObjectError(
                f"transaction record in {where} names rows of shared objects but has "
                f"version {v}")
        named = {p[0] for a in rec.pending for p in a.parts}
        if any(k not in named for k, _ in rec.inline):
            raise CorruptObjectError(
                f"transaction record in {where} carries a copy of a batch object it does "
                "not name as pending")
        return rec

    def inline_bytes(self) -> dict[str, bytes]:
        """The copies this PrepareCommit carries, decoded, that match the CRC-32 their
        keys name (a damaged one is left out: its object is then read, or found missing,
        as without a copy)."""
        out: dict[str, bytes] = {}
        for key, text in self.inline:
            try:
                raw = base64.b64decode(text, validate=True)
                if checksums.expected(key) is not None:
                    out[key] = checksums.verify(key, raw, what="copy of batch object")
            except (binascii.Error, ValueError, CorruptObjectError):
                continue
        return out


#: How a transaction ended (TxnEnd.outcome); NOTHING: there was nothing to end.
COMMITTED = "commit"
ABORTED = "abort"
NOTHING = "none"


@dataclass(frozen=True)
class TxnEnd:
    """How the end of one transaction came out, whichever path ended it: EndTxn commit or
    abort, a newer instance's fence, a timeout, an administrator, or nothing to end.

    ``producer_id``/``epoch`` name the transaction that ended.  ``next_id`` is the
    (producer id, epoch) for the transactional.id's next transaction, known once Complete*
    (or the next transaction's record) is written; None while the decision ``prep`` still
    has markers or Complete* to write.
    """

    txn_id: str
    producer_id: int
    epoch: int
    outcome: str
    # Why an abort happened: "client", "timeout", "fenced", "admin" ("" for a commit).
    reason: str = ""
    next_id: tuple[int, int] | None = None
    # The Prepare* record that decided it (None when the end was answered from a later
    # record, or there was nothing to end).
    prep: TxnRecord | None = None
    # The decision was already made by someone else (a Prepare* found in the state log):
    # this end only rolled it forward.
    rolled_forward: bool = False

    @property
    def completed(self) -> bool:
        return self.next_id is not None

    @staticmethod
    def decided(prep: TxnRecord, *, rolled_forward: bool = False) -> TxnEnd:
        """The end a persisted Prepare* decided, its markers and Complete* still to write."""
        return TxnEnd(prep.txn_id, prep.producer_id, prep.epoch,
                      COMMITTED if prep.state == PREPARE_COMMIT else ABORTED,
                      prep.abort_reason, None, prep, rolled_forward)

    @staticmethod
    def nothing(txn_id: str, producer_id: int, epoch: int) -> TxnEnd:
        """No transaction was open: the producer goes on with the same (id, epoch)."""
        return TxnEnd(txn_id, producer_id, epoch, NOTHING, next_id=(producer_id, epoch))


def ended_as(cur: TxnRecord | None, producer_id: int, epoch: int) -> str | None:
    """How the transaction (producer_id, epoch) ended, if ``cur`` is the record that ended
    it: a Complete* record, or the next transaction's Ongoing record, which carries the
    outcome in prev_outcome (a fold writes it; an Ongoing after Complete* keeps it)."""
    if cur is None or (cur.prev_producer_id, cur.prev_epoch) != (producer_id, epoch):
        return None
    if cur.state == COMPLETE_COMMIT:
        return COMMITTED
    if cur.state == COMPLETE_ABORT:
        return ABORTED
    if cur.state == ONGOING and cur.prev_outcome in (COMMITTED, ABORTED):
        return cur.prev_outcome
    return None


def _pending_of(raw: list[Any]) -> tuple[PendingAppend, ...]:
    """Decode ``pending``; raises TypeError/ValueError on anything malformed."""
    out = []
    for topic, partition, seq, parts in raw:
        ps: list[PendingPart] = []
        for p in parts:
            if not isinstance(p, list) or len(p) not in (6, 8):
                raise ValueError(f"invalid pending batch object {p!r}")
            key, n, nb, lo, hi, untimed, *rows = p
            if not (isinstance(key, str) and key and type(n) is int and n > 0
                    and type(nb) is int and nb >= 0 and isinstance(untimed, bool)
                    and all(v is None or type(v) is int for v in (lo, hi))
                    and all(type(v) is int for v in rows)
                    and (valid_shared_part([key, n, nb, 0, 0, *rows]) if rows
                         else not layout.is_shared(key))):
                raise ValueError(f"invalid pending batch object {key!r}")
            ps.append((key, n, nb, lo, hi, untimed, *rows))
        if not (isinstance(topic, str) and type(partition) is int and type(seq) is int
                and ps):
            raise ValueError(f"invalid pending append to {topic!r}")
        foreign = [p[0] for p in ps if not layout.owns(topic, partition, p[0])]
        if foreign:
            raise ValueError(f"pending batch object {foreign[0]!r} is not "
                             f"{topic}-{partition}'s own")
        out.append(PendingAppend(topic, partition, seq, tuple(ps)))
    return tuple(out)


def _inline_of(raw: Any) -> tuple[tuple[str, str], ...]:
    """Decode ``inline`` (key -> base64 text); raises TypeError/ValueError on anything
    malformed (the bytes are checked when used, see TxnRecord.inline_bytes)."""
    if not isinstance(raw, dict):
        raise TypeError("inline copies are not an object")
    out = []
    for key, text in sorted(raw.items()):
        if not (isinstance(key, str) and key and isinstance(text, str)):
            raise ValueError(f"invalid inline copy of {key!r}")
        out.append((key, text))
    return tuple(out)


def check_timeout(timeout_ms: int, max_timeout_ms: int) -> None:
    """Refuse a transaction.timeout.ms outside [1, transaction.max.timeout.ms], as Kafka's
    coordinator answers INVALID_TRANSACTION_TIMEOUT."""
    if not 1 <= timeout_ms <= max_timeout_ms:
        raise InvalidTransactionTimeoutError(
            f"transaction.timeout.ms must be from 1 to transaction.max.timeout.ms "
            f"({max_timeout_ms}), not {timeout_ms}; choose a smaller timeout (or raise "
            "transaction.max.timeout.ms for the whole root)")


def bump_epoch(rec: TxnRecord, new_producer_id: int | None) -> tuple[int, int]:
    """The (producer id, epoch) after a bump; rotates the producer id on exhaustion.

    ``new_producer_id`` is a fresh id the caller allocated in case the epoch is exhausted.
    """
    if rec.epoch + 1 > MAX_EPOCH:
        if new_producer_id is None:
            raise InvalidTxnStateError("epoch exhausted and no new producer id given")
        return new_producer_id, 0
    return rec.producer_id, rec.epoch + 1


def needs_new_producer_id(rec: TxnRecord, bumps: int = 1) -> bool:
    return rec.epoch + bumps > MAX_EPOCH


def encode_records(records: list[dict[str, Any]]) -> bytes:
    return json.dumps(records, separators=(",", ":"), sort_keys=True).encode()
