"""CLI fuzzing: every hostile input (bad numbers, huge floats, negative settings, non-UTF-8
files, names with tricks, hostile objects in the root) ends in one line on stderr and a
non-zero exit: 1 for an error txlog reports, 2 for a usage error; never a traceback and
never 3 (an error no check caught)."""

from __future__ import annotations

import io
import json
import os
import random
import shlex
import sys
from pathlib import Path

import pytest

import txlog
from txlog import cli, layout
from txlog.model import decode_entry

SEED = int(os.environ.get("TXLOG_TEST_FUZZ_SEED", "31"))
CASES = 150

HOSTILE = ["-1", "0", "1e400", "-1e400", "nan", "inf", "9" * 40, "-" + "9" * 40, "",
           " ", "x\ny", "a/../b", "__consumer_offsets", "ü", "t\n", "1.5", "0x10",
           "{}", "[]", "null", "\x00", "%s", "--", "-", "../../etc", "a" * 300]
UNITS = ["ms", "s", "h", "d"]
SETTINGS = ["retries", "linger.ms", "batch.size", "buffer.memory", "max.poll.records",
            "transaction.timeout.ms", "segment.bytes", "num.partitions", "no.such.key",
            "transaction.state.log.num.partitions", "max.request.size", "fetch.max.bytes"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str], stdin: bytes = b"",
        ) -> tuple[int, str, str]:
    old = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    try:
        try:
            rc = cli.main(argv)
        except SystemExit as exc:  # argparse's usage errors
            rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdin = old
    out, err = capsys.readouterr()
    return rc, out, err


def templates(rng: random.Random, files: dict[str, Path]) -> list[str]:
    h = lambda: rng.choice(HOSTILE)  # noqa: E731
    s = lambda: rng.choice(SETTINGS)  # noqa: E731
    return [
        f"-X {s()}={h()} topics list",
        f"-X {s()}={h()} produce t",
        f"-X {s()}={h()} consume t --from-beginning",
        f"topics create {h()} --partitions {h()}",
        f"topics create t2 --config {rng.choice(['retention.ms', 'segment.bytes'])}={h()}",
        f"topics describe {h()}",
        f"topics delete {h()}",
        f"produce t --partition {h()}",
        f"produce t --file {files['latin1']}",
        f"produce t --file {files['binary']}",
        f"produce t --file {files['missing']}",
        f"produce t --transactional-id {h()}",
        f"produce t --transaction-timeout-ms {h()}",
        f"consume t --partition 0 --offset {h()}",
        f"consume t --max-records {h()}",
        f"consume t --group {h()} --from-beginning",
        f"consume {h()}",
        f"transactions list --state {h()}",
        f"transactions describe --transactional-id {h()}",
        f"transactions describe-producers --topic t --partition {h()}",
        f"transactions find-hanging --max-transaction-timeout {h()}",
        f"transactions find-hanging --max-transaction-timeout {h()}{rng.choice(UNITS)}",
        f"transactions abort --topic t --partition 0 --start-offset {h()}",
        f"transactions abort --transactional-id {h()}",
        f"groups describe --group {h()}",
        f"groups reset-offsets --group g --topic t:{h()} --to-offset {h()}",
        f"groups reset-offsets --group g --topic t --shift-by {h()} --execute",
        f"maintain --topic {h()}",
        f"describe --metrics --topic {h()}",
        f"--storage-options {shlex.quote(h())} topics list",
    ]


def hostile_root(tmp_path: Path) -> str:
    """A root holding a topic with records, keys txlog never writes (under _txn/, in a log
    directory, beside topic metadata), and a topic whose last log entry claims 2**64
    records."""
    root = str(tmp_path / "root")
    log = txlog.connect(root)
    log.create_topic("t")
    log.create_topic("huge")
    for topic in ("t", "huge"):
        p = log.producer()
        p.send(topic, b"v")
        p.flush()
        p.close()
    log.store.put("_txn/stray-key", b"\xff not a txlog object")
    log.store.put("_txn/pid-blocks/garbage.json", b"{}")
    log.store.put("_txn/state/000/log/000000/garbage.json", b"{}")
    log.store.put("topics/t/0/log/000000/zzz.json", b"{}")
    log.store.put("_meta/topics/not a topic.json", b"{}")
    for n in range(50):  # a stray key in every state-log partition
        log.store.put(f"_txn/state/{n:03d}/log/000000/stray.json", b"{}")
    key = log.store.list(layout.log_prefix("huge", 0))[-1]
    raw = json.loads(log.store.get(key))
    raw["count"] = 2**64
    log.store.put(key, json.dumps(raw).encode())
    with pytest.raises(Exception):  # noqa: B017 - whatever the decoder says, it is refused
        decode_entry(log.store.get(key), key)
    return root


