"""Hostile roots: what someone who can write into a txlog root (or a server that lies)
can make txlog do.  Links in a local root, entries naming other partitions' objects,
hostile metadata, settings that must agree across clients, flipped bits, and a server
that ignores the atomic create's condition.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import old_checkpoint

import txlog
from txlog import checksums, layout, root_settings
from txlog.batch_codec import encode_parquet
from txlog.errors import (
    AtomicCreateUnsupportedError,
    ConfigError,
    CorruptObjectError,
    LinkInRootError,
    ProducerFencedError,
)
from txlog.maintenance import maintain
from txlog.model import DATA, Entry
from txlog.partition_log import AppendSpec
from txlog.records import kafka_table
from txlog.storage import beneath, open_store


@pytest.fixture(params=["openat2", "walk"])
def resolve(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the local store refuses links: one openat2 call, or a walk of openat
    calls (kernels before 5.6, sandboxes without openat2)."""
    if request.param == "openat2" and not beneath.use_openat2:
        pytest.skip("no openat2 here")
    if request.param == "walk":
        monkeypatch.setattr(beneath, "use_openat2", False)
    return str(request.param)


def _outside(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    (victim / "0" / "data").mkdir(parents=True)
    (victim / "precious").write_bytes(b"keep me")
    (victim / "0" / "data" / "x.parquet").write_bytes(b"keep me too")
    return victim


def _untouched(victim: Path) -> None:
    assert (victim / "precious").read_bytes() == b"keep me"
    assert (victim / "0" / "data" / "x.parquet").read_bytes() == b"keep me too"
    assert sorted(p.name for p in (victim / "0" / "data").iterdir()) == ["x.parquet"]


# --- links in a local root -------------------------------------------------------------


def test_delete_topic_through_a_linked_topic_directory_stays_in_the_root(
        tmp_path: Path, resolve: str) -> None:
    victim = _outside(tmp_path)
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t")
    with lg.producer() as p:
        p.send("t", b"v")
    os.rename(tmp_path / "root" / "topics" / "t", tmp_path / "moved")
    os.symlink(victim, tmp_path / "root" / "topics" / "t")
    with pytest.raises(LinkInRootError, match="symbolic link"):
        txlog.connect(str(tmp_path / "root")).delete_topic("t")
    _untouched(victim)


def test_a_linked_data_directory_receives_no_batch_object(tmp_path: Path,
                                                          resolve: str) -> None:
    victim = _outside(tmp_path)
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t")
    (tmp_path / "root" / "topics" / "t" / "0").mkdir(parents=True, exist_ok=True)
    os.symlink(victim / "0" / "data", tmp_path / "root" / "topics" / "t" / "0" / "data")
    with pytest.raises(LinkInRootError), lg.producer() as p:
        p.send("t", b"v").get()
    _untouched(victim)


def test_store_calls_never_follow_a_link(tmp_path: Path, resolve: str) -> None:
    victim = _outside(tmp_path)
    store = open_store(str(tmp_path / "root"))
    store.put("a/b/real", b"mine")
    os.symlink(victim, tmp_path / "root" / "a" / "dirlink")
    os.symlink(victim / "precious", tmp_path / "root" / "a" / "b" / "filelink")
    # A link is listed as a key (so it can be deleted), never descended into.
    assert store.list("a/") == ["a/b/filelink", "a/b/real", "a/dirlink"]
    with pytest.raises(LinkInRootError):
        store.list("a/dirlink/")
    for call in (lambda: store.get("a/b/filelink"), lambda: store.size("a/b/filelink"),
                 lambda: store.get_range("a/b/filelink", 0, 3),
                 lambda: store.get("a/dirlink/precious"),
                 lambda: store.put("a/dirlink/new", b"x"),
                 lambda: store.put_new("a/dirlink/0/data/new", b"x"),
                 lambda: store.put_if_absent("a/dirlink/new", b"x"),
                 lambda: store.put_if_absent("a/dirlink/sub/new", b"x"),
                 lambda: store.delete("a/dirlink/precious")):
        with pytest.raises(LinkInRootError):
            call()
    # Deleting a link removes the link, never what it names.
    store.delete("a/b/filelink")
    store.delete("a/dirlink")
    assert store.list("a/") == ["a/b/real"]
    _untouched(victim)
    assert store.get("a/b/real") == b"mine"


def test_a_directory_swapped_for_a_link_after_first_use_is_refused(
        tmp_path: Path, resolve: str) -> None:
    """The store keeps directory descriptors between writes; a directory replaced by a
    link meanwhile is noticed, not written through."""
    victim = _outside(tmp_path)
    store = open_store(str(tmp_path / "root"))
    store.put_if_absent("t/0/data/a", b"1")
    os.rename(tmp_path / "root" / "t", tmp_path / "moved")
    os.symlink(victim, tmp_path / "root" / "t")
    with pytest.raises(LinkInRootError):
        store.put_if_absent("t/0/data/b", b"2")
    with pytest.raises(LinkInRootError):
        store.put_new("t/0/data/c", b"3")
    _untouched(victim)


def test_the_root_itself_may_be_a_link(tmp_path: Path, resolve: str) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "root")
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t")
    with lg.producer() as p:
        p.send("t", b"v")
    with lg.consumer(auto_offset_reset="earliest") as c:
        c.assign(lg.partitions_for("t"))
        assert [r.value for r in c.poll(timeout_ms=0)] == [b"v"]


