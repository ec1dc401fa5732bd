"""The producer, split as Kafka's client is: :mod:`~txlog.producer.client` (the public
``Producer``: its API and state checks), :mod:`~txlog.producer.accumulator` (per-partition
batches, linger, joining, the memory bound), :mod:`~txlog.producer.sender` (queued steps,
uploads, in-flight bounds), :mod:`~txlog.producer.appends` (partition appends, sequence
numbers, retries), :mod:`~txlog.producer.transactions` (ending a transaction, its markers)
and :mod:`~txlog.producer.futures` (what ``send()`` returns).  The parts share one
producer's state (:mod:`~txlog.producer.core`)."""

from txlog.producer.accumulator import JOIN_BATCHES, MAX_QUEUED_STEPS, _PendingBatch
from txlog.producer.client import Producer, StagedObject
from txlog.producer.core import State
from txlog.producer.futures import RecordMetadata, SendFuture
from txlog.producer.sender import DRAIN_UPLOADS, MAX_IN_FLIGHT, MAX_UPLOADS

__all__ = ["DRAIN_UPLOADS", "JOIN_BATCHES", "MAX_IN_FLIGHT", "MAX_QUEUED_STEPS",
           "MAX_UPLOADS", "Producer", "RecordMetadata", "SendFuture", "StagedObject",
           "State", "_PendingBatch"]
