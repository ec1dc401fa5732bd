"""Completing a decided transaction: its markers, then Complete*.

Every path that ends a transaction (a producer's commit or abort, a newer instance's
fence, a timeout abort, an administrator, a reader that finds a Prepare* at a partition's
LSO) comes here once its Prepare* record is durable.  This is the one writer of COMMIT and
ABORT markers: one per registered partition (a commit's also appends the batch objects
its PrepareCommit names), then the Complete* record with the epoch bumped, or, for a
commit, the next transaction's Ongoing record in its place (:meth:`complete_into_next`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from txlog import inline_copies
from txlog.crashpoints import crashpoint
from txlog.fanout import fan_out
from txlog.model import ABORT, COMMIT
from txlog.partition_log import AppendSpec
from txlog.records import TopicPartition, now_ms
from txlog.txn_state import (
    COMMITTED,
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    ONGOING,
    PREPARE_COMMIT,
    PendingAppend,
    TxnEnd,
    TxnRecord,
    bump_epoch,
    ended_as,
    needs_new_producer_id,
)

if TYPE_CHECKING:
    from txlog.producer_ids import ProducerIdAllocator
    from txlog.root import Root
    from txlog.state_log import StateLog


class TxnCompleter:
    """Rolls persisted Prepare* records forward (the coordinator is one)."""

    log: Root
    state_log: StateLog
    pids: ProducerIdAllocator

    def complete(self, prep: TxnRecord) -> TxnEnd:
        """Roll a persisted Prepare* forward: markers to every registered partition, then
        Complete*.  The end says the (id, epoch) for the id's next transaction."""
        self.write_markers(prep)
        return self.finish(prep)

    def write_markers(self, prep: TxnRecord,
                      inline: Mapping[str, bytes] | None = None, *,
                      durable: bool = False) -> None:
        """Write a Prepare* record's markers to every partition it registered; a COMMIT
        marker carries copies of the pending objects ``inline`` holds the bytes of (the
        committing producer's), or else of those the record itself carries.  A record
        that carries copies was decided beside its uploads: each such object is written
        from its copy (if missing) before a marker names it, unless the caller knows
        the uploads landed (``durable``)."""
        commit = prep.state == PREPARE_COMMIT
        crashpoint("after_prepare")

        pending = {(a.topic, a.partition): a for a in prep.pending}
        carried = prep.inline_bytes() if commit and prep.inline else {}
        if not inline and carried:
            inline = carried
        ensure: dict[str, bytes | None] = {} if durable else {
            k: carried.get(k) for k, _ in prep.inline}
        damaged = {k: None for k, v in ensure.items() if v is None}
        if damaged:
            # Before any marker: an object that can be neither found whole nor written
            # from its copy must stop every partition's marker, or the commit is torn.
            inline_copies.ensure_objects(self.log.store, damaged)

        def mark(tp: TopicPartition) -> None:
            self.write_marker(tp, prep.producer_id, prep.epoch, commit,
                              pending.get((tp.topic, tp.partition)), prep.txn_id,
                              inline=inline, ensure=ensure)
            crashpoint("after_marker")

        tps = [TopicPartition(topic, p) for topic, p in prep.partitions]
        # A commit's BEGIN entries are written beside its PrepareCommit, so a partition
        # may not show the transaction yet: its marker goes first.  Marked after the
        # others, a crash in between would leave it where no reader meets the
        # transaction, unmarked, while every partition that holds a reader is done.
        remote = len(tps) > 1 and not self.log.store.local_requests
        unheld: list[TopicPartition] = []
        if commit:  # (loading a partition is a request: side by side on a remote store)
            flags = fan_out(lambda tp: self._unheld(tp, prep), tps) if remote else \
                [self._unheld(tp, prep) for tp in tps]
            unheld = [tp for tp, f in zip(tps, flags, strict=True) if f]
        for wave in (unheld, [tp for tp in tps if tp not in unheld]):
            if len(wave) > 1 and not self.log.store.local_requests:
                # Markers are independent of each other: on a remote store write them in
                # parallel (a 64-partition commit on S3 waited for 64 sequential round
                # trips).
                fan_out(mark, wave)
            else:
                for tp in wave:
                    mark(tp)

    def _unheld(self, tp: TopicPartition, prep: TxnRecord) -> bool:
        """Whether ``tp`` (as cached) shows neither an entry of ``prep``'s transaction
        nor its marker: a reader there would read past the transaction."""
        st = self.log.partition_log(tp).current()
        key = (prep.producer_id, prep.epoch)
        return key not in st.open_txns and st.fence_epoch.get(key[0], -1) < key[1]

    def write_marker(self, tp: TopicPartition, producer_id: int, epoch: int,
                     commit: bool, pending: PendingAppend | None = None,
                     txn_id: str | None = None, *,
                     inline: Mapping[str, bytes] | None = None,
                     ensure: Mapping[str, bytes | None] | None = None) -> None:
        """Append a COMMIT/ABORT marker for (producer_id, epoch) unless one already acts;
        a COMMIT appends the transaction's ``pending`` batch objects in the same entry,
        with copies of those whose bytes ``inline`` holds, after writing those of them
        ``ensure`` holds the bytes of where they are missing."""
        plog = self.log.partition_log(tp)
        # The cached state suffices: a decided transaction stays decided, and append()
        # re-reads the tail and re-checks for another marker if its slot was taken.
        # (A marker that carries batches is found the same way: it raised the fence
        # epoch, so a second roll-forward never appends them twice.)
        st = plog.current()
        if (producer_id, epoch) not in st.open_txns and \
                st.fence_epoch.get(producer_id, -1) >= epoch:
            return
        parts = list(pending.parts) if commit and pending is not None else None
        if parts and ensure:
            inline_copies.ensure_objects(plog.store, {
                p[0]: ensure[p[0]] for p in parts if p[0] in ensure})
        plog.append(AppendSpec(
            kind=COMMIT if commit else ABORT, count=1, producer_id=producer_id, epoch=epoch,
            transactional=True, parts=parts,
            base_sequence=pending.base_sequence if pending is not None and parts else -1,
            txn_id=txn_id if parts else None,
            inline={p[0]: inline[p[0]] for p in parts if p[0] in inline}
            if parts and inline else None))

    def finish(self, prep: TxnRecord) -> TxnEnd:
        """Persist Complete* for a Prepare* record whose markers are written."""
        commit = prep.state == PREPARE_COMMIT
        crashpoint("before_complete")
        part = self.state_log.partition_for(prep.txn_id)
        pid, epoch = bump_epoch(prep, self._fresh_pid_if(needs_new_producer_id(prep)))
        done = prep.transition(COMPLETE_COMMIT if commit else COMPLETE_ABORT,
                               producer_id=pid, epoch=epoch, partitions=(),
                               prev_producer_id=prep.producer_id, prev_epoch=prep.epoch,
                               prev_outcome="commit" if commit else "abort",
                               last_update_ms=now_ms())
        end = TxnEnd.decided(prep)
        if part.compare_and_set(prep.txn_id, prep, done):
            return replace(end, next_id=(pid, epoch))
        cur = part.get(prep.txn_id)
        if cur is not None and ended_as(cur, prep.producer_id, prep.epoch) is not None:
            # Someone else completed it (the same decision).
            return replace(end, next_id=(cur.producer_id, cur.epoch))
        # A newer instance took over since (its init_producer_id rolled this transaction
        # forward): never hand out its epoch, or two live instances would share it.  The
        # epoch we return is already fenced.
        return replace(end, next_id=(pid, epoch))

    def complete_into_next(self, prep: TxnRecord, tps: Iterable[TopicPartition],
                           ) -> TxnEnd | None:
        """Complete a PrepareCommit whose markers are all written, and register ``tps``
        for the same transactional.id's next transaction, in one state-log write
        (CompleteCommit and AddPartitionsToTxn together: a pipelined producer's next
        transaction needs both, one after the other).  The end's next_id is the new
        transaction's; None if the record changed since ``prep`` (another client rolled
        the commit forward, or a newer instance took over): then complete and add
        partitions the usual way, which sees what happened."""
        assert prep.state == PREPARE_COMMIT
        crashpoint("before_complete")
        part = self.state_log.partition_for(prep.txn_id)
        pid, epoch = bump_epoch(prep, self._fresh_pid_if(needs_new_producer_id(prep)))
        now = now_ms()
        nxt = prep.transition(
            ONGOING, producer_id=pid, epoch=epoch,
            partitions=tuple(sorted({(tp.topic, tp.partition) for tp in tps})),
            prev_producer_id=prep.producer_id, prev_epoch=prep.epoch, prev_outcome=COMMITTED,
            txn_start_ms=now, last_update_ms=now, abort_reason="")
        if not part.compare_and_set(prep.txn_id, prep, nxt):
            return None
        crashpoint("after_add_partitions")
        return replace(TxnEnd.decided(prep), next_id=(pid, epoch))

    def _fresh_pid_if(self, needed: bool) -> int | None:
        return self.pids.allocate() if needed else None

