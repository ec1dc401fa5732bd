"""Client processes of the torture harness: ``python -m txlog.testing.harness.worker SPEC.json``.

Roles:

* ``producer``: transactions of sends to several topics and partitions, sometimes with an
  offset commit (``send_offsets_to_transaction``), ending in commit, client abort, a
  commit after the transaction timeout, or a takeover by a newer instance of the same
  transactional.id while the old one keeps writing (an in-process zombie); sometimes a
  *race*: a new instance initialises while the old one commits, then both run a
  transaction at once; after an error the client usually aborts, sometimes carelessly
  commits anyway (Kafka's contract: that commit fails);
* ``idempotent``: an idempotent producer, one batch per operation, kept after failures;
* ``consumer``: forward reads of every data partition, read_committed or
  read_uncommitted, recording positions before and after each poll and the LSO after it;
* ``ctp``: consume-transform-produce: reads the input topic from the group's committed
  offset and, per poll, one transaction of outputs plus the new offset;
* ``sweeper``: ``log.coordinator.sweep()`` in a loop and, with ``compact``, the whole
  maintenance pass on one topic at a time (compaction and purges while others read).

Every operation is recorded (:class:`~txlog.testing.harness.history.Recorder`) as an invocation
and a completion (ok, fail or info).  The store is a seeded :class:`~txlog.testing.faults.
FaultyStore`.  A worker stops at ``until`` (wall clock); the runner may SIGKILL it any time.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import txlog
from txlog.errors import (
    ProducerFencedError,
    TransactionAbortedError,
    TransactionTimeoutError,
    TxlogError,
)
from txlog.records import TopicPartition
from txlog.testing.faults import FaultRates, FaultyStore, InjectedTimeout
from txlog.testing.harness.clock import real_time, shift_wall_clock
from txlog.testing.harness.history import Recorder

#: Errors that mean "this transaction is aborted" when they come out of a transaction.
DEFINITE_ABORT = (ProducerFencedError, TransactionAbortedError)


def is_expected(exc: BaseException) -> bool:
    """Errors txlog is allowed to raise: its own, and the injected raw timeouts."""
    return isinstance(exc, (TxlogError, InjectedTimeout))


def try_abort(prod: Any) -> bool:
    """Abort ``prod``'s transaction; whether that worked (a fault may have broken it)."""
    try:
        prod.abort_transaction()
    except Exception:
        return False
    return True


def close_quietly(client: Any) -> None:
    """Close ``client``, whatever state a fault left it in."""
    try:
        client.close()
    except Exception:
        pass


def fault_rates(spec: dict[str, Any] | None, scale: float = 1.0) -> dict[str, FaultRates]:
    """FaultRates per operation kind; ``scale`` multiplies the error probabilities."""
    out = {}
    for op, r in (spec or {}).items():
        r = dict(r)
        for k in ("error_before", "error_after", "lost_response"):
            r[k] = min(0.3, r.get(k, 0.0) * scale)
        out[op] = FaultRates(**r)
    return out


