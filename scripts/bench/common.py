"""Shared helpers for the txlog benchmarks under ``scripts/bench/``.

Every benchmark:

* takes ``--tiny`` (smoke tests), ``--small`` (CI-sized, the default) or ``--full``, and
  ``--store local|s3|both`` (``s3`` is a real SeaweedFS server started on 127.0.0.1 for the
  run and stopped by process id afterwards);
* measures txlog and its baseline in the same run, interleaved, several rounds, and reports
  medians and ratios (never only absolute times);
* writes progress to stderr, a readable table to stdout and, last, one JSON line per
  benchmark with a ``"bench"`` key (``run_all.py`` collects those lines).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MODES = ("tiny", "small", "full")

# Measure this checkout's code, here and in the processes a benchmark starts (Spark's
# Python workers, servers): an installed txlog may be another clone's (an editable install
# made through a shared virtualenv), and a benchmark run from here measured that clone.
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
    [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))

from txlog.testing import servers  # noqa: E402
from txlog.testing.processes import process_stats  # noqa: E402

perf = time.perf_counter


# -- arguments ------------------------------------------------------------------------------


def parse_args(description: str, *, stores: bool = True,
               argv: Sequence[str] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None,
               ) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--tiny", dest="mode", action="store_const", const="tiny",
                      help="smallest run (smoke tests; numbers meaningless)")
    size.add_argument("--small", dest="mode", action="store_const", const="small",
                      help="CI-sized run (default)")
    size.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="full-sized run")
    if stores:
        p.add_argument("--store", choices=("local", "s3", "both"), default="both",
                       help="where to run: local disk, SeaweedFS S3 on 127.0.0.1, or both")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved measurement rounds (default depends on the mode)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    if args.mode is None:
        args.mode = "small"
    global _QUIET
    _QUIET = args.quiet
    code()  # fails before the rounds, not after them, if txlog is another checkout's
    return args


def records_main(description: str, *, records: tuple[int, int, int],
                 rounds: tuple[int, int, int], prefix: str,
                 run: Callable[..., None], per: str = "", stores: bool = False,
                 flags: dict[str, str] | None = None) -> None:
    """The main of a benchmark sized by ``--records``: the common options, ``--records``
    (by default ``records`` for tiny, small and full) and the rounds (``rounds`` by mode
    unless ``--rounds``); then ``run(mode, records, rounds, workdir)`` in a new temporary
    directory (``prefix``), removed afterwards.  ``per`` says what the records are
    counted per ("topic").  With ``stores``, ``--store`` is taken too and passed on as
    ``run(..., store=...)``; each of ``flags`` (name: help) is an on/off option passed on
    as ``run(..., name=bool)``."""
    def extra(p: argparse.ArgumentParser) -> None:
        tiny, small, full = records
        p.add_argument("--records", type=int, default=None,
                       help=f"records{' per ' + per if per else ''} (default: tiny {tiny:,}, "
                            f"small {small:,}, full {full:,})")
        for name, help_text in (flags or {}).items():
            p.add_argument(f"--{name}", action="store_true", help=help_text)

    args = parse_args(description, stores=stores, extra=extra)
    n = args.records or pick(args.mode, *records)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    more: dict[str, Any] = {"store": args.store} if stores else {}
    more.update({name: bool(getattr(args, name)) for name in flags or {}})
    try:
        run(args.mode, n, args.rounds or pick(args.mode, *rounds), work, **more)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def pick(mode: str, tiny: Any, small: Any, full: Any) -> Any:
    """The parameter for ``mode``."""
    return {"tiny": tiny, "small": small, "full": full}[mode]


# -- progress and output ----------------------------------------------------------------------

_QUIET = False
_T0 = perf()


def progress(msg: str) -> None:
    if not _QUIET:
        print(f"[{perf() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def fmt(x: Any) -> str:
    if isinstance(x, float):
        if x != x:  # NaN
            return "-"
        a = abs(x)
        if a == 0:
            return "0"
        if a >= 1000:
            return f"{x:,.0f}"
        if a >= 100:
            return f"{x:.1f}"
        if a >= 1:
            return f"{x:.2f}"
        return f"{x:.3g}"
    if x is None:
        return "-"
    return str(x)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[fmt(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    print()
    print(title)
    print("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in
                    enumerate(zip(headers, widths, strict=True))))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(r, widths, strict=True))))
    sys.stdout.flush()


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(terse=True), "machine": platform.machine()}


def code() -> dict[str, Any]:
    """Which code was measured: where txlog was imported from (refused unless from this
    checkout) and the checkout's commit, marked dirty if it has uncommitted changes."""
    import subprocess

    import txlog

    where = Path(txlog.__file__).resolve().parent
    if where != REPO / "txlog":
        raise SystemExit(f"txlog was imported from {where}, not from this checkout ({REPO}): "
                         "the numbers would not be this code's; run the benchmark with "
                         "this checkout's scripts/bench/ and nothing ahead of it on "
                         "PYTHONPATH")

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != REPO:  # no git, or not this checkout's repository
        return {"txlog": str(where), "commit": "unknown"}
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"txlog": str(where), "commit": commit + ("-dirty" if dirty else "")}


