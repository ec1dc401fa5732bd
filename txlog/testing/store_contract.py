"""The object-store contract as a test suite any store can run, txlog's own backends and a
third party's alike: subclass :class:`StoreContract` in a pytest module and provide a
``store`` fixture that returns a fresh, empty store::

    from txlog.testing.store_contract import StoreContract

    class TestMyStore(StoreContract):
        shared_between_processes = True

        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(tmp_path)

The suite checks the one atomic primitive (``put_if_absent`` has exactly one winner per key,
also between racing threads and spawned processes, and the stored bytes are the winner's),
reads, ranged reads, deletes, listing order with ``start_after``, key validation, pickling
and request counting.  Seeds are fixed and printed; writers meet at a barrier before every
trial, so no sleep synchronises anything.  ``TXLOG_TEST_RACE_SCALE=10`` multiplies the racing
trials for a soak run.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txlog.errors import InvalidNameError, ObjectNotFoundError
from txlog.storage import ObjectStore, check_key

SEED = 20260611
THREAD_WRITERS = 8
PROCESS_WRITERS = 4
BARRIER_TIMEOUT = 120.0


def _scaled(trials: int) -> int:
    return max(1, round(trials * float(os.environ.get("TXLOG_TEST_RACE_SCALE", "1"))))


def _slot_key(trial: int) -> str:
    """Keys shaped like the partition log's: 'log/<bucket>/<offset>.json'."""
    return f"log/{trial // 100:06d}/{trial:012d}.json"


def _payload(rng: random.Random, writer: int, trial: int) -> bytes:
    """Unique per writer and trial (put_if_absent's contract), random length and body."""
    head = f"writer={writer} trial={trial}\n".encode()
    return head + rng.randbytes(rng.randrange(0, 3000))


LIST_KEYS = [
    "log/000000/000000000003.json",
    "log/000000/000000000010.json",
    "log/000000/000000000012.json",
    "log/000000/000000000099.json",
    "log/000001/000000000100.json",
    "log/000001/000000000105.json",
    "log/000010/000000001000.json",
    "log0",
    "logx/y",
    "a",
    "ab/c",
    "state/000000000001.json",
    "state/000000000002.json",
]


def _expected(keys: list[str], prefix: str, start_after: str | None) -> list[str]:
    return sorted(k for k in keys if k.startswith(prefix)
                  and (start_after is None or k > start_after))


def _viable_prefix(prefix: str) -> bool:
    """Whether some valid key can start with ``prefix``."""
    try:
        check_key(prefix + "x")
    except InvalidNameError:
        return False
    return True


BAD_KEYS = ["", "/abs", "../up", "a/../b", "a//b", "./a", ".hidden", "a/.tmp-x", "a/",
            "a/./b", "a\\b", "a\x00b", "..", "."]


def _check_trials(store: ObjectStore, results: dict[int, list[tuple[int, bool, bytes]]],
                  trials: int, writers: int) -> Counter[int]:
    winners_per_trial: Counter[int] = Counter()
    for t in range(trials):
        outcomes = results[t]
        assert len(outcomes) == writers, (t, len(outcomes))
        winners = [(w, data) for w, won, data in outcomes if won]
        winners_per_trial[len(winners)] += 1
        assert len(winners) == 1, f"trial {t}: winners {[w for w, _ in winners]}"
        assert store.get(_slot_key(t)) == winners[0][1], f"trial {t}: stored bytes not winner's"
    return winners_per_trial


def _report(kind: str, store: ObjectStore, trials: int, writers: int,
            winners: Counter[int], elapsed: float, requests: dict[str, int]) -> None:
    print(f"\n[race] backend={store.backend} mode={kind} seed={SEED} trials={trials} "
          f"writers={writers} winners/trial={dict(winners)} elapsed={elapsed:.2f}s "
          f"requests={requests}")


def _race_process_worker(store: ObjectStore, trials: int, w: int, seed: int,
                         barrier: Any, queue: Any) -> None:
    """Runs in a spawned process: claim every trial's key once, after the barrier."""
    rng = random.Random(seed * 1000 + w)
    try:
        for t in range(trials):
            data = _payload(rng, w, t)
            barrier.wait(BARRIER_TIMEOUT)
            won = store.put_if_absent(_slot_key(t), data)
            queue.put(("ok", t, w, won, data))
        queue.put(("done", w, store.counter.snapshot()["requests"]))
    except BaseException as exc:
        barrier.abort()
        queue.put(("error", w, repr(exc)))


