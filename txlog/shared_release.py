"""Pure decisions about deleting a shared batch object (one object holding the batches
of several partitions of a topic).

No partition deletes a shared object itself: each partition that is done with it
releases it (an empty marker named for the partition), and the object is deleted once
the releases cover every partition its footer names.  Whether nobody references the
object *now* decides nothing: a COMMIT marker carrying a part of it may be written by a
roll-forward long after the other partitions dropped it.  The footer is the object's
own, checksummed, list of the partitions it holds, so it is validated before any
decision is taken from it.  The store I/O is in :mod:`txlog.shared_deletion`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from txlog import layout
from txlog.errors import CorruptObjectError
from txlog.shared_objects import footer_runs


@dataclass(frozen=True)
class SharedFooter:
    """A validated ``txlog.shared`` footer: per partition, its batch's first row and
    row count, in ascending partition order."""

    parts: tuple[tuple[int, int, int], ...]

    @property
    def partitions(self) -> frozenset[int]:
        return frozenset(p for p, _, _ in self.parts)


def parse_footer(value: bytes | str | None, *, where: str, partitions: int,
                 object_rows: int, row_group_starts: Sequence[int] | None = None,
                 ) -> SharedFooter:
    """The footer ``value`` of shared object ``where`` if it is valid for a topic of
    ``partitions`` partitions and an object of ``object_rows`` rows (the rules are
    :func:`txlog.shared_objects.footer_runs`'); else CorruptObjectError."""
    try:
        return SharedFooter(tuple(footer_runs(value, partitions=partitions,
                                              object_rows=object_rows,
                                              row_group_starts=row_group_starts)))
    except ValueError as exc:
        raise _bad(where, str(exc)) from None


def released_partitions(names: Iterable[str]) -> frozenset[int]:
    """The partitions whose release markers are ``names`` (a marker's name is its
    partition in decimal; anything else is not a release and is ignored)."""
    out = set()
    for n in names:
        if n.isascii() and n.isdigit() and str(int(n)) == n:
            out.add(int(n))
    return frozenset(out)


def releases_complete(footer: SharedFooter, released: Iterable[int]) -> bool:
    """Whether every partition the object holds has released it: then, and only then,
    it may be deleted."""
    return footer.partitions <= set(released)


def may_be_complete(released: Iterable[int], holders: Iterable[int]) -> bool:
    """Whether releases ``released`` may cover an object that partitions ``holders``
    still name in their state: not while one of them has not released it (it releases
    and collects the object itself once it drops it), so its footer need not be read."""
    done = set(released)
    return all(p in done for p in holders)


def object_name(topic: str, key: str) -> str | None:
    """The name of ``topic``'s shared object ``key`` (its release markers' folder), or
    None when ``key`` is no shared object of ``topic``."""
    prefix = layout.shared_prefix(topic)
    if not key.startswith(prefix) or not layout.is_shared(key):
        return None
    return key[len(prefix):]


def _bad(where: str, what: str) -> CorruptObjectError:
    return CorruptObjectError(
        f"shared batch object {where} {what}; it is not deleted (the partitions it holds "
        "are unknown). Check the object, and delete it by hand once no partition's log "
        "names it")
