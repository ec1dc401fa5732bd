"""``txlog check``: every batch object a log names is read once and checked against its
name's CRC-32, its footer and every batch reading it, shared objects against their
``txlog.shared`` footer too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import txlog
from txlog.cli import main
from txlog.object_check import Verdict, batch_problems, judge_object
from txlog.records import KAFKA_SCHEMA, conform
from txlog.shared_objects import encode_shared

PARTITIONS = 4


def _check(root: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    capsys.readouterr()
    try:
        rc = main(["--root", root, "check", "--json", *args])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    return rc, json.loads(capsys.readouterr().out)


def _root(tmp_path: Path) -> txlog.Log:
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t", partitions=PARTITIONS)
    p = lg.producer(transactional_id="tx", linger_ms=600_000)
    p.init_transactions()
    p.begin_transaction()
    for q in range(PARTITIONS):
        p.send("t", b"v%d" % q, partition=q)
    p.commit_transaction()
    p.begin_transaction()
    p.send("t", b"own", partition=1)  # a transaction of one partition: its own object
    p.commit_transaction()
    p.close()
    return lg


def test_a_sound_root_has_no_problems(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    lg = _root(tmp_path)
    rc, d = _check(lg.url, capsys, "--topic", "t")
    assert rc == 0 and d["problems"] == []
    assert d["partitions"] == PARTITIONS and d["objects"] == 2 and d["shared_objects"] == 1


def test_a_damaged_shared_object_is_a_problem_of_every_partition_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lg = _root(tmp_path)
    (key,) = lg.store.list("topics/t/_shared/")
    raw = bytearray(lg.store.get(key))
    raw[len(raw) // 2] ^= 0x40
    lg.store.put(key, bytes(raw))
    rc, d = _check(lg.url, capsys)
    assert rc == 1
    assert sorted(p["partition"] for p in d["problems"]) == list(range(PARTITIONS))
    assert all(p["key"] == key and "fails its checksum" in p["problem"]
               for p in d["problems"])


def test_a_missing_object_is_a_problem(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    lg = _root(tmp_path)
    (key,) = lg.store.list("topics/t/_shared/")
    lg.store.delete(key)
    rc, d = _check(lg.url, capsys)
    assert rc == 1 and {p["problem"] for p in d["problems"]} == {"is missing"}


def _shared(partitions: list[int]) -> tuple[str, bytes]:
    batches = [(q, conform(pa.table({"value": [b"a", b"b"]}), KAFKA_SCHEMA, "t",
                           kafka_shaped=True)) for q in partitions]
    key, buf, _ = encode_shared("t", batches)
    return key, buf.to_pybytes()


def test_a_shared_objects_footer_must_give_the_partition_the_rows_it_reads() -> None:
    key, raw = _shared([0, 2])
    v = judge_object(key, raw)
    assert v.error is None and v.rows == 4 and v.runs == ((0, 0, 2), (2, 2, 2))
    assert batch_problems(v, 2, len(raw), 2, 2, 4) == []
    assert batch_problems(v, 1, len(raw), 2, 2, 4) == [
        "its footer gives partition 1 no rows, but a batch of it reads rows 2..3"]
    assert batch_problems(v, 0, len(raw), 1, 2, 4) == [
        "its footer gives partition 0 rows 0..1, but a batch of it reads rows 1..2"]
    assert batch_problems(v, 2, len(raw), 2, 3, 5) == [
        "holds 4 rows, but a batch reads rows 2..4", "holds 4 rows, but the log says 5",
        "its footer gives partition 2 rows 2..3, but a batch of it reads rows 2..4"]
    assert batch_problems(v, 0, len(raw) + 1, 0, 2, 4) == [
        f"is {len(raw)} bytes, but the log says {len(raw) + 1}"]


def test_a_shared_object_without_its_footer_is_a_problem() -> None:
    import pyarrow.parquet as pq

    from txlog import checksums

    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"value": [b"x"]}), buf)
    raw = buf.getvalue().to_pybytes()
    key = f"topics/t/_shared/abc{checksums.tag(raw)}.parquet"
    v = judge_object(key, raw)
    assert v.error is not None and "no txlog.shared footer" in v.error
    assert batch_problems(v, 0, len(raw), 0, 1, 1) == [v.error]
    assert batch_problems(Verdict(error="is missing"), 0, 0, 0, 1, 1) == ["is missing"]
