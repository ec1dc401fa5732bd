"""``txlog maintain``, ``txlog describe`` and ``txlog check``: maintenance of a root, the
root at a glance, and its batch objects checked against their log entries."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from txlog import admin
from txlog.cli.output import PROG, Out, Progress
from txlog.cli.parsing import subcommand
from txlog.tables import fmt_bytes, render


def cmd_maintain(log: Any, args: argparse.Namespace, out: Out,
                 parser: argparse.ArgumentParser) -> int:
    from txlog.maintenance import maintain

    show = args.progress if args.progress is not None else sys.stderr.isatty()
    t0 = time.monotonic()
    report = maintain(log, args.topic or None, compact=not args.no_compact,
                      progress=Progress(show))
    d = report.to_json()
    d["elapsed_s"] = round(time.monotonic() - t0, 3)

    def text() -> str:
        rows = d["partitions"]
        swept = d["swept_transactions"]
        head = (f"Swept {len(swept)} transaction(s)"
                + (f": {', '.join(swept)}" if swept else "") + "; "
                f"maintained {len(rows)} partition(s) in {d['elapsed_s']}s.")
        expired = d["expired_transactional_ids"]
        if expired:
            head += (f"\nExpired {len(expired)} idle transactional.id(s): "
                     f"{', '.join(expired)}.")
        if d["shared_objects_deleted"]:
            head += (f"\nDeleted {d['shared_objects_deleted']} shared object(s) that every "
                     "partition holding them had released.")
        active = [r for r in rows if r["retained_from"] is not None or r["compacted_batches"]
                  or r["dropped_aborted_batches"] or r["objects_deleted"]]
        if not active:
            return head + "\nNothing to retain, compact or delete."
        idle = len(rows) - len(active)
        return head + "\n" + render(active, [
            ("Topic", "topic"), ("Partition", "partition"),
            ("RetainedFrom", "retained_from"), ("CompactedBatches", "compacted_batches"),
            ("DroppedAborted", "dropped_aborted_batches"), ("Segments", "segments_written"),
            ("ObjectsDeleted", "objects_deleted")]) + (
            f"\n({idle} other partition(s): nothing to do)" if idle else "")

    out.emit(d, text)
    # Left alone on purpose (a shared object whose footer cannot be trusted): not a failure.
    for warning in report.warnings:
        sys.stderr.write(f"{PROG}: warning: {warning}\n")
    # One line per failure; everything else was done (and is in the report above).
    for failure in report.failures:
        sys.stderr.write(f"{PROG}: error: {failure}\n")
    return 1 if report.failures else 0


def cmd_check(log: Any, args: argparse.Namespace, out: Out,
              parser: argparse.ArgumentParser) -> int:
    from txlog.object_check import check_objects

    report = check_objects(log, args.topic or None)
    d = report.to_json()

    def text() -> str:
        head = (f"Checked {d['objects']} object(s) ({d['shared_objects']} shared, "
                f"{fmt_bytes(d['bytes'])}) named by {d['partitions']} partition(s): ")
        if not d["problems"]:
            return head + "no problems."
        return head + f"{len(d['problems'])} problem(s).\n" + render(d["problems"], [
            ("Topic", "topic"), ("Partition", "partition"), ("Object", "key"),
            ("Problem", "problem")])

    out.emit(d, text)
    return 1 if report.problems else 0


def cmd_describe(log: Any, args: argparse.Namespace, out: Out,
                 parser: argparse.ArgumentParser) -> int:
    topics = log.list_topics(internal=True)
    tx_states: dict[str, int] = {}
    for r in admin.list_transactions(log):
        tx_states[r["state"]] = tx_states.get(r["state"], 0) + 1
    d: dict[str, Any] = {"root": log.url, "backend": log.store.backend,
                         "topics": len([t for t in topics if not t.startswith("__")]),
                         "internal_topics": [t for t in topics if t.startswith("__")],
                         "transactional_ids": tx_states}
    if args.metrics:
        d["metrics"] = log.metrics(refresh=True, topics=args.topic or None)

    def text() -> str:
        lines = [f"Root: {d['root']} ({d['backend']})",
                 f"Topics: {d['topics']}"
                 + (f" (+ internal: {', '.join(d['internal_topics'])})"
                    if d["internal_topics"] else ""),
                 "Transactional ids: " + (", ".join(f"{k}={v}" for k, v in
                                                     sorted(tx_states.items())) or "none")]
        if args.metrics:
            m = d["metrics"]
            lines.append(f"Open transactions: {m['open_transactions']}")
            st = m["store"]
            req = [{"kind": k, "requests": v, "bytes": st["bytes"].get(k, 0)}
                   for k, v in sorted(st["requests"].items())]
            lines += ["", "Object-store requests made by this command:",
                      render(req, [("Kind", "kind"), ("Requests", "requests"),
                                   ("Bytes", "bytes")])]
            if m["transactions"]:
                lat = [dict(kind=k, **v) for k, v in m["transactions"].items()]
                lines += ["", "Transaction end latency (this process):",
                          render(lat, [("Kind", "kind"), ("Count", "count"),
                                       ("MeanMs", "mean_ms"), ("P99Ms", "p99_ms"),
                                       ("MaxMs", "max_ms")])]
            parts = [dict(partition=k, **v) for k, v in m["partitions"].items()
                     if v["high_watermark"] or not k.startswith("__")]
            lines += ["", "Partitions:", render(parts, [
                ("TopicPartition", "partition"), ("LogStart", "log_start_offset"),
                ("HighWatermark", "high_watermark"), ("LSO", "last_stable_offset"),
                ("LsoLag", "lso_lag"), ("OpenTxns", "open_transactions"),
                ("Batches", "batches"), ("Size", lambda r: fmt_bytes(r["size_bytes"]))])
                if parts else "(none)"]
        return "\n".join(lines)

    out.emit(d, text)
    return 0


def add_commands(subs: Any) -> None:
    p = subcommand(subs, "maintain", "sweep, retention, compaction, purge, checkpoints",
                   "Run maintenance: roll forward transactions stuck in Prepare* and abort those\n"
                   "past their timeout; then per partition apply retention (retention.ms,\n"
                   "retention.bytes), compact committed batches into segments (dropping aborted\n"
                   "data and markers), delete objects whose file.delete.delay.ms has passed, and\n"
                   "write a checkpoint; then delete the shared objects (several partitions'\n"
                   "batches in one) that every partition holding them has released.  Every\n"
                   "step appends to the log, so it is safe to run from cron or a scheduled\n"
                   "notebook while producers and readers work.  A progress bar goes to stderr\n"
                   "when it is a terminal (or with --progress).",
                   "txlog maintain\ntxlog maintain --topic orders --no-compact\n"
                   "*/15 * * * * TXLOG_ROOT=s3://bucket/txlog txlog maintain --json >> "
                   "/var/log/txlog.json",
                   cmd_maintain)
    p.add_argument("--topic", action="append", help="only this topic (repeatable; default: "
                   "all, internal included)")
    p.add_argument("--no-compact", action="store_true", help="skip compaction")
    pg = p.add_mutually_exclusive_group()
    pg.add_argument("--progress", dest="progress", action="store_true", default=None,
                    help="always show the progress bar")
    pg.add_argument("--no-progress", dest="progress", action="store_false",
                    help="never show it")

    # check
    p = subcommand(subs, "check", "verify batch objects against the log entries naming them",
                   "Read every batch object the partitions' logs name (each once) and check it:\n"
                   "its bytes against the CRC-32 in its name, its Parquet footer, its rows\n"
                   "against every batch that reads them, and a shared object's txlog.shared\n"
                   "footer against the partitions naming it.  Exits 1 if any problem is found.\n"
                   "It reads every object: on a large root, give --topic.",
                   "txlog check\ntxlog check --topic orders --json",
                   cmd_check)
    p.add_argument("--topic", action="append", help="only this topic (repeatable; default: "
                   "all, internal included)")

    # describe
    p = subcommand(subs, "describe", "the root at a glance; --metrics for counters",
                   "Summarise the root: topics and transactional ids by state.  --metrics adds\n"
                   "what log.metrics(refresh=True) returns: open transactions, per partition\n"
                   "the high watermark, LSO and LSO lag, and this command's object-store\n"
                   "requests and bytes by kind.",
                   "txlog describe\ntxlog describe --metrics\ntxlog describe --metrics --json",
                   cmd_describe)
    p.add_argument("--metrics", action="store_true", help="include metrics")
    p.add_argument("--topic", action="append", help="metrics for this topic only "
                   "(repeatable)")
