"""Argument parsing shared by the commands: the connection and output options every
command takes, the help layout, and KEY=VALUE lists."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any


def kv_pairs(items: Sequence[str], what: str, parser: argparse.ArgumentParser,
             ) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            parser.error(f"{what} takes KEY=VALUE, not {item!r}")
        out[k.strip()] = v.strip()
    return out


def common_options(suppress: bool) -> argparse.ArgumentParser:
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


class Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)


def subcommand(subs: Any, name: str, help_: str, description: str, examples: str,
               func: Callable[..., int] | None = None) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subs.add_parser(
        name, help=help_, description=description,
        epilog="examples:\n" + "\n".join("  " + e for e in examples.strip().splitlines()),
        formatter_class=Formatter, parents=[common_options(suppress=True)])
    if func is not None:
        p.set_defaults(func=func)
    return p


def command_group(subs: Any, name: str, help_: str, description: str,
                  examples: str) -> Any:
    """A command of subcommands (``txlog topics ...``), whose help is shown when none is
    given; returns the subparsers to add its subcommands to."""
    p = subcommand(subs, name, help_, description, examples)
    p.set_defaults(help_parser=p)
    return p.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
