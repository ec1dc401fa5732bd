"""The object-store contract (txlog.testing.store_contract) run against every backend
(memory, local, s3 through obstore and s3fs, gcs, azure), then what only some backends do:
opening stores from URLs, settling an S3 conditional create whose answer was lost, and the
local store's files and descriptors.  Racing figures are printed; see them with
``pytest -s``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from txlog.errors import (
    AtomicCreateUnsupportedError,
    ConfigError,
    StorageError,
)
from txlog.storage import LocalStore, MemoryStore, ObjectStore, open_store
from txlog.storage import local as local_store
from txlog.testing.s3_faults import ScriptedCreateFS, ScriptedCreateObstore, seaweed_412
from txlog.testing.store_contract import StoreContract

SEED = 20260611
BARRIER_TIMEOUT = 120.0


# --- the contract, once per backend ---------------------------------------------------
# SeaweedFS answers concurrent conditional creates of ONE key slowly (contended requests
# wait in ~1 s steps server-side; distinct keys and plain puts do not), so its racing
# figures are smaller.


class TestMemoryStore(StoreContract):
    thread_trials = 200
    size_of_a_directory_raises = False  # the memory fs reports directories too
    counts_ranged_gets = False  # a ranged get is counted as a get

    @pytest.fixture
    def store(self, store_factory: Any) -> ObjectStore:
        return store_factory("memory")  # type: ignore[no-any-return]


class TestLocalStore(StoreContract):
    shared_between_processes = True
    thread_trials = 200
    process_trials = 50
    size_of_a_directory_raises = False  # os.stat reports directories too
    impossible_prefix_lists_nothing = False

    @pytest.fixture
    def store(self, store_factory: Any) -> ObjectStore:
        return store_factory("local")  # type: ignore[no-any-return]


@pytest.mark.s3
class TestS3Store(StoreContract):
    """SeaweedFS through txlog's default S3 client (obstore)."""

    shared_between_processes = True
    thread_trials = 12

    @pytest.fixture
    def store(self, store_factory: Any) -> ObjectStore:
        return store_factory("s3")  # type: ignore[no-any-return]


@pytest.mark.s3
class TestS3fsStore(StoreContract):
    """SeaweedFS through s3fs (the client for options obstore cannot serve)."""

    shared_between_processes = True
    thread_trials = 12

    @pytest.fixture
    def store(self, store_factory: Any) -> ObjectStore:
        return store_factory("s3fs")  # type: ignore[no-any-return]


@pytest.mark.gcs
class TestGcsStore(StoreContract):
    shared_between_processes = True

    @pytest.fixture
    def store(self, store_factory: Any) -> ObjectStore:
        return store_factory("gcs")  # type: ignore[no-any-return]


class TestAzureStore(StoreContract):
    shared_between_processes = True
    list_examples = 40  # adlfs lists by walking (find), which is slow on Azurite

    @pytest.fixture
    def store(self, store_factory: Any) -> ObjectStore:
        return store_factory("azure")  # type: ignore[no-any-return]


# --- open_store URL handling ----------------------------------------------------------


def test_open_store_local_urls(tmp_path: Path) -> None:
    plain = open_store(str(tmp_path / "db"))
    assert isinstance(plain, LocalStore)
    plain.put("k", b"v")
    via_file = open_store(f"file://{tmp_path / 'db'}")
    assert isinstance(via_file, LocalStore) and via_file.root == plain.root
    assert via_file.get("k") == b"v"
    assert via_file.full_path("k") == f"file://{tmp_path / 'db' / 'k'}"


def test_open_store_memory_url() -> None:
    a = open_store("memory://txlog-tests/open-store")
    b = open_store("memory://txlog-tests/open-store/")
    assert isinstance(a, MemoryStore)
    a.delete_prefix("")
    a.put("k", b"v")
    assert b.get("k") == b"v"  # same process, same memory location
    a.delete_prefix("")


@pytest.mark.parametrize("url", ["ftp://host/x", "hdfs://namenode/x", "http://example.com/x",
                                 "webdav://host/x", "wasb://c@a/x"])
