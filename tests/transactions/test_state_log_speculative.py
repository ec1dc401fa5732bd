"""Speculative state-log entries at the edges: a claimed slot left empty in front of a won
one (its put failed without an answer) and filled later, by another id, by another
client of the same id, or by the loser's own retry; and the ``expect`` digest of a record
read through one or two checkpoints, which must be the digest of the same record read
from its slot, or readers would disagree about whether an entry counts.

Every case ends with every reader agreeing: the clients involved, a reader that replays
the slots one by one, a fresh reader and a reader that starts from a checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from txlog.errors import StorageError
from txlog.layout import data_prefix
from txlog.state_log import StateLogPartition, record_digest
from txlog.storage.base import ObjectStore
from txlog.testing.delegating import DelegatingStore
from txlog.txn_state import PendingAppend, TxnRecord

P = 7  # the partition: every id below is written there, whatever it hashes to


def record(txn_id: str, epoch: int = 0) -> TxnRecord:
    return TxnRecord(txn_id, 1, epoch, "Empty", 60_000, ())


class UnansweredCreates(DelegatingStore):
    """Conditional creates of the keys in ``drop`` fail once without landing, as a
    request that timed out before it reached the server."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.drop: set[str] = set()

    def _call(self, kind: str, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        if kind == "put_if_absent" and key in self.drop:
            self.drop.discard(key)
            raise StorageError(f"conditional create of {key!r} timed out")
        return fn(*args)


def readers_agree(store: ObjectStore, parts: list[StateLogPartition]) -> dict[str, TxnRecord]:
    """Refresh every client in ``parts``, and a fresh reader before and after a
    checkpoint; all must hold the same records and next slot.  Returns the records."""
    for part in parts:
        part.refresh()
    fresh = StateLogPartition(store, P)
    fresh.refresh()
    fresh._checkpoint()
    from_checkpoint = StateLogPartition(store, P)
    from_checkpoint.refresh()
    for part in [*parts, from_checkpoint]:
        assert part.records == fresh.records, part
        assert part.next_slot == fresh.next_slot, part
    return fresh.records


def leave_a_gap(store: ObjectStore) -> tuple[StateLogPartition, StateLogPartition,
                                             StateLogPartition]:
    """Client A (id "a") writes slot 0; B ("b") writes slot 1, behind A's back.  A's next
    compare-and-set loses slot 1 and claims slots 2 and 3 while reading it: the create
    of slot 2 goes unanswered (it never lands) and slot 3 is won, so A cannot tell
    whether its record counts.  Returns A, B and D, a client that read slot 0 only."""
    faulty = UnansweredCreates(store)
    a = StateLogPartition(faulty, P)
    b = StateLogPartition(store, P)
    d = StateLogPartition(store, P)
    assert a.compare_and_set("a", None, record("a"))  # slot 0
    b.refresh()
    d.refresh()
    assert b.compare_and_set("b", None, record("b"))  # slot 1
    faulty.drop.add(a.entry_key(2))
    with pytest.raises(StorageError, match="unknown"):
        a.compare_and_set("a", record("a"), record("a", 1))
    assert not store.exists(a.entry_key(2))
    entry = json.loads(store.get(a.entry_key(3)))
    assert entry["v"] == 2 and entry["expect"] == record_digest(record("a"))
    # Until the gap is filled nobody reads past it: A's record is not changed yet.
    for reader in (StateLogPartition(store, P), b):
        reader.refresh()
        assert reader.get("a") == record("a") and reader.next_slot == 2
    return a, b, d


def test_a_gap_filled_by_another_id_lets_the_entry_after_it_count(
        store_factory: Any) -> None:
    store = store_factory("memory")
    a, b, _ = leave_a_gap(store)
    c = StateLogPartition(store, P)
    c.refresh()
    assert c.compare_and_set("c", None, record("c"))  # fills slot 2
    # Slot 3 expected A's record at epoch 0, which slot 2 (another id) left alone.
    records = readers_agree(store, [a, b, c])
    assert records == {"a": record("a", 1), "b": record("b"), "c": record("c")}
    assert a.next_slot == 4


def test_a_gap_filled_by_another_client_of_the_same_id_voids_the_entry_after_it(
        store_factory: Any) -> None:
    store = store_factory("memory")
    a, b, _ = leave_a_gap(store)
    fencer = StateLogPartition(store, P)
    fencer.refresh()
    # A newer instance of "a" (as a fencing init would) takes slot 2: the record slot 3
    # expected is gone, so slot 3 is void for every reader.
    assert fencer.compare_and_set("a", record("a"), record("a", 5))
    records = readers_agree(store, [a, b, fencer])
    assert records == {"a": record("a", 5), "b": record("b")}
    # A's next compare-and-set on its stale expectation fails without writing.
    assert a.compare_and_set("a", record("a"), record("a", 1)) is False
    assert a.next_slot == 4 and not store.exists(a.entry_key(4))


def test_a_gap_filled_by_the_losers_retry_takes_effect_once(store_factory: Any) -> None:
    store = store_factory("memory")
    a, b, _ = leave_a_gap(store)
    # A retries the same compare-and-set (its outcome was unknown): it claims slot 2,
    # the first it has not read, and wins.  Slot 3 then expected a record that slot 2
    # replaced: void, so the record moved once, not twice.
    assert a.compare_and_set("a", record("a"), record("a", 1))
    assert a.next_slot == 3
    records = readers_agree(store, [a, b])
    assert records == {"a": record("a", 1), "b": record("b")}
    assert a.next_slot == 4
    # The next write of A's builds on epoch 1 and lands after the void slot.
    assert a.compare_and_set("a", record("a", 1), record("a", 2))
    assert readers_agree(store, [a, b])["a"] == record("a", 2)


def test_a_gap_filled_by_a_stale_client_claiming_speculatively_too(
        store_factory: Any) -> None:
    store = store_factory("memory")
    a, b, d = leave_a_gap(store)
    # D read slot 0 only: it loses slot 1, then claims slots 2 (the gap: won) and 3
    # (A's: lost) while reading slot 1.  Its entry at slot 2 is speculative too.
    assert d.next_slot == 1
    assert d.compare_and_set("d", None, record("d"))
    assert json.loads(store.get(d.entry_key(2)))["expect"] == ""
    records = readers_agree(store, [a, b, d])
    assert records == {"a": record("a", 1), "b": record("b"), "d": record("d")}


# --- the expect digest through checkpoints ---------------------------------------------


def rich_records() -> dict[str, TxnRecord]:
    """Records with every field set that a checkpoint might not give back exactly."""
    key = f"{data_prefix('orders', 3)}b0123456789abcdef.crc32-1c2b3a4d.parquet"
    other = f"{data_prefix('orders', 4)}b0123456789abcdef0.parquet"
    return {
        "plain": record("plain", 3),
        "ongoing": TxnRecord("ongoing", 2007, 4, "Ongoing", 45_000,
                             (("orders", 3), ("orders", 4), ("__consumer_offsets", 17)),
                             txn_start_ms=1_795_729_167_360, last_update_ms=1_795_729_167_423,
                             prev_producer_id=2007, prev_epoch=3, prev_outcome="commit",
                             extra={"note": "x", "n": 2, "nested": {"z": [1, None, True]}},
                             start_slot=11),
        "aborted": TxnRecord("aborted", 2008, 9, "CompleteAbort", 60_000, (),
                             txn_start_ms=5, last_update_ms=6, prev_producer_id=2008,
                             prev_epoch=8, abort_reason="fenced", prev_outcome="abort"),
        "deciding": TxnRecord(
            "deciding", 2009, 1, "PrepareCommit", 60_000, (("orders", 3), ("orders", 4)),
            txn_start_ms=7, last_update_ms=8, prev_producer_id=2009, prev_epoch=0,
            pending=(PendingAppend("orders", 3, 12, ((key, 3, 1340, 100, 200, False),)),
                     PendingAppend("orders", 4, 0, ((other, 1, 99, None, None, True),))),
            inline=((key, "UEFSMRUEFQQV"),), start_slot=2),
    }


@pytest.mark.parametrize("round_trips", [1, 2])
def test_a_records_digest_is_the_same_after_checkpoints(store_factory: Any,
                                                        round_trips: int) -> None:
    store = store_factory("memory")
    recs = rich_records()
    writer = StateLogPartition(store, P)
    follower = StateLogPartition(store, P)  # replays every slot, never a checkpoint
    follower.refresh()
    for txn_id, rec in recs.items():
        assert writer.compare_and_set(txn_id, None, rec)
    # ``round_trips`` checkpoints, each written by a client that loaded the one before.
    last = writer
    for i in range(round_trips):
        last._checkpoint()
        loaded = StateLogPartition(store, P)
        loaded.refresh()
        assert loaded.next_slot == writer.next_slot + i
        assert {k: loaded.get(k) for k in recs} == recs
        # Move the partition on, so the next checkpoint is a new object.
        assert loaded.compare_and_set(f"pad-{i}", None, record(f"pad-{i}"))
        last = loaded
    follower.refresh()
    for txn_id, rec in recs.items():
        digest = record_digest(rec)
        assert record_digest(last.get(txn_id)) == digest, txn_id
        assert record_digest(follower.get(txn_id)) == digest, txn_id
    # A client whose records came through the checkpoints loses a slot to another id
    # and claims speculatively, expecting the records as it read them: each entry counts
    # for it, for the follower (which read the slots) and for every other reader.
    stale = last
    nudger = StateLogPartition(store, P)
    for txn_id, rec in recs.items():
        nudger.refresh()
        assert nudger.compare_and_set("nudger", nudger.get("nudger"),
                                      record("nudger", stale.next_slot))
        new = TxnRecord(txn_id, 3000, 1, "Empty", 60_000, ())
        assert stale.compare_and_set(txn_id, rec, new)
        entry = json.loads(store.get(stale.entry_key(stale.next_slot - 1)))
        assert entry["v"] == 2 and entry["expect"] == record_digest(rec), txn_id
    records = readers_agree(store, [stale, follower, writer, nudger])
    for txn_id in recs:
        assert records[txn_id] == TxnRecord(txn_id, 3000, 1, "Empty", 60_000, ()), txn_id
