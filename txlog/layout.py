"""Where every object lives under a txlog root.  One module, so the layout is in one place."""

from __future__ import annotations

ENTRY_BUCKET = 10_000  # entries per directory: tail listings skip whole directories of history


def topic_meta(topic: str) -> str:
    return f"_meta/topics/{topic}.json"


TOPIC_META_PREFIX = "_meta/topics/"


def partition_root(topic: str, partition: int) -> str:
    return f"topics/{topic}/{partition}/"


def log_prefix(topic: str, partition: int) -> str:
    return f"topics/{topic}/{partition}/log/"


def entry_key(topic: str, partition: int, slot: int) -> str:
    return f"topics/{topic}/{partition}/log/{slot // ENTRY_BUCKET:06d}/{slot:012d}.json"


def slot_of(key: str) -> int:
    return int(key.rsplit("/", 1)[1].split(".", 1)[0])


def checkpoint_prefix(topic: str, partition: int) -> str:
    return f"topics/{topic}/{partition}/checkpoints/"


def checkpoint_key(topic: str, partition: int, next_slot: int) -> str:
    return f"topics/{topic}/{partition}/checkpoints/{next_slot:012d}.arrow"


def data_key(topic: str, partition: int, name: str) -> str:
    return f"{data_prefix(topic, partition)}{name}.parquet"


def data_prefix(topic: str, partition: int) -> str:
    return f"topics/{topic}/{partition}/data/"


def owns(topic: str, partition: int, key: str) -> bool:
    """Whether a log entry (or transaction record) of this partition may name ``key``:
    only its own batch objects, objects staged for its topic (Spark's), or its topic's
    shared batch objects (which hold batches of several of its partitions).  Anything
    else (another topic's batch, a producer-id block) is corrupt, and no reader reads
    it nor maintenance deletes it because an entry says so."""
    if ".." in key.split("/") or "\\" in key or "\x00" in key:
        return False
    if key.startswith(shared_prefix(topic)):
        return is_shared(key)  # (not what else lives there, e.g. release markers)
    return key.startswith((data_prefix(topic, partition), staging_prefix_of(topic)))


def shared_prefix(topic: str) -> str:
    """Where the batch objects shared by several partitions of ``topic`` live (one
    object holds one producer step's batches of several of its partitions)."""
    return f"topics/{topic}/_shared/"


def shared_key(topic: str, name: str) -> str:
    return f"{shared_prefix(topic)}{name}.parquet"


def is_shared(key: str) -> bool:
    """Whether ``key`` names a shared batch object of some topic (as shared_key spells
    it: directly under the topic's ``_shared/``)."""
    head, sep, name = key.rpartition("/_shared/")
    return (bool(sep) and head.startswith("topics/") and head.count("/") == 1
            and bool(name) and "/" not in name and name.endswith(".parquet"))


def staging_prefix_of(topic: str) -> str:
    """Where every staged write of ``topic`` (Spark's) keeps its objects."""
    return f"topics/{topic}/_staging/"


def topic_root(topic: str) -> str:
    return f"topics/{topic}/"


def released_prefix(topic: str) -> str:
    """The release markers of ``topic``'s shared objects, a folder per object."""
    return f"{shared_prefix(topic)}_released/"


def release_markers_prefix(topic: str, name: str) -> str:
    """The release markers of shared object ``name``, one per partition done with it."""
    return f"{released_prefix(topic)}{name}/"


def release_key(topic: str, name: str, partition: int) -> str:
    return f"{release_markers_prefix(topic, name)}{partition}"


def staging_prefix(topic: str, txn: str) -> str:
    return f"topics/{topic}/_staging/{txn}/"


# Transaction state log and producer-id blocks.
def txn_state_log_topic(partition: int) -> tuple[str, int]:
    """The state log is a partition log of its own, under the reserved name '_txn'."""
    return ("__transaction_state", partition)


PID_BLOCK_PREFIX = "_txn/pid-blocks/"
TXN_PREFIX = "_txn/"
#: The root's settings (root_settings.py), written once when the root is made.
ROOT_SETTINGS_KEY = "_meta/root.json"
#: Where a remote store keeps its verdict on the backend's atomic create (atomic_check.py).
ATOMIC_CREATE_VERDICT_PREFIX = "_meta/atomic-create/"
#: A folder no object is ever written to: listing it checks that the bucket exists.
BUCKET_CHECK_PREFIX = "_meta/bucket-check/"
#: Objects the store-clock measurement writes and deletes (store_clock.py).
CLOCK_PROBE_PREFIX = "_txn/clock/"


STATE_LOG_PREFIX = f"{TXN_PREFIX}state/"


def state_log_prefix(partition: int) -> str:
    """Everything of state-log partition ``partition``: its entries and checkpoints.
    The number has at least 3 digits (partitions from 1000 on have more), and each
    partition's prefix ends in a slash, so no partition's prefix holds another's."""
    return f"{STATE_LOG_PREFIX}{partition:03d}/"


def state_partition_of(key: str) -> int | None:
    """The state-log partition whose object ``key`` is, or None for a key under the
    state log that txlog did not write there (as :func:`state_log_prefix` spells it)."""
    if not key.startswith(STATE_LOG_PREFIX):
        return None
    name, sep, _ = key[len(STATE_LOG_PREFIX):].partition("/")
    if not sep or not name.isascii() or not name.isdigit():
        return None
    partition = int(name)
    return partition if f"{partition:03d}" == name else None


def state_log_entries_prefix(partition: int) -> str:
    return f"{state_log_prefix(partition)}log/"


def state_log_entry_key(partition: int, slot: int) -> str:
    return f"{state_log_entries_prefix(partition)}{slot // ENTRY_BUCKET:06d}/{slot:012d}.json"


def state_log_checkpoint_prefix(partition: int) -> str:
    return f"{state_log_prefix(partition)}checkpoints/"


def state_log_checkpoint_key(partition: int, next_slot: int) -> str:
    return f"{state_log_checkpoint_prefix(partition)}{next_slot:012d}.json"


def pid_block_key(block: int) -> str:
    return f"_txn/pid-blocks/{block:012d}.json"
