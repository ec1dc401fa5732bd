"""Roots that are mistyped, unreachable, partly damaged or read-only: a read-only command
does not create a root; a server that refuses connections fails the call after
socket.connection.setup.timeout.ms, not after every attempt's retries; ``maintain`` goes
on past a bad partition, reports each failure and exits non-zero; and a root that can be
read but not written is consumed while an expired transaction is open (what is decided
is read, and a warning says the transaction could not be settled)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog import TopicPartition, layout
from txlog.errors import RootNotFoundError, StorageError
from txlog.maintenance import maintain
from txlog.storage.remote import RemoteStore

ENV_DROP = ("TXLOG_ROOT", "TXLOG_CONF", "TXLOG_STORAGE_OPTIONS", "TXLOG_DEBUG")


def cli(*args: str, root: str, prefix: list[str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    return subprocess.run([*(prefix or []), sys.executable, "-m", "txlog.cli", "--root", root,
                           *args], capture_output=True, text=True, env=env, timeout=120)


# -- a mistyped root ---------------------------------------------------------------------


@pytest.mark.parametrize("args", [["topics", "list"], ["consume", "t", "--from-beginning"],
                                  ["describe"], ["transactions", "list"],
                                  ["groups", "list"], ["maintain"]])
def test_a_command_on_a_mistyped_root_does_not_create_it(args: list[str],
                                                         tmp_path: Path) -> None:
    root = tmp_path / "tyop" / "root"
    p = cli(*args, root=str(root))
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith("txlog: error: no txlog root at ") and \
        p.stderr.count("\n") == 1, p.stderr
    assert not (tmp_path / "tyop").exists()


def test_topics_create_and_the_api_still_create_a_root(tmp_path: Path) -> None:
    with pytest.raises(RootNotFoundError, match="does not exist"):
        txlog.connect(str(tmp_path / "missing"), create=False)
    assert not (tmp_path / "missing").exists()
    assert cli("topics", "create", "t", root=str(tmp_path / "new")).returncode == 0
    assert txlog.connect(str(tmp_path / "new"), create=False).list_topics() == ["t"]
    txlog.connect(str(tmp_path / "api"))  # the API's default, as before
    assert (tmp_path / "api").is_dir()


# -- a server that refuses connections ---------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connect_retries_are_bounded_by_the_setup_timeout() -> None:
    pytest.importorskip("obstore")
    pytest.importorskip("s3fs")
    port = _closed_port()
    fast_fail: dict[str, Any] = {"socket.connection.setup.timeout.ms": 1}
    log = txlog.connect("s3://bucket/root", {
        "key": "k", "secret": "s", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}",
                                                     "region_name": "us-east-1"}},
        **fast_fail)
    with pytest.raises(StorageError, match=r"cannot connect .*socket\.connection\.setup"):
        log.create_topic("t")
    # At most one conditional create and one read (the atomic-create probe's or the
    # create's read-back), instead of ten of each.
    requests = log.store.counter.snapshot()["requests"]
    assert requests.get("put_if_absent", 0) <= 1 and requests.get("get", 0) <= 1, requests
    assert isinstance(log.store, RemoteStore) and log.store.connect_timeout_s == 0.001
    import pickle

    assert pickle.loads(pickle.dumps(log)).store.connect_timeout_s == 0.001


# -- maintain past a bad partition -------------------------------------------------------


def _damaged_root(tmp_path: Path) -> str:
    root = str(tmp_path / "root")
    log = txlog.connect(root)
    log.create_topic("a", partitions=2)
    log.create_topic("b")
    for topic, part in (("a", 0), ("a", 1), ("b", 0)):
        p = log.producer()
        for i in range(3):
            p.send(topic, f"{topic}{i}".encode(), partition=part)
            p.flush()  # one batch each: something to compact
        p.close()
    bad = log.store.list(layout.log_prefix("a", 0))[-1]
    log.store.put(bad, b"{not an entry")
    return root


def test_maintain_goes_on_past_a_bad_partition(tmp_path: Path) -> None:
    root = _damaged_root(tmp_path)
    report = maintain(txlog.connect(root))
    by_tp = {(r.topic, r.partition): r for r in report.partitions}
    assert by_tp["a", 0].error is not None and "topics/a/0/log/" in by_tp["a", 0].error
    assert len(report.failures) == 1 and report.failures[0].startswith("a-0: ")
    for tp in (("a", 1), ("b", 0)):
        assert by_tp[tp].error is None and by_tp[tp].checkpoint
        assert by_tp[tp].compacted_batches == 3


def test_maintain_cli_reports_each_failure_and_exits_non_zero(tmp_path: Path) -> None:
    root = _damaged_root(tmp_path)
    log = txlog.connect(root)
    bad_b = log.store.list(layout.log_prefix("b", 0))[0]
    log.store.put(bad_b, b"\xff")
    p = cli("maintain", "--json", root=root)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 2 and all(x.startswith("txlog: error: ") for x in lines), p.stderr
    assert any("a-0: " in x for x in lines) and any("b-0: " in x for x in lines)
    report = json.loads(p.stdout)
    assert [r["error"] is None for r in report["partitions"]] == [False, True, False]
    assert len(report["failures"]) == 2


# -- a root that can be read but not written ---------------------------------------------


@pytest.fixture
def read_only() -> Iterator[tuple[list[str], list[Path]]]:
    """A command prefix that runs a process without write access to files it does not
    own the write bits of, and the roots to make read-only (restored afterwards)."""
    roots: list[Path] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root needs setpriv to drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
                  "--inh-caps", "-dac_override,-dac_read_search"]
    else:
        prefix = []
    yield prefix, roots
    for root in roots:
        for d, _, files in os.walk(root):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)


def _make_read_only(root: Path) -> None:
    for d, _, files in os.walk(root):
        for f in files:
            os.chmod(os.path.join(d, f), stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    for d, _, _ in os.walk(root, topdown=False):
        os.chmod(d, 0o555)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_a_read_only_root_is_consumed_while_an_expired_transaction_is_open(
        tmp_path: Path, read_only: tuple[list[str], list[Path]]) -> None:
    prefix, roots = read_only
    root = tmp_path / "root"
    log = txlog.connect(str(root))
    log.create_topic("t")
    p = log.producer(transactional_id="done")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"committed")
    p.commit_transaction()
    p.close()
    # An open transaction whose timeout (1 ms) is over once anyone reads: its record,
    # and a committed one after it, wait behind the LSO for someone to abort it.
    hung = log.producer(transactional_id="hung", transaction_timeout_ms=1)
    hung.init_transactions()
    hung.begin_transaction()
    hung.send("t", b"never-committed")
    hung.flush()
    later = log.producer()
    later.send("t", b"after")
    later.flush()
    later.close()
    roots.append(root)
    _make_read_only(root)
    before = _files(root)
    # (a reader that cannot write the store's clock probe aborts only what it has itself
    # watched open for the whole timeout: --timeout-ms keeps it polling past the 1 ms)
    res = cli("consume", "t", "--from-beginning", "--timeout-ms", "2000", root=str(root),
              prefix=prefix)
    assert res.returncode == 0, res.stderr
    values = [json.loads(x)["value"] for x in res.stdout.splitlines()]
    assert values == ["committed"]
    assert "could not roll forward or abort" in res.stderr and "t-0" in res.stderr
    assert "Traceback" not in res.stderr
    assert _files(root) == before  # nothing written
    # With write access the same command aborts the transaction and reads on.
    for d, _, files in os.walk(root):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    res = cli("consume", "t", "--from-beginning", root=str(root))
    assert res.returncode == 0, res.stderr
    assert [json.loads(x)["value"] for x in res.stdout.splitlines()] == ["committed", "after"]
    hung.close()


def test_a_read_only_root_is_detected_once_and_committed_answers_at_once(
        tmp_path: Path, read_only: tuple[list[str], list[Path]]) -> None:
    """An open transaction holds the group's offsets, and this client cannot write: it
    cannot settle the transaction (nor measure the store's clock), so committed() says
    so at once instead of retrying until its timeout, and the client tries no write
    again on every check (one attempt in all)."""
    prefix, roots = read_only
    root = tmp_path / "root"
    log = txlog.connect(str(root))
    log.create_topic("t")
    p = log.producer(transactional_id="done")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"committed")
    p.send_offsets_to_transaction({TopicPartition("t", 0): 1}, "g")
    p.commit_transaction()
    p.close()
    hung = log.producer(transactional_id="hung", transaction_timeout_ms=600_000)
    hung.init_transactions()
    hung.begin_transaction()
    hung.send("t", b"never-committed")
    hung.send_offsets_to_transaction({TopicPartition("t", 0): 2}, "g")
    hung.flush()
    roots.append(root)
    _make_read_only(root)
    before = _files(root)
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    res = subprocess.run([*prefix, sys.executable, str(Path(__file__).with_name(
        "read_only_child.py")), str(root), "g"], capture_output=True, text=True, env=env,
        timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out.get("error") == "UnstableOffsetCommitError", out
    assert "cannot write" in out["message"] and "txlog maintain" in out["message"], out
    assert out["puts_after_committed"] == 1, out  # the store-clock probe, once
    assert out["values"] == ["committed"]
    assert out["puts"] == 1, out
    assert _files(root) == before
    hung.close(timeout=0)


def test_only_a_refused_write_counts_as_read_only_access() -> None:
    """A timeout or a dropped connection is tried again later; a permission error, a
    read-only file system or obstore's PermissionDeniedError (a 403) is not."""
    import errno

    from txlog.storage.create_outcome import write_refused

    obstore_exceptions = pytest.importorskip("obstore.exceptions")
    try:
        raise StorageError("put failed") from obstore_exceptions.PermissionDeniedError("403")
    except StorageError as exc:
        assert write_refused(exc)
    assert write_refused(PermissionError(errno.EACCES, "denied"))
    assert write_refused(OSError(errno.EROFS, "read-only file system"))
    assert not write_refused(TimeoutError("timed out"))
    assert not write_refused(StorageError("put failed: 503 SlowDown"))


@pytest.fixture(scope="module")
def seaweed_with_reader() -> Iterator[Any]:
    """A SeaweedFS server of this module's own, with an identity that may only read."""
    from txlog.testing import servers

    require = pytest.importorskip
    require("s3fs")
    try:
        server = servers.start_seaweed(read_only_identity=True)
    except servers.ServerUnavailable as exc:
        pytest.skip(f"SeaweedFS unavailable: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.s3
def test_a_read_only_remote_root_writes_its_clock_probe_once(seaweed_with_reader: Any) -> None:
    """With credentials that may only read, the store refuses the store-clock probe
    (403): the client tries it once, not at every timeout check, and committed() answers
    at once that it cannot settle the transaction holding the group's offsets."""
    server = seaweed_with_reader
    url = server.fresh_url("ro")
    log = txlog.connect(url, server.storage_options)
    log.create_topic("t")
    with log.producer(transactional_id="done") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("t", b"committed")
        p.send_offsets_to_transaction({TopicPartition("t", 0): 1}, "g")
        p.commit_transaction()
    hung = log.producer(transactional_id="hung", transaction_timeout_ms=600_000)
    hung.init_transactions()
    hung.begin_transaction()
    hung.send("t", b"open")
    hung.send_offsets_to_transaction({TopicPartition("t", 0): 2}, "g")
    hung.flush()

    reader = txlog.connect(url, server.reader_storage_options, create=False)
    attempts = []
    put = reader.store.put

    def counted(key: str, data: bytes) -> None:
        attempts.append(key)
        put(key, data)

    reader.store.put = counted  # type: ignore[method-assign]
    c = reader.consumer(group_id="g")
    from txlog.errors import UnstableOffsetCommitError

    with pytest.raises(UnstableOffsetCommitError, match="cannot write"):
        c.committed([TopicPartition("t", 0)], timeout=60)
    plain = reader.consumer(auto_offset_reset="earliest")
    plain.assign([TopicPartition("t", 0)])
    got = []
    for _ in range(5):
        got += [r.value for r in plain.poll(max_records=100)]
    assert got == [b"committed"]
    assert len(attempts) == 1 and attempts[0].startswith("_txn/clock/"), attempts
    hung.abort_transaction()
    hung.close()