def test_open_store_refuses_unknown_scheme(url: str) -> None:
    with pytest.raises(AtomicCreateUnsupportedError) as info:
        open_store(url)
    assert repr(url.split(":", 1)[0]) in str(info.value)


@pytest.mark.s3
def test_open_store_s3_url(seaweed: Any) -> None:
    from txlog.storage.remote import RemoteStore

    url = seaweed.fresh_url("open")
    store = open_store(url, seaweed.storage_options)
    assert isinstance(store, RemoteStore) and store.backend == "s3"
    store.put("a/b", b"v")
    assert store.full_path("a/b") == f"{url}/a/b"
    assert store.fs_path("a/b") == f"{url[len('s3://'):]}/a/b"
    # Same location through a trailing slash and through s3a://.
    again = open_store(url + "/", dict(seaweed.storage_options))
    assert again.get("a/b") == b"v"
    s3a = open_store("s3a" + url[2:], seaweed.storage_options)
    assert s3a.backend == "s3" and s3a.get("a/b") == b"v"
    assert s3a.full_path("a/b").startswith("s3a://")
    # A pickled store carries only its URL, backend and storage options.
    assert set(store.__getstate__()) == {"url", "backend", "storage_options"}
    # A bucket-less URL is a configuration error.
    with pytest.raises(ConfigError):
        open_store("s3://", seaweed.storage_options)


def test_open_store_missing_client_library() -> None:
    import importlib.util

    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed")
    with pytest.raises(StorageError, match="gcsfs"):
        open_store("gs://bucket/path")


# --- racing writers ---------------------------------------------------------------------


# --- settling ambiguous outcomes (remote stores) -----------------------------------------


def _scripted(store: Any, script: list[str]) -> Any:
    fast = store.fast()
    fake: Any
    if fast is not None:
        fake = ScriptedCreateObstore(fast, script)
        store._ob = fake
    else:
        fake = ScriptedCreateFS(store.fsspec(), script)
        store._fs = fake
    store.retry_base_delay = 0.001
    return fake


@pytest.fixture(params=["s3", "s3fs"])
def s3_store(request: pytest.FixtureRequest, store_factory: Any) -> Any:
    """A SeaweedFS store through each client (obstore, s3fs)."""
    return store_factory(request.param, "settle")


@pytest.fixture
def s3fs_store(store_factory: Any) -> Any:
    return store_factory("s3fs", "settle")


@pytest.mark.s3
def test_seaweedfs_real_412_is_settled_as_lost(s3fs_store: Any) -> None:
    """Document what the server really answers to a second conditional create."""
    from txlog.storage.remote import classify_create_error

    s3_store = s3fs_store
    fs = s3_store.fsspec()
    path = s3_store.fs_path("doc/412")
    fs.pipe_file(path, b"first", mode="create")
    with pytest.raises(OSError) as info:
        fs.pipe_file(path, b"second", mode="create")
    print(f"\n[seaweedfs] second conditional create raises {info.value!r} "
          f"(errno={info.value.errno}, cause={info.value.__cause__!r})")
    assert classify_create_error(info.value) == "lost"
    # And the reference fault used below is the same shape.
    fake = seaweed_412()
    assert type(fake) is type(info.value) and fake.errno == info.value.errno


@pytest.mark.s3
@pytest.mark.parametrize("fault", ["412", "exists", "timeout", "read-timeout", "connection",
                                   "500"])
def test_settle_applied_then_error_is_a_win(s3_store: Any, fault: str) -> None:
    """Our create landed, but the answer was an error: reading back shows we won."""
    fake = _scripted(s3_store, [f"apply-{fault}"])
    s3_store.counter.reset()
    assert s3_store.put_if_absent("slot/1", b"ours-writer-A") is True
    assert fake.seen == [f"apply-{fault}"]
    assert s3_store.get("slot/1") == b"ours-writer-A"
    reqs = s3_store.counter.snapshot()["requests"]
    assert reqs["put_if_absent"] == 1 and reqs.get("head", 0) == 0


