"""The perfect hash the native scan evaluates with Spark's ``hash()`` (pure logic; the
Spark test in test_spark_read.py checks the hash against Spark itself)."""

from __future__ import annotations

import random

import pytest

from spark_ext import perfect_hash as ph


def test_hash_matches_values_spark_computed() -> None:
    # Values from Spark 4 (SELECT hash(s)); the tail bytes of 'abcde' and the non-ASCII
    # bytes are where Spark's Murmur3 differs from the reference one.
    known = {"": 142593372, "a": 1485273170, "abcde": 814637928, "é€x": 578460544}
    for s, h in known.items():
        assert ph.spark_hash_bytes(s.encode()) == h, s


@pytest.mark.parametrize("n", [1, 2, 7, 100, 5000])
def test_every_key_gets_its_own_slot(n: int) -> None:
    seed = 1000 + n
    print(f"seed={seed}")
    rng = random.Random(seed)
    keys = sorted({f"{rng.getrandbits(128):032x}.parquet" for _ in range(n)})
    table = ph.build(keys)
    assert table is not None
    assert len(set(table.slot)) == len(keys)
    assert all(0 <= s < table.slots for s in table.slot)
    assert table.slots <= len(keys) / ph.LOAD_FACTOR + 1  # compact: the arrays stay small
    for k, s in zip(keys, table.slot, strict=True):
        h = ph.spark_hash_bytes(k.encode())
        assert ph.slot_of(h, table.buckets, table.slots, table.displacements) == s


def test_keys_sharing_a_hash_get_no_table() -> None:
    # Find two strings with equal 32-bit hashes by brute force over a fixed space.
    seen: dict[int, str] = {}
    pair = None
    for i in range(200_000):
        s = f"f{i}"
        h = ph.spark_hash_bytes(s.encode())
        if h in seen:
            pair = [seen[h], s]
            break
        seen[h] = s
    assert pair is not None
    assert ph.build(pair) is None
    with pytest.raises(ValueError):
        ph.build(["a", "a"])


def test_sql_names_the_slot_expression() -> None:
    table = ph.build(["x.parquet", "y.parquet"])
    assert table is not None
    sql = table.sql_slot("_h")
    assert sql.startswith("pmod(hash(_h, get(cast(split(") and sql.endswith(f", {table.slots})")
    assert f"pmod(_h, {table.buckets})" in sql
