"""A commit decided beside its last uploads: when the batch objects a commit still has
to write are small (each within ``inline.batch.bytes``, all within
``commit.inline.bytes``), its PrepareCommit carries their bytes, registers their
partitions (AddPartitions folded in) and is written while they upload.  The commit
then costs one sequential write, not an upload followed by the decision.

The decision no longer waits for the objects, so whoever rolls it forward writes each
one from its copy where it is missing before a marker names it
(``TxnCompleter.write_markers``); a folded commit writes no BEGIN entry (a BEGIN is only
safe once the record shows its partition), so its partitions meet the transaction at
its markers, as after a crash right after any decision.
"""

from __future__ import annotations

import logging
from concurrent.futures import wait
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txlog import arrow_memory, crashpoints, fanout
from txlog.crashpoints import crashpoint
from txlog.inline_copies import ensure_objects
from txlog.producer.accumulator import Accumulator
from txlog.producer.sender import STEP_OBJECT_UPLOADS, Uploaded, _Upload, _Written
from txlog.records import TopicPartition
from txlog.shared_objects import encode_shared

if TYPE_CHECKING:
    from txlog.producer.accumulator import _PendingBatch
    from txlog.storage import ObjectStore
    from txlog.txn_state import PendingAppend

_log = logging.getLogger(__name__)

#: Crash point hit before each upload of a commit decided beside them; armed, the
#: uploads wait for the decision first, so that a crash there leaves it decided.
AFTER_INLINE_DECISION = "after_inline_decision"

Group = list[tuple[list[tuple[TopicPartition, "_PendingBatch"]], list[_Written]]]


class InlineCommit(Accumulator):

    def _encode_then_write(self, step: _Upload, items: list[tuple[TopicPartition, pa.Table]],
                           ) -> list[_Written]:
        """On a writer thread, for a commit's step: encode its objects first and, if
        they are small enough to travel in PrepareCommit, hand them to the committer
        (``step.encoded``) before putting them; then put them (side by side on a remote
        store).  A shared object travels as one object (its log entries never carry it)."""
        assert step.encoded is not None
        # Each object: the store to put it in, its key and bytes, and per batch in it,
        # (item index, row, object rows).
        encoded: list[tuple[ObjectStore, str, bytes | memoryview,
                            list[tuple[int, int, int]]]] = []
        total, fits = 0, True
        try:
            for unit in self._object_units(items):
                tp, table = items[unit[0]]
                store = self.log.partition_log(tp).store
                if len(unit) == 1:
                    key, data = self.log.partition_log(tp).encode_object(table)
                    members = [(unit[0], 0, 0)]
                else:
                    key, buf, slices = encode_shared(
                        tp.topic, [(items[i][0].partition, items[i][1]) for i in unit])
                    data = memoryview(buf) if store.writes_buffers else buf.to_pybytes()
                    members = [(i, sl.row, sl.object_rows)
                               for i, sl in zip(unit, slices, strict=True)]
                encoded.append((store, key, data, members))
                total += len(data)
                if len(data) > self.inline_bytes or total > self.commit_inline_bytes:
                    fits = False
                    break
        except BaseException:
            step.encoded.set_result(None)
            raise
        placed: list[_Written | None] = [None] * len(items)
        for _, key, data, members in encoded:
            copy = bytes(data) if len(data) <= self.inline_bytes else None
            for i, row, object_rows in members:
                placed[i] = _Written(key, len(data), items[i][1].num_rows,
                                     *step.batches[i][1].ts_range(), inline=copy, row=row,
                                     object_rows=object_rows)
        step.encoded.set_result([w for w in placed if w is not None] if fits else None)
        wait_for_decision = fits and crashpoints.armed(AFTER_INLINE_DECISION)

        def put(item: tuple[ObjectStore, str, bytes | memoryview, Any]) -> None:
            if wait_for_decision:
                step.decided.wait()
                crashpoint(AFTER_INLINE_DECISION)
            item[0].put_new(item[1], item[2])

        try:
            if len(encoded) < 2 or self.log.store.local_requests:
                for item in encoded:
                    put(item)
            else:
                lanes = min(len(encoded), STEP_OBJECT_UPLOADS)

                def lane(i: int) -> None:  # every lanes-th object: that many puts at once
                    for item in encoded[i::lanes]:
                        put(item)

                fanout.fan_out(lane, range(lanes))
        finally:
            encoded.clear()  # (let the bytes go before the rest is written)
            arrow_memory.release()
        rest = [i for i, w in enumerate(placed) if w is None]
        if rest:  # (too large to travel: written as any step's objects are)
            for i, o in zip(rest, self._write_objects([items[i] for i in rest]),
                            strict=True):
                placed[i] = o.written(items[i][1], step.batches[i][1])
        return [w for w in placed if w is not None]  # (every one placed by now)

    def _inline_step(self) -> tuple[_Upload, list[_Written]] | None:
        """On the committer, in a commit's step: the step and its objects (not written
        yet) if they travel in PrepareCommit, else None (the usual path)."""
        step = self._running
        if step is None or step.encoded is None or step.claimed:
            return None
        wait([step.encoded])
        written = step.encoded.result()
        if written is None:
            return None
        if any(tp in self._registered and tp not in self._held for tp, _ in step.batches):
            step.decided.set()  # (nothing waits for it: the uploads go on)
            return None  # (would need a BEGIN entry beside the decision: the usual path)
        return step, written

    def _decide_inline(self, step: _Upload, batches: list[tuple[TopicPartition,
                                                                _PendingBatch]],
                       written: list[_Written], uploaded: Uploaded,
                       pending: tuple[PendingAppend, ...],
                       named: list[tuple[TopicPartition, _PendingBatch, str]],
                       copies: dict[str, bytes]) -> bool:
        """Decide the commit with its objects' bytes (``copies``) while they upload,
        registering the partitions not registered yet in the same write.  Returns
        whether the objects are durable (else its markers write them from the copies
        first); commit_transaction() returns once both are."""
        new = list(dict.fromkeys(tp for tp, _ in batches if tp not in self._registered))
        try:
            self._decide_folded(new, pending, named, copies)
        finally:
            step.decided.set()
        self._registered.update(new)
        wait([uploaded])
        if uploaded.exception() is None:
            return True
        # Decided, but an upload failed: write the objects from their copies now.
        _log.debug("an upload of a decided commit failed (%s); writing it from its copy",
                   uploaded.exception())
        try:
            for (tp, _), w in zip(batches, written, strict=True):
                if w.inline is not None:
                    ensure_objects(self.log.partition_log(tp).store, {w.key: w.inline})
        except Exception as exc:
            _log.warning("objects of a decided commit not written yet (its markers "
                         "write them): %s", exc)
            return False
        return True

    def _decide_folded(self, tps: list[TopicPartition], pending: tuple[PendingAppend, ...],
                       named: list[tuple[TopicPartition, _PendingBatch, str]],
                       copies: dict[str, bytes]) -> None:
        raise NotImplementedError  # (TransactionManager)
