"""Releasing and deleting shared batch objects on a store (txlog.shared_deletion)."""

from __future__ import annotations

import io
import json
import logging
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from txlog import checksums, layout
from txlog.shared_deletion import (
    DAMAGED,
    DELETED,
    GONE,
    WAITING,
    collect,
    collect_topic,
    release,
)
from txlog.storage import ObjectStore

BACKENDS = ["local", pytest.param("s3", marks=pytest.mark.s3)]
TOPIC = "t"


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, store_factory: Any) -> ObjectStore:
    s: ObjectStore = store_factory(request.param)
    return s


def shared_body(parts: list[tuple[int, int]], *, footer: Any = "auto") -> bytes:
    """A shared object of (partition, rows) batches, each starting a row group, with the
    ``txlog.shared`` footer the writer gives it (or ``footer``: a JSON value, or None for
    none)."""
    schema = pa.schema([("value", pa.binary())])
    buf = io.BytesIO()
    w = pq.ParquetWriter(buf, schema)
    row, listed = 0, []
    for p, n in parts:
        w.write_table(pa.table({"value": [b"p%d-%d" % (p, i) for i in range(n)]},
                               schema=schema))
        listed.append([p, row, n])
        row += n
    if footer == "auto":
        footer = {"v": 1, "partitions": listed}
    if footer is not None:
        w.add_key_value_metadata({"txlog.shared": json.dumps(footer)})
    w.close()
    return buf.getvalue()


def put_shared(store: ObjectStore, body: bytes) -> tuple[str, str]:
    name = f"{uuid.uuid4().hex}{checksums.tag(body)}.parquet"
    key = layout.shared_prefix(TOPIC) + name
    store.put(key, body)
    return key, name


def markers(store: ObjectStore, name: str) -> list[str]:
    prefix = layout.release_markers_prefix(TOPIC, name)
    return [k[len(prefix):] for k in store.list(prefix)]


def test_the_last_partition_to_release_deletes_the_object_then_the_markers(
        store: ObjectStore) -> None:
    key, name = put_shared(store, shared_body([(0, 3), (2, 4), (3, 1)]))
    assert release(store, TOPIC, key, 0, partitions=4) == WAITING
    assert release(store, TOPIC, key, 0, partitions=4) == WAITING  # again: the same
    assert release(store, TOPIC, key, 1, partitions=4) == WAITING  # holds nothing of it
    assert release(store, TOPIC, key, 3, partitions=4) == WAITING
    assert store.exists(key)
    assert markers(store, name) == ["0", "1", "3"]
    assert release(store, TOPIC, key, 2, partitions=4) == DELETED
    assert not store.exists(key)
    assert markers(store, name) == []
    assert store.list(layout.shared_prefix(TOPIC)) == []


def test_a_release_of_an_object_already_deleted_leaves_no_marker(store: ObjectStore) -> None:
    key, name = put_shared(store, shared_body([(0, 1), (1, 1)]))
    release(store, TOPIC, key, 0, partitions=2)
    assert release(store, TOPIC, key, 1, partitions=2) == DELETED
    # A late, repeated release (a purge killed before it recorded the first).
    assert release(store, TOPIC, key, 1, partitions=2) == GONE
    assert markers(store, name) == []


@pytest.mark.parametrize("damage", ["bit flip", "no footer", "invalid footer",
                                    "partition beyond the topic", "truncated"])
