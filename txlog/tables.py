"""Readable output for the CLI: aligned tables, times, sizes, and record values that are
UTF-8 text when they decode, else base64 with a marker."""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: The marker of a binary value in JSON output (and accepted by ``txlog produce``).
BASE64_KEY = "base64"

Column = tuple[str, "str | Callable[[Mapping[str, Any]], Any]"]


def cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        return ",".join(cell(x) for x in v) if v else "-"
    if isinstance(v, dict):
        return ",".join(f"{k}={cell(x)}" for k, x in v.items()) if v else "-"
    if isinstance(v, bytes):
        return text_or_marker(v)
    return str(v)


def render(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """An aligned table: ``columns`` are (header, key or function of the row).  Numbers
    are right-aligned, everything else left-aligned."""
    heads = [h for h, _ in columns]
    body: list[list[str]] = []
    numeric = [True] * len(columns)
    seen_number = [False] * len(columns)
    for r in rows:
        line = []
        for n, (_, get) in enumerate(columns):
            v = get(r) if callable(get) else r.get(get)
            if isinstance(v, int) and not isinstance(v, bool):
                seen_number[n] = True
            elif v is not None:
                numeric[n] = False
            line.append(cell(v))
        body.append(line)
    numeric = [a and b for a, b in zip(numeric, seen_number, strict=True)]
    widths = [max([len(h)] + [len(line[n]) for line in body]) for n, h in enumerate(heads)]

    def fmt(values: list[str], header: bool = False) -> str:
        parts = []
        for n, v in enumerate(values):
            right = numeric[n] and not header and bool(body)
            parts.append(v.rjust(widths[n]) if right else v.ljust(widths[n]))
        return "  ".join(parts).rstrip()

    lines = [fmt(heads, header=True)] + [fmt(line) for line in body]
    return "\n".join(lines)


def fmt_time(ms: int | None) -> str | None:
    """ISO-8601 UTC with milliseconds, or None."""
    if not ms:
        return None
    t = _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def fmt_bytes(n: int | None) -> str | None:
    if n is None:
        return None
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def text_or_marker(b: bytes) -> str:
    """For tables: the text if ``b`` is UTF-8, else ``base64:<...>``."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(b).decode()


def json_value(v: Any) -> Any:
    """A record field as JSON: bytes become text when they are UTF-8, else
    ``{"base64": "..."}``; times become ISO strings; containers are converted deeply."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return {BASE64_KEY: base64.b64encode(b).decode()}
    if isinstance(v, Mapping):
        return {str(k): json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return str(v)
    return str(v)


def bytes_from_json(v: Any, what: str) -> bytes | None:
    """The inverse of :func:`json_value` for keys, values and header values: a string is
    UTF-8, ``{"base64": "..."}`` is binary, null is null, any other JSON value is stored
    as its JSON text."""
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, dict) and set(v) == {BASE64_KEY}:
        try:
            return base64.b64decode(v[BASE64_KEY], validate=True)
        except (ValueError, TypeError):
            raise ValueError(f"{what}: invalid base64") from None
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def dumps(obj: Any) -> str:
    return json.dumps(json_value(obj), ensure_ascii=False, separators=(",", ":"))