@pytest.mark.s3
@pytest.mark.parametrize("fault", ["timeout", "read-timeout", "connection", "500"])
def test_settle_dropped_request_is_retried(s3_store: Any, fault: str) -> None:
    """Nothing landed: the object is absent on read-back, so the create is retried."""
    fake = _scripted(s3_store, [f"drop-{fault}", f"drop-{fault}"])
    assert s3_store.put_if_absent("slot/2", b"ours-writer-A") is True
    assert fake.seen == [f"drop-{fault}", f"drop-{fault}"]
    assert s3_store.counter.snapshot()["requests"]["put_if_absent"] == 3
    assert s3_store.get("slot/2") == b"ours-writer-A"


@pytest.mark.s3
def test_conflict_409_is_retried(s3_store: Any) -> None:
    fake = _scripted(s3_store, ["drop-409", "drop-409"])
    s3_store.counter.reset()
    assert s3_store.put_if_absent("slot/3", b"ours-writer-A") is True
    assert fake.seen == ["drop-409", "drop-409"]
    reqs = s3_store.counter.snapshot()["requests"]
    assert reqs["put_if_absent"] == 3 and reqs.get("get", 0) == 0


@pytest.mark.s3
@pytest.mark.parametrize("fault", ["412", "exists", "timeout", "read-timeout", "500"])
def test_settle_other_writer_holds_key_is_a_loss(s3_store: Any, fault: str) -> None:
    other = pickle.loads(pickle.dumps(s3_store))
    assert other.put_if_absent("slot/4", b"theirs-writer-B") is True
    _scripted(s3_store, [f"drop-{fault}"])
    assert s3_store.put_if_absent("slot/4", b"ours-writer-A") is False
    assert s3_store.get("slot/4") == b"theirs-writer-B"


@pytest.mark.s3
def test_real_loss_against_other_writer(s3_store: Any) -> None:
    other = pickle.loads(pickle.dumps(s3_store))
    assert other.put_if_absent("slot/5", b"theirs-writer-B") is True
    assert s3_store.put_if_absent("slot/5", b"ours-writer-A") is False
    assert s3_store.get("slot/5") == b"theirs-writer-B"


@pytest.mark.s3
def test_lost_answer_but_object_gone_is_a_loss(s3_store: Any) -> None:
    """A definite 'exists' whose object was deleted before read-back: not ours."""
    _scripted(s3_store, ["drop-412"])
    assert s3_store.put_if_absent("slot/6", b"ours-writer-A") is False
    assert not s3_store.exists("slot/6")


@pytest.mark.s3
def test_unsettled_create_gives_up(s3_store: Any) -> None:
    s3_store.retry_attempts = 3
    _scripted(s3_store, ["drop-timeout"] * 5)
    with pytest.raises(StorageError, match="could not settle"):
        s3_store.put_if_absent("slot/7", b"ours-writer-A")


@pytest.mark.s3
def test_fatal_errors_are_raised(s3_store: Any) -> None:
    _scripted(s3_store, ["drop-403"])
    with pytest.raises(StorageError) as info:
        s3_store.put_if_absent("slot/8", b"ours-writer-A")
    assert not isinstance(info.value, AtomicCreateUnsupportedError)
    _scripted(s3_store, ["drop-501"])
    with pytest.raises(AtomicCreateUnsupportedError, match="s3"):
        s3_store.put_if_absent("slot/8", b"ours-writer-A")


@pytest.mark.s3
def test_probe_detects_server_ignoring_condition(s3_store: Any) -> None:
    _scripted(s3_store, ["ignore", "ignore"])
    with pytest.raises(AtomicCreateUnsupportedError) as info:
        s3_store.probe_atomic_create()
    message = str(info.value)
    assert "'s3'" in message and s3_store.url in message
    assert s3_store.list("_probe/") == []  # the probe cleans up after itself