# --- entries naming objects that are not their partition's ------------------------------


def _victim_and_attacker(tmp_path: Path) -> tuple[txlog.Log, str]:
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("victim")
    lg.create_topic("attacker", config={"retention.ms": 1, "file.delete.delay.ms": 0})
    with lg.producer() as p:
        p.send("victim", b"secret")
    (victim_obj,) = lg.store.list(layout.data_prefix("victim", 0))
    return lg, victim_obj


@pytest.mark.parametrize("named", ["victim batch", "pid block", "staged elsewhere"])
def test_an_entry_naming_another_partitions_object_is_corrupt(tmp_path: Path,
                                                              named: str) -> None:
    lg, victim_obj = _victim_and_attacker(tmp_path)
    with lg.producer(transactional_id="x") as p:  # claims a producer-id block
        p.init_transactions()
    key = {"victim batch": victim_obj,
           "pid block": layout.pid_block_key(0),
           "staged elsewhere": "topics/victim/_staging/x/p00000-a.parquet"}[named]
    lg.store.put("topics/victim/_staging/x/p00000-a.parquet", lg.store.get(victim_obj))
    before = {k: lg.store.get(k) for k in (victim_obj, layout.pid_block_key(0))}
    entry = Entry(slot=0, kind=DATA, base_offset=0, count=1, data=key, nbytes=10,
                  ts_min=1, ts_max=1, append_ms=1)
    lg.store.put(layout.entry_key("attacker", 0, 0), entry.encode())

    other = txlog.connect(str(tmp_path / "root"))
    with pytest.raises(CorruptObjectError, match="outside attacker-0's own data"), \
            other.consumer(auto_offset_reset="earliest") as c:
        c.assign(other.partitions_for("attacker"))
        c.poll()
    # maintain goes on past a bad partition and reports it (deleting nothing of victim's)
    report = maintain(other, ["attacker"], now=2**40)
    assert any("outside attacker-0's own data" in f for f in report.failures), report.failures
    assert {k: lg.store.get(k) for k in before} == before
    with other.consumer(auto_offset_reset="earliest") as c:
        c.assign(other.partitions_for("victim"))
        assert [r.value for r in c.poll()] == [b"secret"]