def test_a_damaged_or_missing_footer_deletes_nothing_and_warns(
        store: ObjectStore, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    footer: Any = "auto"
    if damage == "no footer":
        footer = None
    elif damage == "invalid footer":
        footer = {"v": 1, "partitions": [[0, 0, 2], [1, 3, 2]]}
    elif damage == "partition beyond the topic":
        footer = {"v": 1, "partitions": [[0, 0, 2], [7, 2, 2]]}
    body = shared_body([(0, 2), (1, 2)], footer=footer)
    name = f"{uuid.uuid4().hex}{checksums.tag(body)}.parquet"
    if damage == "bit flip":  # in the data pages: the footer still parses
        body = body[:10] + bytes([body[10] ^ 0x40]) + body[11:]
    elif damage == "truncated":
        body = body[:-20]
    key = layout.shared_prefix(TOPIC) + name
    store.put(key, body)
    release(store, TOPIC, key, 0, partitions=2)
    with caplog.at_level(logging.WARNING, logger="txlog.shared_deletion"):
        assert release(store, TOPIC, key, 1, partitions=2) == DAMAGED
    assert store.exists(key)
    assert markers(store, name) == ["0", "1"]
    assert any(name in r.getMessage() and "not deleted" in r.getMessage()
               for r in caplog.records)
    report = collect_topic(store, TOPIC, partitions=2)
    assert (report.deleted, report.failures) == (0, [])
    assert len(report.warnings) == 1 and name in report.warnings[0]
    assert store.exists(key)


def test_collect_topic_finishes_what_killed_releasers_left(store: ObjectStore) -> None:
    # Complete releases whose object is still there (killed between marker and delete).
    done_key, done_name = put_shared(store, shared_body([(0, 1), (1, 1)]))
    # Releases still waiting for partition 1.
    wait_key, wait_name = put_shared(store, shared_body([(0, 1), (1, 1)]))
    # Markers whose object is gone (killed between the delete and the markers').
    gone_name = f"{uuid.uuid4().hex}.crc32-00000000.parquet"
    for p in (0, 1):
        store.put(layout.release_key(TOPIC, done_name, p), b"")
        store.put(layout.release_key(TOPIC, gone_name, p), b"")
    store.put(layout.release_key(TOPIC, wait_name, 0), b"")
    report = collect_topic(store, TOPIC, partitions=2)
    assert (report.deleted, report.waiting, report.warnings, report.failures) == (1, 1, [], [])
    assert not store.exists(done_key) and store.exists(wait_key)
    assert markers(store, done_name) == [] and markers(store, gone_name) == []
    assert markers(store, wait_name) == ["0"]
    # Nothing left to do: a second pass changes nothing.
    again = collect_topic(store, TOPIC, partitions=2)
    assert (again.deleted, again.waiting) == (0, 1)


def test_a_key_under_the_shared_folder_that_names_no_object_is_left_alone(
        store: ObjectStore) -> None:
    stray = layout.shared_prefix(TOPIC) + "x/y.parquet"
    store.put(stray, b"not ours")
    assert release(store, TOPIC, stray, 0, partitions=1) == DAMAGED
    assert store.exists(stray)
    assert store.list(layout.released_prefix(TOPIC)) == []


def test_collect_waits_for_every_partition_in_the_footer(store: ObjectStore) -> None:
    key, name = put_shared(store, shared_body([(1, 2), (5, 1)]))
    for p in (0, 1, 2, 3, 4):
        store.put(layout.release_key(TOPIC, name, p), b"")
    assert collect(store, TOPIC, name, partitions=6) == WAITING
    store.put(layout.release_key(TOPIC, name, 5), b"")
    assert collect(store, TOPIC, name, partitions=6) == DELETED
    assert not store.exists(key) and markers(store, name) == []


def test_collect_topic_reads_no_footer_of_an_object_a_partition_holds_unreleased(
        store: ObjectStore) -> None:
    held_key, held_name = put_shared(store, shared_body([(0, 1), (1, 1)], footer=None))
    done_key, done_name = put_shared(store, shared_body([(0, 1), (1, 1)]))
    for name in (held_name, done_name):
        store.put(layout.release_key(TOPIC, name, 0), b"")
    store.put(layout.release_key(TOPIC, done_name, 1), b"")
    # Partition 1 still names the first (unreleased): its footer (missing) is not read;
    # partition 0 names the second, but released it: the second goes.
    report = collect_topic(store, TOPIC, partitions=2,
                           holders={held_key: {1}, done_key: {0}})
    assert (report.deleted, report.waiting, report.warnings) == (1, 1, [])
    assert store.exists(held_key) and not store.exists(done_key)
    # Without what the partitions hold, the footer is read, and its absence warned about.
    report = collect_topic(store, TOPIC, partitions=2)
    assert (report.deleted, report.waiting, len(report.warnings)) == (0, 0, 1)


def test_a_footer_larger_than_the_first_tail_read_is_read_whole(store: ObjectStore) -> None:
    n = 700  # row groups enough for a footer past the first 64 KiB read
    body = shared_body([(p, 1) for p in range(n)])
    assert int.from_bytes(body[-8:-4], "little") > 64 * 1024
    key, name = put_shared(store, body)
    # Waiting (not damaged): the footer was read, parsed and found valid, and names
    # partitions that have not released the object.
    assert release(store, TOPIC, key, 0, partitions=n) == WAITING
    # A footer naming a partition past the topic's is refused from the same read.
    assert collect(store, TOPIC, name, partitions=n - 1) == DAMAGED
    assert store.exists(key)


def test_one_process_reads_an_objects_footer_once_for_all_its_releases(
        store: ObjectStore) -> None:
    n = 8
    key, _ = put_shared(store, shared_body([(p, 2) for p in range(n)]))
    store.counter.reset()
    outcomes = [release(store, TOPIC, key, p, partitions=n) for p in range(n)]
    assert outcomes == [WAITING] * (n - 1) + [DELETED]
    reqs = store.counter.snapshot()["requests"]
    # Per release a put and a listing (one or more requests, by store); the footer's
    # size and tail once; the whole object once (its checksum, before the deletion);
    # then the object and its markers.
    assert (reqs.get("head", 0), reqs.get("get_range", 0), reqs.get("get", 0)) == (1, 1, 1)
    assert (reqs.get("put", 0), reqs.get("delete", 0)) == (n, n + 1)
    assert reqs.get("list", 0) >= n