def emit_json(bench: str, mode: str, **fields: Any) -> dict[str, Any]:
    """Print the benchmark's one machine-readable line (last on stdout)."""
    # When it ended and the load then: charts and reports name the run they come from.
    d = {"bench": bench, "mode": mode, "finished": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                 time.gmtime()),
         "load_average": round(os.getloadavg()[0], 1), **fields, "machine": machine(),
         "code": code()}
    print(json.dumps(d, sort_keys=False, default=_json_default), flush=True)
    return d


def _json_default(x: Any) -> Any:
    if isinstance(x, float):
        return None
    return str(x)


def clean(x: Any) -> Any:
    """Round floats for JSON output; NaN becomes None."""
    if isinstance(x, float):
        if x != x or x in (float("inf"), float("-inf")):
            return None
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


# -- statistics -----------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    if len(s) == 1:
        return float(s[0])
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (k - lo))


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def paired_ratio(base: Sequence[float], other: Sequence[float]) -> float:
    """Median over rounds of ``base``'s time (or CPU) over ``other``'s in the same round:
    of runs made back to back, so the machine's drift over a run cancels in each."""
    return median([ratio(b, o) for b, o in zip(base, other, strict=True)])


class Timer:
    """``with Timer() as t: ...`` then ``t.elapsed`` (seconds, perf_counter)."""

    def __enter__(self) -> Timer:
        self.start = perf()
        self.elapsed = 0.0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.elapsed = perf() - self.start


# -- interleaved A/B measurement --------------------------------------------------------------


def interleaved(sides: dict[str, Callable[[], Any]], *, rounds: int, per_round: int,
                count_store: Any = None, count_side: str | None = None,
                label: str = "") -> dict[str, Any]:
    """Time two (or more) operations alternately, one call each in turn with the order
    flipped every call, so that load from elsewhere on the machine hits every side alike.

    A round is ``per_round`` calls of each side; a side's rate in a round is calls per
    second of time spent in its own calls.  Requests to ``count_store`` are attributed to
    ``count_side`` (counted around its calls only).
    """
    names = list(sides)
    lat: dict[str, list[float]] = {n: [] for n in names}
    rate: dict[str, list[float]] = {n: [] for n in names}
    reqs: dict[str, int] = {}
    for r in range(rounds):
        spent = dict.fromkeys(names, 0.0)
        for i in range(per_round):
            order = names if (r * per_round + i) % 2 == 0 else names[::-1]
            for n in order:
                before = counts(count_store) if n == count_side else None
                t0 = perf()
                sides[n]()
                dt = perf() - t0
                lat[n].append(dt)
                spent[n] += dt
                if before is not None:
                    for k, v in diff_counts(counts(count_store), before).items():
                        reqs[k] = reqs.get(k, 0) + v
        for n in names:
            rate[n].append(per_round / spent[n] if spent[n] else float("nan"))
        progress(f"{label}round {r + 1}/{rounds}: "
                 + ", ".join(f"{n} {rate[n][-1]:.1f}/s" for n in names))
    return {"lat": lat, "rate": rate, "reqs": reqs, "calls": rounds * per_round}


