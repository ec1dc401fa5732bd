"""One torture history: set up a root, run client processes under a nemesis, settle, read
everything, check.

1. Topics are created on a clean store.
2. Client processes (:mod:`txlog.testing.harness.worker`) start: transactional producers (one
   transactional.id each), an idempotent producer, consumers (read_committed and
   read_uncommitted), consume-transform-produce clients and a sweeper that also compacts;
   each talks to the store through a seeded :class:`~txlog.testing.faults.FaultyStore`
   and records its history.  Few offsets and state-log partitions (clients share them),
   frequent checkpoints, a short transaction timeout and a short file-delete delay make
   the interesting interleavings common.
3. The nemesis, driven by the history's seed, SIGKILLs random clients (they are restarted
   at once as a new incarnation) and starts zombies: extra processes with the
   transactional.id of a live producer.  With ``clock_skew_ms``, every client process
   starts with its wall clock shifted by -skew, 0 or +skew (drawn per process), so
   transaction timeouts, append times and deletion delays are judged by clients whose
   clocks disagree (:mod:`txlog.testing.harness.clock`).
4. After ``duration`` the clients stop by themselves (stragglers are SIGKILLed and
   reported as hung); then, without faults, the sweep runs and every partition's LSO is
   resolved until it reaches the high watermark (or ``settle_timeout`` passes: a stuck
   LSO), and every partition is read in full, read_committed and read_uncommitted.
5. :func:`txlog.testing.checker.check` judges the whole history.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import txlog
from txlog import layout
from txlog.names import CONSUMER_OFFSETS_TOPIC
from txlog.records import TopicPartition
from txlog.resolve import resolve_lso
from txlog.testing.checker import Anomaly, CheckResult, check, pair_events
from txlog.testing.harness.history import HISTORY_SUFFIX, Recorder, load_events

#: Data topics and their partitions ("in" feeds the consume-transform-produce clients,
#: which write "out").
TOPICS = {"a": 3, "b": 2, "in": 1, "out": 2}

#: Default fault rates per operation kind (see FaultRates); "*" is every other kind.
DEFAULT_FAULTS: dict[str, dict[str, float]] = {
    "*": {"latency": 0.05, "latency_ms": 10, "error_before": 0.002, "error_after": 0.002,
          "lost_response": 0.001},
    "put_if_absent": {"latency": 0.05, "latency_ms": 10, "error_before": 0.004,
                      "error_after": 0.008, "lost_response": 0.003},
}


@dataclass
class HistoryConfig:
    seed: int
    workdir: Path  # the history goes to workdir / f"h-{seed}"
    store: str = "local"  # "local", or "s3" with url and storage_options given
    url: str | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    duration: float = 4.0  # seconds of workload after the clients started
    startup: float = 1.5  # seconds allowed for client processes to start
    producers: int = 3
    idempotent: int = 1  # non-transactional idempotent producers
    consumers_rc: int = 1
    consumers_ru: int = 1
    ctp: int = 1
    sweeper: bool = True
    compact: bool = True  # the sweeper also compacts and purges, concurrently with readers
    file_delete_delay_ms: int = 300  # short: readers holding older plans meet purges
    checkpoint_interval: int = 7  # partition checkpoints every N batches (default 1000)
    state_checkpoint_interval: int = 15  # state-log checkpoints every N records (200)
    nemesis_every: float = 0.8  # mean seconds between nemesis actions (0: no nemesis)
    max_zombies: int = 2  # extra processes sharing a live transactional.id
    # Clients' wall clocks run this far ahead or behind (one of -skew, 0, +skew per
    # process); 0: every clock right.  Two minutes: well past the transaction timeout.
    clock_skew_ms: int = 120_000
    txn_timeout_ms: int = 1500
    faults: dict[str, dict[str, float]] | None = field(
        default_factory=lambda: {k: dict(v) for k, v in DEFAULT_FAULTS.items()})
    error_style: str = "mixed"
    lost_response_ms: float = 30.0
    offsets_partitions: int = 1  # few: groups share an offsets partition
    state_partitions: int = 4  # few: transactional.ids share state-log partitions
    lso_check_rate: float = 1.0  # share of read_committed polls that also ask the LSO
    grace: float = 30.0  # seconds past the end before stragglers are SIGKILLed
    settle_timeout: float | None = None  # default: 2 x txn timeout + 10 s
    keep: bool = False  # keep the history directory even when it is clean
    #: The command that runs a worker (the spec file's path is appended).
    worker_cmd: list[str] = field(
        default_factory=lambda: [sys.executable, "-m", "txlog.testing.harness.worker"])

    @property
    def dir(self) -> Path:
        return Path(self.workdir) / f"h-{self.seed}"

    def log_config(self) -> dict[str, Any]:
        return {"transaction.timeout.ms": self.txn_timeout_ms,
                "offsets.topic.num.partitions": self.offsets_partitions,
                "transaction.state.log.num.partitions": self.state_partitions,
                "checkpoint.interval.batches": self.checkpoint_interval,
                "linger.ms": 0}


@dataclass
class HistoryResult:
    seed: int
    anomalies: list[Anomaly]
    stats: dict[str, Any]
    directory: Path
    elapsed: float

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def counts(self) -> dict[str, int]:
        return CheckResult(self.anomalies, self.stats).counts()


@dataclass
class _Proc:
    name: str
    role: str
    incarnation: int
    popen: subprocess.Popen[bytes]
    extra: dict[str, Any]


class _Run:
    def __init__(self, cfg: HistoryConfig) -> None:
        self.cfg = cfg
        self.dir = cfg.dir
        self.rng = random.Random(cfg.seed)
        self.url = cfg.url or str(self.dir / "store")
        self.procs: dict[str, _Proc] = {}
        self.finished: list[_Proc] = []
        self.kills = 0
        self.restarts = 0
        self.zombies = 0
        self.uid = 0
        self.killed_pids: set[int] = set()
        self.nemesis: Recorder | None = None
        self.until = 0.0
        # Its own generator: the kill schedule stays what the seed gave before.
        self.skew_rng = random.Random(f"{cfg.seed}:clock")
        self.skews: dict[str, int] = {}

    # -- processes ---------------------------------------------------------------------------

    def spawn(self, name: str, role: str, incarnation: int, **extra: Any) -> _Proc:
        self.uid += 1
        skew = self.skew_rng.choice((-1, 0, 1)) * self.cfg.clock_skew_ms
        self.skews[f"{name}.{incarnation}"] = skew
        spec = {
            "role": role, "name": name, "incarnation": incarnation, "uid": self.uid,
            "url": self.url, "storage_options": self.cfg.storage_options,
            "config": self.cfg.log_config(), "seed": self.cfg.seed, "until": self.until,
            "faults": self.cfg.faults, "error_style": self.cfg.error_style,
            "lost_response_ms": self.cfg.lost_response_ms, "topics": TOPICS,
            "history": str(self.dir / f"{name}.{incarnation}{HISTORY_SUFFIX}"),
            "stats": str(self.dir / f"{name}.{incarnation}.stats.json"),
            "in_topic": "in", "out_topic": "out",
            "state_checkpoint_interval": self.cfg.state_checkpoint_interval,
            "clock_skew_ms": skew, **extra,
        }
        spec_path = self.dir / f"{name}.{incarnation}.spec.json"
        spec_path.write_text(json.dumps(spec))
        with open(self.dir / f"{name}.{incarnation}.out", "wb") as out:
            popen = subprocess.Popen(
                [*self.cfg.worker_cmd, str(spec_path)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        p = _Proc(name, role, incarnation, popen, extra)
        self.procs[name] = p
        if skew and self.nemesis is not None:
            self.nemesis.event("clock_skew", "ok", {"process": f"{name}.{incarnation}",
                                                    "skew_ms": skew})
        return p

    def kill(self, p: _Proc) -> None:
        if p.popen.poll() is None:
            os.kill(p.popen.pid, signal.SIGKILL)
            self.killed_pids.add(p.popen.pid)
        p.popen.wait()

    # -- the run -----------------------------------------------------------------------------

    def setup(self) -> None:
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        log = txlog.connect(self.url, self.cfg.storage_options or None, **self.cfg.log_config())
        for name, n in TOPICS.items():
            log.create_topic(name, partitions=n, config={
                "file.delete.delay.ms": self.cfg.file_delete_delay_ms,
                "checkpoint.interval.batches": self.cfg.checkpoint_interval})
        self.nemesis = Recorder(self.dir / f"nemesis{HISTORY_SUFFIX}", "nemesis")

    def start(self) -> None:
        cfg = self.cfg
        self.until = time.time() + cfg.startup + cfg.duration
        for i in range(cfg.producers):
            self.spawn(f"prod-{i}", "producer", 0, txn_id=f"t{i}")
        for i in range(cfg.idempotent):
            self.spawn(f"idem-{i}", "idempotent", 0, fault_scale=5.0)
        for i in range(cfg.ctp):
            self.spawn(f"ctp-{i}", "ctp", 0, txn_id=f"ctp{i}", group=f"ctp-g{i}")
        for i in range(cfg.consumers_rc):
            self.spawn(f"rc-{i}", "consumer", 0, isolation="read_committed",
                       lso_check_rate=cfg.lso_check_rate)
        for i in range(cfg.consumers_ru):
            self.spawn(f"ru-{i}", "consumer", 0, isolation="read_uncommitted")
        if cfg.sweeper:
            self.spawn("sweeper", "sweeper", 0, compact=cfg.compact)

    def run_nemesis(self) -> None:
        cfg = self.cfg
        assert self.nemesis is not None
        if cfg.nemesis_every <= 0:
            return
        next_at = time.time() + cfg.startup * 0.5 + self.rng.expovariate(1 / cfg.nemesis_every)
        while True:
            now = time.time()
            if now >= self.until - 0.2:
                return
            if now < next_at:
                time.sleep(min(0.05, next_at - now))  # the nemesis's own schedule
                continue
            next_at = now + self.rng.expovariate(1 / cfg.nemesis_every)
            txn_roles = [p for p in self.procs.values() if p.role in ("producer", "ctp")]
            if self.zombies < cfg.max_zombies and txn_roles and self.rng.random() < 0.25:
                victim = self.rng.choice(sorted(txn_roles, key=lambda p: p.name))
                name = f"zombie-{self.zombies}"
                self.zombies += 1
                self.nemesis.event("zombie", "ok", {"process": name, "of": victim.name,
                                                    "txn_id": victim.extra.get("txn_id")})
                self.spawn(name, victim.role, 0, **dict(victim.extra, exit_on_fence=True))
                continue
            weights = {"producer": 4, "ctp": 3, "idempotent": 2, "consumer": 1, "sweeper": 1}
            alive = sorted(self.procs.values(), key=lambda p: p.name)
            victim = self.rng.choices(alive, [weights[p.role] for p in alive])[0]
            was_alive = victim.popen.poll() is None
            self.kill(victim)
            self.kills += int(was_alive)
            self.nemesis.event("kill", "ok", {"process": f"{victim.name}.{victim.incarnation}",
                                              "alive": was_alive})
            self.finished.append(victim)
            self.restarts += 1
            self.spawn(victim.name, victim.role, victim.incarnation + 1, **victim.extra)

    def stop(self) -> list[str]:
        """Wait for every client to finish; SIGKILL stragglers.  Returns the hung ones."""
        assert self.nemesis is not None
        deadline = self.until + self.cfg.grace
        hung = []
        for p in sorted(self.procs.values(), key=lambda p: p.name):
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                hung.append(f"{p.name}.{p.incarnation}")
                self.kill(p)
            self.finished.append(p)
        for p in self.finished:
            rc = p.popen.returncode
            if p.popen.pid in self.killed_pids and f"{p.name}.{p.incarnation}" not in hung:
                continue
            proc = f"{p.name}.{p.incarnation}"
            if proc in hung:
                self.nemesis.event("worker_exit", "info", {"worker": proc, "hung": True},
                                   f"still running {self.cfg.grace:.0f} s after its end")
            elif rc != 0:
                out = (self.dir / f"{proc}.out").read_text(errors="replace")[-3000:]
                self.nemesis.event("worker_exit", "info", {"worker": proc, "returncode": rc},
                                   f"exited with {rc}: {out}", unexpected=True)
        return hung

    def settle_and_read(self) -> dict[str, Any]:
        """Final sweep until every LSO reaches its high watermark, then full reads."""
        cfg = self.cfg
        rec = Recorder(self.dir / f"final{HISTORY_SUFFIX}", "final")
        log = txlog.connect(self.url, cfg.storage_options or None, **cfg.log_config())
        tps = [TopicPartition(t, p) for t in sorted(TOPICS) for p in range(TOPICS[t])]
        otps = log.partitions_for(CONSUMER_OFFSETS_TOPIC)
        settle = cfg.settle_timeout if cfg.settle_timeout is not None \
            else 2 * cfg.txn_timeout_ms / 1000 + 10
        deadline = time.time() + settle
        rounds = 0
        oid = rec.invoke("final_state")
        while True:
            rounds += 1
            log.coordinator.sweep()
            parts = {}
            for tp in tps + otps:
                st = resolve_lso(log, tp)
                parts[f"{tp.topic}:{tp.partition}"] = {
                    "lso": st.last_stable_offset, "hw": st.high_watermark,
                    "open": [[t.producer_id, t.epoch, t.first_offset, t.txn_id]
                             for t in st.open_txns.values()]}
            if all(s["lso"] == s["hw"] for s in parts.values()) or time.time() >= deadline:
                break
            time.sleep(0.1)  # polling interval of a bounded wait for timeouts to expire
        rec.complete(oid, "final_state", "ok", {"partitions": parts, "rounds": rounds})
        # How much of the history went through shared batch objects (batch.objects.shared).
        shared_objects = sum(1 for t in TOPICS for k in log.store.list(layout.shared_prefix(t))
                             if layout.is_shared(k))
        shared_batches = sum(1 for tp in tps for k in log.partition_log(tp).refresh().batches.data
                             if layout.is_shared(k))
        for isolation in ("read_committed", "read_uncommitted"):
            oid = rec.invoke("final_read", {"isolation": isolation})
            records = read_all(log, tps, isolation) + read_offsets(log, otps, isolation)
            rec.complete(oid, "final_read", "ok", {"records": records})
        rec.close()
        return {"settle_rounds": rounds, "shared_objects": shared_objects,
                "shared_batches": shared_batches}

    def injected(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for path in self.dir.glob("*.stats.json"):
            try:
                data = json.loads(path.read_text())
            except ValueError:
                continue
            for k, n in data.get("injected", {}).items():
                kind = k.rsplit(".", 1)[1]
                total[kind] = total.get(kind, 0) + int(n)
        return total


def read_all(log: txlog.Log, tps: list[TopicPartition], isolation: str) -> list[list[Any]]:
    """Every record of ``tps`` from the log start to the end offset, as [t, p, o, value]."""
    return [[r.topic, r.partition, r.offset, r.value.decode()]
            for r in _read_records(log, tps, isolation)]


def read_offsets(log: txlog.Log, otps: list[TopicPartition], isolation: str,
                 ) -> list[list[Any]]:
    """The producers' offset commits (groups 'pg-*') as the values the workers recorded."""
    out = []
    for r in _read_records(log, otps, isolation):
        group, topic, partition = json.loads(r.key)
        if str(group).startswith("pg-"):
            k = json.loads(r.value)["offset"]
            out.append([r.topic, r.partition, r.offset, f"ofs|{group}|{topic}|{partition}|{k}"])
    return out


