"""``txlog produce`` and ``txlog consume``: records as JSON lines on stdin and stdout."""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Any

from txlog.cli.output import CliError, Out, note, one_line
from txlog.cli.parsing import subcommand
from txlog.errors import TxlogError
from txlog.records import TopicPartition
from txlog.tables import bytes_from_json, dumps, json_value, render


def _parse_line(line: str, n: int, fmt: str) -> dict[str, Any]:
    if fmt == "text":
        return {"value": line}
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise CliError(f"stdin line {n}: not valid JSON ({exc}); use --format text for "
                       "plain lines") from None
    if not isinstance(obj, dict):
        raise CliError(f"stdin line {n}: expected a JSON object like "
                       '{"key": "k", "value": "v"}')
    unknown = set(obj) - {"key", "value", "headers", "partition", "timestamp"}
    if unknown:
        raise CliError(f"stdin line {n}: unknown fields {sorted(unknown)}; records take key, "
                       "value, headers, partition, timestamp")
    return obj


def _headers(h: Any, n: int) -> list[tuple[str, bytes | None]] | None:
    if h is None:
        return None
    items = h.items() if isinstance(h, dict) else h
    try:
        return [(str(k), bytes_from_json(v, f"line {n} header {k!r}")) for k, v in items]
    except (TypeError, ValueError) as exc:
        raise CliError(f"stdin line {n}: headers must be an object or a list of "
                       f"[key, value] pairs ({exc})") from None


def cmd_produce(log: Any, args: argparse.Namespace, out: Out,
                parser: argparse.ArgumentParser) -> int:
    info = log.topic(args.topic)
    opts: dict[str, Any] = {"linger.ms": 3_600_000}  # batches flush by size or at the end
    if args.transaction_timeout_ms is not None:
        opts["transaction.timeout.ms"] = args.transaction_timeout_ms
    producer = log.producer(transactional_id=args.transactional_id, **opts)
    # Bytes, decoded line by line: a line that is not UTF-8 is an error naming it.
    stdin: IO[Any] = getattr(sys.stdin, "buffer", sys.stdin)  # text when replaced
    stream = open(args.file, "rb") if args.file else stdin  # noqa: SIM115
    futures = []
    try:
        if args.transactional_id:
            producer.init_transactions()
            producer.begin_transaction()
        try:
            for n, raw in enumerate(stream, 1):
                try:
                    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
                    line = text.rstrip("\r\n")
                except UnicodeDecodeError as exc:
                    raise CliError(f"input line {n} is not UTF-8 text ({exc.reason} at byte "
                                   f"{exc.start}); use {{\"base64\": ...}} for binary "
                                   "values") from None
                if not line.strip():
                    continue
                rec = _parse_line(line, n, args.format)
                partition = rec.get("partition", args.partition)
                if partition is not None and (not isinstance(partition, int)
                                              or isinstance(partition, bool)):
                    raise CliError(f"stdin line {n}: partition must be an integer")
                ts = rec.get("timestamp")
                if ts is not None and not isinstance(ts, int):
                    raise CliError(f"stdin line {n}: timestamp must be milliseconds (int)")
                try:
                    key = bytes_from_json(rec.get("key"), f"line {n} key")
                    if info.kafka_shaped:
                        value: Any = bytes_from_json(rec.get("value"), f"line {n} value")
                    else:
                        value = rec.get("value")
                        if not isinstance(value, dict):
                            raise CliError(f"stdin line {n}: topic {args.topic!r} is typed; "
                                           "value must be an object of its columns")
                except ValueError as exc:
                    raise CliError(f"stdin line {n}: {exc}") from None
                futures.append(producer.send(
                    args.topic, value, key, partition=partition,
                    headers=_headers(rec.get("headers"), n), timestamp_ms=ts))
            producer.flush()
            if args.transactional_id:
                producer.commit_transaction()
        except BaseException as exc:
            if args.transactional_id and producer.state.name in ("IN_TRANSACTION",
                                                                 "ABORTABLE_ERROR"):
                try:
                    producer.abort_transaction()
                except TxlogError:
                    raise exc from None
                if isinstance(exc, (TxlogError, CliError)):
                    # One error line that also says what became of the transaction.
                    raise CliError(f"{one_line(exc)}; the transaction was aborted, "
                                   "nothing was committed") from None
                note("txlog: the transaction was aborted; nothing was committed")
            raise
    finally:
        if stream is not stdin:
            stream.close()
        producer.close()
    per: dict[int, list[int]] = {}
    for f in futures:
        m = f.get()
        per.setdefault(m.partition, []).append(m.offset)
    rows = [{"partition": p, "records": len(o), "first_offset": min(o),
             "last_offset": max(o)} for p, o in sorted(per.items())]
    summary = {"topic": args.topic, "records": len(futures),
               "transactional_id": args.transactional_id, "partitions": rows}
    out.emit(summary, lambda: (
        f"Produced {len(futures)} record(s) to {args.topic}"
        + (f" in one transaction ({args.transactional_id})" if args.transactional_id else "")
        + (".\n" + render(rows, [("Partition", "partition"), ("Records", "records"),
                                 ("FirstOffset", "first_offset"),
                                 ("LastOffset", "last_offset")]) if rows else ".")))
    return 0


