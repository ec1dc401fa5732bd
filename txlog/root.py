"""What the layers below the ``Log`` facade need of a root: its store, configuration,
stored settings and partition logs (and, for what settles transactions, its coordinator).
They take these protocols, not ``Log``, so the facade stays the only module that knows
the producer, consumer and admin clients."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from txlog.coordinator import Coordinator
    from txlog.partition_log import PartitionLog
    from txlog.records import TopicPartition
    from txlog.storage.base import ObjectStore


class Root(Protocol):
    """A txlog root: the store under it, the client's configuration, the settings stored
    in the root, and one partition log object per partition."""

    url: str
    config: dict[str, Any]
    store: ObjectStore

    def root_settings(self) -> dict[str, int]: ...

    def partition_log(self, tp: TopicPartition) -> PartitionLog: ...


class CoordinatedRoot(Root, Protocol):
    """A root with its transaction coordinator (to settle what holds a partition's LSO)."""

    @property
    def coordinator(self) -> Coordinator: ...