def _read_records(log: txlog.Log, tps: list[TopicPartition], isolation: str,
                  max_polls: int = 100_000) -> list[Any]:
    c = log.consumer(isolation_level=isolation)
    c.assign(tps)
    c.seek_to_beginning()
    ends = c.end_offsets(tps)
    out: list[Any] = []
    for _ in range(max_polls):
        if all(c.position(tp) >= ends[tp] for tp in tps):
            return out
        out.extend(c.poll(max_records=5000))
    raise RuntimeError(f"final {isolation} read did not reach the end offsets {ends}")


def run_history(cfg: HistoryConfig) -> HistoryResult:
    """Run one history and check it (see the module docstring)."""
    t0 = time.time()
    run = _Run(cfg)
    run.setup()
    try:
        run.start()
        run.run_nemesis()
    finally:
        hung = run.stop()
    extra = run.settle_and_read()
    ops = pair_events(load_events(run.dir))
    result = check(ops)
    anomalies = list(result.anomalies)
    skewed = [s for s in run.skews.values() if s]
    stats = dict(result.stats, kills=run.kills, restarts=run.restarts, zombies=run.zombies,
                 clocks_ahead=sum(1 for s in skewed if s > 0),
                 clocks_behind=sum(1 for s in skewed if s < 0),
                 injected=run.injected(), processes=run.uid, hung=hung, **extra)
    res = HistoryResult(cfg.seed, anomalies, stats, run.dir, time.time() - t0)
    (run.dir / "result.json").write_text(json.dumps({
        "seed": cfg.seed, "valid": res.valid, "stats": stats,
        "anomalies": [a.to_json() for a in anomalies]}, indent=1, default=str))
    if res.valid and not cfg.keep:
        shutil.rmtree(run.dir, ignore_errors=True)
    return res