@pytest.mark.s3
def test_seaweedfs_real_412_through_obstore_is_lost(store_factory: Any) -> None:
    """obstore's answer to a real second create is classified as a loss."""
    from txlog.storage import obstore_s3

    s3_store = store_factory("s3", "settle")
    fast = s3_store.fast()
    assert fast is not None
    key = s3_store.prefix + "doc/412"
    fast.create(key, b"first")
    with pytest.raises(Exception) as info:
        fast.create(key, b"second")
    print(f"\n[seaweedfs] obstore's second create raises {info.value!r}")
    assert obstore_s3.create_outcome(info.value) == "lost"
    with pytest.raises(FileNotFoundError):
        fast.get(s3_store.prefix + "doc/missing")


@pytest.mark.s3
def test_forked_child_of_an_obstore_user_uses_s3fs(store_factory: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """obstore's runtime hangs in a forked child once the parent has used it, so a store
    in such a child goes through s3fs (the parent's pid is simulated here)."""
    from txlog.storage import obstore_s3

    s3_store = store_factory("s3", "settle")
    assert s3_store.fast() is not None
    s3_store.put("fork/k", b"v")
    monkeypatch.setattr(obstore_s3, "_RUNTIME_PID", os.getpid() + 1)
    assert s3_store.fast() is None
    assert s3_store.get("fork/k") == b"v"
    assert s3_store.put_if_absent("fork/k2", b"child-writer") is True
    assert s3_store.put_if_absent("fork/k2", b"other-writer") is False


@pytest.mark.s3
def test_store_rebuilds_fs_after_fork_or_unpickle(s3fs_store: Any) -> None:
    s3_store = s3fs_store
    s3_store.put("k", b"v")
    state = s3_store.__getstate__()
    assert set(state) == {"url", "backend", "storage_options"}
    copy = pickle.loads(pickle.dumps(s3_store))
    assert copy._fs is None  # built lazily on first use
    assert copy.get("k") == b"v"
    assert copy.fsspec() is not s3_store.fsspec()
    # A forked child (different pid) builds its own filesystem.
    s3_store._fs_pid = os.getpid() + 1
    old = s3_store._fs
    assert s3_store.get("k") == b"v" and s3_store._fs is not old


@pytest.mark.s3
def test_list_paginates(s3fs_store: Any) -> None:
    """s3 listing follows continuation tokens (forced small pages)."""
    s3_store = s3fs_store
    keys = [f"pg/{i:04d}" for i in range(11)]
    for k in keys:
        s3_store.put(k, b"")
    fs = s3_store.fsspec()
    real_call = fs.call_s3

    def small_pages(method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "list_objects_v2":
            kwargs["MaxKeys"] = 3
        return real_call(method, *args, **kwargs)

    fs.call_s3 = small_pages
    try:
        s3_store.counter.reset()
        assert s3_store.list("pg/") == keys
        assert s3_store.counter.snapshot()["requests"]["list"] == 4
        assert s3_store.list("pg/", "pg/0004") == keys[5:]
        assert s3_store.list("pg/", "pg/0010") == []
    finally:
        fs.call_s3 = real_call


def test_local_without_fsync_keeps_atomic_create(tmp_path: Any) -> None:
    """``{"fsync": False}`` drops only power-loss durability: racing creates still have
    exactly one winner, the option survives pickling (Spark workers), and the local store
    refuses options that are not its own."""

    from txlog.errors import ConfigError

    store = open_store(str(tmp_path / "nofsync"), {"fsync": False})
    assert isinstance(store, LocalStore) and store.fsync is False
    assert pickle.loads(pickle.dumps(store)).fsync is False
    writers, trials = 8, 100
    barrier = threading.Barrier(writers)
    wins: Counter[int] = Counter()
    lock = threading.Lock()

    def writer(w: int) -> None:
        for t in range(trials):
            barrier.wait(BARRIER_TIMEOUT)
            if store.put_if_absent(f"slot/{t}", f"{w}".encode()):
                with lock:
                    wins[t] += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(BARRIER_TIMEOUT * trials)
    assert all(wins[t] == 1 for t in range(trials)), wins
    with pytest.raises(ConfigError, match=r"'anon'.*only 'fsync'"):
        open_store(str(tmp_path / "x"), {"anon": True})
    with pytest.raises(ConfigError, match="True or False"):
        open_store(str(tmp_path / "x"), {"fsync": "no"})


@pytest.mark.parametrize("fsync", [True, False])
def test_local_writes_sync_the_file_and_its_directory(tmp_path: Any, monkeypatch: Any,
                                                       fsync: bool) -> None:
    """With fsync on, every put, put_new and won create writes the object durably
    (``O_DSYNC``, or an fsync where there is none) and then syncs its directory before
    returning: a log entry that survives a power loss must not name a batch object whose
    directory entry did not.  With ``{"fsync": False}`` nothing is synced."""
    import os

    from txlog.storage import local

    if not local._AT:
        pytest.skip("this platform has no dir_fd calls: the path-based writes sync as before")
    store = open_store(str(tmp_path / "s"), {"fsync": fsync})
    events: list[tuple[str, ...]] = []
    real_fsync, real_open = os.fsync, os.open

    def where(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def recording_fsync(fd: int) -> None:
        path = where(fd)
        events.append(("fsync", path.rsplit("/", 1)[0] + "/<tmp>" if "/.tmp-" in path
                       else path))
        real_fsync(fd)

    def recording_open(path: str, flags: int, mode: int = 0o777, *,
                       dir_fd: int | None = None) -> int:
        tmpfile = getattr(os, "O_TMPFILE", 0)
        unnamed = bool(tmpfile) and flags & tmpfile == tmpfile
        if flags & os.O_CREAT or unnamed:
            full = os.path.join(where(dir_fd), path) if dir_fd is not None else path
            parent, name = full.rsplit("/", 1)
            events.append(("create", f"{parent}/<tmp>" if name.startswith(".tmp-") or unnamed
                           else full, "dsync" if flags & getattr(os, "O_DSYNC", 0) else ""))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "open", recording_open)
    root = os.path.realpath(str(tmp_path / "s"))
    store.put("topics/t/0/data/first.parquet", b"data")  # creates the directories
    store.put_if_absent("topics/t/0/log/000000/0.json", b"entry")
    if fsync:
        # Each directory created is named durably: its parent is synced after mkdir.
        for parent in (root, f"{root}/topics", f"{root}/topics/t", f"{root}/topics/t/0",
                       f"{root}/topics/t/0/log"):
            assert ("fsync", parent) in events, (parent, events)
    events.clear()
    store.put("topics/t/0/data/a.parquet", b"data")
    store.put_new("topics/t/0/data/b.parquet", b"data")
    assert store.put_if_absent("topics/t/0/log/000000/1.json", b"entry")
    assert not store.put_if_absent("topics/t/0/log/000000/1.json", b"lost")
    data_dir, log_dir = f"{root}/topics/t/0/data", f"{root}/topics/t/0/log/000000"
    if not fsync:
        assert [e for e in events if e[0] == "fsync" or e[2]] == []
        return
    # The object (its temp file, but for put_new), then the directory holding its final
    # name; the losing create writes only its temp file (nothing of it stays).
    durable = ("dsync",) if getattr(os, "O_DSYNC", 0) else ("",)
    file_sync: list[tuple[str, ...]] = [] if durable == ("dsync",) else [("fsync", "?")]
    expected: list[tuple[str, ...]] = []
    for created, directory in ((f"{data_dir}/<tmp>", data_dir),
                               (f"{data_dir}/b.parquet", data_dir),
                               (f"{log_dir}/<tmp>", log_dir), (f"{log_dir}/<tmp>", None)):
        expected += [("create", created, *durable), *file_sync]
        if directory is not None:
            expected.append(("fsync", directory))
    got = [("fsync", "?") if e[0] == "fsync" and e[1] not in (data_dir, log_dir) else e
           for e in events]
    assert got == expected


def test_local_store_writes_into_a_directory_removed_behind_its_back(tmp_path: Any) -> None:
    """The store remembers which directories exist (one stat per directory, not per
    write); a directory removed since (a topic deleted and re-created by another client, a
    staging sweep) is created again, not reported as a missing object."""
    import shutil

    store = open_store(str(tmp_path / "s"))
    store.put("topics/t/0/data/a.parquet", b"a")
    shutil.rmtree(tmp_path / "s" / "topics")
    store.put("topics/t/0/data/b.parquet", b"b")
    assert store.put_if_absent("topics/t/0/log/000000/0.json", b"e")
    shutil.rmtree(tmp_path / "s" / "topics" / "t" / "0" / "log")
    assert store.put_if_absent("topics/t/0/log/000000/0.json", b"e2")
    assert store.get("topics/t/0/data/b.parquet") == b"b"
    assert store.get("topics/t/0/log/000000/0.json") == b"e2"


def test_local_store_writes_into_a_directory_removed_and_made_again(tmp_path: Any) -> None:
    """Writes go through a kept descriptor of their directory.  One removed and made
    again by someone else must not swallow the next writes: they land in the new one
    (the old descriptor names a directory that is gone)."""
    import shutil

    store = open_store(str(tmp_path / "s"))
    for write in (lambda k: store.put(k, b"x"), lambda k: store.put_new(k, b"x"),
                  lambda k: store.put_if_absent(k, b"x")):
        store.put("topics/t/0/data/first", b"x")  # its descriptor is kept
        shutil.rmtree(tmp_path / "s" / "topics")
        (tmp_path / "s" / "topics" / "t" / "0" / "data").mkdir(parents=True)
        write("topics/t/0/data/second")
        assert sorted(store.list("topics/")) == ["topics/t/0/data/second"]


_KILLED_IN_LINK = """
import os, sys
from txlog.storage import open_store
store = open_store(sys.argv[1])
store.put_if_absent("topics/t/0/log/0.json", b"first")
real_link = os.link
def stuck_link(*args, **kwargs):
    print("linking", flush=True)
    sys.stdin.read()  # until killed
os.link = stuck_link
store.put_if_absent("topics/t/0/log/1.json", b"second")
"""


@pytest.mark.slow
def test_local_create_killed_before_its_link_leaves_nothing(tmp_path: Any) -> None:
    """A writer SIGKILLed between writing an atomic create's bytes and linking them
    under the final name leaves no file behind (an unnamed file, freed with the process,
    where Linux has O_TMPFILE; before, a temp file stayed for ever)."""
    import signal
    import subprocess
    import sys

    from txlog.storage import local

    if not (local._AT and hasattr(os, "O_TMPFILE")):
        pytest.skip("no O_TMPFILE here: a killed create may leave its temp file")
    root = tmp_path / "s"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_IN_LINK, str(root)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             cwd=str(Path(__file__).resolve().parents[2]))
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "linking\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert sorted(os.listdir(root / "topics" / "t" / "0" / "log")) == ["0.json"]


_DIR_FDS = pytest.mark.skipif(not local_store._AT, reason="no dir_fd calls on this platform")


@_DIR_FDS
@pytest.mark.parametrize("unnamed", [True, False])
def test_local_create_whose_directory_is_removed_before_its_link(
        tmp_path: Any, monkeypatch: Any, unnamed: bool) -> None:
    """A directory removed (and made again) between an atomic create's write and its
    link: the create is made again in the new directory, on any filesystem (ext4 refuses
    the unnamed file's open in a removed directory, tmpfs only its link)."""
    import shutil

    store = open_store(str(tmp_path / "s"))
    store._unnamed = unnamed and store._unnamed  # type: ignore[attr-defined]
    store.put_if_absent("topics/t/0/log/0.json", b"first")  # its descriptor is kept
    real_link = os.link
    removed: list[bool] = []

    def removing_link(*args: Any, **kwargs: Any) -> None:
        if not removed:
            removed.append(True)
            shutil.rmtree(tmp_path / "s" / "topics")
            (tmp_path / "s" / "topics" / "t" / "0" / "log").mkdir(parents=True)
        real_link(*args, **kwargs)

    monkeypatch.setattr(os, "link", removing_link)
    assert store.put_if_absent("topics/t/0/log/1.json", b"second")
    assert removed
    assert store.get("topics/t/0/log/1.json") == b"second"
    assert sorted(os.listdir(tmp_path / "s" / "topics" / "t" / "0" / "log")) == ["1.json"]


@pytest.mark.parametrize("unnamed", [True, False])
def test_local_create_on_a_filesystem_without_hard_links(tmp_path: Any, monkeypatch: Any,
                                                          unnamed: bool) -> None:
    """A filesystem that refuses hard links cannot give txlog its atomic create: the
    store says so (a StorageError naming the cause), not a bare OSError, and leaves no
    file behind."""
    store = open_store(str(tmp_path / "s"))
    store._unnamed = unnamed and store._unnamed  # type: ignore[attr-defined]
    store.put("topics/t/0/log/first", b"x")

    def refusing_link(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", refusing_link)
    with pytest.raises(StorageError, match="does not support hard links"):
        store.put_if_absent("topics/t/0/log/0.json", b"entry")
    assert os.listdir(tmp_path / "s" / "topics" / "t" / "0" / "log") == ["first"]


@_DIR_FDS
def test_local_store_child_process_closes_inherited_descriptors(tmp_path: Any) -> None:
    """A forked child closes its copies of the store's kept directory descriptors (its
    parent's writes never finish there) and writes through descriptors of its own."""
    root = os.path.realpath(str(tmp_path / "s"))
    store = open_store(root)
    for i in range(3):
        store.put_new(f"d{i}/x", b"x")

    def kept() -> int:
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                n += os.readlink(f"/proc/self/fd/{fd}").startswith(root)
        return n

    assert kept() == 3
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        try:
            after_fork = kept()
            store.put_new("d0/y", b"y")
            os.write(w, f"{after_fork} {kept()}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        report = f.read()
    os.waitpid(pid, 0)
    assert report == "0 1"
    assert store.get("d0/y") == b"y"
    assert kept() == 3


def test_local_store_writes_into_a_directory_moved_away(tmp_path: Any) -> None:
    """A kept directory descriptor follows a directory that someone renames; the writes
    after it must still go to the path (where readers and other writers look), and the
    atomic create must still be decided there: one winner."""
    import os

    root = tmp_path / "s"
    a = open_store(str(root))
    for i, write in enumerate((lambda k: a.put(k, b"a"), lambda k: a.put_new(k, b"a"),
                               lambda k: a.put_if_absent(k, b"a"))):
        a.put(f"topics/t/0/log/first{i}", b"x")  # its descriptor is kept
        os.rename(root / "topics", root / f"moved{i}")
        (root / "topics" / "t" / "0" / "log").mkdir(parents=True)
        write(f"topics/t/0/log/{i}.json")
        assert a.get(f"topics/t/0/log/{i}.json") == b"a"
        assert not open_store(str(root)).put_if_absent(f"topics/t/0/log/{i}.json", b"b")
        assert a.get(f"topics/t/0/log/{i}.json") == b"a"


@_DIR_FDS
def test_local_store_closes_one_descriptor_per_new_one(tmp_path: Any,
                                                         monkeypatch: Any) -> None:
    """Past the bound, a write into a new directory closes the least recently used idle
    descriptor (one; not every idle one in that write)."""
    import os

    from txlog.storage import local

    monkeypatch.setattr(local, "_MAX_DIR_FDS", 4)
    store = open_store(str(tmp_path / "s"))
    for i in range(4):
        store.put_new(f"d{i}/x", b"x")
    store.put_new("d0/y", b"x")  # d0 is now the most recently used
    closed: list[str] = []
    real_close = os.close
    kept: dict[int, str] = {}

    def recording_close(fd: int) -> None:
        # Only the descriptors the store keeps (not the one a new directory's creation
        # opens and closes on the way).
        if fd in kept:
            closed.append(kept.pop(fd))
        real_close(fd)

    def keep_snapshot() -> None:
        kept.clear()
        kept.update({h.fd: os.path.basename(p)
                     for p, h in store._dir_fds._open.items()})  # type: ignore[attr-defined]

    monkeypatch.setattr(os, "close", recording_close)
    keep_snapshot()
    store.put_new("d4/x", b"x")
    assert closed == ["d1"]
    keep_snapshot()
    store.put_new("d5/x", b"x")
    assert closed == ["d1", "d2"]


def test_local_store_keeps_a_bounded_number_of_descriptors(tmp_path: Any) -> None:
    """Writes from several threads into more directories than the store keeps
    descriptors for all land, the process holds no more than that bound of them, and
    they are closed once the store is gone."""
    import gc
    import os
    from concurrent.futures import ThreadPoolExecutor

    from txlog.storage import local

    root = os.path.realpath(str(tmp_path / "s"))

    def open_fds() -> int:  # this store's (other tests' stores may be collected here)
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}").startswith(root)
            except OSError:  # (closed meanwhile: listdir's own descriptor)
                pass
        return n

    def write_all() -> None:
        store = open_store(str(tmp_path / "s"))
        dirs = local._MAX_DIR_FDS * 2
        keys = [f"topics/t/{i % dirs}/data/{i}" for i in range(dirs * 3)]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda k: store.put_new(k, k.encode()), keys))
        assert all(store.get(k) == k.encode() for k in keys)
        assert open_fds() - before <= local._MAX_DIR_FDS

    before = open_fds()
    write_all()
    gc.collect()
    assert open_fds() == before == 0  # the store is gone: so are its descriptors


