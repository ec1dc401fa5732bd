"""Internal topics: clients cannot create, delete or plain-produce to ``__consumer_offsets``,
and a malformed record found there (written by a client of the store behind txlog's
back) is a CorruptObjectError naming it, not a raw JSON, type or overflow error."""

from __future__ import annotations

import json
import uuid

import pytest

import txlog
from txlog import admin
from txlog.errors import CorruptObjectError, InvalidTopicError
from txlog.model import DATA
from txlog.names import CONSUMER_OFFSETS_TOPIC
from txlog.offsets import offsets_partition
from txlog.partition_log import AppendSpec
from txlog.records import TopicPartition, kafka_table, now_ms

TP = TopicPartition("t", 0)


def new_log() -> txlog.Log:
    log = txlog.connect(f"memory://internal/{uuid.uuid4().hex}")
    log.create_topic("t")
    return log


def test_clients_cannot_create_delete_or_produce_to_internal_topics() -> None:
    log = new_log()
    c = log.consumer(group_id="g")
    c.assign([TP])
    c.commit({TP: 0})  # creates the offsets topic, as txlog does
    with pytest.raises(InvalidTopicError, match="internal topic '__consumer_offsets'"):
        log.create_topic(CONSUMER_OFFSETS_TOPIC, partitions=1)
    with pytest.raises(InvalidTopicError, match="internal"):
        log.delete_topic(CONSUMER_OFFSETS_TOPIC)
    p = log.producer()
    with pytest.raises(InvalidTopicError, match="cannot produce"):
        p.send(CONSUMER_OFFSETS_TOPIC, b"junk", partition=0)
    with pytest.raises(InvalidTopicError):
        p.send_batch(CONSUMER_OFFSETS_TOPIC, kafka_table([(None, b"junk", None, None)]))
    with pytest.raises(InvalidTopicError):
        p.send_staged(TopicPartition(CONSUMER_OFFSETS_TOPIC, 0), "x", 1, 1)
    p.close()
    # Offsets still go through their own calls, in and out of transactions.
    tp = log.producer(transactional_id="tx")
    tp.init_transactions()
    tp.begin_transaction()
    tp.send_offsets_to_transaction({TP: 5}, "g")
    tp.commit_transaction()
    tp.close()
    assert c.committed([TP]) == {TP: 5}
    assert CONSUMER_OFFSETS_TOPIC in log.list_topics(internal=True)


def _write_raw_offsets_record(log: txlog.Log, group: str, key: bytes, value: bytes) -> int:
    """A record in the group's offsets partition, as a hostile writer of the store could
    append it; returns its offset."""
    otp = offsets_partition(log, group)
    plog = log.partition_log(otp)
    data, nbytes = plog.write_data(kafka_table([(key, value, None, None)]))
    res = plog.append(AppendSpec(kind=DATA, count=1, data=data, nbytes=nbytes,
                                 ts_min=now_ms(), ts_max=now_ms()))
    return res.base_offset


GOOD_KEY = json.dumps(["g", "t", 0], separators=(",", ":")).encode()


@pytest.mark.parametrize("value", [b"not json", b"[1, 2]", b'{"offset": "5"}',
                                   b'{"offset": -1}', b'{"offset": 1e999}',
                                   b'{"offset": 99999999999999999999999}', b'{"no": 1}',
                                   b"[" * 100_000])
def test_a_malformed_offsets_value_is_named(value: bytes) -> None:
    log = new_log()
    c = log.consumer(group_id="g")
    c.assign([TP])
    c.commit({TP: 1})
    off = _write_raw_offsets_record(log, "g", GOOD_KEY, value)
    otp = offsets_partition(log, "g")
    where = f"{otp.topic}-{otp.partition} offset {off}"
    fresh = txlog.connect(log.url)
    with pytest.raises(CorruptObjectError, match=f"offsets record {where} has a malformed "
                                                 "value"):
        fresh.consumer(group_id="g").committed([TP])
    with pytest.raises(CorruptObjectError, match=where):
        admin.list_groups(fresh)


@pytest.mark.parametrize("key", [b"nope", b'{"a": 1, "b": 2, "c": 3}', b'["g", "t", 1e999]',
                                 b'[1, "t", 0]', b'["g", "t", -1]', b'["g", "t"]'])
def test_a_malformed_offsets_key_is_named(key: bytes) -> None:
    log = new_log()
    c = log.consumer(group_id="g")
    c.assign([TP])
    c.commit({TP: 3})
    off = _write_raw_offsets_record(log, "g", key, b'{"offset": 1}')
    fresh = txlog.connect(log.url)
    # A consumer looks only for its own keys: one it cannot match does not concern it.
    assert fresh.consumer(group_id="g").committed([TP]) == {TP: 3}
    with pytest.raises(CorruptObjectError, match=f"offset {off} has a malformed key"):
        admin.describe_group(fresh, "g")
