"""``txlog groups``: consumer groups' committed offsets, lag and offset resets."""

from __future__ import annotations

import argparse
from typing import Any

from txlog import admin
from txlog.cli.output import Out, note
from txlog.cli.parsing import command_group, subcommand
from txlog.records import TopicPartition
from txlog.tables import render


def cmd_groups_list(log: Any, args: argparse.Namespace, out: Out,
                    parser: argparse.ArgumentParser) -> int:
    rows = admin.list_groups(log, include_internal=args.include_internal)
    out.emit(rows, lambda: render(rows, [("GROUP", "group"), ("TOPICS", "topics"),
                                         ("PARTITIONS", "partitions")])
             if rows else "(no consumer groups)")
    return 0


_GROUP_COLUMNS: list[tuple[str, Any]] = [
    ("GROUP", "group"), ("TOPIC", "topic"), ("PARTITION", "partition"),
    ("CURRENT-OFFSET", "current_offset"), ("LOG-END-OFFSET", "log_end_offset"),
    ("LAG", "lag")]


def cmd_groups_describe(log: Any, args: argparse.Namespace, out: Out,
                        parser: argparse.ArgumentParser) -> int:
    rows = admin.describe_group(log, args.group)
    out.emit(rows, lambda: render(rows, _GROUP_COLUMNS))
    return 0


def _parse_topic_spec(log: Any, spec: str, parser: argparse.ArgumentParser,
                      ) -> list[TopicPartition]:
    """``topic`` or ``topic:0,2`` (Kafka's reset-offsets syntax)."""
    name, sep, parts = spec.partition(":")
    if not sep:
        return list(log.partitions_for(name))
    try:
        return [TopicPartition(name, int(p)) for p in parts.split(",") if p.strip()]
    except ValueError:
        parser.error(f"--topic {spec!r}: partitions must be integers, e.g. orders:0,1")


def cmd_groups_reset(log: Any, args: argparse.Namespace, out: Out,
                     parser: argparse.ArgumentParser) -> int:
    if not args.topic and not args.all_topics:
        parser.error("reset-offsets needs --topic TOPIC[:PARTITIONS] or --all-topics")
    tps = None
    if args.topic:
        tps = [tp for spec in args.topic for tp in _parse_topic_spec(log, spec, parser)]
    spec = admin.ResetSpec(to_earliest=args.to_earliest, to_latest=args.to_latest,
                           to_offset=args.to_offset, shift_by=args.shift_by)
    rows = admin.reset_offsets(log, args.group, tps, spec, execute=args.execute)
    out.emit(rows, lambda: render(rows, [
        ("GROUP", "group"), ("TOPIC", "topic"), ("PARTITION", "partition"),
        ("CURRENT-OFFSET", "current_offset"), ("NEW-OFFSET", "new_offset")]))
    if not args.execute:
        note("Dry run: nothing was committed. Add --execute to commit these offsets.")
    return 0


def add_commands(subs: Any) -> None:
    gs = command_group(subs, "groups", "list, describe and reset consumer groups",
                       "Consumer groups: committed offsets, lag, and offset resets.",
                       "txlog groups list\ntxlog groups describe --group audit\n"
                       "txlog groups reset-offsets --group audit --topic orders --to-earliest "
                       "--execute")
    p = subcommand(gs, "list", "groups with committed offsets",
                   "List consumer groups (every group with committed offsets).",
                   "txlog groups list", cmd_groups_list)
    p.add_argument("--include-internal", action="store_true",
                   help="include txnAppId groups (txnapp:*)")
    p = subcommand(gs, "describe", "offsets and lag of a group",
                   "Per partition of a group: its committed offset, the log end offset a\n"
                   "read_committed consumer sees (the LSO) and the lag between them.",
                   "txlog groups describe --group audit", cmd_groups_describe)
    p.add_argument("--group", required=True)
    p = subcommand(gs, "reset-offsets", "move a group's offsets (dry run unless --execute)",
                   "Move a group's committed offsets.  Prints the plan; commits only with\n"
                   "--execute (as kafka-consumer-groups.sh).  Targets are clamped to\n"
                   "[log start offset, LSO].",
                   "txlog groups reset-offsets --group audit --topic orders --to-earliest\n"
                   "txlog groups reset-offsets --group audit --topic orders:0,1 --to-offset 100 "
                   "--execute\n"
                   "txlog groups reset-offsets --group audit --all-topics --shift-by -10 --execute",
                   cmd_groups_reset)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", action="append", metavar="TOPIC[:P,...]",
                   help="topic, optionally with partitions (repeatable)")
    p.add_argument("--all-topics", action="store_true",
                   help="every partition the group has committed")
    tgt = p.add_mutually_exclusive_group(required=True)
    tgt.add_argument("--to-earliest", action="store_true")
    tgt.add_argument("--to-latest", action="store_true", help="to the LSO")
    tgt.add_argument("--to-offset", type=int, metavar="N")
    tgt.add_argument("--shift-by", type=int, metavar="N")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    mode.add_argument("--dry-run", action="store_true", help="only show them (default)")