def test_a_checkpoint_naming_another_partitions_object_is_not_used(tmp_path: Path) -> None:
    """A checkpoint is checked as the entries are: one naming a foreign object is
    passed over for the log itself."""
    lg, victim_obj = _victim_and_attacker(tmp_path)
    with lg.producer() as p:
        p.send("attacker", b"mine")
    plog = lg.partition_log(txlog.TopicPartition("attacker", 0))
    st = plog.refresh()
    st.pending_deletes.append((0, victim_obj))
    plog.write_checkpoint(st)
    other = txlog.connect(str(tmp_path / "root"))
    assert other.partition_log(txlog.TopicPartition("attacker", 0)).refresh() \
        .pending_deletes == []
    maintain(other, ["attacker"], now=2**40)
    assert lg.store.exists(victim_obj)


# --- stored metadata is checked as creation checks it ----------------------------------


@pytest.mark.parametrize("change", [
    {"partitions": 10**9}, {"partitions": 0}, {"partitions": -5}, {"partitions": "3"},
    {"partitions": True}, {"partitions": 2.0}, {"name": "other"}, {"name": "../x"},
    {"kafka_shaped": "yes"}, {"config": {"retention.ms": "soon"}},
    {"config": {"no.such.key": 1}}, {"config": [1]}, {"created_ms": "x"},
])
def test_hostile_topic_metadata_is_a_clear_error(tmp_path: Path,
                                                 change: dict[str, Any]) -> None:
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t", partitions=2)
    key = layout.topic_meta("t")
    meta = json.loads(lg.store.get(key))
    meta.update(change)
    lg.store.put(key, json.dumps(meta).encode())
    other = txlog.connect(str(tmp_path / "root"))
    for call in (lambda: other.describe_topic("t"),
                 lambda: other.partitions_for("t"),
                 lambda: other.producer().send("t", b"v").get()):
        with pytest.raises(CorruptObjectError, match=r"topic metadata _meta/topics/t\.json"):
            call()
    # maintain goes on past it and reports it
    failures = maintain(other, ["t"]).failures
    assert any("topic metadata _meta/topics/t.json" in f for f in failures), failures


# --- settings every client of a root must agree on ---------------------------------------


