"""What a round reads before committing through Delta's transaction API: the checksum's
app versions are used only when well-formed, and only a frame with exactly the table's
columns skips Delta's schema checks of the DataFrame writer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spark_ext.delta_txn import checksum_versions, same_columns


def test_checksum_versions_by_app() -> None:
    assert checksum_versions([("a", 3), ("b", 0)]) == {"a": 3, "b": 0}
    assert checksum_versions([]) == {}


@pytest.mark.parametrize("entries", [[("a", 1), ("a", 2)], [("a", -1)], [("a", "1")],
                                     [("a", True)], [(None, 1)], [("a", 1.0)]])
def test_a_malformed_checksum_is_not_used(entries: list[tuple[Any, Any]]) -> None:
    assert checksum_versions(entries) is None


def _schema(*fields: tuple[str, Any, bool]) -> str:
    return json.dumps({"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": null, "metadata": {}} for n, t, null in fields]})


def test_same_columns_ignores_nullability_only() -> None:
    table = _schema(("id", "long", True), ("tags", {"type": "array", "elementType": "string",
                                                    "containsNull": True}, True))
    frame = _schema(("id", "long", False), ("tags", {"type": "array", "elementType": "string",
                                                     "containsNull": False}, False))
    assert same_columns(table, frame)
    assert not same_columns(table, _schema(("id", "int", True), ("tags", "string", True)))
    assert not same_columns(table, _schema(("id", "long", True)))
    assert not same_columns(table, _schema(("ID", "long", True), ("tags", "string", True)))
    reordered = _schema(("tags", {"type": "array", "elementType": "string",
                                  "containsNull": True}, True), ("id", "long", True))
    assert not same_columns(table, reordered)
