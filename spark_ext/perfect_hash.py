"""A perfect hash of strings that Spark SQL can evaluate with its built-in ``hash()``.

The native scan must map every row's ``_metadata.file_name`` to its planned slice (base
offset, partition, ...).  A broadcast join does that at about 120 ns a row and stays in
the plan even when no column it adds is read.  Instead the driver builds a perfect hash
of the planned names ("hash and displace", as in CHD, without the compression):

* ``h = hash(name)``: Spark's Murmur3 (seed 42), replicated here bit for bit;
* ``bucket = pmod(h, buckets)``: each bucket has a displacement ``d`` found on the driver;
* ``slot = pmod(hash(h, d), slots)``: distinct for every planned name.

The per-slot values become SQL array literals and a row's values are ``get`` of its
slot: two hashes and a few array reads per row, and a plain projection, so Spark
prunes it with the columns it feeds.  Pure logic, no Spark needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

_M32 = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
SEED = 42  # Spark's hash() seed

#: Keys per slot, and per bucket on average.  Chosen by measurement: denser tables took
#: several times as long to place the names (docs/benchmarks.md).
LOAD_FACTOR = 0.7
BUCKET_SIZE = 2
#: Displacements tried per bucket before the whole table is rebuilt larger.
MAX_DISPLACEMENT = 1 << 16


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k: int) -> int:
    return (_rotl((k * _C1) & _M32, 15) * _C2) & _M32


def _mix_h1(h: int, k: int) -> int:
    return (_rotl(h ^ k, 13) * 5 + 0xE6546B64) & _M32


def _fmix(h: int, length: int) -> int:
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def spark_hash_bytes(data: bytes, seed: int = SEED) -> int:
    """Spark's ``hash()`` of a string with these UTF-8 bytes (Murmur3_x86_32 as Spark has
    it: the trailing bytes are mixed one by one, sign-extended, unlike reference Murmur3)."""
    h = seed & _M32
    n = len(data)
    aligned = n - n % 4
    for i in range(0, aligned, 4):
        h = _mix_h1(h, _mix_k1(int.from_bytes(data[i:i + 4], "little")))
    for b in data[aligned:]:
        h = _mix_h1(h, _mix_k1((b - 256 if b > 127 else b) & _M32))
    return _signed(_fmix(h, n))


def spark_hash_int(value: int, seed: int) -> int:
    """Spark's Murmur3 of one INT value with ``seed``."""
    return _signed(_fmix(_mix_h1(seed & _M32, _mix_k1(value & _M32)), 4))


def spark_hash_int_pair(a: int, b: int) -> int:
    """Spark's ``hash(a, b)`` of two INT values."""
    return spark_hash_int(b, spark_hash_int(a, SEED))


@dataclass(frozen=True)
class PerfectHash:
    """``slot_of(name) = pmod(hash(h, displacements[pmod(h, buckets)]), slots)`` with
    ``h = hash(name)``; ``slot[i]`` is the slot of ``keys[i]`` (all distinct)."""

    buckets: int
    slots: int
    displacements: tuple[int, ...]
    slot: tuple[int, ...]

    def sql_slot(self, name_hash_sql: str) -> str:
        """Spark SQL for the slot of a row whose ``hash(name)`` is given.  ``get`` (0-based,
        no ANSI bounds error to raise) reads a literal array in half ``element_at``'s time."""
        disp = sql_array(self.displacements, "int")
        return (f"pmod(hash({name_hash_sql}, get({disp}, pmod({name_hash_sql}, "
                f"{self.buckets}))), {self.slots})")


def sql_array(values: Sequence[int], element_type: str = "bigint") -> str:
    """Spark SQL for a constant array of integers.  Spark folds it into a literal once;
    written as ``array(1, 2, ...)`` its parser takes ten times as long as for a split
    string."""
    return f"cast(split('{','.join(str(int(v)) for v in values)}', ',') AS array<{element_type}>)"


def slot_of(h: int, buckets: int, slots: int, displacements: Sequence[int]) -> int:
    """The 0-based slot of a key whose ``hash(name)`` is ``h``."""
    return spark_hash_int_pair(h, displacements[h % buckets]) % slots


def build(keys: Sequence[str]) -> PerfectHash | None:
    """A perfect hash of the distinct ``keys`` (as Spark sees them: UTF-8), or None when
    two keys share a 32-bit ``hash()`` (the slot depends on nothing else; about 1% of
    plans with 10,000 files): the caller then needs another way to tell them apart."""
    if len(set(keys)) != len(keys):
        raise ValueError("perfect hash keys must be distinct")
    hashes = [spark_hash_bytes(k.encode()) for k in keys]
    if len(set(hashes)) != len(hashes):
        return None
    n = max(1, len(keys))
    slots = math.ceil(n / LOAD_FACTOR)
    while True:
        table = _try_build(hashes, max(1, math.ceil(n / BUCKET_SIZE)), slots)
        if table is not None:
            return table
        slots = math.ceil(slots * 1.25)  # a bucket found no displacement: more room


def _try_build(hashes: list[int], buckets: int, slots: int) -> PerfectHash | None:
    members: list[list[int]] = [[] for _ in range(buckets)]
    for i, h in enumerate(hashes):
        members[h % buckets].append(i)
    used = [False] * slots
    disp = [0] * buckets
    slot = [0] * len(hashes)
    # Biggest buckets first, while most slots are free.
    for b in sorted(range(buckets), key=lambda b: -len(members[b])):
        idx = members[b]
        if not idx:
            continue
        for d in range(MAX_DISPLACEMENT):
            cand = [spark_hash_int_pair(hashes[i], d) % slots for i in idx]
            if len(set(cand)) == len(cand) and not any(used[c] for c in cand):
                break
        else:
            return None
        disp[b] = d
        for i, c in zip(idx, cand, strict=True):
            used[c] = True
            slot[i] = c
    return PerfectHash(buckets, slots, tuple(disp), tuple(slot))