# -- Spark ---------------------------------------------------------------------------------


def start_spark(app_name: str, *, s3a: bool = False) -> Any:
    """A local[2] session for the Spark benchmarks, with txlog registered; with ``s3a``,
    hadoop-aws and the AWS SDK from the set-up's cache (``.jars/``, scripts/jars.txt) on
    its classpath, so that Spark's own filesystem opens ``s3a://`` (nothing is fetched)."""
    import spark_ext

    conf = {"spark.driver.memory": "2g"}
    if s3a:
        conf["spark.jars"] = ",".join(map(str, s3a_jars()))
    return spark_ext.local_session(app_name, **conf)


def s3a_jars() -> list[Path]:
    """hadoop-aws, the AWS SDK bundle and hadoop-aws's stream library in ``.jars/``."""
    names = ("hadoop-aws-", "bundle-", "analyticsaccelerator-s3-")
    found = sorted(p for p in (REPO / ".jars").glob("*.jar") if p.name.startswith(names))
    if len(found) < len(names):
        raise SystemExit("hadoop-aws and the AWS SDK are not in .jars/: run "
                         "scripts/fetch-jars.sh (scripts/bootstrap.sh does) for --store s3")
    return found


def spark_target(spark: Any, target: Target) -> Any:
    """The Hadoop location of ``target``'s root (``s3a://`` for S3), with the settings
    txlog derives from its storage options put into ``spark``'s Hadoop configuration, so
    that a baseline read or written by Spark alone reaches the same server the same way."""
    from spark_ext import hadoop_conf

    where = hadoop_conf.locate(target.base, target.storage_options)
    hadoop_conf.apply(spark, where)
    return where


def kafka_shaped_frame(spark: Any, records: int, value_size: int) -> Any:
    """``records`` Kafka-shaped rows: string keys over 100,003 users and binary values of
    ``value_size`` bytes that start with the row's number."""
    from pyspark.sql import functions as F

    return (spark.range(0, records, numPartitions=2)
            .select(F.concat(F.lit("user-"), (F.col("id") % 100_003).cast("string"))
                    .alias("key"),
                    F.concat(F.lpad(F.col("id").cast("string"), 12, "0"),
                             F.lit("x" * (value_size - 12))).cast("binary").alias("value")))


