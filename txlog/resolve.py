"""Resolution instead of waiting: settle what holds a partition's LSO (no daemon needed).

A transaction in Prepare* is rolled forward; one past its timeout is fenced and aborted; a
zombie's batch whose transaction is already over gets an ABORT marker.  A transaction that
is merely open and in time keeps holding the LSO, as in Kafka.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from txlog.errors import CorruptObjectError, StorageError
from txlog.partition_state import PartitionState
from txlog.records import TopicPartition
from txlog.storage.create_outcome import write_refused

if TYPE_CHECKING:
    from txlog.root import CoordinatedRoot

MAX_ROUNDS = 16
log = logging.getLogger(__name__)
_warned: set[tuple[str, TopicPartition]] = set()  # (root, partition): warn once each


def resolve_lso(txlog: CoordinatedRoot, tp: TopicPartition) -> PartitionState:
    """Refresh ``tp`` and settle the open transactions at its LSO; returns the new state."""
    plog = txlog.partition_log(tp)
    st = plog.refresh()
    seen: set[tuple[int, int]] = set()
    for _ in range(MAX_ROUNDS):
        txn = st.earliest_open_txn()
        if txn is None or (txn.producer_id, txn.epoch) in seen:
            break
        seen.add((txn.producer_id, txn.epoch))
        # The partition was read above, before the state log is consulted: any marker
        # written before the transaction's Complete* record is already in ``st``.
        if not txlog.coordinator.resolve_open(tp, txn.producer_id, txn.epoch, txn.txn_id):
            break
        st = plog.refresh()
    return st


def resolve_or_read(txlog: CoordinatedRoot, tp: TopicPartition) -> PartitionState:
    """resolve_lso() for readers.  When the root cannot be written (read-only access, or
    the store refuses writes for now), what holds the LSO cannot be settled: read what
    is decided (the LSO stays where the open transaction starts) and warn."""
    try:
        return resolve_lso(txlog, tp)
    except CorruptObjectError:
        raise
    except (StorageError, OSError) as exc:
        if write_refused(exc):
            txlog.coordinator.clock.note_refused()
        first = (txlog.url, tp) not in _warned
        _warned.add((txlog.url, tp))
        (log.warning if first else log.debug)(
            "%s-%s: could not roll forward or abort the transaction holding its LSO (%s: "
            "%s); reading only what is decided. Run `txlog maintain` with write access "
            "to settle it.", tp.topic, tp.partition, type(exc).__name__, exc)
        return txlog.partition_log(tp).refresh()
