"""The producer: Kafka's client API over txlog partition logs.

Non-transactional producers are idempotent by default (a producer id and per-partition
sequence numbers, so a retried append is recognised).  With ``transactional_id`` the
producer runs Kafka's transaction protocol through the in-process coordinator:
partitions are registered before the first write to them, and every transaction end
bumps the epoch.

Records are batched per partition (``batch.size`` bytes or ``linger.ms`` since the first
record, checked on each send) and every batch is written on flush, commit or close.  A
batch is written in the background, as Kafka's sender thread does: its object uploads
(two at a time) and a committer thread appends the entries in order, while the caller
goes on sending; ``flush()`` and commits wait for what was queued, and too much queued
makes ``send()`` wait for the oldest write.  A batch past linger goes on its own once
fewer than two writes are queued (it grows meanwhile); a full one always goes, and takes
the batches past linger along.  A batch joins its partition's last queued batch whose
upload has not started (up to four batch sizes together): behind a backlog, one object
and one entry carry several batches.  A non-transactional producer also runs a
linger thread that queues a batch once ``linger.ms`` has passed with no further send: a
quiet producer's records do not wait for ``flush()``.  (A transactional producer's
records become visible only at commit, which writes them anyway.)  Without a
transaction a failed write fails its batch's futures, those of the writes queued before
the failure was known (nothing lands behind a lost batch), and the next ``flush()``; in
a transaction it fails the transaction, as below.

``commit_transaction()`` returns once PrepareCommit is durable (the outcome is decided
then: anyone who meets it rolls it forward), as Kafka answers EndTxn before its markers
are written.  The committer thread writes the markers and CompleteCommit while the caller
goes on; the next write of a transaction, the next end and ``close()`` come after them,
because the next transaction needs the epoch that CompleteCommit hands out.  When the
next transaction's first write is already queued by then, CompleteCommit is written
together with its AddPartitions, in one state-log write.  ``abort_transaction()``
finishes its markers before it returns.

``commit_transaction_async()`` does not wait even for PrepareCommit: the transaction's
last batches and its PrepareCommit are written by a committer thread while the caller
begins the next transaction (as Flink's two-phase-commit sinks keep producing while the
last checkpoint's transaction commits).  The commit is a step in the same queue as the
batch writes, so the next transaction's entries follow the last one's commit and carry
the epoch it hands out.  In a transaction, if a queued step fails, the later ones are
skipped and the next operation of the caller raises its error: the open transaction (and
the failed one, if it was never decided) must be aborted, or, after a fatal error, the
producer closed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import pyarrow as pa

from txlog import completions, fanout
from txlog.config import normalize_key
from txlog.coordinator import ended_as
from txlog.crashpoints import crashpoint
from txlog.errors import (
    AtomicCreateUnsupportedError,
    ConfigError,
    CorruptObjectError,
    InvalidTopicError,
    InvalidTxnStateError,
    ProducerFencedError,
    RecordTooLargeError,
    StorageError,
    TransactionTimeoutError,
    TxlogError,
    UnknownProducerIdError,
)
from txlog.metrics import record_end_txn
from txlog.model import BEGIN, DATA
from txlog.names import CONSUMER_OFFSETS_TOPIC, INTERNAL_TOPICS, validate_id
from txlog.offsets import encode_offset_commits, offsets_partition
from txlog.partition_log import AppendResult, AppendSpec, Part, PartitionLog
from txlog.partition_state import PartitionState
from txlog.partitioner import RoundRobin, partition_for_key
from txlog.records import (
    CheckedRow,
    TopicPartition,
    checked_kafka_batch,
    checked_row,
    conform,
    largest_record,
    now_ms,
    ts_range,
)
from txlog.txn_state import PREPARE_ABORT, PREPARE_COMMIT, PendingAppend, PendingPart

if TYPE_CHECKING:
    from txlog.log import Log
    from txlog.txn_state import TxnRecord

_log = logging.getLogger(__name__)


class State(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    ABORTING = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"
    CLOSED = "CLOSED"


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


@dataclass
class _PendingBatch:
    rows: list[CheckedRow] = field(default_factory=list)
    tables: list[pa.Table] = field(default_factory=list)
    nbytes: int = 0
    first_ms: int = 0
    table_rows: int = 0  # rows in ``tables`` (counted once per send, not summed)
    # What its futures wait for (its ``written`` event: see _Outcome).
    outcome: _Outcome = field(default_factory=_Outcome)
    # Later batches of the partition that joined this one while it waited to upload
    # (their records follow this batch's; their outcomes point to this one's).
    joined: list[_PendingBatch] = field(default_factory=list)

    # The (min, max) of the timestamps in ``tables`` (None: no record there has one),
    # and whether some record there has none: the log entry's fields.
    ts_min: int | None = None
    ts_max: int | None = None
    untimed: bool = False

    @property
    def written(self) -> threading.Event | None:
        """Set once the batch is resolved (kept in its outcome only, where get() looks)."""
        return self.outcome.written

    def set_event(self) -> None:
        """Give a transaction's batch its ``written`` event (when queued for writing)."""
        if self.outcome.written is None:
            self.outcome.written = threading.Event()

    def resolve(self, base: int) -> None:
        self.outcome.base = base

    def fail(self, exc: BaseException) -> None:
        self.outcome.error = exc

    def count(self) -> int:
        return len(self.rows) + self.table_rows + sum(j.count() for j in self.joined)

    def add_table(self, table: pa.Table, ts: tuple[int | None, int | None, bool]) -> None:
        """Add records already in the topic's schema, with their ts_range()."""
        self.tables.append(table)
        self.table_rows += table.num_rows
        lo, hi, untimed = ts
        if not table.num_rows:
            return
        if lo is not None and hi is not None:
            self.ts_min = lo if self.ts_min is None else min(self.ts_min, lo)
            self.ts_max = hi if self.ts_max is None else max(self.ts_max, hi)
        self.untimed |= untimed

    def seal(self) -> None:
        """Turn the records sent one at a time into a table, on the thread that closes
        the batch (a sender, the linger thread, a commit): building it on a writer
        thread made the writer wait for the GIL, which the sender holds, at every
        pyarrow call, and the uploads fell behind."""
        if self.rows:
            table, lo, hi = checked_kafka_batch(self.rows)
            self.add_table(table, (lo, hi, False))
            self.rows = []

    def ts_range(self) -> tuple[int | None, int | None, bool]:
        """What records.ts_range() gives for the batch's table, joined batches and all
        (every part sealed)."""
        lo = hi = None
        untimed = False
        for part in (self, *self.joined):
            if part.ts_min is not None and part.ts_max is not None:
                lo = part.ts_min if lo is None else min(lo, part.ts_min)
                hi = part.ts_max if hi is None else max(hi, part.ts_max)
            untimed |= part.untimed
        if lo is None or hi is None:
            return None, None, True
        return lo, hi, untimed

    def set_written(self) -> None:
        """Wake every get() waiting on this batch, also on a joined batch's own event (a
        plain producer's batch has one from the start, and a get() may wait on it)."""
        for b in (self, *self.joined):
            if b.written is not None:
                b.written.set()

    def join(self, later: _PendingBatch) -> None:
        """Take ``later``'s records after this batch's (the caller holds the lock that
        keeps this batch's upload from starting)."""
        # (shift before parent: a get() that sees the parent sees the shift too)
        later.outcome.shift = self.count()
        later.outcome.parent = self.outcome
        self.joined.append(later)
        self.nbytes += later.nbytes


def _given_or_now(ts_min: int | None, ts_max: int | None, untimed: bool,
                  now: int) -> tuple[int | None, int | None]:
    """A batch's timestamp range for its entry: (0, 0) with no record untimed means none
    was given (a staged object's default), so the append time stands for it."""
    if not untimed and not ts_min and not ts_max:
        return now, now
    return ts_min, ts_max


def _definite(exc: BaseException) -> bool:
    """Store errors that say the write did not happen: a backend without atomic create,
    or a corrupt object met before the write."""
    return isinstance(exc, (AtomicCreateUnsupportedError, CorruptObjectError))


def _outcome_unknown(exc: BaseException) -> StorageError:
    """The error of a commit whose PrepareCommit write failed without a definite answer
    (a store error, not _definite(); its read-back did not find it landed): it may have
    landed, or still land."""
    return StorageError(
        f"the commit's PrepareCommit write failed ({exc}) and may have landed or still "
        "land: whether its records commit is unknown until abort_transaction() settles "
        "it (it fails if the commit landed) or a new producer's init_transactions() "
        "finishes it; read the partitions before sending those records again")


def _resolve(fut: Future[None], exc: BaseException | None = None) -> None:
    """Resolve ``fut`` unless it already is (two threads may finish one completion)."""
    with contextlib.suppress(InvalidStateError):
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


class _Completion:
    """A decided commit whose markers and CompleteCommit are still to be written."""

    __slots__ = ("batches", "markers", "prep")

    def __init__(self, prep: TxnRecord,
                 batches: list[tuple[TopicPartition, _PendingBatch, str]]) -> None:
        self.prep = prep
        # The batches (partition, batch, object key) its COMMIT markers append
        # (prep.pending): their futures resolve once the markers are written.
        self.batches = batches
        # Resolves once the markers are written (or failed to be: _settle retries them);
        # readers of this process wait for it (txlog.completions).
        self.markers: Future[None] = Future()