def _record_json(r: Any, kafka_shaped: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"topic": r.topic, "partition": r.partition, "offset": r.offset,
                         "timestamp": r.timestamp, "timestampType": r.timestamp_type}
    if kafka_shaped:
        d["key"] = json_value(r.key)
        d["value"] = json_value(r.value)
        d["headers"] = [[k, json_value(v)] for k, v in r.headers]
    else:
        d["value"] = json_value(r.value)
    return d


def cmd_consume(log: Any, args: argparse.Namespace, out: Out,
                parser: argparse.ArgumentParser) -> int:
    info = log.topic(args.topic)
    if args.offset is not None and args.partition is None:
        parser.error("--offset needs --partition")
    consumer = log.consumer(group_id=args.group, isolation_level=args.isolation_level,
                            auto_offset_reset="earliest" if args.from_beginning else "latest")
    n = 0
    try:
        if args.partition is not None:
            tp = TopicPartition(args.topic, args.partition)
            consumer.assign([tp])
            if args.offset is not None:
                consumer.seek(tp, args.offset)
        else:
            consumer.subscribe([args.topic])
        limit = args.max_records
        while limit is None or n < limit:
            want = 500 if limit is None else min(500, limit - n)
            recs = consumer.poll(max_records=want, timeout_ms=args.timeout_ms)
            if not recs:
                break
            for r in recs:
                out.stream.write(dumps(_record_json(r, info.kafka_shaped)) + "\n")
            n += len(recs)
            out.stream.flush()
        if args.group:
            consumer.commit()
    finally:
        consumer.close()
    if not args.quiet:
        note(f"Processed a total of {n} messages")
    return 0


def add_commands(subs: Any) -> None:
    p = subcommand(subs, "produce", "write JSON lines from stdin to a topic",
                   "Write records read from stdin (or --file), one JSON object per line:\n"
                   '  {"key": ..., "value": ..., "headers": {...}, "partition": N, '
                   '"timestamp": MS}\n'
                   'Strings are stored as UTF-8; {"base64": "..."} is binary; null is null; any\n'
                   "other JSON value is stored as its JSON text.  With --transactional-id all\n"
                   "lines are written in one transaction, committed at the end of input (and\n"
                   "aborted on any error).  Without it the producer is idempotent.",
                   "echo '{\"key\": \"k1\", \"value\": \"hello\"}' | txlog produce orders\n"
                   "txlog produce orders --transactional-id loader-1 < records.jsonl\n"
                   "printf 'a\\nb\\n' | txlog produce orders --format text --partition 0",
                   cmd_produce)
    p.add_argument("topic")
    p.add_argument("--transactional-id", metavar="ID",
                   help="write everything in one transaction of this transactional.id")
    p.add_argument("--transaction-timeout-ms", type=int, metavar="MS",
                   help="transaction.timeout.ms for this producer")
    p.add_argument("--partition", type=int, help="default partition (else by key, or "
                   "round-robin)")
    p.add_argument("--format", choices=["json", "text"], default="json",
                   help="json: one record object per line (default); text: each line is a "
                        "value")
    p.add_argument("--file", metavar="PATH", help="read from PATH instead of stdin")

    p = subcommand(subs, "consume", "read records as JSON lines",
                   "Read records and print one JSON object per line (topic, partition, offset,\n"
                   "timestamp, key, value, headers).  Values that are not UTF-8 print as\n"
                   '{"base64": "..."}.  read_committed by default: aborted and open transactions\n'
                   "are never shown.  Stops when caught up (or after --timeout-ms without new\n"
                   "records).  Without --from-beginning and without a committed offset it starts\n"
                   "at the end, as Kafka's console consumer does.  With --group the group's\n"
                   "committed offsets are used and the new positions committed at the end.",
                   "txlog consume orders --from-beginning\n"
                   "txlog consume orders --from-beginning --max-records 10\n"
                   "txlog consume orders --group audit --from-beginning\n"
                   "txlog consume orders --partition 0 --offset 42 --isolation-level "
                   "read_uncommitted\n"
                   "txlog consume orders --timeout-ms 10000    # wait up to 10 s for new records",
                   cmd_consume)
    p.add_argument("topic")
    p.add_argument("--from-beginning", action="store_true",
                   help="start at the log start offset when there is no committed offset")
    p.add_argument("--max-records", type=int, metavar="N", help="stop after N records")
    p.add_argument("--group", metavar="GROUP", help="consumer group: start from its "
                   "committed offsets and commit the new positions")
    p.add_argument("--isolation-level", choices=["read_committed", "read_uncommitted"],
                   default="read_committed")
    p.add_argument("--partition", type=int, help="read only this partition")
    p.add_argument("--offset", type=int, help="with --partition: start at this offset")
    p.add_argument("--timeout-ms", type=int, default=0, metavar="MS",
                   help="wait this long for new records before stopping (default 0)")
    p.add_argument("--quiet", action="store_true", help="no summary line on stderr")