def test_a_second_client_with_other_state_log_partitions_is_refused(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    first = txlog.connect(root, transaction_state_log_num_partitions=3)
    first.create_topic("t")
    other = txlog.connect(root, transaction_state_log_num_partitions=5)
    with pytest.raises(ConfigError, match=r"transaction\.state\.log\.num\.partitions=5.*=3"):
        other.producer(transactional_id="app")
    with pytest.raises(ConfigError, match=r"offsets\.topic\.num\.partitions"):
        txlog.connect(root, offsets_topic_num_partitions=2).producer()


def test_a_client_that_sets_nothing_takes_the_roots_settings_and_fences(
        tmp_path: Path) -> None:
    """The issue's race: the old instance hashed its transactional.id over 3 state-log
    partitions, the new one (defaults) would have used 4096, and neither fenced the other."""
    root = str(tmp_path / "root")
    old_lg = txlog.connect(root, transaction_state_log_num_partitions=3,
                           transaction_max_timeout_ms=120_000)
    old_lg.create_topic("t")
    old = old_lg.producer(transactional_id="app")
    old.init_transactions()
    old.begin_transaction()
    old.send("t", b"zombie")
    new_lg = txlog.connect(root)
    new = new_lg.producer(transactional_id="app")
    assert new_lg.config["transaction.state.log.num.partitions"] == 3
    assert new_lg.config["transaction.max.timeout.ms"] == 120_000
    new.init_transactions()
    with pytest.raises(ProducerFencedError):
        old.commit_transaction()
    new.begin_transaction()
    new.send("t", b"live")
    new.commit_transaction()
    with new_lg.consumer(auto_offset_reset="earliest") as c:
        c.assign(new_lg.partitions_for("t"))
        assert [r.value for r in c.poll()] == [b"live"]



def test_a_client_that_read_no_settings_just_before_the_root_was_made_still_agrees(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client finds no settings object, and before it looks whether the root is in
    use, another client creates the root (settings, then a topic): the root is new, not
    one made before settings were stored, so the first client takes its settings too."""
    root = str(tmp_path / "root")
    late = txlog.connect(root)  # sets nothing: must end up with the root's 3
    first = txlog.connect(root, transaction_state_log_num_partitions=3)
    real_get = late.store.get

    def get(key: str) -> bytes:
        if key == root_settings.KEY and not first.list_topics():
            first.create_topic("t")  # lands between this read and the next look
            raise KeyError(key)
        return real_get(key)

    monkeypatch.setattr(late.store, "get", get)
    assert late.root_settings()["transaction.state.log.num.partitions"] == 3
    with pytest.raises(ConfigError, match=r"transaction\.state\.log\.num\.partitions=5"):
        txlog.connect(root, transaction_state_log_num_partitions=5).root_settings()


def test_a_root_made_before_stored_settings_keeps_its_clients_configuration(
        tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    lg = txlog.connect(root, transaction_state_log_num_partitions=3)
    lg.create_topic("t")
    lg.store.delete(root_settings.KEY)  # as a root written before settings were stored
    again = txlog.connect(root, transaction_state_log_num_partitions=3)
    with again.producer(transactional_id="app") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("t", b"v")
        p.commit_transaction()
    assert again.root_settings()["transaction.state.log.num.partitions"] == 3
    assert not again.store.exists(root_settings.KEY)  # nothing guessed and written


@pytest.mark.parametrize("settings", [
    b"{", b"[]", b'{"v": 1}', b'{"v": 9, "settings": {}}',
    b'{"v": 1, "settings": {"transaction.state.log.num.partitions": 0, '
    b'"offsets.topic.num.partitions": 1, "transaction.max.timeout.ms": 1}}',
    b'{"v": 1, "settings": {"transaction.state.log.num.partitions": "3", '
    b'"offsets.topic.num.partitions": 1, "transaction.max.timeout.ms": 1}}',
])
def test_hostile_root_settings_are_a_clear_error(tmp_path: Path, settings: bytes) -> None:
    root = str(tmp_path / "root")
    txlog.connect(root).create_topic("t")
    txlog.connect(root).store.put(root_settings.KEY, settings)
    with pytest.raises(CorruptObjectError, match=r"root settings _meta/root\.json"):
        txlog.connect(root).producer()


# --- a server that ignores the atomic create's condition ---------------------------------


def _lying(store_factory: Any, backend: str, **options: Any) -> Any:
    """A SeaweedFS store whose first two conditional creates the server answers as a
    plain overwrite (If-None-Match ignored), through the client ``backend`` uses."""
    from txlog.testing.s3_faults import ScriptedCreateFS, ScriptedCreateObstore

    store = store_factory(backend, "lying")
    if options:
        from txlog.storage.remote import RemoteStore

        store = RemoteStore(store.url, "s3", {**store.storage_options, **options})
    fast = store.fast()
    if fast is not None:
        store._ob = ScriptedCreateObstore(fast, ["ignore", "ignore"])
    else:
        store._fs = ScriptedCreateFS(store.fsspec(), ["ignore", "ignore"])
    return store


@pytest.mark.s3
@pytest.mark.parametrize("backend", ["s3", "s3fs"])
def test_a_server_ignoring_if_none_match_is_refused_on_first_create(
        store_factory: Any, backend: str) -> None:

    store = _lying(store_factory, backend)
    with pytest.raises(AtomicCreateUnsupportedError, match="ignores conditional creates"):
        store.check_atomic_create()
    assert store.list("") == []  # no passing verdict stored, the probe cleaned up
    with pytest.raises(AtomicCreateUnsupportedError):  # (the verdict is kept in-process)
        store.check_atomic_create()


@pytest.mark.s3
def test_a_passing_verdict_is_stored_in_the_root_and_read_by_the_next_process(
        store_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from txlog.storage import atomic_check, remote
    from txlog.storage.remote import RemoteStore

    store = store_factory("s3", "verdict")
    store.check_atomic_create()
    (verdict,) = store.list(remote.VERDICT_PREFIX)
    assert json.loads(store.get(verdict))["verdict"] == "atomic"
    monkeypatch.setattr(atomic_check, "_VERDICTS", {})  # as a new process
    again = RemoteStore(store.url, "s3", store.storage_options)
    again.check_atomic_create()
    assert again.counter.snapshot()["requests"] == {"get": 1}  # the verdict; no probe
    # Behind another endpoint (a proxy to the same bucket, say) the check runs again.
    assert again._verdict_key() != RemoteStore(
        store.url, "s3", {**store.storage_options, "endpoint_url": "http://127.0.0.2:1"},
    )._verdict_key()


@pytest.mark.s3
def test_the_escape_hatch_skips_the_check(store_factory: Any) -> None:
    store = _lying(store_factory, "s3", txlog_probe_atomic_create=False)
    assert store.fast() is not None  # (the option does not send the store to s3fs)
    store.check_atomic_create()
    assert store.list("") == []  # nothing probed
    with pytest.raises(ConfigError, match="txlog_probe_atomic_create"):
        open_store(store.url, {**store.storage_options, "txlog_probe_atomic_create": "no"})


@pytest.mark.s3
def test_create_topic_on_a_lying_server_is_refused(seaweed: Any) -> None:
    from txlog.testing.s3_faults import ScriptedCreateObstore

    lg = txlog.connect(seaweed.fresh_url("lying-log"), seaweed.storage_options)
    store: Any = lg.store  # its S3 client is swapped for a scripted one
    store._ob = ScriptedCreateObstore(store.fast(), ["ignore", "ignore"])
    with pytest.raises(AtomicCreateUnsupportedError):
        lg.create_topic("t")
    assert lg.list_topics() == []
    with pytest.raises(AtomicCreateUnsupportedError):
        lg.producer()


# --- checksums -------------------------------------------------------------------------


def _flip_parquet_value(raw: bytes, needle: bytes) -> bytes:
    """``raw`` with one bit flipped inside the first occurrence of ``needle`` (a value
    stored uncompressed enough to find; the Parquet file stays decodable)."""
    i = raw.index(needle)
    return raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:]


def test_a_flipped_bit_in_a_batch_object_is_an_error_not_data(tmp_path: Path) -> None:
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t")
    value = b"payment to account 1234567890" * 4
    with lg.producer() as p:
        p.send("t", value)
    (obj,) = lg.store.list(layout.data_prefix("t", 0))
    assert checksums.expected(obj) is not None
    lg.store.put(obj, _flip_parquet_value(lg.store.get(obj), b"account 1234567890"))
    other = txlog.connect(str(tmp_path / "root"))
    with pytest.raises(CorruptObjectError, match="fails its checksum"), \
            other.consumer(auto_offset_reset="earliest") as c:
        c.assign(other.partitions_for("t"))
        c.poll()


def test_objects_without_a_checksum_stay_readable(tmp_path: Path) -> None:
    """Batch objects written before checksums (no tag in the name) are read unchecked."""
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t")
    plog = lg.partition_log(txlog.TopicPartition("t", 0))
    data = encode_parquet(kafka_table([(None, b"old", None, None)]))
    key = layout.data_key("t", 0, "before-checksums")
    lg.store.put(key, data)
    plog.append(AppendSpec(kind=DATA, count=1, data=key, nbytes=len(data)))
    with lg.consumer(auto_offset_reset="earliest") as c:
        c.assign(lg.partitions_for("t"))
        assert [r.value for r in c.poll()] == [b"old"]


@pytest.mark.parametrize("damage", ["digit", "trailer", "strip"])
def test_a_damaged_checkpoint_is_not_trusted(tmp_path: Path, damage: str) -> None:
    """The issue's case: a flipped digit in a checkpoint's offsets skipped records for
    good.  Now the checkpoint fails its checksum and the log is replayed."""
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t")
    with lg.producer() as p:
        for i in range(3):
            p.send("t", f"v{i}".encode()).get()
    plog = lg.partition_log(txlog.TopicPartition("t", 0))
    key = plog.write_checkpoint()
    raw = lg.store.get(key)
    if damage == "digit":
        i = raw.index(b'"high_watermark": 3')
        raw = raw[:i] + b'"high_watermark": 9' + raw[i + len(b'"high_watermark": 3'):]
    elif damage == "trailer":
        raw = raw[:-1] + bytes([raw[-1] ^ 0x10])
    else:
        raw = raw[:-12]
    lg.store.put(key, raw)
    other = txlog.connect(str(tmp_path / "root"))
    st = other.partition_log(txlog.TopicPartition("t", 0)).refresh()
    assert st.high_watermark == 3
    with other.consumer(auto_offset_reset="earliest") as c:
        c.assign(other.partitions_for("t"))
        assert [r.value for r in c.poll()] == [b"v0", b"v1", b"v2"]


def test_a_version_1_checkpoint_without_a_checksum_is_still_read(tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    from txlog import checkpoint

    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t")
    with lg.producer() as p:
        p.send("t", b"v").get()
    st = lg.partition_log(txlog.TopicPartition("t", 0)).refresh()
    raw = old_checkpoint(st, 1)
    assert checkpoint.decode_checkpoint(raw, "old").high_watermark == 1


@pytest.mark.parametrize("backend", [
    pytest.param("s3", marks=pytest.mark.s3), pytest.param("s3fs", marks=pytest.mark.s3),
    pytest.param("gcs", marks=pytest.mark.gcs)])
def test_real_servers_pass_the_probe(store_factory: Any, backend: str) -> None:
    """SeaweedFS (If-None-Match) and fake-gcs-server (ifGenerationMatch=0) honour the
    condition: the probe passes and leaves only its verdict."""
    from txlog.storage import remote

    store = store_factory(backend, "probe")
    store.check_atomic_create()
    assert [k.startswith(remote.VERDICT_PREFIX) for k in store.list("")] == [True]


def test_a_damaged_state_log_checkpoint_is_not_trusted(tmp_path: Path) -> None:
    """A flipped digit in a state-log checkpoint (an epoch here) would let a fenced
    producer back in; it fails its checksum and the log is replayed."""
    from txlog import state_log

    lg = txlog.connect(str(tmp_path / "root"), transaction_state_log_num_partitions=1)
    lg.create_topic("t")
    with lg.producer(transactional_id="app") as p:
        p.init_transactions()
    part = lg.coordinator.state_log.partition_for("app")
    part.refresh()
    epoch = part.records["app"].epoch
    part._checkpoint()
    (key,) = lg.store.list(f"{part.prefix}checkpoints/")
    raw = json.loads(lg.store.get(key))
    assert "crc" in raw
    raw["records"]["app"]["epoch"] = epoch + 7
    lg.store.put(key, json.dumps(raw, separators=(",", ":")).encode())
    fresh = state_log.StateLogPartition(lg.store, part.partition)
    fresh.refresh()
    assert fresh.records["app"].epoch == epoch


def test_a_prepare_commit_naming_another_partitions_object_is_corrupt() -> None:
    from txlog.txn_state import PREPARE_COMMIT, PendingAppend, TxnRecord

    own = PendingAppend("a", 0, 0, (("topics/a/0/data/x.parquet", 1, 10, None, None,
                                     True),))
    rec = TxnRecord("t", 1, 0, PREPARE_COMMIT, 1000, (("a", 0),), pending=(own,))
    assert TxnRecord.from_json(rec.to_json(), "x") == rec
    for key in ("topics/b/0/data/x.parquet", "topics/a/1/data/x.parquet",
                "_txn/pid-blocks/000000000000.json", "topics/a/0/data/../../b/x"):
        d = rec.to_json()
        d["pending"][0][3][0][0] = key
        with pytest.raises(CorruptObjectError, match="not a-0's own"):
            TxnRecord.from_json(d, "x")


@pytest.mark.parametrize("field,value", [("next_slot", -1), ("high_watermark", "7"),
                                         ("log_start_offset", 99), ("high_watermark", 2.5)])
def test_a_checkpoint_with_impossible_offsets_is_not_used(field: str, value: Any) -> None:
    """Checked as the log's own replay would have them (its checksum may match: it is
    written by whoever can write the root)."""
    import pyarrow as pa

    from txlog import checkpoint
    from txlog.partition_state import PartitionState

    raw = checkpoint.encode_checkpoint(PartitionState(next_slot=3, high_watermark=5))
    table = pa.ipc.open_stream(pa.py_buffer(raw[:-12])).read_all()
    meta = json.loads(table.schema.metadata[b"txlog"])
    meta[field] = value
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema.with_metadata({"txlog": json.dumps(meta)})) as w:
        w.write_table(table.replace_schema_metadata({"txlog": json.dumps(meta)}))
    with pytest.raises(CorruptObjectError, match="invalid contents"):
        checkpoint.decode_checkpoint(checkpoint.with_checksum(sink.getvalue().to_pybytes()),
                                     "x")


def _checkpoint_of(data: list[str], bases: list[int]) -> bytes:
    from txlog.checkpoint import encode_checkpoint
    from txlog.partition_state import COMMITTED, BatchColumns, PartitionState

    b = BatchColumns()
    for key, base in zip(data, bases, strict=True):
        for name, value in (("base_offset", base), ("count", 2), ("producer_id", 1),
                            ("epoch", 0), ("status", COMMITTED), ("data", key),
                            ("nbytes", 10), ("ts_min", 1), ("ts_max", 1), ("append_ms", 1),
                            ("txn_id", None), ("row", 0), ("object_rows", 0)):
            getattr(b, name).append(value)
    st = PartitionState(next_slot=len(data), high_watermark=max(bases, default=0) + 2)
    st.batches = b
    return encode_checkpoint(st)


@pytest.mark.parametrize("keys,used", [
    (["topics/t/0/data/a.parquet", "topics/t/0/data/b.parquet"], True),
    (["topics/t/0/data/a.parquet", "topics/t/_staging/x/b.parquet"], True),
    (["topics/t/0/data/a.parquet", "topics/t/1/data/b.parquet"], False),
    (["topics/t/0/data/a.parquet", "topics/u/0/data/b.parquet"], False),
    (["topics/t/0/data/a.parquet", "topics/t/0/data/../../1/data/b.parquet"], False),
    (["topics/t/0/data/a.parquet", "topics/t/0/data/b\\..parquet"], False),
])
def test_every_object_a_checkpoints_batches_name_is_checked(tmp_path: Path, keys: list[str],
                                                            used: bool) -> None:
    """The batch index is checked as a column: one foreign key among a partition's own
    keeps the whole checkpoint out."""
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t", partitions=2)
    lg.store.put(layout.checkpoint_key("t", 0, 2), _checkpoint_of(keys, [0, 2]))
    st = lg.partition_log(txlog.TopicPartition("t", 0)).refresh()
    assert (len(st.batches) == 2) is used
    if used:
        assert st.batches.data == keys


def test_a_checkpoint_whose_batches_go_back_or_have_no_value_is_not_used() -> None:
    import pyarrow as pa

    from txlog import checkpoint

    keys = ["topics/t/0/data/a.parquet", "topics/t/0/data/b.parquet"]
    checkpoint.decode_checkpoint(_checkpoint_of(keys, [0, 2]), "x")
    with pytest.raises(CorruptObjectError, match="overlap or go backwards"):
        checkpoint.decode_checkpoint(_checkpoint_of(keys, [0, 1]), "x")
    raw = _checkpoint_of(keys, [0, 2])
    table = pa.ipc.open_stream(pa.py_buffer(raw[:-12])).read_all()
    i = table.schema.get_field_index("ts_min")
    table = table.set_column(i, table.schema.field(i), pa.array([1, None], pa.int64()))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(CorruptObjectError, match="null values"):
        checkpoint.decode_checkpoint(checkpoint.with_checksum(sink.getvalue().to_pybytes()),
                                     "x")