class _Upload:
    """The batch objects of one queued step; batches may join it until it starts."""

    __slots__ = ("batches", "claimed", "commit", "dispatched", "nbytes", "started", "step",
                 "uploaded")

    def __init__(self, batches: list[tuple[TopicPartition, _PendingBatch]]) -> None:
        self.batches = batches
        self.nbytes = sum(b.nbytes for _, b in batches)
        self.started = False
        self.dispatched = False  # handed to a writer thread (see Producer._dispatch)
        self.step = 0  # its number among the queued steps, once queued
        self.uploaded: Uploaded | None = None  # the objects' keys, once written
        self.commit = False  # the step commits the transaction (after its batches)
        # Its batches' entries were appended by an earlier step (Producer._claim_ready):
        # it has nothing left to write.
        self.claimed = False


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
#: Batch objects uploading at once (Kafka's producer keeps up to
#: five requests in flight per connection).
MAX_UPLOADS = 2
#: Steps whose objects are being written or whose entries wait for the committer, at
#: most (Kafka's max.in.flight.requests.per.connection); later steps wait to upload, and
#: meanwhile take their partitions' later batches (see Producer._join_queued).
MAX_IN_FLIGHT = 3
#: Uploads at once of the steps a queued commit waits for.  Its caller is blocked (or
#: the commit is the oldest work), so they no longer compete with send() for the GIL,
#: whose hand-over kept the two writers behind while records were being sent
#: (measured in docs/benchmarks.md).
DRAIN_UPLOADS = 4
#: Why sends fail while close() runs (compared by identity: begin_transaction() refuses too).
_CLOSING = "the producer is being closed"
#: Steps (batch writes, pipelined commits) queued before send() waits for the oldest.
MAX_QUEUED_STEPS = 16
#: A queued batch that has not started uploading takes later batches of its partition
#: up to this many ``batch.size``s: behind a backlog, one object and one entry carry
#: several batches, as a Kafka produce request carries every batch ready for its broker
#: (measured in docs/benchmarks.md).
JOIN_BATCHES = 4


class StagedObject(NamedTuple):
    """An already-written batch object to append (see Producer.send_staged_many)."""

    tp: TopicPartition
    key: str
    rows: int
    nbytes: int
    ts_min: int | None = 0
    ts_max: int | None = 0
    untimed: bool = False


class _Written(NamedTuple):
    """A batch object written, with what its log entry needs (worked out by the writer
    thread: the committer appends entries one after another, and every pyarrow call
    there costs it a wait for the GIL, which the sending thread holds)."""

    key: str
    nbytes: int
    rows: int
    ts_min: int | None
    ts_max: int | None
    untimed: bool


Uploaded = Future[list[_Written]]

_PRODUCER_KEYS = {"batch.size", "linger.ms", "buffer.memory", "enable.idempotence",
                  "append.parts", "commit.appends.batches", "transaction.timeout.ms",
                  "retries", "max.request.size"}