class Worker:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.role: str = spec["role"]
        self.proc = f"{spec['name']}.{spec['incarnation']}"
        self.rng = random.Random(f"{spec['seed']}:{self.proc}")
        self.until: float = spec["until"]
        self.rec = Recorder(spec["history"], self.proc)
        self.log = txlog.connect(spec["url"], spec.get("storage_options") or None,
                                 **spec.get("config", {}))
        self.store = FaultyStore(self.log.store, seed=spec["seed"], stream=self.proc,
                                 rates=fault_rates(spec.get("faults"),
                                                   float(spec.get("fault_scale", 1.0))),
                                 error_style=spec.get("error_style", "storage"),
                                 lost_response_ms=spec.get("lost_response_ms", 50))
        self.log.store = self.store  # before any use: partition logs and coordinator take it
        if spec.get("state_checkpoint_interval"):
            # A test knob: state-log checkpoints every few records, so clients load them.
            from txlog import state_log

            state_log.CHECKPOINT_INTERVAL = int(spec["state_checkpoint_interval"])
        self.topics: dict[str, int] = spec["topics"]  # data topics -> partitions
        self.txn_id: str = spec.get("txn_id", "")
        self.timeout_ms = int(spec.get("config", {}).get("transaction.timeout.ms", 60_000))
        self.stats_path = spec.get("stats")
        self._ops = 0
        self._fenced = False
        # A pipelined commit still in flight: (op id, its future, the sends' futures).
        # It is settled while the next transaction runs, after that one's sends.
        self._inflight: tuple[str, Any, list[tuple[str, str, Any]]] | None = None
        self._txn_no = 0
        self._txn_lock = threading.Lock()

    # -- plumbing ------------------------------------------------------------------------

    def expired(self) -> bool:
        return real_time() >= self.until

    def pace(self, lo: float, hi: float) -> None:
        """Think time between operations (workload pacing, not synchronisation)."""
        time.sleep(min(self.rng.uniform(lo, hi), max(0.0, self.until - real_time())))

    def done_op(self) -> None:
        self._ops += 1
        if self.stats_path and (self._ops % 5 == 0 or self.expired()):
            self.write_stats()

    def write_stats(self) -> None:
        if not self.stats_path:
            return
        tmp = f"{self.stats_path}.tmp"
        with open(tmp, "w") as f:
            json.dump({"injected": dict(self.store.injected), "ops": self._ops,
                       "requests": dict(self.store.requests)}, f)
        os.replace(tmp, self.stats_path)

    def fail(self, oid: str, f: str, exc: BaseException, value: dict[str, Any] | None = None,
             outcome: str = "fail") -> None:
        unexpected = not is_expected(exc)
        err: BaseException | str = exc
        if unexpected:
            err = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        self.rec.complete(oid, f, outcome, value, err, unexpected=unexpected)

    def run(self) -> None:
        try:
            getattr(self, f"run_{self.role}")()
        finally:
            self.write_stats()
            self.rec.close()

    # -- producers -------------------------------------------------------------------------

    def new_producer(self, txn_id: str) -> Any:
        """A new instance of ``txn_id`` after init_transactions(), or None if that failed."""
        oid = self.rec.invoke("init", {"txn_id": txn_id})
        try:
            # Shares of instances take each older format or commit path (a long linger
            # leaves the last batches to the commit to carry): all meet in a log.
            p = self.log.producer(transactional_id=txn_id, **{
                "commit.appends.batches": self.rng.random() >= float(
                    self.spec.get("v2_commit_rate", 0.25)),
                "inline.batch.bytes": 0 if self.rng.random() < 0.25 else 16_384,
                "commit.inline.bytes": 0 if self.rng.random() < 0.3 else 65_536,
                "batch.objects.shared": self.rng.random() >= 0.25,
                "linger.ms": 5 if self.rng.random() < 0.5 else 30_000})
            p.init_transactions()
        except Exception as exc:
            self.fail(oid, "init", exc)
            return None
        self.rec.complete(oid, "init", "ok", {"pid": p.producer_id, "epoch": p.epoch})
        return p

    def _plan_sends(self, tag: str) -> list[list[Any]]:
        names = sorted(t for t in self.topics if t != self.spec.get("out_topic"))
        sends = []
        for i in range(self.rng.randint(1, 5)):
            topic = self.rng.choice(names)
            sends.append([topic, self.rng.randrange(self.topics[topic]), f"{tag}:{i}"])
        return sends

    def fenced_out(self) -> bool:
        """A zombie process ends once a newer instance fenced it (as a real one would)."""
        return bool(self.spec.get("exit_on_fence")) and self._fenced

    def next_txn_no(self) -> int:
        with self._txn_lock:
            self._txn_no += 1
            return self._txn_no

    def run_producer(self) -> None:
        prod = None
        while not self.expired() and not self.fenced_out():
            if prod is None:
                prod = self.new_producer(self.txn_id)
                if prod is None:
                    self.pace(0.01, 0.05)
                    continue
            if self.rng.random() < float(self.spec.get("race_rate", 0.04)):
                prod = self.race(prod)
            else:
                prod = self.producer_txn(prod, self.next_txn_no())
            self.done_op()
        self.settle_inflight()

    def settle_inflight(self) -> None:
        """Record the outcome of the pipelined commit in flight, if any."""
        if self._inflight is None:
            return
        oid, cfut, futures = self._inflight
        self._inflight = None
        try:
            cfut.result()
        except Exception as exc:
            definite = isinstance(exc, DEFINITE_ABORT)
            self._fenced |= isinstance(exc, ProducerFencedError)
            self.fail(oid, "txn", exc, {"pipelined": True}, "fail" if definite else "info")
            return
        self.rec.complete(oid, "txn", "ok", {**self.acks(futures), "pipelined": True})

    @staticmethod
    def acks(futures: list[tuple[str, str, Any]]) -> dict[str, Any]:
        """The offsets a committed transaction's futures give.  A future may say the
        batch committed but its offset is unknown (the read that finds it failed): the
        commit holds all the same, so the value is still checked, only not its offset."""
        acks, unknown = [], []
        for topic, value, fut in futures:
            try:
                md = fut.get()
            except TxlogError as exc:
                unknown.append(f"{value}: {exc}")
                continue
            acks.append([topic, md.partition, md.offset, value])
        return {"acks": acks, **({"offsets_unknown": unknown} if unknown else {})}

    def race(self, prod: Any) -> Any:
        """A newer instance of the transactional.id initialises while this one commits;
        then, if both still think they are live, each runs a transaction at the same
        time.  Only one of them may succeed with anything: the other must be fenced."""
        holder: list[Any] = []
        t = threading.Thread(target=lambda: holder.append(self.new_producer(self.txn_id)))
        old = self.producer_txn(prod, self.next_txn_no(), mode="commit", on_commit=t.start)
        if t.ident is None:  # the commit was never reached
            t.start()
        t.join()
        new = holder[0] if holder else None
        if new is None:
            return old
        if old is None or old is new:
            return new
        done: list[Any] = []
        t2 = threading.Thread(target=lambda: done.append(
            self.producer_txn(old, self.next_txn_no(), mode="commit")))
        t2.start()
        nxt = self.producer_txn(new, self.next_txn_no(), mode="commit")
        t2.join()
        close_quietly(old)
        return nxt

    def producer_txn(self, prod: Any, n: int, mode: str | None = None,
                     on_commit: Any = None) -> Any:
        """One transaction; returns the producer to use next (None: make a new one)."""
        tag = f"{self.proc}:{n}"
        sends = self._plan_sends(tag)
        offsets = None
        if self.rng.random() < 0.3:
            group = f"pg-{self.txn_id}"
            k = int(self.spec.get("uid", 0)) * 1_000_000 + n  # unique in the history
            in_topic = self.spec.get("in_topic", "in")
            offsets = (group, TopicPartition(in_topic, 0), k)
            sends.append(["__consumer_offsets", None, f"ofs|{group}|{in_topic}|0|{k}"])
        # Commit without waiting (commit_transaction_async) in a share of the plain
        # commits; never in a race, whose two instances run on two threads.
        pipelined = mode is None and on_commit is None and \
            self.rng.random() < float(self.spec.get("pipeline_rate", 0.3))
        if mode is None:
            mode = self.rng.choices(["commit", "abort", "hang", "zombie"], [82, 10, 3, 5])[0]
        # Reading the id and epoch would wait for a commit in flight.
        ids = {} if self._inflight else {"pid": prod.producer_id, "epoch": prod.epoch}
        oid = self.rec.invoke("txn", {"txn_id": self.txn_id, "sends": sends, "mode": mode,
                                      **ids})
        futures: list[tuple[str, str, Any]] = []
        nxt = prod
        # A timeout abort of this transaction before its timeout passed (on this process's
        # monotonic clock, from before its first write) would abort a live transaction
        # early; a commit in flight may still raise the last transaction's timeout here.
        began = None if self._inflight else time.monotonic()
        try:
            prod.begin_transaction()
            for topic, partition, value in sends:
                if topic == "__consumer_offsets":
                    continue
                futures.append((topic, value, prod.send(topic, value=value.encode(),
                                                        partition=partition)))
                if self.rng.random() < 0.3:
                    prod.flush()
            self.settle_inflight()  # the last transaction's commit overlapped the sends
            if offsets is not None:
                prod.send_offsets_to_transaction({offsets[1]: offsets[2]}, offsets[0])
            if mode == "zombie":
                # A newer instance takes over; this one keeps writing and tries to commit.
                nxt = self.new_producer(self.txn_id)
                extra = [self._plan_sends(f"{tag}z")[0]]
                if nxt is not None:  # its init_transactions() aborted this transaction
                    self.rec.complete(oid, "txn", "fail", None, "fenced by a new instance")
                else:
                    self.rec.complete(oid, "txn", "info", {"note": "zombie continues"})
                oid = self.rec.invoke("txn", {"txn_id": self.txn_id, "sends": extra,
                                              "mode": "zombie-late", "pid": prod.producer_id,
                                              "epoch": prod.epoch})
                topic, partition, value = extra[0]
                futures = [(topic, value, prod.send(topic, value=value.encode(),
                                                    partition=partition))]
                prod.flush()
            if mode == "hang":
                self.pace(self.timeout_ms / 1000 + 0.2, self.timeout_ms / 1000 + 0.5)
            if mode == "abort":
                prod.abort_transaction()
                self.rec.complete(oid, "txn", "fail", None, "aborted by the client")
                return nxt
            if on_commit is not None:
                on_commit()
            if pipelined and mode == "commit":
                self._inflight = (oid, prod.commit_transaction_async(), futures)
                return nxt
            prod.commit_transaction()
        except Exception as exc:
            self.settle_inflight()
            if isinstance(exc, TransactionTimeoutError) and began is not None:
                open_ms = (time.monotonic() - began) * 1000
                if open_ms < self.timeout_ms:
                    self.rec.event("early_timeout_abort", "info", {"open_ms": open_ms},
                                   f"aborted for its timeout ({self.timeout_ms} ms) after "
                                   f"{open_ms:.0f} ms: {exc}", unexpected=True)
            definite = isinstance(exc, DEFINITE_ABORT)
            self._fenced |= isinstance(exc, ProducerFencedError)
            if not definite and self.rng.random() < float(self.spec.get("commit_after_error",
                                                                        0.2)):
                # A careless client commits anyway: Kafka's contract is that the commit
                # then fails (a send of the transaction failed), never that it succeeds
                # without the failed batch.
                try:
                    prod.commit_transaction()
                except Exception:
                    pass
                else:
                    self.rec.complete(oid, "txn", "ok", {"commit_after_error": repr(exc)})
                    return nxt
            aborted = try_abort(prod)
            self.fail(oid, "txn", exc, {"abort_after_error": aborted},
                      "fail" if definite or aborted else "info")
            if not aborted or nxt is not prod:
                close_quietly(prod)
                return None if nxt is prod else nxt
            return prod
        self.rec.complete(oid, "txn", "ok", {**self.acks(futures), "next_epoch": prod.epoch})
        return nxt

    # -- idempotent (non-transactional) producers ----------------------------------------

    def run_idempotent(self) -> None:
        """Batches of one to three records with an idempotent producer: each batch is
        acknowledged exactly once or fails with an unknown outcome; after a failure the
        same producer carries on, as an application retrying its sends would."""
        import pyarrow as pa

        prod = None
        n = 0
        linger = 0
        while not self.expired():
            if prod is None:
                # Some producers leave their batches to the linger thread (no flush).
                linger = self.rng.choice([0, 0, 5, 30])
                oid = self.rec.invoke("init", {"idempotent": True, "linger_ms": linger})
                try:
                    prod = self.log.producer(linger_ms=linger)
                except Exception as exc:
                    self.fail(oid, "init", exc)
                    self.pace(0.01, 0.05)
                    continue
                self.rec.complete(oid, "init", "ok", {"pid": prod.producer_id})
            n += 1
            topic = self.rng.choice(sorted(t for t in self.topics
                                           if t != self.spec.get("out_topic")))
            partition = self.rng.randrange(self.topics[topic])
            values = [f"{self.proc}:{n}:{i}" for i in range(self.rng.randint(1, 3))]
            # Sends left to the linger thread may land in separate batches, and without a
            # transaction one of them may land while another fails: not atomic.
            single = not (linger and self.rng.random() < 0.5)
            oid = self.rec.invoke("txn", {"txn_id": None, "mode": "idempotent",
                                          "atomic": single,
                                          "sends": [[topic, partition, v] for v in values]})
            try:
                if not single:
                    futs = [prod.send(topic, v.encode(), partition=partition) for v in values]
                    for f in futs:
                        f.get(timeout=60)  # written by the linger thread
                else:
                    prod.send_batch(topic, pa.table({"value": [v.encode() for v in values]}),
                                    partition=partition)
                    prod.flush()
            except Exception as exc:
                self.fail(oid, "txn", exc, outcome="info")  # it may have landed
            else:
                self.rec.complete(oid, "txn", "ok")
            self.done_op()
            self.pace(0.0, 0.02)

    # -- consumers -------------------------------------------------------------------------

    def _positions(self, c: Any, tps: list[TopicPartition]) -> dict[str, int]:
        return {f"{tp.topic}:{tp.partition}": c.position(tp) for tp in tps}

    def poll(self, c: Any, tps: list[TopicPartition], session: str, isolation: str,
             max_records: int) -> list[Any] | None:
        """One recorded poll; returns its records, or None if it failed."""
        before = self._positions(c, tps)
        oid = self.rec.invoke("poll", {"session": session, "isolation": isolation,
                                       "before": before, "max_records": max_records})
        try:
            recs = c.poll(max_records=max_records)
        except Exception as exc:
            self.fail(oid, "poll", exc, {"after": self._positions(c, tps)})
            return None
        after = self._positions(c, tps)
        lso: dict[str, int] = {}
        if isolation == "read_committed" and self.rng.random() < float(
                self.spec.get("lso_check_rate", 1.0)):
            try:
                for tp in tps:
                    lso[f"{tp.topic}:{tp.partition}"] = c.last_stable_offset(tp)
            except Exception as exc:
                if not is_expected(exc):
                    self.rec.event("lso", "fail", {"session": session}, exc, unexpected=True)
                lso = {}
        self.rec.complete(oid, "poll", "ok", {
            "records": [[r.topic, r.partition, r.offset, r.value.decode()] for r in recs],
            "after": after, "lso": lso})
        return list(recs)

    def run_consumer(self) -> None:
        isolation = self.spec.get("isolation", "read_committed")
        tps = [TopicPartition(t, p) for t in sorted(self.topics) for p in range(self.topics[t])]
        n = 0
        while not self.expired():
            n += 1
            session = f"{self.proc}/{n}"
            c = self.log.consumer(isolation_level=isolation)
            try:
                c.assign(tps)
                c.seek_to_beginning()
            except Exception as exc:
                self.rec.event("seek", "fail", {"session": session}, exc,
                               unexpected=not is_expected(exc))
                self.pace(0.01, 0.05)
                continue
            for _ in range(self.rng.randint(20, 120)):
                if self.expired():
                    break
                self.poll(c, tps, session, isolation, self.rng.randint(1, 40))
                self.done_op()
                self.pace(0.0, 0.02)
            c.close()

    # -- consume-transform-produce ----------------------------------------------------------

    def run_ctp(self) -> None:
        in_tp = TopicPartition(self.spec.get("in_topic", "in"), 0)
        out_topic = self.spec.get("out_topic", "out")
        group = self.spec.get("group", "ctp-g")
        prod = None
        cons = None
        n = 0
        t = 0
        session = ""
        while not self.expired() and not self.fenced_out():
            if prod is None:
                prod = self.new_producer(self.txn_id)
                if prod is None:
                    self.pace(0.01, 0.05)
                    continue
                cons = None
            if cons is None:
                n += 1
                session = f"{self.proc}/{n}"
                cons = self.log.consumer(group_id=group, isolation_level="read_committed",
                                         auto_offset_reset="earliest")
                oid = self.rec.invoke("committed", {"session": session, "group": group})
                try:
                    cons.assign([in_tp])
                    pos = cons.position(in_tp)  # the group's committed offset
                except Exception as exc:
                    self.fail(oid, "committed", exc)
                    cons = None
                    self.pace(0.01, 0.05)
                    continue
                self.rec.complete(oid, "committed", "ok", {"offset": pos})
            recs = self.poll(cons, [in_tp], session, "read_committed", self.rng.randint(1, 8))
            self.done_op()
            if recs is None:
                cons = None
                continue
            if not recs:
                self.pace(0.005, 0.03)
                continue
            t += 1
            sends = [[out_topic, self.rng.randrange(self.topics[out_topic]),
                      f"x|{r.value.decode()}|{self.proc}:{t}:{i}"]
                     for i, r in enumerate(recs)]
            consumed = [r.value.decode() for r in recs]
            new_pos = cons.position(in_tp)
            oid = self.rec.invoke("txn", {"txn_id": self.txn_id, "sends": sends,
                                          "consumed": consumed, "mode": "ctp",
                                          "offset": new_pos})
            futures = []
            try:
                prod.begin_transaction()
                for topic, partition, value in sends:
                    futures.append((topic, value, prod.send(topic, value=value.encode(),
                                                            partition=partition)))
                prod.send_offsets_to_transaction({in_tp: new_pos}, group)
                prod.commit_transaction()
            except Exception as exc:
                self._fenced |= isinstance(exc, ProducerFencedError)
                aborted = try_abort(prod)
                self.fail(oid, "txn", exc, {"abort_after_error": aborted},
                          "fail" if aborted or isinstance(exc, DEFINITE_ABORT) else "info")
                cons = None  # start again from the committed offset
                if not aborted:
                    close_quietly(prod)
                    prod = None
                continue
            self.rec.complete(oid, "txn", "ok", self.acks(futures))

    # -- maintenance -------------------------------------------------------------------------

    def run_sweeper(self) -> None:
        """The maintenance sweep; with ``compact``, sometimes the whole maintenance pass
        (sweep, compaction, purge of objects past file.delete.delay.ms, checkpoints)."""
        compact = bool(self.spec.get("compact"))
        while not self.expired():
            f = "maintain" if compact and self.rng.random() < 0.5 else "sweep"
            topic = self.rng.choice([*sorted(self.topics), "__consumer_offsets"])
            oid = self.rec.invoke(f, {"topic": topic} if f == "maintain" else {})
            try:
                if f == "maintain":
                    from txlog.maintenance import maintain

                    report = maintain(self.log, [topic], compact=True)
                    value: dict[str, Any] = {"compacted": sum(
                        p.compacted_batches for p in report.partitions)}
                    if report.failures:
                        # maintain() reports what it could not do instead of raising: a
                        # pass with failures is not an ok pass.
                        self.rec.complete(oid, f, "fail", value, "; ".join(report.failures))
                        self.done_op()
                        self.pace(0.05, 0.25)
                        continue
                else:
                    value = {"acted": self.log.coordinator.sweep()}
            except Exception as exc:
                self.fail(oid, f, exc)
            else:
                self.rec.complete(oid, f, "ok", value)
            self.done_op()
            self.pace(0.05, 0.25)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m txlog.testing.harness.worker SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    if spec.get("clock_skew_ms"):
        shift_wall_clock(int(spec["clock_skew_ms"]))
    w = Worker(spec)
    try:
        w.run()
    except Exception as exc:  # a bug in the harness or an escaped error: record it
        rec = Recorder(spec["history"], w.proc)
        rec.event("crash", "info", {"role": w.role}, f"{type(exc).__name__}: {exc}\n"
                  f"{traceback.format_exc()}", unexpected=True)
        rec.close()
        raise
    # Skip interpreter teardown: pyarrow's thread pools sometimes abort a process at exit
    # ("terminate called without an active exception", apache/arrow#34314), which would
    # read as a crash.  The history and stats are already written and closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
