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
from collections.abc import Sequence
from typing import Any

from txlog.cli import groups, maintenance, records, topics, transactions
from txlog.cli.output import PROG, CliError, Out, one_line, quiet_stdout
from txlog.cli.parsing import Formatter, common_options, kv_pairs
from txlog.cli.transactions import parse_duration_ms
from txlog.errors import TxlogError

__all__ = ["build_parser", "main", "parse_duration_ms"]


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
    config = kv_pairs(args.property or [], "-X/--property", parser)
    # Only `topics create` makes a root: any other command on a mistyped path would
    # leave an empty directory behind (and report an empty root).
    return txlog.connect(root, opts, create=args.func is topics.cmd_topics_create, **config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=Formatter, parents=[common_options(suppress=False)],
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
    for group in (topics, records, transactions, groups, maintenance):
        group.add_commands(subs)
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
        sys.stderr.write(f"{PROG}: error: {one_line(exc)}\n")
        return 1
    except CliError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 1
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            quiet_stdout()
            return 0
        sys.stderr.write(f"{PROG}: error: {type(exc).__name__}: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except Exception as exc:  # a bug, or input no check above caught: still one line
        if os.environ.get("TXLOG_DEBUG"):
            raise
        sys.stderr.write(f"{PROG}: internal error: {type(exc).__name__}: {one_line(exc)} "
                         f"(set TXLOG_DEBUG=1 for the traceback)\n")
        return 3
