"""``txlog topics``: create, list, describe and delete topics."""

from __future__ import annotations

import argparse
from typing import Any

from txlog import admin
from txlog.cli.output import Out
from txlog.cli.parsing import command_group, kv_pairs, subcommand
from txlog.tables import fmt_bytes, fmt_time, render


def cmd_topics_create(log: Any, args: argparse.Namespace, out: Out,
                      parser: argparse.ArgumentParser) -> int:
    config = kv_pairs(args.topic_config or [], "--config", parser)
    info = log.create_topic(args.topic, partitions=args.partitions, config=config or None)
    out.emit({"name": info.name, "partitions": info.partitions, "config": info.config,
              "id": info.topic_id},
             f"Created topic {info.name} with {info.partitions} partition(s).")
    return 0


def cmd_topics_list(log: Any, args: argparse.Namespace, out: Out,
                    parser: argparse.ArgumentParser) -> int:
    names = log.list_topics(internal=args.internal)
    rows = []
    for n in names:
        info = log.topic(n)
        rows.append({"name": n, "partitions": info.partitions,
                     "shape": "kafka" if info.kafka_shaped else "typed",
                     "created": fmt_time(info.created_ms)})
    out.emit(rows, lambda: render(rows, [("Topic", "name"), ("Partitions", "partitions"),
                                         ("Shape", "shape"), ("Created", "created")])
             if rows else "(no topics)")
    return 0


def _partition_columns() -> list[tuple[str, Any]]:
    return [("Partition", "partition"), ("LogStart", "log_start_offset"),
            ("HighWatermark", "high_watermark"), ("LSO", "last_stable_offset"),
            ("LsoLag", "lso_lag"), ("Batches", "batches"), ("OpenTxns", "open_transactions"),
            ("Objects", "objects"), ("Size", lambda r: fmt_bytes(r["size_bytes"])),
            ("PendingDeletes", "pending_deletes"),
            ("LastAppend", lambda r: fmt_time(r["last_append_ms"]))]


def cmd_topics_describe(log: Any, args: argparse.Namespace, out: Out,
                        parser: argparse.ArgumentParser) -> int:
    names = args.topics or log.list_topics(internal=args.internal)
    result = []
    for name in names:
        info = log.topic(name)
        parts = admin.describe_partitions(log, name)
        result.append({"name": name, "id": info.topic_id, "partitions": info.partitions,
                       "shape": "kafka" if info.kafka_shaped else "typed",
                       "schema": None if info.kafka_shaped else str(info.schema),
                       "config": info.config, "created_ms": info.created_ms,
                       "partition_info": parts})

    def text() -> str:
        blocks = []
        for t in result:
            cfg = ",".join(f"{k}={v}" for k, v in sorted(t["config"].items()))
            total = sum(p["size_bytes"] for p in t["partition_info"])
            head = (f"Topic: {t['name']}\tPartitions: {t['partitions']}\tShape: {t['shape']}"
                    f"\tSize: {fmt_bytes(total)}\tCreated: {fmt_time(t['created_ms'])}\n"
                    f"Configs: {cfg}")
            if t["schema"]:
                head += "\nSchema: " + t["schema"].replace("\n", "; ")
            blocks.append(head + "\n" + render(t["partition_info"], _partition_columns()))
        return "\n\n".join(blocks) if blocks else "(no topics)"

    out.emit(result, text)
    return 0


def cmd_topics_delete(log: Any, args: argparse.Namespace, out: Out,
                      parser: argparse.ArgumentParser) -> int:
    log.delete_topic(args.topic)
    out.emit({"deleted": args.topic}, f"Deleted topic {args.topic}.")
    return 0


def add_commands(subs: Any) -> None:
    tsubs = command_group(subs, "topics", "create, list, describe and delete topics",
                          "Create, list, describe and delete topics.",
                          "txlog topics create orders --partitions 3\n"
                          "txlog topics list\ntxlog topics describe orders")
    p = subcommand(tsubs, "create", "create a topic (Kafka-shaped records: key, value, headers)",
                   "Create a topic of Kafka-shaped records (key, value, headers, timestamp).\n"
                   "Topic configuration keys: retention.ms, retention.bytes, segment.bytes,\n"
                   "file.delete.delay.ms, checkpoint.interval.batches.",
                   "txlog topics create orders --partitions 3\n"
                   "txlog topics create clicks --config retention.ms=604800000 "
                   "--config retention.bytes=1073741824", cmd_topics_create)
    p.add_argument("topic", help="topic name (letters, digits, '.', '_', '-')")
    p.add_argument("--partitions", type=int, default=None,
                   help="number of partitions (default: num.partitions, 1)")
    p.add_argument("--config", dest="topic_config", metavar="KEY=VALUE", action="append",
                   help="topic configuration, repeatable")
    p = subcommand(tsubs, "list", "list topics", "List the topics of the root.",
                   "txlog topics list\ntxlog topics list --internal --json", cmd_topics_list)
    p.add_argument("--internal", action="store_true", help="include __consumer_offsets")
    p = subcommand(tsubs, "describe", "partitions, offsets, LSO, batches, open transactions, size",
                   "Describe topics: per partition the log start offset, high watermark, last\n"
                   "stable offset (LSO) and its lag, batches, open transactions, objects and size.",
                   "txlog topics describe orders\ntxlog topics describe --json",
                   cmd_topics_describe)
    p.add_argument("topics", nargs="*", metavar="TOPIC", help="topics (default: all)")
    p.add_argument("--internal", action="store_true",
                   help="with no TOPIC, include internal topics")
    p = subcommand(tsubs, "delete", "delete a topic and all its data",
                   "Delete a topic: its metadata first, then every object under it.",
                   "txlog topics delete scratch", cmd_topics_delete)
    p.add_argument("topic")
