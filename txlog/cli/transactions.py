"""``txlog transactions``: list, describe, find hanging and abort transactions, as
kafka-transactions.sh does."""

from __future__ import annotations

import argparse
from typing import Any

from txlog import admin
from txlog.admin import fmt_duration
from txlog.cli.output import Out
from txlog.cli.parsing import command_group, subcommand
from txlog.records import TopicPartition
from txlog.tables import fmt_time, render

_TXN_COLUMNS: list[tuple[str, Any]] = [
    ("TransactionalId", "transactional_id"), ("ProducerId", "producer_id"),
    ("ProducerEpoch", "producer_epoch"), ("TransactionState", "state"),
    ("TransactionDuration", lambda r: fmt_duration(r["duration_ms"])
     if r["duration_ms"] is not None else None),
    ("TimeoutMs", "timeout_ms"), ("TopicPartitions", "partitions"),
]


def cmd_txn_list(log: Any, args: argparse.Namespace, out: Out,
                 parser: argparse.ArgumentParser) -> int:
    rows = admin.list_transactions(log, states=args.state)
    out.emit(rows, lambda: render(rows, _TXN_COLUMNS) if rows else "(no transactional ids)")
    return 0


def cmd_txn_describe(log: Any, args: argparse.Namespace, out: Out,
                     parser: argparse.ArgumentParser) -> int:
    d = admin.describe_transaction(log, args.transactional_id)
    d["txn_start"] = fmt_time(d["txn_start_ms"])
    d["last_update"] = fmt_time(d["last_update_ms"])
    out.emit(d, lambda: render([d], [
        *_TXN_COLUMNS, ("TransactionStartTime", "txn_start"), ("LastUpdate", "last_update"),
        ("LastAbortReason", "last_abort_reason")]))
    return 0


def cmd_txn_describe_producers(log: Any, args: argparse.Namespace, out: Out,
                               parser: argparse.ArgumentParser) -> int:
    rows = admin.describe_producers(log, TopicPartition(args.topic, args.partition))
    for r in rows:
        r["last_timestamp"] = fmt_time(r["last_timestamp_ms"])
    out.emit(rows, lambda: render(rows, [
        ("ProducerId", "producer_id"), ("ProducerEpoch", "producer_epoch"),
        ("LastSequence", "last_sequence"), ("LastTimestamp", "last_timestamp"),
        ("CurrentTransactionStartOffset", "current_txn_start_offset"),
        ("TransactionalId", "transactional_id")]) if rows else "(no producers)")
    return 0


def parse_duration_ms(s: str, default_unit: str = "m") -> int:
    """``15`` (minutes by default, as kafka-transactions.sh), ``500ms``, ``30s``, ``2h``."""
    units = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
             "d": 86_400_000}
    t = s.strip().lower()
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u) and t[: -len(u)].strip():
            num, unit = t[: -len(u)].strip(), u
            break
    else:
        num, unit = t, default_unit
    try:
        value = float(num)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid duration {s!r}: use minutes (15) or a unit: 500ms, 30s, 10m, 2h"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"duration must not be negative: {s!r}")
    if not value * units[unit] < 2**63:  # also inf and nan
        raise argparse.ArgumentTypeError(f"duration out of range: {s[:40]!r}")
    return int(value * units[unit])


def cmd_txn_find_hanging(log: Any, args: argparse.Namespace, out: Out,
                         parser: argparse.ArgumentParser) -> int:
    if args.partition is not None and not args.topic:
        parser.error("--partition needs --topic")
    rows = admin.find_hanging(log, topics=args.topic, partition=args.partition,
                              max_transaction_timeout_ms=args.max_transaction_timeout,
                              prepare_grace_ms=args.prepare_grace_ms)
    for r in rows:
        r["duration"] = fmt_duration(r["duration_ms"])
    out.emit(rows, lambda: render(rows, [
        ("Kind", "kind"), ("Topic", "topic"), ("Partition", "partition"),
        ("ProducerId", "producer_id"), ("ProducerEpoch", "producer_epoch"),
        ("TransactionalId", "transactional_id"), ("StartOffset", "start_offset"),
        ("Duration", "duration"), ("CoordinatorState", "state"), ("Reason", "reason"),
    ]) if rows else "No hanging transactions found.")
    return 0


