"""The transaction state log: partitions keyed by hash(transactional.id), on the store.

Each partition is a sequence of slots claimed with put-if-absent; each slot holds one
:class:`TxnRecord`.  Claiming the next slot after reading the current record is a
compare-and-set: two clients acting on one transactional.id at once are serialised, and
the loser re-reads and re-decides (:meth:`StateLogPartition.run`, the one such loop, with
the decisions of :mod:`txlog.txn_decide`).  Periodic JSON checkpoints bound replay.

Transactional ids that share a partition share its sequence of slots.  A client that
loses a slot to another id claims the next one while it reads the one it lost, rather
than after: such a speculative entry names the record it expects its id to have (a
digest, ``expect``), and counts only if that is still the id's record when every reader
replays it in slot order (:func:`counts`).  Without it, the client that won a slot knows
the next one while the loser must first read, and a loser kept losing to a busy neighbour.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import threading
import zlib
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from txlog import layout
from txlog.errors import (
    ConcurrentTransactionsError,
    CorruptObjectError,
    ObjectNotFoundError,
    StorageError,
    UnsupportedFormatError,
)
from txlog.fanout import fan_out
from txlog.model import new_token
from txlog.records import now_ms
from txlog.storage.base import ObjectStore
from txlog.txn_decide import (
    Complete,
    Decision,
    Expire,
    Facts,
    Fail,
    Reread,
    Return,
)
from txlog.txn_state import COMPLETE, DEAD, ONGOING, TxnEnd, TxnRecord

log = logging.getLogger(__name__)

#: Many, unlike Kafka's 50: an empty partition costs nothing on a store, and two ids
#: that share one serialise their writes (sweeps list only the partitions in use).
DEFAULT_STATE_PARTITIONS = 4096
CHECKPOINT_INTERVAL = 200

#: Slots whose entry keys share one prefix (see StateLogPartition._first_load).
FIRST_SLOTS = 100
#: Entries: 1 counts unconditionally (written with every slot before it read), 2 is a
#: speculative entry that counts only if its ``expect`` holds (counts()).
VERSION = 2
#: The version of the checkpoints written (their format did not change with entries').
CHECKPOINT_VERSION = 1

#: Slots a refresh reads by name before it lists the partition (StateLogPartition._probe):
#: a lost conditional create needs the slot it lost, and usually no more.
PROBE_SLOTS = 3
#: Slots a client that lost one claims at once, speculatively (_claim_reading).
CLAIM_AHEAD = 2
#: Listed entries read side by side on a remote store, at most this many at once.
READ_WINDOW = 16


def _no_expire() -> None:
    raise AssertionError("this operation was given no timeout abort")


def state_partition_for(txn_id: str, partitions: int = DEFAULT_STATE_PARTITIONS) -> int:
    return zlib.crc32(txn_id.encode()) % partitions


def record_digest(rec: TxnRecord | None) -> str:
    """What a speculative entry's ``expect`` holds: a digest of the record its writer
    decided on ("" for no record), over the record's JSON without ``start_slot`` and
    ``v`` (as records compare equal without start_slot)."""
    if rec is None:
        return ""
    d = rec.to_json()
    d.pop("start_slot", None)
    d.pop("v", None)
    canonical = json.dumps(d, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def counts(d: dict[str, Any], current: TxnRecord | None) -> bool:
    """Whether the entry ``d`` (decoded) takes effect over ``current``, its id's record
    from the slots before it: a speculative entry only if it expected that record."""
    expect = d.get("expect")
    return expect is None or expect == record_digest(current)


class StateLogPartition:
    def __init__(self, store: ObjectStore, partition: int) -> None:
        self.store = store
        self.partition = partition
        self.prefix = layout.state_log_prefix(partition)
        self.records: dict[str, TxnRecord] = {}
        self.next_slot = 0
        self.loaded = False
        self._lock = threading.RLock()  # shared by the threads of one Log

    def entry_key(self, slot: int) -> str:
        """The object that holds slot ``slot``'s record."""
        return self._entry_key(slot)

    def _entry_key(self, slot: int) -> str:
        return layout.state_log_entry_key(self.partition, slot)

    def _ckpt_key(self, next_slot: int) -> str:
        return layout.state_log_checkpoint_key(self.partition, next_slot)

    # -- reading -------------------------------------------------------------------------

    def refresh(self) -> None:
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        keys: list[str] | None = None
        if not self.loaded:
            keys = self._first_load()
            self.loaded = True
        elif self._probe() < PROBE_SLOTS:
            return
        if keys is None:  # a backlog, or the first load: list the rest
            start_after = self._entry_key(self.next_slot - 1) if self.next_slot else None
            keys = self.store.list(layout.state_log_entries_prefix(self.partition),
                                   start_after=start_after)
        run: list[str] = []  # the contiguous slots from next_slot: none is ever skipped
        for key in keys:
            try:
                slot = layout.slot_of(key)
            except ValueError:
                continue  # a key txlog did not write (as in partition logs)
            if slot != self.next_slot + len(run):
                break
            run.append(key)
        if self.store.local_requests:
            for key in run:
                self._apply(self._decode(self.store.get(key), key), self.next_slot)
            return
        # On a remote store, a backlog is read side by side, a bounded window at a time.
        for i in range(0, len(run), READ_WINDOW):
            window = run[i:i + READ_WINDOW]
            for key, raw in zip(window, fan_out(self.store.get, window), strict=True):
                self._apply(self._decode(raw, key), self.next_slot)

    def _probe(self) -> int:
        """Read the next PROBE_SLOTS slots by name, side by side on a remote store,
        instead of listing the partition: a client that lost a conditional create finds
        the slot it lost (and what followed) with one round of GETs, where a LIST costs
        a round trip of its own before they can be read, and more than a GET.  Slots are
        claimed in order, so only the run up to the first missing one counts.  Returns
        how many records were applied."""
        keys = [self._entry_key(self.next_slot + i) for i in range(PROBE_SLOTS)]

        def probe(key: str) -> bytes | None:
            try:
                return self.store.get(key)
            except ObjectNotFoundError:
                return None

        if self.store.local_requests:
            raws: list[bytes | None] = []
            for key in keys:
                raws.append(probe(key))
                if raws[-1] is None:
                    break
        else:
            raws = fan_out(probe, keys)
        applied = 0
        for key, raw in zip(keys, raws, strict=False):
            if raw is None:
                break
            self._apply(self._decode(raw, key), self.next_slot)
            applied += 1
        return applied

    def _apply(self, d: dict[str, Any], slot: int) -> bool:
        """Replay slot ``slot``'s entry; returns whether it took effect."""
        where = self._entry_key(slot)
        if not isinstance(d.get("record"), dict):
            raise CorruptObjectError(f"state-log object {where} holds no transaction record")
        if "expect" in d and not isinstance(d["expect"], str):
            raise CorruptObjectError(f"state-log object {where} has a malformed expect")
        rec = TxnRecord.from_json(d["record"], where)
        took = counts(d, self.records.get(rec.txn_id))
        if took:
            self._set(rec)
        self.next_slot = slot + 1
        return took

    @staticmethod
    def _decode(raw: bytes, where: str, newest: int = VERSION) -> dict[str, Any]:
        try:
            d = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise CorruptObjectError(
                f"state-log object {where} is not valid JSON (truncated or corrupt)"
            ) from None
        if not isinstance(d, dict) or not isinstance(d.get("v"), int):
            raise CorruptObjectError(f"state-log object {where} has no format version")
        if d["v"] > newest:
            raise UnsupportedFormatError(
                f"state-log object {where} has version {d['v']}, newer than this txlog reads; "
                "upgrade txlog"
            )
        return d

    def _first_load(self) -> list[str] | None:
        """Load the newest checkpoint.  On a remote store, the entries of the first
        FIRST_SLOTS slots are listed beside the checkpoints: a partition that has no
        checkpoint and fewer entries than that (a young one) is then read whole without
        a second listing in sequence.  Returns those entries' keys, or None if the
        entries after the checkpoint are still to be listed."""
        ckpt_prefix = layout.state_log_checkpoint_prefix(self.partition)
        if self.store.local_requests:
            self._load_checkpoint(self.store.list(ckpt_prefix))
            return None
        first = self._entry_key(0)[:-len("00.json")]  # the keys of slots 0-99
        ckpts, young = fan_out(self.store.list, [ckpt_prefix, first])
        self._load_checkpoint(ckpts)
        if self.next_slot == 0 and len(young) < FIRST_SLOTS:
            return young
        return None

    def _load_checkpoint(self, keys: list[str]) -> None:
        for key in reversed(keys):
            try:
                d = self._decode(self.store.get(key), key, CHECKPOINT_VERSION)
                if "crc" in d and d["crc"] != _checkpoint_crc(d["next_slot"], d["records"]):
                    raise CorruptObjectError(f"state-log checkpoint {key} fails its checksum")
                records = {k: TxnRecord.from_json(v, key) for k, v in d["records"].items()}
                self.records, self.next_slot = records, int(d["next_slot"])
                return
            except ObjectNotFoundError:
                continue
            except (CorruptObjectError, KeyError, TypeError, ValueError, AttributeError,
                    OverflowError) as exc:
                log.warning("ignoring unreadable state-log checkpoint %s: %s", key, exc)
        self.records, self.next_slot = {}, 0

    def _set(self, rec: TxnRecord) -> None:
        # A Dead record is a tombstone: the transactional.id is forgotten, and its next
        # init_transactions() starts afresh with a new producer id.
        if rec.state == DEAD:
            self.records.pop(rec.txn_id, None)
        else:
            self.records[rec.txn_id] = rec

    def get(self, txn_id: str) -> TxnRecord | None:
        return self.records.get(txn_id)

    # -- writing -------------------------------------------------------------------------

    def compare_and_set(self, txn_id: str, expected: TxnRecord | None,
                        new: TxnRecord) -> bool:
        """Persist ``new`` only if ``txn_id``'s current record is ``expected``.

        Returns False (without writing) when another client changed the record first.
        """
        with self._lock:
            return self._compare_and_set(txn_id, expected, new)

    def _compare_and_set(self, txn_id: str, expected: TxnRecord | None,
                         new: TxnRecord) -> bool:
        # No re-read first: the put-if-absent of the cached next slot fails if anyone
        # wrote since, and then we read what we lost and compare again (callers just read).
        if not self.loaded:
            self.refresh()
        lost: int | None = None  # the last slot lost to other writers, not yet read
        while True:
            if lost is None:
                if self.records.get(txn_id) != expected:
                    return False
                if self._claim(self.next_slot, txn_id, expected, new) is not None:
                    return True
                lost = self.next_slot
                continue
            # Claim the two slots after the lost one while reading it.  A loser that read
            # first, or claimed only the next slot, found the winner ahead of it again:
            # the winner learns it won before the loser learns it lost, and its next
            # write often follows at once.
            took, backlog = self._claim_reading(lost + 1, lost, expected, new)
            if took is not None:
                return took
            if self.records.get(txn_id) != expected:
                return False
            if backlog:  # more slots taken since: read them all, then claim
                self._refresh()
                lost = None
            else:
                lost += CLAIM_AHEAD

    def _payload(self, slot: int, expected: TxnRecord | None, new: TxnRecord, *,
                 speculative: bool) -> bytes:
        stored = expected
        if new.begins_transaction_after(stored):
            new = replace(new, start_slot=slot)
        elif stored is not None and new.state == ONGOING:
            new = replace(new, start_slot=stored.start_slot)
        entry: dict[str, Any] = {"v": 1, "slot": slot, "token": new_token(),
                                 "record": new.to_json()}
        if speculative:  # (an entry after every slot before it was read needs no expect)
            entry.update(v=VERSION, expect=record_digest(expected))
        return json.dumps(entry, separators=(",", ":")).encode()

    def _claim(self, slot: int, txn_id: str, expected: TxnRecord | None,
               new: TxnRecord) -> bool | None:
        """Claim ``slot``, the next one after every slot read.  None: lost to another
        writer; True: the record is written."""
        payload = self._payload(slot, expected, new, speculative=False)
        if not self.store.put_if_absent(self._entry_key(slot), payload):
            return None
        self._won(payload, slot)
        return True

    def _won(self, payload: bytes, slot: int) -> bool:
        took = self._apply(json.loads(payload), slot)
        if self.next_slot % CHECKPOINT_INTERVAL == 0:
            self._checkpoint()
        return took

    def _claim_reading(self, claim: int, lost: int, expected: TxnRecord | None,
                       new: TxnRecord) -> tuple[bool | None, bool]:
        """Claim slots ``claim`` to ``claim + CLAIM_AHEAD - 1`` speculatively while
        reading the slots from next_slot to ``lost`` (claimed by others).  Returns
        whether the record took effect if a claim was won (else None; the slots read are
        applied either way), and whether the probe found a backlog (every claim lost and
        the slot after them taken too).

        Of two claims won, the later is void once the earlier takes effect (it expected
        the record the earlier replaced), as it is when the earlier is void; every slot
        claimed is either won or already taken, so none is left empty behind a won one
        (unless a put fails without an answer: the error then says the outcome is
        unknown, and the next writer of the partition fills the slot)."""
        slots = range(claim, claim + CLAIM_AHEAD)
        payloads = [self._payload(s, expected, new, speculative=True) for s in slots]
        known = [self._entry_key(s) for s in range(self.next_slot, lost + 1)]

        def read(slot: int) -> bytes | None:
            try:
                return self.store.get(self._entry_key(slot))
            except ObjectNotFoundError:
                return None

        # Besides the claims and the lost slots: the claimed slots but the last (should
        # one be lost and a later one won, the record that took it is needed), and the
        # slot after the claims (a backlog).
        calls: list[Callable[[], object]] = [
            *(partial(self.store.put_if_absent, self._entry_key(s), p)
              for s, p in zip(slots, payloads, strict=True)),
            *(partial(self.store.get, k) for k in known),
            *(partial(read, s) for s in slots[:-1]), partial(read, claim + CLAIM_AHEAD)]
        if self.store.local_requests:  # (the claims first, as on a remote store)
            got = [_outcome(call) for call in calls]
        else:
            got = fan_out(_outcome, calls)
        claims, got = got[:CLAIM_AHEAD], got[CLAIM_AHEAD:]
        reads, early, ahead = got[:len(known)], got[len(known):-1], got[-1]
        won = [i for i, c in enumerate(claims) if c is True]
        failed = [c for c in claims if isinstance(c, Exception)]
        try:
            for key, raw in zip(known, reads, strict=True):
                if isinstance(raw, Exception):
                    raise raw
                assert isinstance(raw, bytes)
                self._apply(self._decode(raw, key), self.next_slot)
            if won and won[0] > 0:  # the earlier slots were taken: read them
                for s in range(claim, claim + won[0]):
                    outcome, raw = claims[s - claim], early[s - claim]
                    if isinstance(outcome, Exception):
                        raise outcome
                    key = self._entry_key(s)
                    if not isinstance(raw, bytes):  # (read before it was written)
                        raw = self.store.get(key)
                    self._apply(self._decode(raw, key), s)
        except Exception as exc:
            if not won:
                raise
            # A record is written, and whether it counts depends on the slots that
            # could not be read: not a definite failure (callers treat those as unwritten).
            raise StorageError(
                f"wrote state-log slot {self._entry_key(claim + won[0])}, but whether it "
                f"takes effect is unknown until the slots before it can be read: {exc}"
            ) from exc
        if won:
            took = self._won(payloads[won[0]], claim + won[0])
            for i in range(won[0] + 1, CLAIM_AHEAD):
                if claims[i] is not True:
                    break
                self._won(payloads[i], claim + i)  # (void: the record moved on)
            return took, False
        if failed:
            raise failed[0]
        if isinstance(ahead, Exception):
            raise ahead
        return None, ahead is not None

    def run(self, txn_id: str, decide: Callable[[TxnRecord | None, Facts], Decision], *,
            complete: Callable[[TxnRecord], TxnEnd],
            expire: Callable[[], object] = _no_expire,
            expired: Callable[[TxnRecord], bool] | None = None,
            new_producer_id: Callable[[], int] | None = None,
            owner: tuple[int, int] | None = None, clock: Callable[[], int] = now_ms,
            attempts: int | None = None) -> TxnRecord | TxnEnd | None:
        """The read-decide-write loop of every state-log operation on ``txn_id``.

        ``decide`` (a pure function of txlog.txn_decide) maps the current record and the
        facts to a decision; this carries it out, with ``complete`` to roll a Prepare*
        forward and ``expire`` to abort a transaction found past its timeout, and decides
        again whenever another client wins the compare-and-set.  Returns the record
        written, the end a completion gave, or what the decision returned.

        ``owner``: the (producer id, epoch) of the producer acting; its own cached record
        is trusted for a decision that ends in a compare-and-set (the put-if-absent of
        the next slot fails if anyone wrote since, and then this re-reads), which saves a
        list per AddPartitions and EndTxn.  ``attempts``: give up after that many reads.
        """
        given: dict[str, Any] = {}
        if expired is not None:
            given["expired"] = expired
        if new_producer_id is not None:
            given["new_producer_id"] = new_producer_id
        fresh = False
        for _ in itertools.repeat(None) if attempts is None else range(attempts):
            cur, fresh = self._current(txn_id, owner, fresh)
            d = decide(cur, Facts(clock(), fresh, **given))
            if isinstance(d, Reread):
                if fresh:
                    raise AssertionError(f"{decide!r} asked to re-read a fresh record")
                fresh = True
            elif isinstance(d, Return):
                return d.end
            elif isinstance(d, Fail):
                raise d.error
            elif isinstance(d, Expire):
                expire()
                raise d.error
            elif isinstance(d, Complete):
                end = replace(complete(d.record), rolled_forward=True)
                if d.error is not None:
                    raise d.error
                if not d.retry:
                    return end
                fresh = True
            else:
                fresh = True
                if not self.compare_and_set(txn_id, cur, d.record):
                    continue
                if not d.complete:
                    return d.record
                end = complete(d.record)
                if not d.retry:
                    return end
        raise ConcurrentTransactionsError(
            f"transactional.id {txn_id!r}: the state log kept changing; retry later"
        )

    def _current(self, txn_id: str, owner: tuple[int, int] | None,
                 fresh: bool) -> tuple[TxnRecord | None, bool]:
        """The record, and whether it was just read from the store.  Only the owner's
        own record in a state the owner left it in (Ongoing, Empty, Complete*) is taken
        from the cache; anything else is re-read."""
        if not fresh and owner is not None and self.loaded:
            cur = self.get(txn_id)
            if cur is not None and (cur.producer_id, cur.epoch) == owner \
                    and (cur.state == ONGOING or cur.state in COMPLETE):
                return cur, False
        self.refresh()
        return self.get(txn_id), True

    def _checkpoint(self) -> None:
        try:
            records = {k: r.to_json() for k, r in self.records.items()}
            body = json.dumps({"v": CHECKPOINT_VERSION, "next_slot": self.next_slot,
                               "records": records,
                               "crc": _checkpoint_crc(self.next_slot, records)},
                              separators=(",", ":")).encode()
            key = self._ckpt_key(self.next_slot)
            self.store.put(key, body)
            for old in self.store.list(layout.state_log_checkpoint_prefix(self.partition))[:-2]:
                if old < key:
                    self.store.delete(old)
        except Exception as exc:
            log.warning("state-log checkpoint failed (retried at the next interval): %s", exc)


