"""The pure decisions of deleting shared batch objects (txlog.shared_release)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from txlog.errors import CorruptObjectError, TxlogError
from txlog.shared_release import (
    SharedFooter,
    may_be_complete,
    object_name,
    parse_footer,
    released_partitions,
    releases_complete,
)


def footer(parts: Any, v: Any = 1) -> bytes:
    return json.dumps({"v": v, "partitions": parts}).encode()


def test_a_valid_footer_names_its_partitions() -> None:
    f = parse_footer(footer([[0, 0, 3], [2, 3, 5]]), where="k", partitions=4, object_rows=8,
                     row_group_starts=[0, 3, 6])
    assert f.parts == ((0, 0, 3), (2, 3, 5))
    assert f.partitions == {0, 2}


@pytest.mark.parametrize(("value", "why"), [
    (None, "no txlog.shared"),
    (b"{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (footer([[0, 0, 8]], v=2), "version 2"),
    (footer([[0, 0, 8]], v="1"), "version '1'"),
    (footer([[0, 0, 8]], v=True), "version True"),
    (json.dumps({"v": 1}).encode(), "without a list"),
    (footer([]), "without a list"),
    (footer([[0, 0]]), "not [partition, row, count]"),
    (footer([[0, 0, 8.0]]), "not [partition, row, count]"),
    (footer([[True, 0, 8]]), "not [partition, row, count]"),
    (footer([[4, 0, 8]]), "partition 4"),
    (footer([[-1, 0, 8]]), "partition -1"),
    (footer([[1, 0, 4], [1, 4, 4]]), "distinct and ascending"),
    (footer([[2, 0, 4], [1, 4, 4]]), "distinct and ascending"),
    (footer([[0, 0, 4], [1, 5, 3]]), "end at row 4"),
    (footer([[0, 1, 7]]), "end at row 0"),
    (footer([[0, 0, 0], [1, 0, 8]]), "end at row 0"),
    (footer([[0, 0, 4], [1, 4, 3]]), "names 7 rows in its footer but holds 8"),
    (footer([[0, 0, 4], [1, 4, 5]]), "names 9 rows"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # past the parser's nesting depth
])
def test_an_invalid_footer_is_refused(value: bytes | None, why: str) -> None:
    with pytest.raises(CorruptObjectError, match="not deleted") as err:
        parse_footer(value, where="topics/t/_shared/x.parquet", partitions=4, object_rows=8)
    assert why in str(err.value)
    assert isinstance(err.value, TxlogError)


def test_a_batch_must_start_a_row_group() -> None:
    value = footer([[0, 0, 4], [1, 4, 4]])
    parse_footer(value, where="k", partitions=2, object_rows=8, row_group_starts=[0, 2, 4, 6])
    with pytest.raises(CorruptObjectError, match=r"row 4.*starts no row group"):
        parse_footer(value, where="k", partitions=2, object_rows=8, row_group_starts=[0, 3])


def test_release_markers_name_partitions_in_decimal() -> None:
    assert released_partitions(["0", "3", "12"]) == {0, 3, 12}
    # Not a release: leading zeros, signs, other names (a stray temporary file).
    assert released_partitions(["01", "-1", "+2", "x", "", "1.tmp", "\u0663"]) == set()


def test_releases_complete_only_when_they_cover_every_partition_of_the_footer() -> None:
    f = SharedFooter(((0, 0, 1), (2, 1, 1), (5, 2, 1)))
    assert not releases_complete(f, [])
    assert not releases_complete(f, [0, 2])
    assert not releases_complete(f, [0, 2, 3, 4])  # releases of others do not count
    assert releases_complete(f, [0, 2, 5])
    assert releases_complete(f, [0, 1, 2, 5])


def test_object_name_is_a_direct_child_of_the_shared_folder() -> None:
    pre = "topics/t/_shared/"
    assert object_name("t", pre + "ab.crc32-00000000.parquet") == "ab.crc32-00000000.parquet"
    assert object_name("u", pre + "ab.crc32-00000000.parquet") is None  # another topic's
    assert object_name("t", "topics/t/0/data/x.parquet") is None
    assert object_name("t", pre + "_released/ab.parquet/0") is None
    assert object_name("t", pre + "a/b.parquet") is None
    assert object_name("t", pre + "ab.json") is None
    assert object_name("t", pre) is None


def test_an_object_a_partition_holds_unreleased_cannot_be_complete() -> None:
    assert may_be_complete([0, 1], [])
    assert may_be_complete([0, 1], [1])
    assert not may_be_complete([0], [0, 1])
    assert not may_be_complete([], [2])