class StoreContract:
    """The contract every :class:`~txlog.storage.ObjectStore` keeps.  A subclass provides a
    ``store`` fixture (a fresh, empty store per test) and may adjust the settings below."""

    #: Whether other processes see this store's objects (the racing-processes test needs it;
    #: the store is pickled into spawned writers).
    shared_between_processes: bool = False
    #: Racing trials per test (each trial: every writer claims one key at once).
    thread_trials: int = 24
    process_trials: int = 10
    #: Random listing queries checked against a model of the keys.
    list_examples: int = 150
    #: Known gaps a store may declare; the test then reports an expected failure.
    size_of_a_directory_raises: bool = True
    impossible_prefix_lists_nothing: bool = True
    #: Whether ``get_range`` is counted as its own request kind (not as a ``get``).
    counts_ranged_gets: bool = True

    def test_put_if_absent_true_exactly_once(self, store: ObjectStore) -> None:
        assert store.put_if_absent("a/b/c.json", b"first") is True
        assert store.put_if_absent("a/b/c.json", b"second") is False
        assert store.put_if_absent("a/b/c.json", b"third") is False
        assert store.get("a/b/c.json") == b"first"
        # A different key is independent.
        assert store.put_if_absent("a/b/d.json", b"other") is True

    def test_put_if_absent_after_put_and_delete(self, store: ObjectStore) -> None:
        store.put("k", b"plain")
        assert store.put_if_absent("k", b"claim") is False
        assert store.get("k") == b"plain"
        store.delete("k")
        assert store.put_if_absent("k", b"claim") is True
        assert store.get("k") == b"claim"

    def test_probe_atomic_create_passes(self, store: ObjectStore) -> None:
        store.probe_atomic_create()  # raises if the store's create is not atomic
        assert store.list("_probe/") == []

    def test_put_get_overwrite(self, store: ObjectStore) -> None:
        store.put("x/y", b"one")
        assert store.get("x/y") == b"one"
        store.put("x/y", b"two-longer")
        assert store.get("x/y") == b"two-longer"
        store.put("empty", b"")
        assert store.get("empty") == b""
        assert store.size("empty") == 0
        big = random.Random(SEED).randbytes(300_000)
        store.put("big.bin", big)
        assert store.get("big.bin") == big
        assert store.size("big.bin") == len(big)

    def test_put_new_from_a_buffer(self, store: ObjectStore) -> None:
        """A store that declares ``writes_buffers`` writes a memoryview of an Arrow
        buffer as its bytes (any store takes bytes)."""
        import pyarrow as pa

        data = random.Random(SEED).randbytes(200_000)
        store.put_new("new.bin", memoryview(pa.py_buffer(data)) if store.writes_buffers
                      else data)
        assert store.get("new.bin") == data
        assert store.size("new.bin") == len(data)

    def test_get_range(self, store: ObjectStore) -> None:
        data = bytes(range(256)) * 4
        store.put("r.bin", data)
        assert store.get_range("r.bin", 0, 10) == data[:10]
        assert store.get_range("r.bin", 100, 356) == data[100:356]
        assert store.get_range("r.bin", 1000, 5000) == data[1000:]  # clipped at the end
        assert store.get_range("r.bin", 1024, 1030) == b""  # starts at the end
        assert store.get_range("r.bin", 2000, 3000) == b""  # starts past the end
        assert store.get_range("r.bin", 7, 7) == b""
        with pytest.raises(ObjectNotFoundError):
            store.get_range("missing.bin", 0, 10)

    def test_size_exists_delete(self, store: ObjectStore) -> None:
        store.put("d/e", b"12345")
        assert store.size("d/e") == 5
        assert store.exists("d/e")
        store.delete("d/e")
        assert not store.exists("d/e")
        store.delete("d/e")  # deleting a missing object is fine
        store.delete("never/was")

    def test_directory_is_not_an_object(self, store: ObjectStore) -> None:
        store.put("d/e", b"12345")
        if not self.size_of_a_directory_raises:
            pytest.xfail(f"{type(store).__name__}.size() answers for a directory")
        assert not store.exists("d")
        with pytest.raises(ObjectNotFoundError):
            store.size("d")

    def test_missing_objects(self, store: ObjectStore) -> None:
        for call in (store.get, store.size):
            with pytest.raises(ObjectNotFoundError) as info:
                call("no/such/key")
            assert "no/such/key" in str(info.value)
            assert isinstance(info.value, KeyError)  # ObjectNotFoundError is a KeyError too
        assert store.list("no/such/") == []

    def test_list_children_names_the_level_below_a_prefix_once_each(
            self, store: ObjectStore) -> None:
        for k in LIST_KEYS:
            store.put(k, b"x")
        assert store.list_children("log/") == ["000000", "000001", "000010"]
        assert store.list_children("log/000001/") == ["000000000100.json",
                                                      "000000000105.json"]
        assert store.list_children("no/such/") == []
        # Whatever the store does natively, it names what a full listing implies.
        n = len("log/")
        assert store.list_children("log/") == sorted(
            {k[n:].split("/", 1)[0] for k in store.list("log/")})

    def test_delete_prefix(self, store: ObjectStore) -> None:
        for k in ("p/1", "p/2", "p/q/3", "pp/4"):
            store.put(k, b"x")
        assert store.delete_prefix("p/") == 3
        assert store.list("") == ["pp/4"]

    def test_list_order_prefix_start_after(self, store: ObjectStore) -> None:
        shuffled = list(LIST_KEYS)
        random.Random(SEED).shuffle(shuffled)
        for k in shuffled:
            store.put(k, k.encode())
        assert store.list("") == sorted(LIST_KEYS)
        assert store.list("log/") == [k for k in sorted(LIST_KEYS) if k.startswith("log/")]
        # A prefix is a string prefix, not a directory.
        assert store.list("log") == _expected(LIST_KEYS, "log", None)
        assert store.list("log/00000") == _expected(LIST_KEYS, "log/00000", None)
        assert store.list("log/000000/") == LIST_KEYS[:4]
        # start_after is exclusive, need not exist, and may point into another "directory".
        assert store.list("log/", "log/000000/000000000010.json") == LIST_KEYS[2:7]
        assert store.list("log/", "log/000000/000000000011.json") == LIST_KEYS[2:7]
        assert store.list("log/", "log/000000/") == LIST_KEYS[:7]
        assert store.list("log/", "log/000000/~") == LIST_KEYS[4:7]
        assert store.list("log/", "log/000001/000000000105.json") == LIST_KEYS[6:7]
        assert store.list("log/", "log/000010/000000001000.json") == []
        assert store.list("log/", "a") == LIST_KEYS[:7]
        assert store.list("log/", "z") == []
        assert store.list("state/", "state/000000000001.json") == ["state/000000000002.json"]
        assert store.list("", "logx/y") == ["state/000000000001.json", "state/000000000002.json"]
        # start_after naming a "directory" (SeaweedFS skips that directory when such a value
        # is sent as StartAfter as is; the remote store sends a safe bound instead).
        assert store.list("", "log") == _expected(LIST_KEYS, "", "log")
        assert store.list("log/", "log/000000") == LIST_KEYS[:7]
        assert store.list("", "logx") == _expected(LIST_KEYS, "", "logx")
        assert store.list("", "ab") == _expected(LIST_KEYS, "", "ab")
        assert store.list("", "log-") == _expected(LIST_KEYS, "", "log-")

    def test_list_matches_model(self, store: ObjectStore) -> None:
        """Random (prefix, start_after) queries against a fixed key set (hypothesis,
        derandomized)."""
        for k in LIST_KEYS:
            store.put(k, b"")
        near = sorted({k[:i] for k in LIST_KEYS for i in range(len(k) + 1)})
        text = st.text(alphabet="alog/01.jsnxy~-", max_size=30)
        prefixes = st.one_of(st.sampled_from(near), text.filter(_viable_prefix))
        examples = self.list_examples

        @settings(max_examples=examples, derandomize=True, deadline=None, database=None)
        @given(prefix=prefixes,
               start_after=st.one_of(st.none(), st.sampled_from(near), text))
        def check(prefix: str, start_after: str | None) -> None:
            assert store.list(prefix, start_after) == _expected(LIST_KEYS, prefix, start_after)

        check()

    @pytest.mark.parametrize("prefix", ["/", "//", "./", ".", "a//", "log//", "log/.", "\\"],
                             ids=repr)
    def test_list_impossible_prefix_is_empty(self, store: ObjectStore, prefix: str) -> None:
        """A prefix that no valid key can start with lists nothing (servers would normalise it)."""
        for k in LIST_KEYS:
            store.put(k, b"")
        got = store.list(prefix)
        if got and not self.impossible_prefix_lists_nothing:
            pytest.xfail(f"{type(store).__name__} lists {len(got)} keys for impossible "
                         f"prefix {prefix!r}")
        assert got == []

    @pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
    def test_key_validation(self, store: ObjectStore, key: str) -> None:
        for call in (lambda: store.put(key, b"x"), lambda: store.put_if_absent(key, b"x"),
                     lambda: store.get(key), lambda: store.size(key),
                     lambda: store.delete(key)):
            with pytest.raises(InvalidNameError):
                call()
        assert store.list("") == []

    def test_pickled_store_works(self, store: ObjectStore) -> None:
        store.put("shared/k", b"v")
        copy = pickle.loads(pickle.dumps(store))
        assert type(copy) is type(store) and copy.url == store.url
        assert copy.get("shared/k") == b"v"
        assert copy.put_if_absent("shared/k", b"w") is False
        assert copy.put_if_absent("shared/new", b"n") is True
        assert store.get("shared/new") == b"n"
        assert copy.list("shared/") == ["shared/k", "shared/new"]

    def test_fsspec_view_matches(self, store: ObjectStore) -> None:
        store.put("f/g.bin", b"payload")
        fs = store.fsspec()
        assert fs.cat_file(store.fs_path("f/g.bin")) == b"payload"
        assert store.full_path("f/g.bin").endswith("/f/g.bin")

    def test_request_counter(self, store: ObjectStore) -> None:
        store.counter.reset()
        store.put_if_absent("c/1", b"a")
        store.put("c/2", b"bb")
        store.get("c/2")
        store.get_range("c/2", 0, 1)
        store.size("c/2")
        store.list("c/")
        store.delete("c/2")
        reqs = store.counter.snapshot()["requests"]
        for kind in ("put_if_absent", "put", "get", "head", "list", "delete"):
            assert reqs.get(kind, 0) >= 1, (kind, reqs)
        if self.counts_ranged_gets:
            assert reqs.get("get_range", 0) == 1, reqs
        # A won create costs exactly one request: no exists-then-write.
        assert reqs["put_if_absent"] == 1

    def test_racing_threads(self, store: ObjectStore) -> None:
        trials = _scaled(self.thread_trials)
        writers = THREAD_WRITERS
        barrier = threading.Barrier(writers)
        results: dict[int, list[tuple[int, bool, bytes]]] = {t: [] for t in range(trials)}
        lock = threading.Lock()
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            rng = random.Random(SEED * 1000 + w)
            try:
                for t in range(trials):
                    data = _payload(rng, w, t)
                    barrier.wait(BARRIER_TIMEOUT)
                    won = store.put_if_absent(_slot_key(t), data)
                    with lock:
                        results[t].append((w, won, data))
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()

        store.counter.reset()
        start = time.monotonic()
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.monotonic() - start
        real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
        if real:
            raise real[0]
        assert not errors, errors
        winners = _check_trials(store, results, trials, writers)
        _report("threads", store, trials, writers, winners, elapsed,
                store.counter.snapshot()["requests"])
        assert winners == Counter({1: trials})

    def test_racing_processes(self, store: ObjectStore) -> None:
        if not self.shared_between_processes:
            pytest.skip(f"{type(store).__name__} is not shared between processes")
        trials = _scaled(self.process_trials)
        writers = PROCESS_WRITERS
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(writers)
        queue = ctx.Queue()
        procs = [ctx.Process(target=_race_process_worker,
                             args=(store, trials, w, SEED, barrier, queue), daemon=True)
                 for w in range(writers)]
        start = time.monotonic()
        for p in procs:
            p.start()
        results: dict[int, list[tuple[int, bool, bytes]]] = {t: [] for t in range(trials)}
        requests: Counter[str] = Counter()
        done = 0
        try:
            while done < writers:
                msg = queue.get(timeout=BARRIER_TIMEOUT + 60)
                if msg[0] == "ok":
                    _, t, w, won, data = msg
                    results[t].append((w, won, data))
                elif msg[0] == "done":
                    done += 1
                    requests.update(msg[2])
                else:
                    pytest.fail(f"writer process {msg[1]} failed: {msg[2]}")
        finally:
            # A writer that reported "done" still has to close its client; on a loaded
            # machine that can take long, so it gets the barrier's allowance before a kill.
            for p in procs:
                p.join(timeout=BARRIER_TIMEOUT)
                if p.is_alive():
                    p.kill()
        elapsed = time.monotonic() - start
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        winners = _check_trials(store, results, trials, writers)
        _report("processes", store, trials, writers, winners, elapsed, dict(requests))
        assert winners == Counter({1: trials})

    def test_list_after_a_bound_ending_in_a_one_letter_folder(self, store: ObjectStore) -> None:
        """A start_after whose safe server bound ends in a one-letter folder ('z/q/') must not
        turn into that folder's bare name (which SeaweedFS would skip as a whole)."""
        for k in ("z/q/r", "z/q/s", "z/qq"):
            store.put(k, b"x")
        assert store.list("", "z/q/a") == ["z/q/r", "z/q/s", "z/qq"]
        assert store.list("z/", "z/q/") == ["z/q/r", "z/q/s", "z/qq"]
        assert store.list("z/q/", "z/q/r") == ["z/q/s"]
