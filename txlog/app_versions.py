"""Idempotent re-runs: Delta Lake's txnAppId / txnVersion on txlog.

The last committed version of an application id is stored like a consumer offset, in the
internal offsets topic, inside the writing transaction: it becomes visible exactly when
the data does.  Writers use a transactional.id derived from the app id, so a concurrent
run of the same app fences the other (only one can commit) and a run that starts after a
crash sees the version its predecessor committed, if it did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txlog.names import validate_id
from txlog.offsets import read_committed_offsets
from txlog.records import TopicPartition

if TYPE_CHECKING:
    from txlog.log import Log

_VERSION_TP = TopicPartition("__txn_app_version", 0)


def app_group(app_id: str) -> str:
    return f"txnapp:{validate_id('txnAppId', app_id)}"


def app_transactional_id(app_id: str) -> str:
    """The transactional.id every writer of ``app_id`` uses (so they fence each other)."""
    return f"txnapp-{validate_id('txnAppId', app_id)}"


def app_version_offsets(app_id: str, version: int) -> tuple[str, dict[TopicPartition, int]]:
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        from txlog.errors import ConfigError

        raise ConfigError(f"txnVersion must be a non-negative integer, not {version!r}")
    return app_group(app_id), {_VERSION_TP: version}


def committed_app_version(txlog: Log, app_id: str) -> int | None:
    """The highest version committed for ``app_id``, or None if it never committed.

    Call it after ``init_transactions()`` of the app's transactional.id: that completes or
    aborts whatever an earlier run left open, so the answer is final for this run.
    """
    return read_committed_offsets(txlog, app_group(app_id), [_VERSION_TP])[_VERSION_TP]
