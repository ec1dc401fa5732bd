"""The producer's shared state: its configuration, locks, queues and transaction state,
and the state checks every part makes before it acts."""

from __future__ import annotations

import collections
import enum
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NoReturn

from txlog.config import normalize_key
from txlog.errors import (
    ConfigError,
    InvalidTopicError,
    InvalidTxnStateError,
    ProducerFencedError,
    RecordTooLargeError,
    TxlogError,
)
from txlog.names import validate_id
from txlog.partitioner import RoundRobin
from txlog.records import TopicPartition

if TYPE_CHECKING:
    from txlog.log import Log
    from txlog.producer.accumulator import _PendingBatch
    from txlog.producer.sender import _Upload, _Written
    from txlog.producer.transactions import _Completion

_log = logging.getLogger(__name__)


class State(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    ABORTING = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"
    CLOSED = "CLOSED"


_PRODUCER_KEYS = {"batch.size", "linger.ms", "buffer.memory", "enable.idempotence",
                  "append.parts", "commit.appends.batches", "transaction.timeout.ms",
                  "retries", "max.request.size", "inline.batch.bytes",
                  "commit.inline.bytes", "batch.objects.shared"}


#: Why sends fail while close() runs (compared by identity: begin_transaction() refuses too).
_CLOSING = "the producer is being closed"


class ProducerCore:
    """What every part of the producer shares: its options, locks, queues, producer id,
    epoch and state, and the checks of that state.  The parts (the partition appends,
    the sender, the accumulator, the transaction manager and the client) are the
    classes built on this one, each in its own module."""

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
        # Batch objects up to this size travel inline in the entries that append them
        # (format version 4: not while an older format is held back for older readers).
        self.inline_bytes = int(cfg["inline.batch.bytes"]) if self.append_parts and \
            cfg["commit.appends.batches"] else 0
        # A commit's last objects, all small, travel in its PrepareCommit, which is then
        # written beside their uploads (and registers their partitions): one sequential
        # write instead of two (state record version 3).
        self.commit_inline_bytes = int(cfg["commit.inline.bytes"]) \
            if self.inline_bytes and self.commit_batches else 0
        # A step's batches of several partitions of a topic go in one shared object
        # (entry format version 5; its batches are parts of entries, so needs parts).
        self.shared_objects = self.append_parts and bool(cfg["batch.objects.shared"])
        # Written batches a step left to the commit queued behind it (see _write_batches).
        self._deferred: list[tuple[list[tuple[TopicPartition, _PendingBatch]],
                                   list[_Written]]] = []
        self._lock = threading.RLock()
        self._pending: dict[TopicPartition, _PendingBatch] = {}
        self._pending_bytes = 0  # of the batches in _pending (under _lock)
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
        # Partitions of a commit whose BEGIN entries are written beside its
        # PrepareCommit (held already: see Sender._write_batches).
        self._unbegun: list[TopicPartition] = []
        # A commit that registered its partitions in its PrepareCommit failed with an
        # unknown outcome: the abort must claim the record's next slot, or that write
        # could still land after the abort returned (see txn_decide.end_txn's claim).
        self._claim_on_abort = False
        self._error: BaseException | None = None
        # The state send() needs no further check in (see _check_can_send).
        self._sending_state = State.READY if transactional_id is None else \
            State.IN_TRANSACTION
        if transactional_id is None:
            self.state = State.READY
            if self.idempotent:
                self._producer_id = txlog.coordinator.pids.allocate()
        else:
            self.state = State.UNINITIALIZED

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
                self._txn_error(exc)
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

    def _txn_error(self, exc: TxlogError) -> None:
        """An abortable error leaves the transaction to be aborted; any other is fatal."""
        if exc.abortable:
            self.state = State.ABORTABLE_ERROR
            self._error = exc
        else:
            self._fatal(exc)

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


    # -- provided by the parts above (the transaction manager and the sender) ------------

    def _settle(self) -> None:
        raise NotImplementedError

    def _complete_into_next(self, tps: list[TopicPartition]) -> bool:
        raise NotImplementedError

    def _await_pipeline(self, *, quiet: bool = False) -> None:
        raise NotImplementedError
