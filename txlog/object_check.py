"""Checking the stored batch objects against the log entries that name them (``txlog
check``): each object's bytes against the CRC-32 its key names, its Parquet footer, its
rows against every batch that reads them, and a shared object's ``txlog.shared`` footer
against the partitions that name it.

:func:`judge_object` and :func:`batch_problems` are pure; :func:`check_objects` reads the
logs and the objects (each object once, however many partitions name it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from txlog import checksums, layout
from txlog.batch_codec import open_parquet
from txlog.errors import ObjectNotFoundError, TxlogError
from txlog.records import TopicPartition
from txlog.shared_objects import footer_partitions

if TYPE_CHECKING:
    from txlog.log import Log


@dataclass(frozen=True, slots=True)
class Verdict:
    """What an object's bytes say: its size and rows, a shared object's runs
    ``(partition, row, count)``, or why it cannot be read (``error``)."""

    size: int = 0
    rows: int = 0
    runs: tuple[tuple[int, int, int], ...] | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Problem:
    topic: str
    partition: int
    key: str
    what: str

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "key": self.key,
                "problem": self.what}


@dataclass
class CheckReport:
    partitions: int = 0
    objects: int = 0
    shared_objects: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"partitions": self.partitions, "objects": self.objects,
                "shared_objects": self.shared_objects, "bytes": self.bytes,
                "problems": [p.to_json() for p in self.problems]}


def judge_object(key: str, raw: bytes) -> Verdict:
    """Check an object's bytes: the CRC-32 its key names, a Parquet footer within the
    decoding limits, and, for a shared object, its ``txlog.shared`` footer."""
    try:
        checksums.verify(key, raw)
        pf, _, _ = open_parquet(raw, key)
        runs = tuple(footer_partitions(pf.metadata, key)) if layout.is_shared(key) else None
        return Verdict(len(raw), pf.metadata.num_rows, runs)
    except TxlogError as exc:
        return Verdict(len(raw), error=str(exc))


def batch_problems(v: Verdict, partition: int, nbytes: int, row: int, count: int,
                   object_rows: int) -> list[str]:
    """What is wrong with one batch of ``partition`` that reads rows [row, row + count)
    of an object judged ``v`` (its entry saying the object is ``nbytes`` and, if shared,
    ``object_rows`` rows)."""
    if v.error is not None:
        return [v.error]
    out = []
    if row + count > v.rows:
        out.append(f"holds {v.rows} rows, but a batch reads rows {row}..{row + count - 1}")
    if v.runs is not None:
        if object_rows != v.rows:
            out.append(f"holds {v.rows} rows, but the log says {object_rows}")
        if nbytes != v.size:
            out.append(f"is {v.size} bytes, but the log says {nbytes}")
        run = next((r for r in v.runs if r[0] == partition), None)
        if run is None or not run[1] <= row or row + count > run[1] + run[2]:
            has = "no rows" if run is None else f"rows {run[1]}..{run[1] + run[2] - 1}"
            out.append(f"its footer gives partition {partition} {has}, but a batch of it "
                       f"reads rows {row}..{row + count - 1}")
    return out


def check_objects(log: Log, topics: Iterable[str] | None = None) -> CheckReport:
    """Check every object the partitions of ``topics`` (default: all, internal ones
    included) name, against every batch that names it."""
    report = CheckReport()
    verdicts: dict[str, Verdict] = {}
    for topic in (list(topics) if topics else log.list_topics(internal=True)):
        for p in range(log.topic(topic).partitions):
            report.partitions += 1
            st = log.partition_log(TopicPartition(topic, p)).refresh()
            b = st.batches
            for key, nbytes, row, count, object_rows in zip(
                    b.data, b.nbytes, b.row, b.count, b.object_rows, strict=True):
                if not key:
                    continue
                v = verdicts.get(key)
                if v is None:
                    try:
                        v = judge_object(key, log.store.get(key))
                    except ObjectNotFoundError:
                        v = Verdict(error="is missing")
                    verdicts[key] = v
                    report.objects += 1
                    report.shared_objects += layout.is_shared(key)
                    report.bytes += v.size
                for what in batch_problems(v, p, nbytes, row, count, object_rows):
                    report.problems.append(Problem(topic, p, key, what))
    report.problems = list(dict.fromkeys(report.problems))  # (once per partition)
    return report