class Producer:
    def __init__(self, txlog: Log, *, transactional_id: str | None = None,
                 **config: Any) -> None:
        self.log = txlog
        self.transactional_id = (validate_id("transactional.id", transactional_id)
                                 if transactional_id is not None else None)
        cfg: dict[str, Any] = {k: txlog.config[k] for k in _PRODUCER_KEYS}
        for k, v in config.items():
            key = normalize_key(k)
            if key not in _PRODUCER_KEYS:
                raise ConfigError(
                    f"unknown producer option {k!r}; producer options: "
                    f"{', '.join(sorted(_PRODUCER_KEYS))}")
            from txlog.config import _coerce

            cfg[key] = _coerce(key, v)
        self.batch_size = int(cfg["batch.size"])
        self.linger_ms = int(cfg["linger.ms"])
        # Queued bytes before send() waits (see _backpressure).  32 MiB as in Kafka:
        # every producer is faster than with less, at the cost of a blocking commit
        # waiting for more queued data (docs/benchmarks.md).
        self.buffer_memory = max(int(cfg["buffer.memory"]), 2 * self.batch_size)
        if transactional_id is not None and not cfg["enable.idempotence"]:
            raise ConfigError(
                "a transactional producer needs enable.idempotence=true (transactions are "
                "built on producer ids and sequence numbers); drop enable.idempotence=false "
                "or the transactional_id")
        # A record larger than any of these could never be written (Kafka's checks).
        self._record_limits = sorted([
            (int(cfg["max.request.size"]), "max.request.size"),
            (int(txlog.config["message.max.bytes"]), "message.max.bytes"),
            (self.buffer_memory, "buffer.memory")])
        self._max_record = self._record_limits[0][0]
        self.idempotent = bool(cfg["enable.idempotence"]) or transactional_id is not None
        self.timeout_ms = int(cfg["transaction.timeout.ms"])
        self.retries = int(cfg["retries"])
        self.append_parts = bool(cfg["append.parts"])
        # A commit's batches that no entry appended yet are named in its PrepareCommit and
        # appended by its COMMIT markers (format version 3; needs version 2's parts).
        self.commit_batches = self.append_parts and bool(cfg["commit.appends.batches"]) \
            and transactional_id is not None
        # Written batches a step left to the commit queued behind it (see _write_batches).
        self._deferred: list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                   list[_Written]]] = []
        self._lock = threading.RLock()
        self._pending: dict[TopicPartition, _PendingBatch] = {}
        # Why records cannot be queued now (None: they can); read and set under _lock. A
        # commit, abort or close() takes the pending batches under _lock and closes this
        # there, so a send that passed its state check before them, and takes the lock
        # after, fails instead of queuing into the next transaction or into no write.
        self._sends_closed: str | None = None if transactional_id is None else \
            "no transaction is open"
        self._seq: dict[TopicPartition, int] = {}
        self._reset_pid = False  # set after an append of unknown outcome (non-transactional)
        self._rr = RoundRobin()
        self._tps: dict[str, list[TopicPartition]] = {}  # see _partition_of
        # The last commit, decided, while its markers and CompleteCommit are not all
        # written (see _complete_decided, _complete_into_next and _settle).
        self._completing: _Completion | None = None
        self._settle_lock = threading.Lock()
        self._writer: ThreadPoolExecutor | None = None
        # Pipelined commits (commit_transaction_async): the committer thread runs queued
        # steps in order; _pipeline is the last one queued, _last_commit the last commit.
        # While _pipeline is not done the committer owns _registered, _seq and the
        # producer id and epoch: the caller's thread only queues.
        self._committer: ThreadPoolExecutor | None = None
        self._committer_ident: int | None = None
        self._pipeline: Future[Any] | None = None
        self._last_commit: Future[None] | None = None
        self._pipeline_error: BaseException | None = None
        self._pipeline_error_raised = False  # raised to a caller once already
        self._queued_bytes = 0
        self._queued_steps = 0
        self._steps: collections.deque[Future[Any]] = collections.deque()  # for back-pressure
        # Steps queued and not started, in the committer's order (see _claim_ready), and
        # the one it runs.
        self._order: collections.deque[_Upload] = collections.deque()
        self._running: _Upload | None = None
        # Steps whose uploads wait for a slot (see _dispatch), and the steps being
        # written or waiting for their entries.
        self._to_upload: collections.deque[_Upload] = collections.deque()
        self._in_flight = 0
        self._uploading = 0
        self._closed_through = 0  # the last queued commit's step: no joins up to it
        # Each partition's last queued batch, with its step (see _join_queued).
        self._tails: dict[TopicPartition, tuple[_Upload, _PendingBatch]] = {}
        self._step_ids = 0  # the last queued step's number
        self._skip_through = 0  # without a transaction: steps up to it fail (see _run_queued)
        self._skip_cause: BaseException | None = None  # the failure they fail for
        self._qlock = threading.Lock()  # the committer never takes _lock: the caller may
        # hold it while waiting for the committer
        # The linger thread (non-transactional producers): waits on _wake for batches.
        self._wake: threading.Condition | None = None
        self._lingerer: threading.Thread | None = None
        self._linger_error: BaseException | None = None
        self._producer_id = -1
        self._epoch = 0
        self._registered: set[TopicPartition] = set()
        # Partitions where the open transaction has an entry (BEGIN or DATA): only there
        # may its COMMIT marker append batches (a reader meets the transaction there).
        self._held: set[TopicPartition] = set()
        self._error: BaseException | None = None
        # The state send() needs no further check in (see _check_can_send).
        self._sending_state = State.READY if transactional_id is None else \
            State.IN_TRANSACTION
        if transactional_id is None:
            self.state = State.READY
            if self.idempotent:
                self.producer_id = txlog.coordinator.pids.allocate()
        else:
            self.state = State.UNINITIALIZED

    @property
    def producer_id(self) -> int:
        """This instance's producer id: the next transaction's once the last commit's
        markers are written (waits for them; until a failed attempt is retried by the
        next operation, the ended transaction's)."""
        self._try_settle()
        return self._producer_id

    @producer_id.setter
    def producer_id(self, value: int) -> None:
        self._producer_id = value

    @property
    def epoch(self) -> int:
        """This instance's epoch, as :attr:`producer_id`."""
        self._try_settle()
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch = value

    def _try_settle(self) -> None:
        # Reading an attribute must not raise a store error: the next operation retries
        # the background work and reports its failure.
        if self.transactional_id is None:
            return  # nothing to settle (and no need to wait for background writes)
        try:
            self._settle()
        except Exception:  # raw OSErrors from a filesystem too
            pass

    # -- transactions -----------------------------------------------------------------------

    def init_transactions(self) -> None:
        """Register this instance as the owner of its transactional.id, fencing older ones
        and completing or aborting whatever they left open."""
        self._require_txn()
        if self.state is not State.UNINITIALIZED:
            # As Kafka's client: an instance initialises once (a second call would fence
            # this very instance's open transaction); create a new producer instead.
            raise InvalidTxnStateError(
                f"init_transactions() was already called (state {self.state.value}); it "
                "runs once per producer")
        assert self.transactional_id is not None
        self.producer_id, self.epoch = self.log.coordinator.init_producer_id(
            self.transactional_id, self.timeout_ms)
        self._seq.clear()
        self.state = State.READY

    def begin_transaction(self) -> None:
        self._require_txn()
        self._reap_pipeline()  # a failed pipelined commit fails the next begin
        with self._lock, self._qlock:  # not over a failure another thread has just taken
            if self._sends_closed is _CLOSING:
                self._refuse_send("begin_transaction()")
            self._check_state(State.READY, "begin_transaction()")
            self.state = State.IN_TRANSACTION
            self._sends_closed = None
        if not self._pipelining():  # else the queued commit resets them when it ends
            self._registered.clear()
            self._held.clear()
            self._seq.clear()

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int],
                                    group_id: str) -> None:
        """Commit consumer offsets as part of the transaction (visible only if it commits)."""
        self._require_txn()
        self._check_state(State.IN_TRANSACTION, "send_offsets_to_transaction()")
        validate_id("group.id", group_id)
        self._topic_info(CONSUMER_OFFSETS_TOPIC)  # a failure here fails the transaction
        if not offsets:
            return  # nothing to commit (as in Kafka): no batch of no records
        tp = offsets_partition(self.log, group_id)
        table = encode_offset_commits(group_id, offsets)
        with self._lock:
            self._check_sends_open("send_offsets_to_transaction()")
            self._guard(lambda: self._append_now(tp, table))

    def send_staged(self, tp: TopicPartition, data_key: str, num_rows: int, nbytes: int,
                    ts_min: int | None = 0, ts_max: int | None = 0, *,
                    untimed: bool = False) -> int:
        """Append an already-written batch object (e.g. a Spark task's staged Parquet file)
        to ``tp`` without copying it; returns its base offset.  The object must match the
        topic's schema; the caller checked it when it wrote the file.  An object of no
        records is left out (-1, as Kafka gives for an offset it does not know): a batch
        of none would start where the next one does."""
        if self.transactional_id is not None:
            self._check_state(State.IN_TRANSACTION, "send_staged()")
        tp = TopicPartition(*tp)
        if tp.topic in INTERNAL_TOPICS:
            self._refuse_internal(tp.topic)
        self._topic_info(tp.topic)  # a failure here fails the transaction
        self.log.partition_log(tp)  # validates topic and partition
        with self._lock:
            self._check_sends_open("send_staged()")
            if num_rows <= 0:
                return -1
            return int(self._guard(lambda: self._append_object(
                tp, data_key, num_rows, nbytes, ts_min, ts_max, untimed)))

    def send_staged_many(self, items: list[StagedObject]) -> list[int]:
        """send_staged() for several objects: each partition's appends in the given
        order, different partitions' at the same time in a transaction (their logs are
        independent; the commit comes after all of them, as always).  Returns the base
        offsets in the order of ``items`` (-1 for an object of no records, left out as
        send_staged() leaves it)."""
        if self.transactional_id is not None:
            self._check_state(State.IN_TRANSACTION, "send_staged_many()")
        groups: dict[TopicPartition, list[int]] = {}
        for i, it in enumerate(items):
            tp = TopicPartition(*it.tp)
            if tp.topic in INTERNAL_TOPICS:
                self._refuse_internal(tp.topic)
            self._topic_info(tp.topic)  # a failure here fails the transaction
            self.log.partition_log(tp)  # validates topic and partition
            if it.rows > 0:
                groups.setdefault(tp, []).append(i)
        bases = [-1] * len(items)
        stop = threading.Event()  # one partition failed: the others stop appending

        def append(i: int) -> None:
            it = items[i]
            bases[i] = self._append_object(TopicPartition(*it.tp), it.key, it.rows,
                                           it.nbytes, it.ts_min, it.ts_max, it.untimed)

        def one_partition(tp: TopicPartition) -> None:
            for i in groups[tp]:
                if stop.is_set():
                    return
                try:
                    append(i)
                except BaseException:
                    stop.set()
                    raise

        def append_all() -> None:
            # Registered first, in one state-log write, not by each thread on its own.
            self._register(list(groups))
            if self.transactional_id is None or len(groups) < 2:
                # In the given order: a plain producer's appends land as they go.
                for i in range(len(items)):
                    if items[i].rows > 0:
                        append(i)
                return
            # Every append has ended before the caller goes on.
            errors = [e for e in fanout.errors(one_partition, list(groups)) if e is not None]
            if errors:
                # The gravest decides the state (_guard): a fence or an unknown outcome
                # over an abortable store error; the rest are logged.
                worst = next((e for e in errors
                              if not (isinstance(e, TxlogError) and e.abortable)), errors[0])
                for e in errors:
                    if e is not worst:
                        _log.warning("staged append also failed on another partition: %r", e)
                raise worst

        with self._lock:
            self._check_sends_open("send_staged_many()")
            self._guard(append_all)
        return bases

    def add_partitions_to_transaction(self, tps: Any) -> None:
        """Register ``tps`` with the open transaction in one state-log write (optional:
        every write registers its own partition; this saves a write per partition when
        many are about to be written, e.g. by a Spark commit)."""
        self._require_txn()
        self._check_state(State.IN_TRANSACTION, "add_partitions_to_transaction()")
        tps = [TopicPartition(*tp) for tp in tps]
        for tp in tps:
            self.log.partition_log(tp)  # validates topic and partition
        with self._lock:
            self._check_sends_open("add_partitions_to_transaction()")
            self._guard(lambda: self._register(tps))

    def partitions_for(self, topic: str) -> list[TopicPartition]:
        """The partitions of ``topic`` (raises UnknownTopicError if there is none)."""
        return self.log.partitions_for(topic)

    def metrics(self) -> dict[str, Any]:
        """This producer's state and queue, with the root's store and transaction metrics
        (``Log.metrics()``) under ``"log"``."""
        with self._qlock:
            queued_bytes, queued_steps = self._queued_bytes, self._queued_steps
        return {"transactional_id": self.transactional_id, "state": self.state.value,
                "producer_id": self._producer_id, "epoch": self._epoch,
                "queued_bytes": queued_bytes, "queued_writes": queued_steps,
                "pending_partitions": len(self._pending), "log": self.log.metrics()}

    def send_app_version(self, app_id: str, version: int) -> None:
        """Record, inside this transaction, that ``app_id`` committed ``version`` (Delta's
        txnAppId/txnVersion): visible through committed_app_version() once it commits."""
        from txlog.app_versions import app_version_offsets

        group, offsets = app_version_offsets(app_id, version)
        self.send_offsets_to_transaction(offsets, group)

    def commit_transaction(self) -> None:
        """Commit; returns once the outcome is decided (PrepareCommit is durable)."""
        self._require_txn()
        # The commit is queued behind the transaction's writes, as a pipelined one is:
        # its last batches then upload while the earlier ones are still being appended,
        # and PrepareCommit follows the last entry on the committer thread at once.
        decided, _ = self._queue_commit()
        self._raise_if_failed(decided)

    def commit_transaction_async(self) -> Future[None]:
        """Commit without waiting: the transaction's last batches and its PrepareCommit are
        written by the committer thread, and the caller may begin the next transaction at
        once.  The returned future resolves when the commit is decided (what
        :meth:`commit_transaction` waits for) and its markers are written, or raises why
        it failed; then the producer's next operation raises too, and
        :meth:`abort_transaction` aborts what is open.  (If the markers fail, the
        future still resolves: the commit holds, and the producer writes them later.)  So
        a read in its callbacks, or on a thread they wait for, sees the commit, and the
        future cannot be cancelled.

        Sends of the next transaction are queued behind this commit (up to
        ``buffer.memory`` or 16 flushes of them, then ``send()`` waits).  This call
        queues the commit (its batches start uploading), then waits until the previous
        commit is decided, so at most one undecided commit is left when it returns.  If
        the previous commit failed, this one is not written and its error is raised
        here.  Do not call the
        producer from a callback of the returned future: callbacks run on the committer
        thread, which must not wait for itself."""
        self._require_txn()
        prev = self._last_commit
        undecided = prev is not None and not prev.done()  # else reaped below or before
        _, fut = self._queue_commit()
        if prev is None or not undecided:
            return fut
        # If that commit failed, this one is skipped: raise its cause now.
        self._raise_if_failed(prev)
        return fut

    def _raise_if_failed(self, decided: Future[None]) -> None:
        """Wait for a commit's decision; if it failed, wait for the queued steps, take the
        state the failure leaves (abortable or fatal) and raise it."""
        wait([decided])
        exc = decided.exception()
        if exc is not None:
            self._await_pipeline()  # raises it, unless another thread took it first
            raise exc

    def _queue_commit(self) -> tuple[Future[None], Future[None]]:
        """Queue the open transaction's last batches and its commit on the committer;
        returns the future of the decision, and the caller's future, which resolves
        once the markers are written too (or failed to be: the commit holds, and they are
        written later), so that what its callbacks do sees the commit."""
        self._reap_pipeline()
        self._check_can_end()
        with self._lock:
            self._check_can_end()  # again: a send may have failed the transaction meanwhile
            self._check_sends_open("commit_transaction()")  # not ended by another thread
            self._sends_closed = "its transaction is being committed"
            self._seal_pending(list(self._pending))  # raises: nothing is committed
            batches = self._join_queued(list(self._pending.items()))
            self._pending.clear()
        # Queue first: this transaction's objects upload while the last commit is still
        # being decided (the committer runs the steps in order, so only the uploads,
        # which need no epoch, overlap).
        decided: Future[None] = Future()
        done: Future[None] = Future()
        done.set_running_or_notify_cancel()  # a commit cannot be called off once queued
        try:
            self._queue(self._commit_queued, batches, [decided, done])
        except BaseException as exc:
            # Not queued, and its batches are failed: it must not be committed without them.
            with self._qlock:
                if self.state == State.IN_TRANSACTION:
                    self.state = State.ABORTABLE_ERROR
                    self._error = exc
            raise
        self._last_commit = decided
        with self._qlock:  # not over a failure another thread has just taken
            if self.state == State.IN_TRANSACTION:
                self.state = State.READY
        return decided, done

    def _check_can_end(self) -> None:
        if self.state == State.ABORTABLE_ERROR:
            raise InvalidTxnStateError(
                f"cannot commit: the transaction hit an error ({self._error}); "
                "call abort_transaction()")
        self._check_state(State.IN_TRANSACTION, "commit_transaction()")

    def abort_transaction(self) -> None:
        self._require_txn()
        self._await_pipeline(quiet=True)  # its failure leaves an abortable state
        if self.state not in (State.IN_TRANSACTION, State.ABORTABLE_ERROR):
            raise InvalidTxnStateError(f"abort_transaction() in state {self.state.value}")
        with self._lock:
            if self._sends_closed is not None and self.state is State.IN_TRANSACTION:
                self._refuse_send("abort_transaction()")  # a commit was queued
            self._sends_closed = "its transaction is being aborted"
            for batch in self._pending.values():
                batch.fail(InvalidTxnStateError("transaction aborted before the batch was sent"))
            self._pending.clear()
        with self._qlock:
            self._tails.clear()
        self._abort_now()

    def _abort_now(self) -> None:
        """EndTxn(abort) on the caller's thread (a commit is a step of the committer)."""
        assert self.transactional_id is not None
        self.state = State.ABORTING
        try:
            self._decide(commit=False)
            with self._qlock:  # what failed is aborted: later steps run again
                self._pipeline_error, self._pipeline_error_raised = None, False
        except ProducerFencedError as exc:
            self._fatal(exc)
            raise
        except TxlogError as exc:
            if exc.abortable:
                self.state = State.ABORTABLE_ERROR
                self._error = exc
            else:
                self._fatal(exc)
            raise
        except Exception as exc:
            # Not a txlog error (a raw OSError from a filesystem): the abort may be
            # retried (a landed PrepareAbort is rolled forward), not left in ABORTING.
            self.state = State.ABORTABLE_ERROR
            self._error = exc
            raise
        self._registered.clear()
        self._held.clear()
        self._seq.clear()
        self.state = State.READY

    def _decide(self, commit: bool, pending: tuple[PendingAppend, ...] = (),
                batches: list[tuple[TopicPartition, _PendingBatch, str]] | None = None,
                ) -> None:
        """Write Prepare* (an abort also its markers and Complete*; a commit's are left
        to _complete_decided).  A commit's ``pending`` batch objects (``batches``) are
        named in PrepareCommit and appended by its markers."""
        assert self.transactional_id is not None
        t0 = time.perf_counter()
        coord = self.log.coordinator
        self._settle()
        step = coord.prepare_end(self.transactional_id, self.producer_id, self.epoch, commit,
                                 pending)
        if isinstance(step, tuple):
            self.producer_id, self.epoch = step
            if batches:  # it ended as a commit already: whoever ended it appended them
                self._resolve_batches(batches)
        elif not commit:
            # An abort is the error path: finish it before returning, so nothing of the
            # failed transaction is left to settle.
            self.producer_id, self.epoch = coord.complete(step)
        else:
            c = _Completion(step, batches or [])
            completions.track(self.log.store.identity, step.producer_id, step.epoch,
                              c.markers)
            self._completing = c
        record_end_txn(self.log, commit, (time.perf_counter() - t0) * 1000)

    # -- the committer thread (pipelined commits) ------------------------------------------

    def _pipelining(self) -> bool:
        """True while queued steps (writes, pipelined commits) are outstanding."""
        return self._pipeline is not None and not self._pipeline.done()

    def _reap_pipeline(self) -> None:
        """Take the outcome of queued steps that are all done (raising a failure) without
        waiting for any."""
        if (self._pipeline is not None and self._pipeline.done()) or \
                self._pipeline_error is not None:
            self._await_pipeline()

    def _in_committer(self) -> bool:
        return threading.get_ident() == self._committer_ident

    def _queue(self, fn: Any, batches: list[tuple[TopicPartition, _PendingBatch]],
               outcome: list[Future[None]] | None = None) -> Any:
        """Run ``fn(batches, uploaded)`` (a commit: ``fn(batches, uploaded, outcome)``) on
        the committer thread after everything queued before; the batches' objects are
        written meanwhile.  The ``outcome`` futures get the step's failure if it fails or
        is skipped."""
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix=(
                f"txlog-commit-{self.transactional_id}" if self.transactional_id is not None
                else "txlog-send"))
        step = _Upload(batches)
        nbytes = step.nbytes
        for _, b in batches:
            b.set_event()  # a transaction's batch: get() may now wait for it
        with self._qlock:
            self._queued_bytes += nbytes
            self._queued_steps += 1
        uploaded: Uploaded | None = Future() if batches else None
        step.uploaded = uploaded
        try:
            with self._qlock:  # callers on several threads: one order of steps, _pipeline
                self._step_ids += 1
                step.step = self._step_ids
                step.commit = outcome is not None
                fut = self._committer.submit(self._run_queued, fn, batches, step,
                                             uploaded, self._step_ids, outcome)
                self._order.append(step)  # (under _qlock: before the step can start)
                if outcome is not None:  # a commit: later batches never join this
                    self._tails.clear()  # transaction's (cleared with the step queued)
                    self._closed_through = step.step
                else:
                    for tp, b in batches:  # a later batch may join these
                        self._tails[tp] = (step, b)
                if uploaded is not None:  # uploads start in the committer's order
                    self._to_upload.append(step)
                if uploaded is not None or outcome is not None:
                    # (a commit lifts the in-flight bound of the steps before it)
                    self._dispatch()
                self._pipeline = fut
                while self._steps and self._steps[0].done():  # steps end in order
                    self._steps.popleft()
                self._steps.append(fut)
        except BaseException as exc:  # e.g. a send racing close(): the pools are shut
            with self._qlock:
                self._queued_bytes -= nbytes
                self._queued_steps -= 1
                if self.transactional_id is not None and self._pipeline_error is None:
                    # The transaction lost these batches: it must not commit.
                    self._pipeline_error, self._pipeline_error_raised = exc, True
            self._fail_batches([b for _, b in batches], exc)
            raise
        return fut

    def _run_queued(self, fn: Any, batches: list[tuple[TopicPartition, _PendingBatch]],
                    upload: _Upload, uploaded: Uploaded | None, step: int,
                    outcome: list[Future[None]] | None) -> Any:
        self._committer_ident = threading.get_ident()
        with self._qlock:
            if self._order and self._order[0] is upload:
                self._order.popleft()
            elif upload in self._order:  # (steps start in order: not expected)
                self._order.remove(upload)
        self._running = upload
        try:
            if self._pipeline_error is not None or step <= self._skip_through:
                # Skipped: an earlier step failed.  In a transaction, the open
                # transaction cannot commit.  Without one, the writes queued before the
                # failure was known fail too, so nothing lands behind a lost batch (as
                # Kafka fails the batches in flight behind one); later writes go on.
                exc = InvalidTxnStateError(
                    f"not written: an earlier queued write failed "
                    f"({self._pipeline_error or self._skip_cause})")
                with self._qlock:
                    upload.started = True  # nothing joins a failed step from here on
                    if uploaded is not None and not upload.dispatched:
                        self._to_upload.remove(upload)  # and nothing uploads for it
                        uploaded.set_exception(exc)
                if not upload.claimed:  # (else the step that claimed it settled them)
                    self._fail_batches([b for _, b in batches], exc)
                if outcome is not None and self._deferred:  # left to this commit
                    group, self._deferred = self._deferred, []
                    self._drop_group(group, exc, discard=True)
                for f in outcome or ():
                    _resolve(f, exc)
                if uploaded is not None and not upload.claimed:  # (claimed: attempted)
                    wait([uploaded])
                    if uploaded.exception() is None:
                        self._discard_keys([tp for tp, _ in batches],
                                           [w.key for w in uploaded.result()])
                raise exc
            try:
                if upload.claimed:  # its entries are appended: only a commit is left
                    batches, uploaded = [], None
                if outcome is not None:
                    return fn(batches, uploaded, outcome)
                return fn(batches, uploaded)
            except BaseException as exc:
                for f in outcome or ():
                    _resolve(f, exc)
                with self._qlock:
                    if self.transactional_id is not None:
                        if self._pipeline_error is None:
                            self._pipeline_error, self._pipeline_error_raised = exc, False
                    else:
                        # Without a transaction the batches' futures carry the error,
                        # and the next flush() raises it.
                        self._skip_through = self._step_ids
                        self._skip_cause = exc
                        if self._linger_error is None:
                            self._linger_error = exc
                raise
        finally:
            self._running = None
            with self._qlock:
                self._queued_bytes -= upload.nbytes
                self._queued_steps -= 1
                if upload.dispatched:
                    self._in_flight -= 1
                elif upload.uploaded is not None and upload in self._to_upload:
                    # (every path waits for its upload or takes it out of the queue;
                    # this only keeps the queue right if one ever does neither)
                    self._to_upload.remove(upload)
                    upload.uploaded.set_exception(InvalidTxnStateError("not written"))
                self._dispatch()  # the next upload may start

    def _commit_queued(self, batches: list[tuple[TopicPartition, _PendingBatch]],
                       uploaded: Uploaded | None, outcome: list[Future[None]]) -> None:
        decided, done = outcome
        group, self._deferred = self._deferred, []
        if not self.commit_batches:
            self._write_batches(batches, uploaded)
            self._settle()  # the last commit's errors are its own, not this PrepareCommit's
            try:
                self._decide(commit=True)
            except (StorageError, OSError) as exc:
                if _definite(exc):
                    raise
                raise _outcome_unknown(exc) from exc
        else:
            # No DATA entry before the decision: PrepareCommit names the objects written
            # since the last entry, and the markers append them (one entry per partition).
            try:
                group += self._write_batches(batches, uploaded, defer=True)
            except BaseException as exc:
                self._drop_group(group, exc, discard=True)  # never named anywhere
                raise
            group = self._append_unheld(group)
            pending, named = self._pending_appends(group)
            try:
                self._settle()  # (as above)
            except BaseException as exc:
                self._drop_group(group, exc, discard=True)  # never named anywhere
                raise
            try:
                self._decide(commit=True, pending=pending, batches=named)
            except BaseException as exc:
                if not isinstance(exc, (StorageError, OSError)) or _definite(exc):
                    self._drop_group(group, exc, discard=False)
                    raise
                if not self._decided_after_all(named):
                    # Not discarded: a PrepareCommit of unknown outcome may name them,
                    # and whoever rolls it forward appends them.  The futures must not
                    # read as "not written": resending those records could duplicate them.
                    unknown = _outcome_unknown(exc)
                    self._drop_group(group, unknown, discard=False)
                    raise unknown from exc
        self._registered.clear()
        self._held.clear()
        self._seq.clear()
        _resolve(decided)  # a blocking commit_transaction() returns; the markers follow
        try:
            self._complete_decided()
        finally:
            # The caller's future (and its callbacks, on this thread) once the markers
            # are written: a read there, or on a thread it waits for, sees the commit.
            _resolve(done)

    def _decided_after_all(self, named: list[tuple[TopicPartition, _PendingBatch, str]],
                           ) -> bool:
        """After PrepareCommit failed with a store error: read the record once more.
        True if the commit landed after all (then it goes on as decided: failing the
        futures of batches that end up committed would invite a resend, a duplicate)."""
        assert self.transactional_id is not None
        pid, epoch = self._producer_id, self._epoch
        try:
            rec = self.log.coordinator.record(self.transactional_id)
        except Exception:
            return False  # still unknown: the error stands
        if rec is None or self._completing is not None:
            return False
        if rec.state == PREPARE_COMMIT and (rec.producer_id, rec.epoch) == (pid, epoch):
            c = _Completion(rec, named)
            completions.track(self.log.store.identity, pid, epoch, c.markers)
            self._completing = c
            return True
        if ended_as(rec, pid, epoch) == "commit":  # rolled forward by someone already
            self._producer_id, self._epoch = rec.producer_id, rec.epoch
            self._resolve_batches(named)
            return True
        return False

    def _pending_appends(self, group: list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                                 list[_Written]]],
                         ) -> tuple[tuple[PendingAppend, ...],
                                    list[tuple[TopicPartition, _PendingBatch, str]]]:
        """The written objects of ``group`` as PrepareCommit's pending appends (one per
        partition, in order, each from the partition's next sequence number), and the
        batches they carry."""
        now = now_ms()
        by_tp: dict[TopicPartition, list[PendingPart]] = {}
        named: list[tuple[TopicPartition, _PendingBatch, str]] = []
        for batches, written in group:
            for (tp, batch), w in zip(batches, written, strict=True):
                if w.rows <= 0:  # (nothing to append: resolved at once)
                    batch.resolve(0)
                    batch.set_written()
                    continue
                by_tp.setdefault(tp, []).append(
                    (w.key, w.rows, w.nbytes, *_given_or_now(w.ts_min, w.ts_max, w.untimed, now),
                     w.untimed))
                named.append((tp, batch, w.key))
                batch.outcome.drive = self._drive_markers
        pending = tuple(PendingAppend(tp.topic, tp.partition,
                                      self._seq.get(tp, 0) if self.idempotent else -1,
                                      tuple(parts)) for tp, parts in by_tp.items())
        return pending, named

    def _append_unheld(self, group: list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                              list[_Written]]],
                       ) -> list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                       list[_Written]]]:
        """Append the batches of ``group`` in partitions where the transaction holds
        no entry yet (a COMMIT marker may only append where a reader meets the
        transaction first); returns the rest."""
        if all(tp in self._held for batches, _ in group for tp, _ in batches):
            return group
        now: list[tuple[list[tuple[TopicPartition, _PendingBatch]], list[_Written]]] = []
        later: list[tuple[list[tuple[TopicPartition, _PendingBatch]], list[_Written]]] = []
        for batches, written in group:
            for keep, out in ((False, now), (True, later)):
                pairs = [(b, w) for b, w in zip(batches, written, strict=True)
                         if (b[0] in self._held) == keep]
                if pairs:
                    out.append(([b for b, _ in pairs], [w for _, w in pairs]))
        try:
            self._append_entries(now)
        except BaseException as exc:
            self._drop_group(later, exc, discard=True)
            raise
        return later

    def _drop_group(self, group: list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                           list[_Written]]],
                    exc: BaseException, *, discard: bool) -> None:
        """Fail the batches of a group no commit appends; ``discard``: delete their
        objects too (only when nothing can name them)."""
        self._fail_batches([b for batches, _ in group for _, b in batches], exc)
        if discard:
            tps = [tp for batches, _ in group for tp, _ in batches]
            self._discard_keys(tps, [w.key for _, written in group for w in written])

    def _drive_markers(self, timeout: float | None) -> None:
        """For SendFuture.get() of a batch the last commit's markers append: wait for
        the committer to write them; if that failed, write them here (retrying, up to
        ``timeout``), so the batch's offsets come without another producer call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            c = self._completing
            if c is None or not c.batches:
                return  # resolved, or being resolved right now
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not c.markers.done():
                wait([c.markers], timeout=left)
                if not c.markers.done():
                    return  # out of time
                continue
            if c.markers.exception() is None:
                return  # the committer resolves the batches next
            try:
                self._finish_completion(c)  # (or another thread finishes it)
                return
            except (CorruptObjectError, AtomicCreateUnsupportedError) as exc:
                # Retrying cannot help: the commit holds, and the futures say why their
                # offsets are unknown (the producer's next operation raises it too).
                _log.warning("markers of a decided commit cannot be written: %s", exc)
                self._resolve_appended(c, exc)
                return
            except (StorageError, OSError) as exc:
                _log.debug("markers of a decided commit not written yet: %s", exc)
                if left is not None and left <= delay:
                    return
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except Exception:
                # Fenced, or the record moved on: a newer instance rolled the commit
                # forward (then the log has the batches) or nothing will.  The producer's
                # next operation reports the error; the futures get what the log says.
                self._resolve_appended(c)
                return

    def _resolve_appended(self, c: _Completion, why: BaseException | None = None) -> None:
        """Give the futures of the batches a commit's markers appended their offsets."""
        batches, c.batches = c.batches, []
        self._resolve_batches(batches, why)

    def _resolve_batches(self, batches: list[tuple[TopicPartition, _PendingBatch, str]],
                         unwritten: BaseException | None = None) -> None:
        """Give each batch's futures the offset of its object in the log (its marker is
        written), or an error if the object is not there (``unwritten``: why the
        markers could not be written)."""
        if not batches:
            return
        by_tp: dict[TopicPartition, list[tuple[_PendingBatch, str]]] = {}
        for tp, batch, key in batches:
            by_tp.setdefault(tp, []).append((batch, key))
        for tp, items in by_tp.items():
            plog = self.log.partition_log(tp)
            why: BaseException | None = None
            try:
                found = _find_objects(plog.current(), [k for _, k in items])
                if len(found) < len(items):  # another client's roll-forward wrote them
                    found = _find_objects(plog.refresh(), [k for _, k in items])
            except Exception as exc:  # the commit holds: only the offsets are unknown
                found, why = {}, exc
            for batch, key in items:
                if key in found:
                    batch.resolve(found[key])
                elif unwritten is not None:
                    batch.fail(TxlogError(
                        f"the batch is committed, but the marker that appends it to "
                        f"{tp.topic}-{tp.partition} cannot be written ({unwritten}); "
                        "repair the store: the producer's next operation, a reader "
                        "or `txlog maintain` then writes it"))
                else:
                    batch.fail(TxlogError(
                        f"the batch committed, but its offset in {tp.topic}-"
                        f"{tp.partition} is unknown "
                        f"({why or 'not in the log: compacted since?'}); "
                        "read the partition to find its records"))
                batch.set_written()

    def _complete_decided(self) -> None:
        """On the committer thread, right after a commit's decision: write its markers,
        then CompleteCommit, unless more steps are queued behind: then the next
        transaction's first AddPartitions writes CompleteCommit with it (one state-log
        write; see Coordinator.complete_into_next).  Failures are left to _settle, which
        writes whatever is missing (the commit is decided either way)."""
        c = self._completing
        if c is None:
            return
        coord = self.log.coordinator
        try:
            with completions.running():
                coord.write_markers(c.prep)
        except BaseException as exc:
            _resolve(c.markers, exc)  # readers waiting for them go on
            if not isinstance(exc, Exception):
                raise
            _log.debug("markers of a decided commit not written yet: %s", exc)
            return
        _resolve(c.markers)
        self._resolve_appended(c)
        with self._qlock:
            if self._queued_steps > 1:  # this step counts itself
                return
        with self._settle_lock:
            if self._completing is not c:
                return  # another thread's _settle finished it
            try:
                self._producer_id, self._epoch = coord.finish(c.prep)
            except Exception as exc:
                _log.debug("CompleteCommit not written yet: %s", exc)
                return
            self._completing = None

    def _await_pipeline(self, *, quiet: bool = False) -> None:
        """Wait for the steps queued so far (the committer is then idle, unless another
        thread queued more meanwhile, as flush() allows).  If a step failed, the open
        transaction cannot
        commit: the state becomes ABORTABLE_ERROR (or FATAL_ERROR, as the same error would
        make it in the caller's thread) and, unless ``quiet``, the error is raised."""
        if self._in_committer():
            return
        fut = self._pipeline
        if fut is not None:
            wait([fut])  # steps run in order: everything queued before it is done too
        with self._qlock:
            exc = self._pipeline_error
            if fut is not None and self._pipeline is fut:  # else another thread queued
                self._pipeline = None  # more meanwhile: keep tracking it
            if exc is None:
                return
            # The failure stays until the transaction is aborted (or the producer
            # re-initialised): later steps are skipped, and every thread that waits
            # here leaves the state it calls for, whichever took it first.  It is
            # raised once; later operations raise for the state.
            self._error = exc
            if self.state not in (State.FATAL_ERROR, State.CLOSED):
                if isinstance(exc, TxlogError) and exc.abortable:
                    self.state = State.ABORTABLE_ERROR
                else:  # fenced, or the outcome of a write is unknown
                    self.state = State.FATAL_ERROR
            raise_now = not quiet and not self._pipeline_error_raised
            if raise_now:
                self._pipeline_error_raised = True
        if raise_now:
            raise exc

    def _settle(self) -> None:
        """Finish the last commit's markers and Complete* where _complete_decided left
        them (a store error, or Complete* left to a next transaction that did not write
        it), and take the (id, epoch) for the next transaction.  The outcome was decided,
        so this only retries writing it down."""
        self._await_pipeline(quiet=True)  # a failed step is raised by the operation
        if self._completing is not None:
            self._finish_completion(None)

    def _finish_completion(self, c: _Completion | None) -> None:
        """Write what is missing of completion ``c`` (None: the one left, if any) with
        end_txn, take the (id, epoch) for the next transaction, and resolve what waits
        for it.  A no-op if another thread finished it meanwhile."""
        assert self.transactional_id is not None
        # One thread at a time: the committer may be folding or finishing the same
        # completion (after another thread queued more), and only one may hand out the
        # next epoch.
        with self._settle_lock:
            c = self._completing if c is None else c
            if c is None or self._completing is not c:
                return
            self._producer_id, self._epoch = self.log.coordinator.end_txn(
                self.transactional_id, c.prep.producer_id, c.prep.epoch, commit=True)
            self._completing = None
        _resolve(c.markers)  # end_txn wrote them (if the committer has not said so yet)
        self._resolve_appended(c)

    def _complete_into_next(self, tps: list[TopicPartition]) -> bool:
        """Register ``tps`` in the state-log write that completes the last commit, whose
        markers are written (see Coordinator.complete_into_next).  False: settle and add
        partitions the usual way."""
        with self._settle_lock:
            c = self._completing
            if c is None or not c.markers.done() or c.markers.exception() is not None:
                return False
            got = self.log.coordinator.complete_into_next(c.prep, tps)
            if got is None:
                return False  # someone else completed it: _settle takes what they wrote
            self._producer_id, self._epoch = got
            self._completing = None
            return True

    # -- sending ---------------------------------------------------------------------------

    def send(self, topic: str, value: Any = None, key: Any = None, *,
             partition: int | None = None, headers: Any = None,
             timestamp_ms: int | None = None) -> SendFuture:
        """Queue one record; returns a future whose offset is known after flush()."""
        # Called once per record: the common case avoids every call and allocation it
        # can (a sum over an empty generator, a lock in Log.topic() and a new
        # TopicPartition per record were a third of the producer's GIL time).
        if self.state is not self._sending_state:
            self._check_can_send()
        if topic in INTERNAL_TOPICS:
            self._refuse_internal(topic)
        info = self._topic_info(topic)
        if not info.kafka_shaped:
            if not isinstance(value, Mapping):
                raise TypeError(
                    f"topic {topic!r} is typed: send a dict of its columns as value, or "
                    "use send_batch() with an Arrow table")
            return self._queue_table(topic, pa.Table.from_pylist([dict(value)]), partition,
                                     key)
        row = checked_row(key, value, headers, timestamp_ms)
        kb, vb = row[0], row[1]
        tp = self._partition_of(topic, info.partitions, partition, kb)
        size = (len(kb) if kb else 0) + (len(vb) if vb else 0)
        if row[2]:
            size += sum(len(h["key"].encode()) + len(h["value"] or b"") for h in row[2])
        if size > self._max_record:
            self._too_large(topic, size)
        with self._lock:
            # Overtaken since the check above? (_check_sends_open inline: once per record)
            if self._sends_closed is not None:
                self._refuse_send("send()")
            batch = self._pending.get(tp)
            if batch is None:
                batch = self._pending[tp] = self._new_batch()
            fut = SendFuture(tp, len(batch.rows) + batch.table_rows, batch.outcome)
            batch.rows.append(row)
            batch.nbytes += size + 16
            self._maybe_flush(tp, batch)
        return fut

    def send_batch(self, topic: str, table: pa.Table, *, partition: int | None = None,
                   ) -> list[RecordMetadata] | None:
        """Queue an Arrow table of records (columns of the topic, or key/value/headers/
        timestamp for Kafka-shaped topics) for one partition."""
        self._check_can_send()
        if topic in INTERNAL_TOPICS:
            self._refuse_internal(topic)
        info = self._topic_info(topic)  # an unknown topic fails the open transaction
        if not isinstance(table, pa.Table):
            raise TypeError("send_batch() takes a pyarrow.Table")
        if not table.num_rows:
            # Checked all the same, then nothing to write: a batch of no records would
            # start where the next one does.
            conform(table, info.schema, topic, kafka_shaped=info.kafka_shaped)
            if partition is not None:
                self._choose_partition(topic, info.partitions, partition, None)
            return None
        self._queue_table(topic, table, partition, None)
        return None

    def _queue_table(self, topic: str, table: pa.Table, partition: int | None,
                     key: Any) -> SendFuture:
        """Queue ``table`` (checked here: a bad table fails this call, not its batch)."""
        info = self.log.topic(topic)
        table = conform(table, info.schema, topic, kafka_shaped=info.kafka_shaped)
        if table.nbytes > self._max_record:  # else no record in it can be too large
            largest = largest_record(table)
            if largest > self._max_record:
                self._too_large(topic, largest)
        ts = ts_range(table)
        kb = key.encode() if isinstance(key, str) else key
        tp = self._partition_of(topic, info.partitions, partition, kb)
        with self._lock:
            self._check_sends_open("send()")  # overtaken since the caller's check
            batch = self._pending.get(tp)
            if batch is None:
                batch = self._pending[tp] = self._new_batch()
            batch.seal()  # records sent one at a time before it come first
            fut = SendFuture(tp, batch.table_rows, batch.outcome)
            batch.add_table(table, ts)
            batch.nbytes += table.nbytes
            self._maybe_flush(tp, batch)
        return fut

    def _partition_of(self, topic: str, n: int, partition: int | None,
                      key: bytes | None) -> TopicPartition:
        """The record's TopicPartition, one shared object per partition."""
        p = self._choose_partition(topic, n, partition, key)
        tps = self._tps.get(topic)
        if tps is None or len(tps) != n:  # a topic deleted and made again may differ
            tps = self._tps[topic] = [TopicPartition(topic, i) for i in range(n)]
        return tps[p]

    def _choose_partition(self, topic: str, n: int, partition: int | None,
                          key: bytes | None) -> int:
        if partition is not None:
            if not 0 <= partition < n:
                from txlog.errors import UnknownTopicError

                raise UnknownTopicError(
                    f"topic {topic!r} has partitions 0..{n - 1}, not {partition}")
            return partition
        if key:
            return partition_for_key(key, n)
        return self._rr.next(n)

    def _new_batch(self) -> _PendingBatch:
        """A partition's next batch (the caller holds ``_lock``); wakes the linger thread,
        started with the first batch of a non-transactional producer."""
        if self.transactional_id is not None:
            return _PendingBatch(first_ms=now_ms())
        if self._wake is None:
            self._wake = threading.Condition(self._lock)
            self._lingerer = threading.Thread(target=self._linger, daemon=True,
                                              name="txlog-linger")
            self._lingerer.start()
        self._wake.notify()
        return _PendingBatch(first_ms=now_ms(), outcome=_Outcome(threading.Event()))

    def _linger(self) -> None:
        """Write each batch once linger.ms has passed since its first record."""
        wake = self._wake
        assert wake is not None
        with wake:
            while self.state != State.CLOSED:
                if not self._pending:
                    wake.wait()
                    continue
                now = now_ms()
                due = [tp for tp, b in self._pending.items()
                       if now - b.first_ms >= self.linger_ms]
                if due and not self._writes_idle():
                    # No callback wakes this thread when a write ends (the committer
                    # never takes the producer's lock): look again shortly.
                    wake.wait(0.002)
                    continue
                if not due:
                    first = min(b.first_ms for b in self._pending.values())
                    wake.wait(max(1, first + self.linger_ms - now) / 1000)
                    continue
                try:
                    self._flush_partitions(due)
                except Exception as exc:
                    # The batches' futures carry it; send_batch() has none, so the next
                    # flush() (or close()) raises it, as it would have written the batch.
                    _log.debug("linger flush failed: %s", exc)
                    self._linger_error = exc

    def _maybe_flush(self, tp: TopicPartition, batch: _PendingBatch) -> None:
        if batch.nbytes >= self.batch_size:
            # Batches past linger go with it, as Kafka's sender drains every ready batch:
            # while full ones keep the writes busy, a quiet partition's would wait on.
            now = now_ms()
            self._flush_partitions([tp] + [t for t, b in self._pending.items()
                                           if t != tp and now - b.first_ms >= self.linger_ms])
        elif self._queued_steps < MAX_UPLOADS and now_ms() - batch.first_ms >= self.linger_ms:
            # (_writes_idle() inlined, and the clock read only then: once per record)
            self._flush_partitions([tp])

    def _writes_idle(self) -> bool:
        """Whether a batch past linger may go on its own now: while two or more writes
        (or commits) are queued it keeps growing instead, as Kafka's batches wait for a
        free in-flight slot (many small batches would each cost the committer a request,
        and it would fall behind).  Full batches always go, and take such batches along."""
        return self._queued_steps < MAX_UPLOADS

    def flush(self) -> None:
        """Write every queued batch (and wait for the committer's queue).  Without a
        transaction, raises the error of a background write that failed since the last
        flush."""
        with self._lock:
            self._flush_partitions(list(self._pending))
        self._await_pipeline()
        with self._qlock:
            exc, self._linger_error = self._linger_error, None
        if exc is not None:
            raise exc

    def _flush_partitions(self, tps: list[TopicPartition]) -> None:
        self._reap_pipeline()  # raises a failure before anything is taken
        tps = [tp for tp in tps if tp in self._pending]
        if not tps:
            return
        failed: Exception | None = None
        try:
            self._seal_pending(tps)
        except Exception as exc:  # that batch failed; the others are written
            failed = exc
        batches = self._join_queued([(tp, self._pending.pop(tp)) for tp in tps
                                     if tp in self._pending])
        # Written in the background, as Kafka's sender thread does: the caller goes on
        # queueing records while the objects upload and the committer appends their
        # entries in order.  A transaction's writes wait for nothing but its commit.
        if batches:
            self._queue(self._write_batches, batches)
        if failed is not None and self.transactional_id is None:
            # The failed batch's futures carry it, and the next flush() raises it (a
            # transaction's state does): the caller's own record may be queued, so
            # send() must not raise.
            with self._qlock:
                self._linger_error = self._linger_error or failed
        self._backpressure()

    def _seal_pending(self, tps: list[TopicPartition]) -> None:
        """Seal these partitions' pending batches (the caller holds ``_lock``).  send()
        checked every record, so this should not fail; if a batch cannot be sealed all
        the same, it fails (its futures get the error, and it leaves ``_pending``) and so
        does an open transaction, instead of being lost unnoticed; then this raises."""
        failed: BaseException | None = None
        for tp in tps:
            batch = self._pending[tp]
            try:
                batch.seal()
            except Exception as exc:
                del self._pending[tp]
                self._fail_batches([batch], exc)
                failed = failed or exc
        if failed is None:
            return
        if self.transactional_id is not None:
            with self._qlock:
                if self.state == State.IN_TRANSACTION:
                    self.state = State.ABORTABLE_ERROR
                    self._error = failed
        raise failed

    def _backpressure(self) -> None:
        """Wait for the oldest queued steps while too much is queued: queued batches hold
        memory (as Kafka's buffer.memory bounds), and each step costs the committer at
        least one request.  The oldest only, so the uploads never run dry."""
        limit = self.buffer_memory
        while self._queued_bytes > limit or self._queued_steps > MAX_QUEUED_STEPS:
            with self._qlock:
                while self._steps and self._steps[0].done():
                    self._steps.popleft()
                oldest = self._steps[0] if self._steps else None
            if oldest is None:
                return
            wait([oldest])

    def _dispatch(self) -> None:
        """Start the oldest queued uploads (the caller holds ``_qlock``) while a writer
        is free (MAX_UPLOADS; DRAIN_UPLOADS for the steps a queued commit waits for) and
        fewer than MAX_IN_FLIGHT steps are being written or wait for their entries.
        Objects need no epoch and no registration, so they upload beside the commit in
        flight; but a step that waits here still takes its partition's later batches, so
        behind slow uploads or a slow committer one object and one entry carry several
        batches."""
        while self._to_upload and self._uploading < (
                DRAIN_UPLOADS if self._to_upload[0].step <= self._closed_through
                else MAX_UPLOADS) and (
                self._in_flight < MAX_IN_FLIGHT
                # A step a commit was queued behind takes no more batches: holding it
                # back would only make the commit wait.
                or self._to_upload[0].step <= self._closed_through):
            step = self._to_upload.popleft()
            step.started = True  # no batch joins from here on
            for tp, _ in step.batches:
                if (tail := self._tails.get(tp)) is not None and tail[0] is step:
                    del self._tails[tp]
            step.dispatched = True
            self._in_flight += 1
            self._uploading += 1
            assert step.uploaded is not None
            try:
                if self._writer is None:
                    self._writer = ThreadPoolExecutor(
                        MAX_UPLOADS if self.transactional_id is None else
                        max(MAX_UPLOADS, DRAIN_UPLOADS),
                                                      thread_name_prefix="txlog-write")
                self._writer.submit(self._write_step, step, step.uploaded)
            except BaseException as exc:  # the pool is shut (close() racing a send)
                self._uploading -= 1
                step.uploaded.set_exception(exc)

    def _write_step(self, step: _Upload, uploaded: Uploaded) -> None:
        try:
            written = self._conform_and_write(step)
        except BaseException as exc:
            uploaded.set_exception(exc)
        else:
            uploaded.set_result(written)
        finally:
            with self._qlock:
                self._uploading -= 1
                self._dispatch()

    def _join_queued(self, batches: list[tuple[TopicPartition, _PendingBatch]],
                     ) -> list[tuple[TopicPartition, _PendingBatch]]:
        """Let each batch join its partition's last queued batch if that one has not
        started uploading (at most JOIN_BATCHES batch sizes together); returns the rest.
        A commit's last batch, a linger flush or a full batch behind a backlog then
        costs no object and no log entry of its own, as a Kafka batch takes records
        until it is sent."""
        rest = []
        with self._qlock:
            # Not into a step that an earlier failure dooms: a batch sent after the
            # failure was known goes on (a plain producer's), in a step of its own.
            doomed = self._pipeline_error is not None
            for tp, b in batches:
                tail = self._tails.get(tp)
                if tail is not None and not tail[0].started and not doomed \
                        and tail[0].step > self._skip_through \
                        and tail[1].nbytes + b.nbytes <= JOIN_BATCHES * self.batch_size:
                    tail[1].join(b)
                    tail[0].nbytes += b.nbytes
                    self._queued_bytes += b.nbytes
                else:
                    rest.append((tp, b))
        return rest

    def _conform_and_write(self, step: _Upload) -> list[_Written]:
        batches = step.batches
        tables = [self._joined_table(b) for _, b in batches]
        items = [(tp, t) for (tp, _), t in zip(batches, tables, strict=True)]
        return [_Written(key, nbytes, t.num_rows, *b.ts_range()) for t, (_, b), (key, nbytes)
                in zip(tables, batches, self._write_objects(items), strict=True)]

    def _write_batches(self, batches: list[tuple[TopicPartition, _PendingBatch]],
                       uploaded: Uploaded | None, *, defer: bool = False,
                       ) -> list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                       list[_Written]]]:
        """On the committer thread: wait for the batch objects ``uploaded`` is writing,
        registering their partitions meanwhile, then append their log entries (a commit
        with ``defer``: return them instead, for its PrepareCommit to name; a step that
        a commit's is claimed with leaves them to it too).  A failure is the step's:
        _await_pipeline gives the caller's thread the state it leaves."""
        if not batches:
            return []
        assert uploaded is not None  # _upload() writes every non-empty step's objects
        tps = [tp for tp, _ in batches]
        try:
            # Register while the objects are still being written (AddPartitions waits
            # for the last commit's markers; neither needs the other).
            try:
                self._register(tps)
                if defer:  # a commit's: its markers append them, and a reader that
                    # meets the transaction here first rolls a decided one forward
                    self._begin([tp for tp in dict.fromkeys(tps) if tp not in self._held])
            except BaseException:
                wait([uploaded])
                if uploaded.exception() is None:
                    self._discard_keys(tps, [w.key for w in uploaded.result()])
                raise
            written = uploaded.result()
        except BaseException as exc:
            self._fail_batches([b for _, b in batches], exc)
            raise
        group = [(batches, written)]
        if defer:
            return group
        running = self._running
        if running is not None and not running.commit and self.append_parts:
            claimed, through_commit = self._claim_ready()
            group += claimed
            if through_commit and self.commit_batches:
                # The commit's PrepareCommit names them (appended here: those in
                # partitions the transaction holds nothing in yet).
                self._deferred += self._append_unheld(group)
                return []
        self._append_entries(group)
        return []

    def _claim_ready(self) -> tuple[list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                                list[_Written]]], bool]:
        """Take over the appends of the steps queued right behind the running one whose
        objects are written already, up to and including a commit's (not past it: the
        next transaction's batches follow its decision).  Behind a slow committer, one
        entry per partition then appends what several steps wrote, instead of one entry
        per object: on S3 each is a conditional put of 3-7 ms, and a transaction's
        commit waited for them one by one.  Once a commit is queued, the uploads before
        it are waited for first (_uploads_through_commit), so that one entry takes all.
        Also returns whether a commit's step was claimed."""
        out: list[tuple[list[tuple[TopicPartition, _PendingBatch]], list[_Written]]] = []
        wait(self._uploads_through_commit())
        with self._qlock:
            if self._pipeline_error is not None:
                return out, False
            for u in self._order:
                up = u.uploaded
                if u.commit and up is None and not u.claimed and \
                        u.step > self._skip_through:
                    # A commit with no batch of its own (its last records joined a write
                    # before it): claimed with nothing to append.
                    u.claimed = True
                    return out, True
                if u.claimed or up is None or not up.done() or up.exception() is not None \
                        or u.step <= self._skip_through:
                    break
                if self.transactional_id is not None and \
                        any(tp not in self._registered for tp, _ in u.batches):
                    break  # it registers a partition first, in its own turn
                u.claimed = True
                out.append((u.batches, up.result()))
                if u.commit:
                    return out, True
        return out, False

    def _uploads_through_commit(self) -> list[Uploaded]:
        """The uploads of the steps queued behind the running one, through a queued
        commit's, if all of them can be claimed once written (else none): the commit
        waits for every one of them anyway, and one entry after the last upload is
        sooner than an entry per step, one after another."""
        ups: list[Uploaded] = []
        with self._qlock:
            # The wait below needs every one of them started: start what the in-flight
            # bound held back (as _queue does when it queues a commit).
            self._dispatch()
            for u in self._order:
                if u.claimed or u.step <= self._skip_through or \
                        any(tp not in self._registered for tp, _ in u.batches):
                    return []
                if u.uploaded is not None:
                    ups.append(u.uploaded)
                if u.commit:
                    return ups
        return []

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
                if len(parts) == 1:
                    w = parts[0][1]
                    base = self._append_object(tp, w.key, w.rows, w.nbytes, w.ts_min,
                                               w.ts_max, w.untimed)
                else:
                    base = self._append_object(tp, "", 0, 0, None, None, parts=[
                        (w.key, w.rows, w.nbytes, w.ts_min, w.ts_max, w.untimed)
                        for _, w in parts])
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
    def _joined_table(batch: _PendingBatch) -> pa.Table:
        """A sealed batch, joined batches and all, as one table (every part is in the
        topic's schema already)."""
        tables = [t for part in (batch, *batch.joined) for t in part.tables]
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def _discard_keys(self, tps: list[TopicPartition], keys: list[str]) -> None:
        """Delete batch objects that were never made appendable: no log entry names them
        (none was attempted), so nothing can ever read them.  Best effort."""
        for tp, key in zip(tps, keys, strict=True):
            try:
                self.log.partition_log(tp).store.delete(key)
            except Exception as exc:  # an unreferenced object costs only space
                _log.warning("could not delete unreferenced batch object %s: %s", key, exc)

    def _write_objects(self, items: list[tuple[TopicPartition, pa.Table]],
                       ) -> list[tuple[str, int]]:
        """Write each table as a batch object (plain puts of unique names)."""
        return [self.log.partition_log(tp).write_data(t) for tp, t in items]

    @staticmethod
    def _fail_batches(batches: list[_PendingBatch], exc: BaseException) -> None:
        for b in batches:
            b.fail(exc)
            b.set_written()

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

    def _begin(self, tps: list[TopicPartition]) -> None:
        """Open the transaction in ``tps`` with a BEGIN entry each (model.BEGIN), while
        the batches that its COMMIT markers will append there upload."""
        if not tps:
            return
        # Read here, on the committer: the properties settle the last commit first, and
        # on a fan-out thread that would wait for the committer, which waits for it.
        pid, epoch = self.producer_id, self.epoch

        def one(tp: TopicPartition) -> None:
            self._append_with_retries(self.log.partition_log(tp), AppendSpec(
                kind=BEGIN, count=0, producer_id=pid, epoch=epoch, transactional=True,
                txn_id=self.transactional_id))
            self._held.add(tp)
            crashpoint("after_begin")

        if len(tps) > 1 and self.log.store.backend not in ("local", "memory"):
            fanout.fan_out(one, tps)
        else:
            for tp in tps:
                one(tp)

    def _append_now(self, tp: TopicPartition, table: pa.Table) -> int:
        """Write the batch object, then claim the partition's next slot for it."""
        self._register([tp])
        key, nbytes = self.log.partition_log(tp).write_data(table)
        ts_min, ts_max, untimed = ts_range(table)
        return self._append_object(tp, key, table.num_rows, nbytes, ts_min, ts_max, untimed)

    def _append_object(self, tp: TopicPartition, key: str, num_rows: int, nbytes: int,
                       ts_min: int | None, ts_max: int | None, untimed: bool = False,
                       parts: list[Part] | None = None) -> int:
        """Register ``tp`` with the transaction (before the first write to it), then claim
        the partition's next slot for the batch object ``key`` (or for ``parts``, several
        objects in one entry: the other arguments are then taken from them)."""
        now = now_ms()
        ts_min, ts_max = _given_or_now(ts_min, ts_max, untimed, now)
        if parts is not None:  # each part stamped as a single object is
            num_rows = sum(p[1] for p in parts)
            parts = [(k, n, nb, *_given_or_now(lo, hi, untimed, now), untimed)
                     for k, n, nb, lo, hi, untimed in parts]
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
            ts_max=ts_max, untimed=untimed, parts=parts)
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
                or ended_as(rec, *mine) == "abort":
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

    # -- state checks ------------------------------------------------------------------------

    def _guard(self, fn: Any) -> Any:
        """Run a write on the caller's thread, leaving the state its failure calls for
        (the committer's steps leave theirs to _await_pipeline)."""
        try:
            return fn()
        except ProducerFencedError as exc:
            self._fatal(exc)
            raise
        except TxlogError as exc:
            if self.transactional_id is not None and self.state == State.IN_TRANSACTION:
                if exc.abortable:
                    self.state = State.ABORTABLE_ERROR
                    self._error = exc
                else:
                    self._fatal(exc)
            raise
        except Exception as exc:
            # Not a txlog error (e.g. a raw OSError from a filesystem): whether the write
            # took effect is unknown, as after a StorageError.  The transaction must not
            # be committed without it.
            if self.transactional_id is not None and self.state == State.IN_TRANSACTION:
                self._fatal(exc)
            raise

    @staticmethod
    def _refuse_internal(topic: str) -> None:
        raise InvalidTopicError(
            f"cannot produce to internal topic {topic!r}: consumer offsets are written by "
            "send_offsets_to_transaction() and Consumer.commit()")

    def _too_large(self, topic: str, size: int) -> None:
        limit, name = self._record_limits[0]
        raise RecordTooLargeError(
            f"a record of {size} bytes for topic {topic!r} is larger than {limit}, the "
            f"value of the {name} configuration; raise it or send smaller records")

    def _topic_info(self, topic: str) -> Any:
        """The topic's metadata.  Failing to get it fails the open transaction, as a
        metadata timeout does in Kafka: the record was not queued, and a commit must not
        succeed without it."""
        try:
            return self.log.topic(topic)
        except Exception as exc:
            if self.transactional_id is not None and self.state == State.IN_TRANSACTION:
                self.state = State.ABORTABLE_ERROR
                self._error = exc
            raise

    def _fatal(self, exc: BaseException) -> None:
        self.state = State.FATAL_ERROR
        self._error = exc

    def _require_txn(self) -> None:
        if self.transactional_id is None:
            raise InvalidTxnStateError(
                "this producer has no transactional_id; create it with "
                "log.producer(transactional_id=...) to use transactions")

    def _check_state(self, want: State, what: str) -> None:
        if self.state == State.FATAL_ERROR:
            raise ProducerFencedError(f"{what}: the producer hit a fatal error ({self._error}); "
                                      "close it") if isinstance(
                self._error, ProducerFencedError) else InvalidTxnStateError(
                f"{what}: the producer hit a fatal error ({self._error}); close it")
        if self.state != want:
            raise InvalidTxnStateError(f"{what} is not allowed in state {self.state.value}")

    def _check_sends_open(self, what: str) -> None:
        """Under ``_lock``: raise if a commit, abort or close() overtook the caller."""
        if self._sends_closed is not None:
            self._refuse_send(what)

    def _refuse_send(self, what: str) -> NoReturn:
        """A call that passed its state check but finds, under ``_lock``, that a commit,
        abort or close() overtook it."""
        if self.state is State.CLOSED:
            raise InvalidTxnStateError(f"{what} on a closed producer")
        raise InvalidTxnStateError(f"{what}: {self._sends_closed}; nothing was queued")

    def _check_can_send(self) -> None:
        if self.state is State.IN_TRANSACTION:  # the per-record fast path
            return
        if self.transactional_id is not None:
            if self.state == State.ABORTABLE_ERROR:
                raise InvalidTxnStateError(
                    f"the transaction hit an error ({self._error}); call abort_transaction()")
            self._check_state(State.IN_TRANSACTION, "send()")
        elif self.state == State.CLOSED:
            raise InvalidTxnStateError("send() on a closed producer")

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued, finish the last commit and, as Kafka's client does on a
        graceful close, abort a transaction left open (else it would hold the LSO of
        every partition it wrote until its timeout).  ``timeout`` (seconds) bounds the
        wait: once it passes, or with 0, the producer closes at once, and an open
        transaction is left for readers or ``txlog maintain`` to abort after its
        timeout (Kafka's forced close)."""
        if self.state == State.CLOSED:
            return
        with self._lock:  # what is sent from here on would miss the flush below
            self._sends_closed = _CLOSING
        finished = True
        try:
            if timeout is None:
                self._close_work()
            else:
                finished = timeout > 0 and _run_bounded(self._close_work, timeout)
                if not finished:
                    _log.warning("close(timeout=%s): closing without waiting; anything "
                                 "still open is aborted after transaction.timeout.ms",
                                 timeout)
        finally:
            with self._lock:
                self._fail_batches(list(self._pending.values()),
                                   InvalidTxnStateError("the producer was closed first"))
                self._pending.clear()
                self.state = State.CLOSED
                self._sends_closed = "the producer is closed"
                if self._wake is not None:
                    self._wake.notify_all()  # the linger thread ends
            if self._lingerer is not None and finished:
                self._lingerer.join()
            if self._committer is not None:
                self._committer.shutdown(wait=finished)  # (queued steps still resolve)
            if self._writer is not None:  # (its last steps may have started it just now)
                self._writer.shutdown(wait=finished)

    def _close_work(self) -> None:
        if self.transactional_id is None:
            self.flush()
            return
        self._close_settle()
        if self.state in (State.IN_TRANSACTION, State.ABORTABLE_ERROR):
            _log.info("close(): aborting the open transaction of %r", self.transactional_id)
            with self._lock:
                self._fail_batches(list(self._pending.values()), InvalidTxnStateError(
                    "the producer was closed before the batch was sent; its transaction "
                    "was aborted"))
                self._pending.clear()
            with self._qlock:
                self._tails.clear()
            try:
                self._abort_now()
            except Exception as exc:
                _log.warning("close(): the open transaction of %r could not be aborted "
                             "(%s); readers and `txlog maintain` abort it after "
                             "transaction.timeout.ms", self.transactional_id, exc)

    def _close_settle(self) -> None:
        """Leave no commit in PrepareCommit behind, if the store lets us; if not, any
        reader or ``txlog maintain`` rolls it forward (the commit already holds)."""
        self._await_pipeline(quiet=True)  # a failed later step must not stop this
        try:
            self._settle()
        except Exception as exc:
            _log.warning("close(): the last commit's markers or CompleteCommit could not be "
                         "written (%s); readers and `txlog maintain` will finish them", exc)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()





def _run_bounded(fn: Callable[[], None], timeout: float) -> bool:
    """Run ``fn`` on a helper thread for up to ``timeout`` seconds; True if it finished
    (its error is raised here), False if it is still running (it goes on by itself)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            failure.append(exc)

    t = threading.Thread(target=run, name="txlog-close", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return False
    if failure:
        raise failure[0]
    return True


def _find_objects(st: PartitionState, keys: list[str]) -> dict[str, int]:
    """The base offsets of the batch objects ``keys`` in ``st`` (the newest batches
    first: a commit's markers appended them a moment ago)."""
    want = set(keys)
    found: dict[str, int] = {}
    b = st.batches
    for i in range(len(b) - 1, -1, -1):
        if b.data[i] in want and b.data[i] not in found:
            found[b.data[i]] = b.base_offset[i]
            if len(found) == len(want):
                break
    return found
