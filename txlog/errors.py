"""Every error txlog raises derives from :class:`TxlogError`.

Each message says what happened and what to do about it.  Classes mirror Kafka's client
errors where the meaning is the same, so Kafka users can catch what they already know.
"""

from __future__ import annotations


class TxlogError(Exception):
    """Base class of every txlog error."""

    #: True when the caller may abort the current transaction and carry on (Kafka's
    #: "abortable" errors); False for fatal errors after which the producer must be closed.
    abortable: bool = False
    #: True when the same call may simply be retried later (Kafka's retriable errors).
    retriable: bool = False


# --- storage -------------------------------------------------------------------------


class StorageError(TxlogError):
    """The object store failed in a way txlog could not settle."""

    # Inside a transaction a failed write is abortable: aborting makes whatever landed
    # invisible, and the epoch bump starts the next transaction clean.
    abortable = True


class ObjectNotFoundError(StorageError, KeyError):
    """An object that should exist is missing."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "object not found"


class AtomicCreateUnsupportedError(StorageError):
    """The backend cannot create an object atomically only-if-absent; txlog refuses it."""


class IncompleteListingError(StorageError):
    """A listing's pages did not add up to a whole listing (a page said more followed but
    gave no way to fetch them, or pointed back at a page already read); txlog acts on no
    partial listing."""

    retriable = True  # a server's passing fault; a lasting one fails the retry the same way


class CorruptObjectError(StorageError):
    """A stored object cannot be decoded (truncated, corrupted, or not a txlog object)."""


class LinkInRootError(CorruptObjectError):
    """A local root holds a symbolic link where txlog expects its own file or directory."""


class UnsupportedFormatError(CorruptObjectError):
    """A stored object was written by a newer txlog format version than this one reads."""


# --- topics and configuration --------------------------------------------------------


class ConfigError(TxlogError, ValueError):
    """A configuration key or option is unknown or has a bad value."""


class InvalidNameError(TxlogError, ValueError):
    """A topic name, transactional id or group id is not allowed."""


class RootNotFoundError(TxlogError):
    """A command that only reads named a root that does not exist (txlog creates a root
    only when writing to it)."""


class BucketNotFoundError(RootNotFoundError):
    """The bucket or container a remote root's URL names does not exist (a mistyped
    name would otherwise read as an empty root, or a server might create it)."""


class InvalidTopicError(TxlogError, ValueError):
    """The operation is not allowed on this topic (for example, a client creating,
    deleting or producing plain records to an internal topic)."""


class RecordTooLargeError(TxlogError, ValueError):
    """A record (or a stored batch object) is larger than the configured limit."""

    # Refused before it was queued: the transaction may go on without it.
    abortable = True


class TopicExistsError(TxlogError):
    """create_topic was asked for a topic that already exists."""


class UnknownTopicError(TxlogError, KeyError):
    """The topic (or partition) does not exist."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown topic"


class SchemaMismatchError(TxlogError, ValueError):
    """Data written to a topic does not match the topic's schema."""

    abortable = True


class OffsetOutOfRangeError(TxlogError):
    """A fetch position lies outside [log start offset, high watermark] and
    ``auto_offset_reset`` is ``none`` (or no committed offset exists to start from)."""


class UnassignedPartitionError(TxlogError, ValueError):
    """seek() or position() named a partition this consumer is not assigned."""


class UnstableOffsetCommitError(TxlogError):
    """A transaction holds pending offsets for the group (KIP-447): the committed offset
    is not settled yet.  Retriable: call committed() again once the transaction ends."""

    retriable = True


# --- producers and transactions ------------------------------------------------------


class ProducerFencedError(TxlogError):
    """Another producer with the same transactional.id (or a timeout abort) took over.

    Fatal: close this producer; the newer instance owns the transactional.id.
    """


class InvalidProducerEpochError(ProducerFencedError):
    """A request carried an epoch older than the current one (the producer was fenced)."""


class InvalidTransactionTimeoutError(ConfigError):
    """transaction.timeout.ms is below 1 or above transaction.max.timeout.ms."""


class InvalidTxnStateError(TxlogError):
    """The call is not valid in the producer's (or coordinator's) current transaction state."""


class TransactionAbortedError(TxlogError):
    """The transaction was aborted (for example, after its timeout) and cannot commit."""

    abortable = True


class TransactionTimeoutError(TransactionAbortedError):
    """The transaction ran past transaction.timeout.ms and was aborted by another client."""


class OutOfOrderSequenceError(TxlogError):
    """A batch's sequence number leaves a gap: records between would be lost."""


class ConcurrentTransactionsError(TxlogError):
    """The state log changed under us too many times in a row; retry later."""

    abortable = True


class UnknownProducerIdError(OutOfOrderSequenceError):
    """The partition keeps no sequence state for the producer id (it expired after
    producer.id.expiration.ms without a write there) and the batch does not start at
    sequence 0.  An idempotent producer starts afresh with a new producer id."""


class TransactionalIdNotFoundError(TxlogError, KeyError):
    """The state log has no record of the transactional.id (admin commands)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "transactional.id not found"


class GroupIdNotFoundError(TxlogError, KeyError):
    """The consumer group has no committed offsets (admin commands)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "group not found"