def _outcome(call: Callable[[], object]) -> object:
    """``call()``, or the error it raised: a claim made beside reads must not be lost
    to an error of one of them."""
    try:
        return call()
    except Exception as exc:
        return exc


def _checkpoint_crc(next_slot: Any, records: Any) -> int:
    """CRC-32 of a state-log checkpoint's contents, as canonical JSON: a flipped digit in
    an epoch or a state is found rather than trusted (the log is then replayed).  Readers
    before it ignore the field; a checkpoint without one is read unchecked."""
    canonical = json.dumps({"next_slot": next_slot, "records": records}, sort_keys=True,
                           separators=(",", ":"))
    return zlib.crc32(canonical.encode())


class StateLog:
    """All partitions of the state log for one root."""

    def __init__(self, store: ObjectStore, partitions: int = DEFAULT_STATE_PARTITIONS) -> None:
        self.store = store
        self.num_partitions = partitions
        self._parts: dict[int, StateLogPartition] = {}

    def partition_for(self, txn_id: str) -> StateLogPartition:
        p = state_partition_for(txn_id, self.num_partitions)
        part = self._parts.get(p)
        if part is None:
            part = self._parts[p] = StateLogPartition(self.store, p)
        return part

    def used_partitions(self) -> list[int]:
        """The partitions that hold any object, found with one delimiter listing of the
        state log (the names below it, not their history): a root has many more
        partitions than ids in use (an empty one costs nothing on a store), so refreshing
        each in turn would cost a request per partition.  Objects of partitions past the
        root's count are not its own."""
        used = set()
        for name in self.store.list_children(layout.STATE_LOG_PREFIX):
            p = layout.state_partition_of(f"{layout.STATE_LOG_PREFIX}{name}/")
            if p is not None and p < self.num_partitions:
                used.add(p)
        return sorted(used)

    def all_records(self) -> list[TxnRecord]:
        """Every transactional.id's record, from the partitions in use."""
        out: list[TxnRecord] = []
        for p in self.used_partitions():
            part = self._parts.get(p) or self._parts.setdefault(p, StateLogPartition(self.store, p))
            part.refresh()
            out.extend(part.records.values())
        return out
