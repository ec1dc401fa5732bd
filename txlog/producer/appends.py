"""Partition appends: registering partitions with the transaction, sequence numbers,
the producer id reset after an unknown outcome, and retries of an append."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa

from txlog import fanout, layout
from txlog.crashpoints import crashpoint
from txlog.errors import (
    ProducerFencedError,
    StorageError,
    TransactionTimeoutError,
    UnknownProducerIdError,
)
from txlog.model import BEGIN, DATA
from txlog.partition_log import AppendResult, AppendSpec, Part, PartitionLog
from txlog.producer.core import ProducerCore
from txlog.records import TopicPartition, now_ms, ts_range
from txlog.txn_state import ABORTED, PREPARE_ABORT, ended_as

if TYPE_CHECKING:
    from txlog.producer.accumulator import _PendingBatch
    from txlog.producer.sender import _Written

_log = logging.getLogger(__name__)


def _given_or_now(ts_min: int | None, ts_max: int | None, untimed: bool,
                  now: int) -> tuple[int | None, int | None]:
    """A batch's timestamp range for its entry: (0, 0) with no record untimed means none
    was given (a staged object's default), so the append time stands for it."""
    if not untimed and not ts_min and not ts_max:
        return now, now
    return ts_min, ts_max



class Appender(ProducerCore):
    def _register(self, tps: list[TopicPartition]) -> None:
        # Every write of the caller's thread registers first: here it waits for the
        # committer (a no-op on the committer thread itself).
        self._await_pipeline()
        if self.transactional_id is None:
            return
        new = [tp for tp in tps if tp not in self._registered]
        if new:
            if not self._complete_into_next(new):
                self._settle()
                self.log.coordinator.add_partitions(self.transactional_id, self.producer_id,
                                                    self.epoch, new)
            self._registered.update(new)

    def _begin_beside(self, tps: list[TopicPartition], decide: Callable[[], None],
                      ) -> list[tuple[TopicPartition, BaseException]]:
        """Run ``decide`` (a commit's PrepareCommit, on this thread) while the
        transaction opens in ``tps`` with a BEGIN entry each (model.BEGIN): neither needs
        the other, so a commit whose batches are unsent waits for its uploads and then
        one round trip, not two.  Raises what ``decide`` raised; else returns the BEGIN
        entries that failed (the commit is decided without them: its markers go to
        those partitions first, see TxnCompleter.write_markers)."""
        if not tps:
            decide()
            return []
        # Read here, on the committer: the properties settle the last commit first, and
        # on a fan-out thread that would wait for the committer, which waits for it.
        pid, epoch = self.producer_id, self.epoch

        def one(tp: TopicPartition | None) -> None:
            if tp is None:
                decide()
                return
            self._append_with_retries(self.log.partition_log(tp), AppendSpec(
                kind=BEGIN, count=0, producer_id=pid, epoch=epoch, transactional=True,
                txn_id=self.transactional_id))
            crashpoint("after_begin")

        items: list[TopicPartition | None] = [None, *tps]
        if self.log.store.local_requests:  # one after another, the decision first
            decide()
            errs: list[BaseException | None] = [None]
            errs += [fanout.errors(one, [tp])[0] for tp in tps]
        else:
            errs = fanout.errors(one, items)
            if errs[0] is not None:
                raise errs[0]
        failed = [(tp, e) for tp, e in zip(tps, errs[1:], strict=True) if e is not None]
        for tp, e in failed:
            if not isinstance(e, Exception):
                raise e  # an interrupt
            _log.debug("BEGIN entry in %s not written beside a decided commit: %s", tp, e)
        return failed

    def _append_now(self, tp: TopicPartition, table: pa.Table) -> int:
        """Write the batch object, then claim the partition's next slot for it."""
        self._register([tp])
        key, nbytes = self.log.partition_log(tp).write_data(table)
        ts_min, ts_max, untimed = ts_range(table)
        return self._append_object(tp, key, table.num_rows, nbytes, ts_min, ts_max, untimed)

    def _append_object(self, tp: TopicPartition, key: str, num_rows: int, nbytes: int,
                       ts_min: int | None, ts_max: int | None, untimed: bool = False,
                       parts: list[Part] | None = None,
                       inline: dict[str, bytes] | None = None) -> int:
        """Register ``tp`` with the transaction (before the first write to it), then claim
        the partition's next slot for the batch object ``key`` (or for ``parts``, several
        objects in one entry: the other arguments are then taken from them).  ``inline``:
        the bytes of objects the entry may carry copies of."""
        now = now_ms()
        ts_min, ts_max = _given_or_now(ts_min, ts_max, untimed, now)
        if parts is not None:  # each part stamped as a single object is
            num_rows = sum(p[1] for p in parts)
            parts = [(*p[:3], *_given_or_now(p[3], p[4], p[5], now), *p[5:]) for p in parts]
        self._register([tp])
        plog = self.log.partition_log(tp)
        if self._reset_pid:
            # An earlier append's outcome is unknown: its sequence numbers may be taken, so
            # other data must not reuse them (it would be taken for a retry of that batch
            # and dropped).  A fresh producer id starts fresh sequences (as KIP-360 does).
            self.producer_id = self.log.coordinator.pids.allocate()
            self._seq.clear()
            self._reset_pid = False
        seq = self._seq.get(tp, 0) if self.idempotent else -1
        spec = AppendSpec(
            kind=DATA, count=num_rows, producer_id=self.producer_id, epoch=self.epoch,
            base_sequence=seq, transactional=self.transactional_id is not None,
            txn_id=self.transactional_id, data=key, nbytes=nbytes, ts_min=ts_min,
            ts_max=ts_max, untimed=untimed, parts=parts, inline=inline or None)
        try:
            try:
                res = self._append_with_retries(plog, spec)
            except UnknownProducerIdError:
                if self.transactional_id is not None:
                    raise
                # The partition forgot this producer (producer.id.expiration.ms): start
                # afresh with a new producer id, as Kafka's client does (KIP-360).
                self.producer_id = self.log.coordinator.pids.allocate()
                self._seq.clear()
                seq = 0
                spec = dataclasses.replace(spec, producer_id=self.producer_id,
                                           base_sequence=0)
                res = self._append_with_retries(plog, spec)
        except Exception:
            if self.idempotent and self.transactional_id is None:
                self._reset_pid = True
            raise
        if self.idempotent:
            self._seq[tp] = seq + num_rows
        if spec.transactional:
            self._held.add(tp)
        crashpoint("after_data_append")
        return res.base_offset

    def _append_with_retries(self, plog: PartitionLog, spec: AppendSpec) -> AppendResult:
        """Retry an append whose outcome is unknown: the same sequence numbers make a
        retry of a batch that did land come back as a duplicate with its first offsets."""
        try:
            return self._append_retrying(plog, spec)
        except ProducerFencedError as exc:
            self._raise_if_timed_out(spec, exc)
            raise

    def _raise_if_timed_out(self, spec: AppendSpec, exc: ProducerFencedError) -> None:
        """A partition refuses a write of a transaction that another client aborted for
        its timeout (the ABORT marker raised the partition's epoch): that is not a newer
        instance, so raise the abortable timeout error that commit would raise."""
        if self.transactional_id is None or not spec.transactional:
            return
        try:
            rec = self.log.coordinator.record(self.transactional_id)
        except Exception:
            return  # keep the fencing error: it is not known to be a timeout
        if rec is None or rec.abort_reason != "timeout":
            return
        mine = (spec.producer_id, spec.epoch)
        if ((rec.producer_id, rec.epoch) == mine and rec.state == PREPARE_ABORT) \
                or ended_as(rec, *mine) == ABORTED:
            raise TransactionTimeoutError(
                f"the transaction of {self.transactional_id!r} ran past "
                f"transaction.timeout.ms ({rec.timeout_ms} ms) and was aborted by another "
                "client; call abort_transaction() and start again") from exc

    def _append_retrying(self, plog: PartitionLog, spec: AppendSpec) -> AppendResult:
        delay = 0.05
        for attempt in range(self.retries + 1):
            try:
                return plog.append(spec)
            except StorageError:
                # (a BEGIN's retry is recognised as its transaction's open entry)
                if attempt == self.retries or (spec.base_sequence < 0 and spec.kind != BEGIN):
                    raise
                plog.state = None  # re-read the log: our view may be behind
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def _append_entries(self, group: list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                                list[_Written]]]) -> None:
        """Append the written objects of one or more steps (in their order): one entry
        per partition, of several objects where a partition has several."""
        by_tp: dict[TopicPartition, list[tuple[_PendingBatch, _Written]]] = {}
        for batches, written in group:
            for (tp, batch), w in zip(batches, written, strict=True):
                by_tp.setdefault(tp, []).append((batch, w))
        items = list(by_tp.items())
        for i, (tp, parts) in enumerate(items):
            try:
                inline = {w.key: w.inline for _, w in parts if w.inline is not None}
                if len(parts) == 1 and not parts[0][1].object_rows:
                    w = parts[0][1]
                    base = self._append_object(tp, w.key, w.rows, w.nbytes, w.ts_min,
                                               w.ts_max, w.untimed, inline=inline)
                else:
                    base = self._append_object(tp, "", 0, 0, None, None, parts=[
                        w.part(w.ts_min, w.ts_max) for _, w in parts], inline=inline)
            except BaseException as exc:
                self._fail_batches([b for _, ps in items[i:] for b, _ in ps], exc)
                # The later partitions' objects: no append named them (this one's may
                # have landed).  Nothing else deletes a claimed step's.
                later = [(t, w.key) for t, ps in items[i + 1:] for _, w in ps]
                self._discard_keys([t for t, _ in later], [k for _, k in later])
                raise
            for batch, w in parts:
                batch.resolve(base)
                batch.set_written()
                base += w.rows

    @staticmethod
    def _fail_batches(batches: list[_PendingBatch], exc: BaseException) -> None:
        for b in batches:
            b.fail(exc)
            b.set_written()

    def _discard_keys(self, tps: list[TopicPartition], keys: list[str]) -> None:
        """Delete batch objects that were never made appendable: no log entry names them
        (none was attempted), so nothing can ever read them.  Best effort.  A shared
        object is kept: another partition's entry may name it (its appends are per
        partition), and an orphan costs only space."""
        for tp, key in zip(tps, keys, strict=True):
            if layout.is_shared(key):
                continue
            try:
                self.log.partition_log(tp).store.delete(key)
            except Exception as exc:  # an unreferenced object costs only space
                _log.warning("could not delete unreferenced batch object %s: %s", key, exc)