def test_remote_identity_names_the_endpoint() -> None:
    """Two S3-compatible servers may both have a bucket called 'lake': their stores must
    not share in-flight commit completions."""
    from txlog.storage.remote import RemoteStore

    def ident(**opts: Any) -> str:
        return RemoteStore("s3://lake/root", "s3", opts).identity

    a = ident(endpoint_url="http://127.0.0.1:8333")
    assert a == ident(client_kwargs={"endpoint_url": "http://127.0.0.1:8333/"})
    assert a != ident(endpoint_url="http://127.0.0.1:9000")
    assert a != ident()
    assert ident() == RemoteStore("s3://lake/root/", "s3", {}).identity


def test_one_directory_has_one_identity_however_it_is_spelled(tmp_path: Any,
                                                              monkeypatch: Any) -> None:
    """A reader waits for its own process's in-flight commit completions by store
    identity: a Log opened through a symlink, a relative path or a trailing slash must
    meet the commits of a Log on the absolute path."""
    import txlog

    root = tmp_path / "root"
    a = txlog.connect(str(root))
    (tmp_path / "link").symlink_to(root)
    monkeypatch.chdir(tmp_path)
    spellings = [str(tmp_path / "link"), "root", "./root/", str(root) + "/", f"file://{root}"]
    for url in spellings:
        assert txlog.connect(url).store.identity == a.store.identity, url
    assert txlog.connect(str(tmp_path / "other")).store.identity != a.store.identity
    # End to end: a commit through one spelling is read at once through another.
    a.create_topic("t", partitions=1)
    p = a.producer(transactional_id="x")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"v", partition=0)
    p.commit_transaction()
    c = txlog.connect(str(tmp_path / "link")).consumer(auto_offset_reset="earliest")
    c.assign([txlog.TopicPartition("t", 0)])
    assert [r.value for r in c.poll(10)] == [b"v"]
    p.close()


@pytest.mark.s3
@pytest.mark.parametrize("backend", ["s3", "s3fs"])
def test_folder_markers_are_not_listed(store_factory: Any, backend: str) -> None:
    """A console-made folder marker ('log/000002/', zero bytes) is not a key: obstore
    returns it as 'log/000002', so such listings are answered through s3fs."""
    store = store_factory(backend, "marker")
    fs = store.fsspec()
    for marker in ("log/000002/", "log/000003/"):
        fs.call_s3("put_object", Bucket=store.bucket, Key=store.prefix + marker, Body=b"")
    store.put("log/000002/000000000001.json", b"{}")
    assert store.list("log/") == ["log/000002/000000000001.json"]
    assert store.list("log/", "log/000001/x") == ["log/000002/000000000001.json"]
    assert store.list("log/000003/") == []