def cmd_txn_abort(log: Any, args: argparse.Namespace, out: Out,
                  parser: argparse.ArgumentParser) -> int:
    if args.transactional_id:
        if args.topic or args.partition is not None or args.producer_id is not None \
                or args.start_offset is not None:
            parser.error("use either --transactional-id or --topic/--partition, not both")
        res = admin.abort_transaction(log, args.transactional_id)
        out.emit(res, lambda: (
            f"Transaction of {res['transactional_id']!r} (producer {res['producer_id']}, "
            f"epoch {res['producer_epoch']}): {res['action']}; markers written to "
            f"{', '.join(res['partitions']) or 'no partitions'}."))
        return 0
    if not args.topic or args.partition is None:
        parser.error("abort needs --transactional-id, or --topic and --partition with "
                     "--producer-id/--producer-epoch or --start-offset")
    if args.start_offset is None and (args.producer_id is None or args.producer_epoch is None):
        parser.error("abort --topic/--partition needs --producer-id and --producer-epoch, "
                     "or --start-offset")
    res = admin.abort_partition_txn(log, TopicPartition(args.topic, args.partition),
                                    producer_id=args.producer_id,
                                    producer_epoch=args.producer_epoch,
                                    start_offset=args.start_offset)
    out.emit(res, lambda: (
        f"{res['topic']}-{res['partition']}: producer {res['producer_id']} epoch "
        f"{res['producer_epoch']} (start offset {res['start_offset']}): {res['action']}. "
        f"LSO {res['lso_before']} -> {res['lso_after']}."))
    return 0


def add_commands(subs: Any) -> None:
    xs = command_group(subs, "transactions", "list, describe, find and abort transactions",
                       "Inspect and end transactions, as kafka-transactions.sh does.",
                       "txlog transactions list\n"
                       "txlog transactions find-hanging --max-transaction-timeout 15\n"
                       "txlog transactions abort --transactional-id etl-1")
    p = subcommand(xs, "list", "every transactional.id and its state",
                   "List every transactional.id in the transaction state log with its producer\n"
                   "id, epoch, state and (if open) duration and partitions.",
                   "txlog transactions list\ntxlog transactions list --state Ongoing --json",
                   cmd_txn_list)
    p.add_argument("--state", action="append", metavar="STATE",
                   help="only these states (Empty, Ongoing, PrepareCommit, PrepareAbort, "
                        "CompleteCommit, CompleteAbort), repeatable")
    p = subcommand(xs, "describe", "one transactional.id's state",
                   "Describe one transactional.id: its state, producer id and epoch, timeout,\n"
                   "open transaction start and partitions, and why its last abort happened.",
                   "txlog transactions describe --transactional-id etl-1", cmd_txn_describe)
    p.add_argument("--transactional-id", required=True, metavar="ID")
    p = subcommand(xs, "describe-producers", "producers a partition remembers",
                   "The producers a partition remembers: epoch, last sequence, last write and the\n"
                   "start offset of their open transaction (-1 when none).",
                   "txlog transactions describe-producers --topic orders --partition 0",
                   cmd_txn_describe_producers)
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=int, required=True)
    p = subcommand(xs, "find-hanging", "open transactions that will not end by themselves",
                   "Find transactions that hold (or may hold) a partition's LSO and will not end\n"
                   "by themselves: open longer than --max-transaction-timeout (or past their own\n"
                   "transaction.timeout.ms): kind 'hanging'; open on a partition the state log\n"
                   "no longer connects to them (the transactional.id moved on, or never\n"
                   "registered the partition): 'orphaned'; state-log entries stuck in\n"
                   "PrepareCommit/PrepareAbort: 'stuck-prepare'.  Read-only.",
                   "txlog transactions find-hanging\n"
                   "txlog transactions find-hanging --max-transaction-timeout 5      # minutes\n"
                   "txlog transactions find-hanging --topic orders --partition 0 "
                   "--max-transaction-timeout 30s",
                   cmd_txn_find_hanging)
    p.add_argument("--topic", action="append", help="only this topic (repeatable; default: "
                   "every topic)")
    p.add_argument("--partition", type=int, help="only this partition (with --topic)")
    p.add_argument("--max-transaction-timeout", type=parse_duration_ms,
                   default=None, metavar="DURATION",
                   help="longest transaction timeout in use: minutes or with a unit (500ms, "
                        "30s, 2h); default: the root's transaction.max.timeout.ms")
    p.add_argument("--prepare-grace-ms", type=int, default=admin.DEFAULT_PREPARE_GRACE_MS,
                   metavar="MS", help="report Prepare* entries older than this (default "
                   "30000)")
    p = subcommand(xs, "abort", "end a transaction safely",
                   "End a transaction safely.  --transactional-id fences its producer and aborts\n"
                   "the open transaction through the coordinator (a PrepareCommit is rolled\n"
                   "forward: that decision is final).  --topic/--partition with --producer-id and\n"
                   "--producer-epoch (or --start-offset, from describe-producers / find-hanging)\n"
                   "ends one partition's open transaction: if the state log still has it open it\n"
                   "is aborted as a whole, else an ABORT marker is written on that partition.",
                   "txlog transactions abort --transactional-id etl-1\n"
                   "txlog transactions abort --topic orders --partition 0 --producer-id 3 "
                   "--producer-epoch 7\n"
                   "txlog transactions abort --topic orders --partition 0 --start-offset 1200",
                   cmd_txn_abort)
    p.add_argument("--transactional-id", metavar="ID")
    p.add_argument("--topic")
    p.add_argument("--partition", type=int)
    p.add_argument("--producer-id", type=int)
    p.add_argument("--producer-epoch", type=int)
    p.add_argument("--start-offset", type=int)
