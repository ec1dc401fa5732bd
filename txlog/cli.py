"""``txlog``: the command line, in the style of Kafka's tools.

Readable tables by default and ``--json`` on every command for scripts.  The root comes
from ``--root URL`` or ``TXLOG_ROOT``; fsspec options from ``--storage-options JSON`` or
``TXLOG_STORAGE_OPTIONS``; configuration from the usual precedence (defaults <
``TXLOG_CONF`` < ``TXLOG_*`` < ``-X key=value``).

Exit status: 0 on success, 1 when txlog reports an error (one line on stderr, no
traceback), 2 on a usage error, 3 on an internal error (one line; TXLOG_DEBUG=1 shows
the traceback), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from txlog import admin
from txlog.admin import fmt_duration
from txlog.errors import TxlogError
from txlog.records import TopicPartition
from txlog.tables import bytes_from_json, dumps, fmt_bytes, fmt_time, json_value, render

PROG = "txlog"


class CliError(Exception):
    """A user-facing failure of a command (exit 1), e.g. malformed input lines."""


# -- output helpers -----------------------------------------------------------------------


class Out:
    def __init__(self, as_json: bool, stream: IO[str] | None = None) -> None:
        self.json = as_json
        self.stream = stream or sys.stdout

    def emit(self, obj: Any, text: str | Callable[[], str]) -> None:
        if self.json:
            self.stream.write(json.dumps(json_value(obj), indent=2, ensure_ascii=False) + "\n")
        else:
            s = text() if callable(text) else text
            if s:
                self.stream.write(s.rstrip("\n") + "\n")

    def line(self, s: str) -> None:
        self.stream.write(s + "\n")


def note(msg: str) -> None:
    """A remark for the human (stderr, so stdout stays parseable)."""
    sys.stderr.write(msg + "\n")


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, enabled: bool, width: int = 30) -> None:
        self.enabled = enabled
        self.width = width
        self.t0 = time.monotonic()

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.enabled:
            return
        frac = done / total if total else 1.0
        fill = int(self.width * frac)
        bar = "#" * fill + "-" * (self.width - fill)
        elapsed = time.monotonic() - self.t0
        sys.stderr.write(f"\r[{bar}] {done}/{total} {elapsed:5.1f}s {what[:40]:<40}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


# -- connecting ---------------------------------------------------------------------------


def _connect(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    import txlog

    root = args.root or os.environ.get("TXLOG_ROOT")
    if not root:
        parser.error("no txlog root: pass --root URL or set TXLOG_ROOT")
    raw_opts = args.storage_options or os.environ.get("TXLOG_STORAGE_OPTIONS")
    opts: dict[str, Any] = {}
    if raw_opts:
        try:
            opts = json.loads(raw_opts)
        except ValueError as exc:
            parser.error(f"--storage-options is not valid JSON: {exc}")
        if not isinstance(opts, dict):
            parser.error("--storage-options must be a JSON object")
    config = _kv_pairs(args.property or [], "-X/--property", parser)
    # Only `topics create` makes a root: any other command on a mistyped path would
    # leave an empty directory behind (and report an empty root).
    return txlog.connect(root, opts, create=args.func is cmd_topics_create, **config)


def _kv_pairs(items: Sequence[str], what: str, parser: argparse.ArgumentParser,
              ) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            parser.error(f"{what} takes KEY=VALUE, not {item!r}")
        out[k.strip()] = v.strip()
    return out


def _tp(topic: str, partition: int) -> TopicPartition:
    return TopicPartition(topic, partition)


# -- topics -------------------------------------------------------------------------------


def cmd_topics_create(log: Any, args: argparse.Namespace, out: Out,
                      parser: argparse.ArgumentParser) -> int:
    config = _kv_pairs(args.topic_config or [], "--config", parser)
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


# -- produce / consume --------------------------------------------------------------------


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
                    raise CliError(f"{_one_line(exc)}; the transaction was aborted, "
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
            tp = _tp(args.topic, args.partition)
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


# -- transactions -------------------------------------------------------------------------

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
    rows = admin.describe_producers(log, _tp(args.topic, args.partition))
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
    res = admin.abort_partition_txn(log, _tp(args.topic, args.partition),
                                    producer_id=args.producer_id,
                                    producer_epoch=args.producer_epoch,
                                    start_offset=args.start_offset)
    out.emit(res, lambda: (
        f"{res['topic']}-{res['partition']}: producer {res['producer_id']} epoch "
        f"{res['producer_epoch']} (start offset {res['start_offset']}): {res['action']}. "
        f"LSO {res['lso_before']} -> {res['lso_after']}."))
    return 0


# -- groups -------------------------------------------------------------------------------


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
        return [_tp(name, int(p)) for p in parts.split(",") if p.strip()]
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


# -- maintain / describe ------------------------------------------------------------------


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
    # One line per failure; everything else was done (and is in the report above).
    for failure in report.failures:
        sys.stderr.write(f"{PROG}: error: {failure}\n")
    return 1 if report.failures else 0


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


# -- the parser ---------------------------------------------------------------------------


def _common(suppress: bool) -> argparse.ArgumentParser:
    """Options every command takes (before or after the command name)."""
    p = argparse.ArgumentParser(add_help=False)
    d: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    g = p.add_argument_group("connection and output")
    g.add_argument("--root", metavar="URL", **d,
                   help="txlog root: a path, file://, s3://, gs://, abfs:// or memory:// URL "
                        "(default: $TXLOG_ROOT)")
    g.add_argument("--storage-options", metavar="JSON", **d,
                   help="fsspec storage options as a JSON object, e.g. "
                        "'{\"endpoint_url\": \"http://127.0.0.1:8333\"}' "
                        "(default: $TXLOG_STORAGE_OPTIONS)")
    g.add_argument("-X", "--property", metavar="KEY=VALUE", action="append", **d,
                   help="a configuration key (see conf/txlog.toml), repeatable; overrides "
                        "$TXLOG_CONF and TXLOG_* variables")
    g.add_argument("--json", action="store_true", **d,
                   help="print JSON for scripts instead of tables")
    return p


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)


def _sub(subs: Any, name: str, help_: str, description: str, examples: str,
         func: Callable[..., int] | None = None) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subs.add_parser(
        name, help=help_, description=description,
        epilog="examples:\n" + "\n".join("  " + e for e in examples.strip().splitlines()),
        formatter_class=_Formatter, parents=[_common(suppress=True)])
    if func is not None:
        p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=_Formatter, parents=[_common(suppress=False)],
        description="txlog: Kafka's transactions on object storage, without a broker.\n"
                    "Operate a txlog root: topics, quick produce/consume, transactions, "
                    "consumer groups, maintenance.",
        epilog="examples:\n"
               "  export TXLOG_ROOT=/data/lake        # or s3://bucket/txlog\n"
               "  txlog topics create orders --partitions 3\n"
               "  echo '{\"key\": \"k1\", \"value\": \"hello\"}' | txlog produce orders\n"
               "  txlog consume orders --from-beginning\n"
               "  txlog transactions find-hanging --max-transaction-timeout 15\n"
               "  txlog maintain\n\n"
               "Run `txlog COMMAND --help` for a command's options.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")

    # topics
    topics = _sub(subs, "topics", "create, list, describe and delete topics",
                  "Create, list, describe and delete topics.",
                  "txlog topics create orders --partitions 3\n"
                  "txlog topics list\ntxlog topics describe orders")
    topics.set_defaults(help_parser=topics)
    tsubs = topics.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    p = _sub(tsubs, "create", "create a topic (Kafka-shaped records: key, value, headers)",
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
    p = _sub(tsubs, "list", "list topics", "List the topics of the root.",
             "txlog topics list\ntxlog topics list --internal --json", cmd_topics_list)
    p.add_argument("--internal", action="store_true", help="include __consumer_offsets")
    p = _sub(tsubs, "describe", "partitions, offsets, LSO, batches, open transactions, size",
             "Describe topics: per partition the log start offset, high watermark, last\n"
             "stable offset (LSO) and its lag, batches, open transactions, objects and size.",
             "txlog topics describe orders\ntxlog topics describe --json", cmd_topics_describe)
    p.add_argument("topics", nargs="*", metavar="TOPIC", help="topics (default: all)")
    p.add_argument("--internal", action="store_true",
                   help="with no TOPIC, include internal topics")
    p = _sub(tsubs, "delete", "delete a topic and all its data",
             "Delete a topic: its metadata first, then every object under it.",
             "txlog topics delete scratch", cmd_topics_delete)
    p.add_argument("topic")

    # produce / consume
    p = _sub(subs, "produce", "write JSON lines from stdin to a topic",
             "Write records read from stdin (or --file), one JSON object per line:\n"
             '  {"key": ..., "value": ..., "headers": {...}, "partition": N, "timestamp": MS}\n'
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

    p = _sub(subs, "consume", "read records as JSON lines",
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

    # transactions
    tx = _sub(subs, "transactions", "list, describe, find and abort transactions",
              "Inspect and end transactions, as kafka-transactions.sh does.",
              "txlog transactions list\n"
              "txlog transactions find-hanging --max-transaction-timeout 15\n"
              "txlog transactions abort --transactional-id etl-1")
    tx.set_defaults(help_parser=tx)
    xs = tx.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    p = _sub(xs, "list", "every transactional.id and its state",
             "List every transactional.id in the transaction state log with its producer\n"
             "id, epoch, state and (if open) duration and partitions.",
             "txlog transactions list\ntxlog transactions list --state Ongoing --json",
             cmd_txn_list)
    p.add_argument("--state", action="append", metavar="STATE",
                   help="only these states (Empty, Ongoing, PrepareCommit, PrepareAbort, "
                        "CompleteCommit, CompleteAbort), repeatable")
    p = _sub(xs, "describe", "one transactional.id's state",
             "Describe one transactional.id: its state, producer id and epoch, timeout,\n"
             "open transaction start and partitions, and why its last abort happened.",
             "txlog transactions describe --transactional-id etl-1", cmd_txn_describe)
    p.add_argument("--transactional-id", required=True, metavar="ID")
    p = _sub(xs, "describe-producers", "producers a partition remembers",
             "The producers a partition remembers: epoch, last sequence, last write and the\n"
             "start offset of their open transaction (-1 when none).",
             "txlog transactions describe-producers --topic orders --partition 0",
             cmd_txn_describe_producers)
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=int, required=True)
    p = _sub(xs, "find-hanging", "open transactions that will not end by themselves",
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
                   default=admin.DEFAULT_MAX_TRANSACTION_TIMEOUT_MS, metavar="DURATION",
                   help="longest transaction timeout in use: minutes (default 15) or with a "
                        "unit (500ms, 30s, 2h)")
    p.add_argument("--prepare-grace-ms", type=int, default=admin.DEFAULT_PREPARE_GRACE_MS,
                   metavar="MS", help="report Prepare* entries older than this (default "
                   "30000)")
    p = _sub(xs, "abort", "end a transaction safely",
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

    # groups
    gr = _sub(subs, "groups", "list, describe and reset consumer groups",
              "Consumer groups: committed offsets, lag, and offset resets.",
              "txlog groups list\ntxlog groups describe --group audit\n"
              "txlog groups reset-offsets --group audit --topic orders --to-earliest "
              "--execute")
    gr.set_defaults(help_parser=gr)
    gs = gr.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    p = _sub(gs, "list", "groups with committed offsets",
             "List consumer groups (every group with committed offsets).",
             "txlog groups list", cmd_groups_list)
    p.add_argument("--include-internal", action="store_true",
                   help="include txnAppId groups (txnapp:*)")
    p = _sub(gs, "describe", "offsets and lag of a group",
             "Per partition of a group: its committed offset, the log end offset a\n"
             "read_committed consumer sees (the LSO) and the lag between them.",
             "txlog groups describe --group audit", cmd_groups_describe)
    p.add_argument("--group", required=True)
    p = _sub(gs, "reset-offsets", "move a group's offsets (dry run unless --execute)",
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

    # maintain
    p = _sub(subs, "maintain", "sweep, retention, compaction, purge, checkpoints",
             "Run maintenance: roll forward transactions stuck in Prepare* and abort those\n"
             "past their timeout; then per partition apply retention (retention.ms,\n"
             "retention.bytes), compact committed batches into segments (dropping aborted\n"
             "data and markers), delete objects whose file.delete.delay.ms has passed, and\n"
             "write a checkpoint.  Every step appends to the log, so it is safe to run from\n"
             "cron or a scheduled notebook while producers and readers work.  A progress\n"
             "bar goes to stderr when it is a terminal (or with --progress).",
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

    # describe
    p = _sub(subs, "describe", "the root at a glance; --metrics for counters",
             "Summarise the root: topics and transactional ids by state.  --metrics adds\n"
             "what log.metrics(refresh=True) returns: open transactions, per partition\n"
             "the high watermark, LSO and LSO lag, and this command's object-store\n"
             "requests and bytes by kind.",
             "txlog describe\ntxlog describe --metrics\ntxlog describe --metrics --json",
             cmd_describe)
    p.add_argument("--metrics", action="store_true", help="include metrics")
    p.add_argument("--topic", action="append", help="metrics for this topic only "
                   "(repeatable)")
    return parser


def _version() -> str:
    import txlog

    return str(getattr(txlog, "__version__", "?"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        # `txlog` or `txlog topics` alone: show the relevant help (a usage error).
        getattr(args, "help_parser", parser).print_help()
        return 2
    out = Out(args.json)
    try:
        log = _connect(args, parser)
        return int(func(log, args, out, parser))
    except TxlogError as exc:
        sys.stderr.write(f"{PROG}: error: {_one_line(exc)}\n")
        return 1
    except CliError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 1
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            _quiet_stdout()
            return 0
        sys.stderr.write(f"{PROG}: error: {type(exc).__name__}: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except Exception as exc:  # a bug, or input no check above caught: still one line
        if os.environ.get("TXLOG_DEBUG"):
            raise
        sys.stderr.write(f"{PROG}: internal error: {type(exc).__name__}: {_one_line(exc)} "
                         f"(set TXLOG_DEBUG=1 for the traceback)\n")
        return 3


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _quiet_stdout() -> None:
    # Python flushes stdout at exit; after EPIPE that would print a second error.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