def test_fuzz_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    print(f"seed {SEED} (TXLOG_TEST_FUZZ_SEED)")
    rng = random.Random(SEED)
    root = hostile_root(tmp_path)
    files = {"latin1": tmp_path / "latin1.txt", "binary": tmp_path / "binary.bin",
             "missing": tmp_path / "missing.txt"}
    files["latin1"].write_bytes('{"value": "caf\xe9"}\n'.encode("latin-1"))
    files["binary"].write_bytes(bytes(range(256)) * 4)
    monkeypatch.setenv("TXLOG_ROOT", root)
    monkeypatch.delenv("TXLOG_DEBUG", raising=False)
    for case in range(CASES):
        line = rng.choice(templates(rng, files))
        try:
            argv = shlex.split(line)
        except ValueError:
            continue
        stdin = rng.choice([b"", b'{"value": "x"}\n', b"\xff\xfe\n", b"not json\n",
                            b'{"value": "x", "partition": 99999999999999999999}\n',
                            b'{"value": "x", "timestamp": 1e400}\n'])
        rc, _out, err = run(argv, capsys, stdin)
        what = f"case {case} (seed {SEED}): txlog {line!r} < {stdin!r}"
        assert "Traceback" not in err, what
        assert rc != 3, f"{what}: {err}"
        if rc != 0:
            assert rc in (1, 2), what
            lines = [x for x in err.splitlines() if x.strip()]
            if rc == 1:  # maintain reports each failure on a line of its own
                assert lines and all(x.startswith("txlog: error: ") for x in lines), \
                    f"{what}: {err}"
                assert len(lines) == 1 or argv[0] == "maintain", f"{what}: {err}"


@pytest.mark.parametrize("argv", [
    ["-X", "retries=-1", "produce", "t"],
    ["-X", "linger.ms=1.5", "topics", "list"],
    ["transactions", "find-hanging", "--max-transaction-timeout", "1e400"],
    ["consume", "huge", "--from-beginning"],
    ["maintain"],
    ["topics", "describe"],
])
def test_named_inputs_end_in_one_line(argv: list[str], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXLOG_ROOT", hostile_root(tmp_path))
    rc, _out, err = run(argv, capsys, b'{"value": "x"}\n')
    assert rc in (1, 2) and "Traceback" not in err, err
    lines = err.strip().splitlines()
    if rc == 1:  # a usage error (2) prints argparse's usage above its one error line
        assert len(lines) == 1, err
    assert "error: " in lines[-1], err


def test_stray_keys_are_not_state(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXLOG_ROOT", hostile_root(tmp_path))
    rc, out, err = run(["transactions", "list"], capsys)
    assert rc == 0, err
    rc, out, err = run(["topics", "list", "--json"], capsys)
    assert rc == 0 and [t["name"] for t in json.loads(out)] == ["huge", "t"], err
    rc, out, err = run(["consume", "t", "--from-beginning"], capsys)
    assert rc == 0 and [json.loads(x)["value"] for x in out.splitlines()] == ["v"], err
    rc, out, err = run(["produce", "t", "--transactional-id", "tx"], capsys,
                       b'{"value": "x"}\n')
    assert rc == 0 and "Produced 1 record" in out, err


def test_a_non_utf8_file_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXLOG_ROOT", hostile_root(tmp_path))
    f = tmp_path / "in.jsonl"
    f.write_bytes(b'{"value": "ok"}\n{"value": "caf\xe9"}\n')
    rc, _out, err = run(["produce", "t", "--file", str(f)], capsys)
    assert rc == 1 and "line 2 is not UTF-8" in err, err