def spark_rounds(sides: Mapping[str, Callable[[int], Any]], *, rounds: int, warmup: int,
                 before: Callable[[str], None] | None = None,
                 after: Callable[[str, Any], None] | None = None,
                 ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run every side ``warmup`` times (called with -1, -2, ...), then ``rounds`` rounds of
    one call each (called with the round), in an order flipped every round so that no side
    always follows the same one.  Returns each side's wall seconds and CPU seconds (of the
    whole process tree: the JVM and the Python workers too) per round.  ``before(name)``
    and ``after(name, result)`` run around each measured call, outside its time."""
    for w in range(warmup):  # the JIT and the Python workers: rounds sped up for a while
        for name, fn in sides.items():
            progress(f"warm-up {w + 1}/{warmup} {name}")
            fn(-1 - w)
    times: dict[str, list[float]] = {n: [] for n in sides}
    cpus: dict[str, list[float]] = {n: [] for n in sides}
    for r in range(rounds):
        order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
        for name, fn in order:
            if before is not None:
                before(name)
            cpu0 = tree_cpu_seconds()
            with Timer() as t:
                out = fn(r)
            cpus[name].append(tree_cpu_seconds() - cpu0)
            times[name].append(t.elapsed)
            if after is not None:
                after(name, out)
            progress(f"round {r + 1}/{rounds} {name}: {t.elapsed:.2f}s, "
                     f"{cpus[name][-1]:.2f} CPU s")
    return times, cpus


# -- object-store request counts ------------------------------------------------------------


def counts(store: Any) -> dict[str, int]:
    return dict(store.counter.snapshot()["requests"])


def diff_counts(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0)
            for k in sorted(set(after) | set(before)) if after.get(k, 0) - before.get(k, 0)}


def per(c: dict[str, int], n: int) -> dict[str, float]:
    return {k: v / n for k, v in c.items()} if n else {}


def fmt_counts(c: dict[str, float]) -> str:
    return " ".join(f"{k}={fmt(float(v))}" for k, v in sorted(c.items())) or "-"


# -- test data ------------------------------------------------------------------------------


def kafka_records(n: int, value_size: int = 1024, seed: int = 0) -> Any:
    """A Kafka-shaped Arrow table of ``n`` records with ``value_size``-byte values.

    Values are random bytes (incompressible), so neither side gains from compression.
    """
    import pyarrow as pa

    from txlog.records import KAFKA_SCHEMA

    rnd = _random_bytes(n * value_size, seed)
    offsets = pa.array([i * value_size for i in range(n + 1)], pa.int32())
    values = pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets.buffers()[1],
                                                           pa.py_buffer(rnd)])
    now = int(time.time() * 1000)
    return pa.table([pa.nulls(n, pa.binary()), values,
                     pa.nulls(n, KAFKA_SCHEMA.field("headers").type),
                     pa.array([now] * n, pa.timestamp("ms", tz="UTC"))], schema=KAFKA_SCHEMA)


def plain_records(n: int, value_size: int = 1024, seed: int = 0) -> Any:
    """The same values as :func:`kafka_records` in a flat (key, value, timestamp) table,
    which every engine (delta-rs included) writes without nested types."""
    t = kafka_records(n, value_size, seed)
    return t.drop_columns(["headers"])


def _random_bytes(n: int, seed: int) -> bytes:
    import random

    return random.Random(seed).randbytes(n)


# -- stores ---------------------------------------------------------------------------------


@dataclass
class Target:
    """One store a benchmark runs on: a fresh URL per call of :meth:`url`."""

    name: str  # "local" or "s3"
    base: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    delta_options: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def url(self, what: str) -> str:
        return f"{self.base.rstrip('/')}/{what}-{uuid.uuid4().hex[:8]}"

    def connect(self, url: str, **config: Any) -> Any:
        import txlog

        return txlog.connect(url, self.storage_options or None, **config)


@contextlib.contextmanager
def local_target() -> Iterator[Target]:
    root = tempfile.mkdtemp(prefix="txlog-bench-", dir=os.environ.get("TXLOG_BENCH_TMP"))
    try:
        yield Target("local", root, note=f"local disk under {tempfile.gettempdir()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def s3_target() -> Iterator[Target]:
    progress("starting SeaweedFS (weed mini) on 127.0.0.1")
    server = servers.start_seaweed(bucket="txlog-bench")
    try:
        opts = server.storage_options
        delta = {
            "AWS_ENDPOINT_URL": server.endpoint,
            "AWS_ACCESS_KEY_ID": server.key,
            "AWS_SECRET_ACCESS_KEY": server.secret,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            # Safe concurrent commits through S3 conditional put (If-None-Match), which
            # SeaweedFS honours: the same atomic primitive txlog uses.
            "conditional_put": "etag",
        }
        yield Target("s3", f"s3://{server.bucket}/bench", opts, delta,
                     note="SeaweedFS weed mini on 127.0.0.1 (same machine)")
    finally:
        progress("stopping SeaweedFS")
        server.stop()


@contextlib.contextmanager
def targets(which: str) -> Iterator[list[Target]]:
    """The stores named by ``--store`` (both: local and S3), started and cleaned up."""
    with contextlib.ExitStack() as stack:
        out = []
        if which in ("local", "both"):
            out.append(stack.enter_context(local_target()))
        if which in ("s3", "both"):
            out.append(stack.enter_context(s3_target()))
        yield out


class DeltaAppender:
    """delta-rs appends to one table, the way a long-lived writer would do them: the
    table is created once, then each append is ``write_deltalake(dt, data, mode="append")``
    on the same DeltaTable object (its state is updated incrementally, not reloaded)."""

    def __init__(self, target: Target, schema_table: Any) -> None:
        from deltalake import DeltaTable, write_deltalake

        self.uri = target.url("delta")
        self.options = dict(target.delta_options) or None
        write_deltalake(self.uri, schema_table.slice(0, 0), mode="append",
                        storage_options=self.options)
        self.table = DeltaTable(self.uri, storage_options=self.options)
        self._write = write_deltalake

    def append(self, data: Any) -> None:
        self._write(self.table, data, mode="append")

    def version(self) -> int:
        return int(self.table.version())


# -- fast history builder (read.py, scale.py) -----------------------------------------------


def build_history(plog: Any, batches: int, *, shared_key: str, records_per_batch: int = 1,
                  nbytes: int = 0, producer_id: int = -1, quick_store: Any = None,
                  report_every: int = 20_000) -> None:
    """Append ``batches`` tiny non-transactional entries to ``plog``, each referencing
    the one shared data object ``shared_key`` (rows 0..records_per_batch-1), through
    :meth:`PartitionLog.append` (so checkpoints are written every interval as usual).

    ``quick_store`` (a :class:`QuickLocalStore` over the same root) skips the fsyncs of
    the local store while building the fixture; the benchmark then opens the partition
    through a normal store.
    """
    from txlog.model import DATA
    from txlog.partition_log import AppendSpec

    real_store = plog.store
    if quick_store is not None:
        plog.store = quick_store
    t0 = perf()
    try:
        for i in range(batches):
            plog.append(AppendSpec(kind=DATA, count=records_per_batch,
                                   producer_id=producer_id, data=shared_key, nbytes=nbytes,
                                   ts_min=1, ts_max=1))
            if report_every and (i + 1) % report_every == 0:
                progress(f"  built {i + 1:,}/{batches:,} batches ({perf() - t0:.1f}s)")
    finally:
        plog.store = real_store


def quick_local_store(url: str) -> Any:
    """A LocalStore over ``url`` for building fixtures fast, with a single writer and no
    concurrent reader: put-if-absent is ``open(O_CREAT | O_EXCL)`` then write, without
    fsyncs or a temp file.  Still exclusive, but a reader could see a half-written
    object, so it is for building a fixture before the benchmark opens it, never more.
    """
    from txlog.storage import open_store
    from txlog.storage.local import LocalStore

    base = open_store(url)
    assert isinstance(base, LocalStore)

    class QuickLocalStore(LocalStore):
        def put_if_absent(self, key: str, data: bytes) -> bool:
            final = self._path(key)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            try:
                try:
                    fd = os.open(final, flags, 0o644)
                except FileNotFoundError:
                    os.makedirs(os.path.dirname(final), exist_ok=True)
                    fd = os.open(final, flags, 0o644)
            except FileExistsError:
                won = False
            else:
                won = True
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
            self.counter.add("put_if_absent", len(data))
            return won

    return QuickLocalStore(base.url, base.root)


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and every live descendant (the JVM, the
    Python worker daemons and workers), including the children they have reaped.  Wall
    time on a shared machine depends on the neighbours; CPU time much less so."""
    return sum(tree_cpu_parts().values())


def tree_cpu_parts() -> dict[str, float]:
    """:func:`tree_cpu_seconds` split by the command of each process: ``weed`` (a
    SeaweedFS server a benchmark started), ``java`` (Spark's JVM) and ``other`` (this
    process, Python workers), so that a store's CPU is told apart from the client's."""
    ticks = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, int] = {}
    for pid, f in process_stats():
        parent[pid] = int(f[1])
        cpu[pid] = int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    me = os.getpid()
    out = {"weed": 0.0, "java": 0.0, "other": 0.0}
    for pid in cpu:
        p = pid
        while p > 1 and p != me:
            p = parent.get(p, 1)
        if p == me:
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                comm = ""
            part = comm if comm in ("weed", "java") else "other"
            out[part] += cpu[pid] / ticks
    return out
