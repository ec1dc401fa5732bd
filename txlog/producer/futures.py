"""What send() returns: a future per record, resolved once per batch."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass

from txlog.errors import InvalidTxnStateError
from txlog.records import TopicPartition

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int


class _Outcome:
    """What the futures of one batch wait for, shared by all of them: its base offset once
    written, or its error.  A batch resolves in one step, not once per record: setting
    every future took GIL time on the committer per record, which a commit waited for.  A
    batch that joins an earlier one points there (``parent``), its records ``shift``
    places after that batch's first."""

    __slots__ = ("base", "drive", "error", "parent", "shift", "written")

    def __init__(self, written: threading.Event | None = None) -> None:
        self.base = -1
        self.error: BaseException | None = None
        # Set once the batch is resolved (a plain producer's from its first record, a
        # transaction's once the batch is queued for writing).
        self.written = written
        # A batch a commit's markers append: get() writes them itself if they failed
        # (the commit stands; the producer may never be called again).
        self.drive: Callable[[float | None], None] | None = None
        self.parent: _Outcome | None = None
        self.shift = 0

    def root(self) -> tuple[_Outcome, int]:
        """The outcome this one resolves with, and how many records precede it there."""
        o, shift = self, 0
        while o.parent is not None:
            shift += o.shift
            o = o.parent
        return o, shift

    def resolved(self) -> bool:
        return self.base >= 0 or self.error is not None


class SendFuture:
    """Result of :meth:`Producer.send`: the record's offset once its batch is written."""

    __slots__ = ("_meta", "_outcome", "index", "tp")

    def __init__(self, tp: TopicPartition, index: int, outcome: _Outcome) -> None:
        self.tp = tp
        self.index = index  # among its batch's records
        # The metadata is built on first get(): most callers never ask, and building one
        # per record cost a tenth of send()'s time.
        self._meta: RecordMetadata | None = None
        self._outcome = outcome

    def done(self) -> bool:
        return self._outcome.root()[0].resolved()

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """The record's metadata, once its batch is written.  Waits for a batch already
        queued for writing (up to ``timeout`` seconds); a non-transactional producer's
        linger thread queues every batch.  A transactional producer's batch that is
        still filling is queued when full, or on flush or commit: before that this
        raises.  A batch its commit's markers append (``commit.appends.batches``) is
        written a moment after the commit returns; if those markers failed, this
        writes them (retrying up to ``timeout``)."""
        if self._meta is not None and self._outcome.root()[0].error is None:
            return self._meta
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # (again each time: the batch may join a queued one meanwhile)
            o, shift = self._outcome.root()
            if o.resolved():
                break
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if o.drive is not None:
                o.drive(left)
                if o.resolved():
                    break
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if o.written is None or left == 0.0:
                break
            # In slices: a batch left to its commit's markers gets its driver only when
            # the commit names it, and a wait begun before must then drive them too.
            if o.written.wait(_GET_SLICE if left is None else min(_GET_SLICE, left)):
                o, shift = self._outcome.root()
                break
        if o.error is not None:
            raise o.error
        if o.base < 0:
            if o.written is not None:
                raise InvalidTxnStateError(
                    f"record not written within {timeout} s; call flush() to wait for it")
            raise InvalidTxnStateError("record not written yet; call flush() first")
        self._meta = RecordMetadata(self.tp.topic, self.tp.partition,
                                    o.base + shift + self.index)
        return self._meta


#: How long SendFuture.get() waits at a time before it looks again for markers to drive.
_GET_SLICE = 0.1


def _resolve(fut: Future[None], exc: BaseException | None = None) -> None:
    """Resolve ``fut`` unless it already is (two threads may finish one completion)."""
    with contextlib.suppress(InvalidStateError):
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)

