"""The ``txlog`` command, driven as a subprocess (as an operator or a cron job would)."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import txlog
from txlog.cli import build_parser, main, parse_duration_ms
from txlog.tables import bytes_from_json, json_value, render

ENV_DROP = ("TXLOG_CONF", "TXLOG_ROOT", "TXLOG_STORAGE_OPTIONS", "TXLOG_CRASH_AT")


def _env(root: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    if root is not None:
        env["TXLOG_ROOT"] = root
    return env


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


class Txlog:
    """Runs ``txlog`` against one root: as a subprocess (``[python, -m, txlog.cli]``), or
    in this process through ``main()`` (same code, no interpreter start-up) for the tests
    that do not need a process boundary."""

    def __init__(self, root: str | None, *, in_process: pytest.CaptureFixture[str] | None
                 = None, monkeypatch: pytest.MonkeyPatch | None = None) -> None:
        self.root = root
        self.capsys = in_process
        self.monkeypatch = monkeypatch

    def __call__(self, *args: str, input: str | None = None, expect: int | None = 0,
                 ) -> Result:
        if self.capsys is None:
            p = subprocess.run([sys.executable, "-m", "txlog.cli", *args], input=input,
                               capture_output=True, text=True, env=_env(self.root),
                               timeout=120)
            res = Result(p.returncode, p.stdout, p.stderr)
        else:
            assert self.monkeypatch is not None
            self.monkeypatch.setattr(sys, "stdin", io.StringIO(input or ""))
            for k in ENV_DROP:
                self.monkeypatch.delenv(k, raising=False)
            argv = ["--root", self.root, *args] if self.root else list(args)
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = int(exc.code or 0)
            out, err = self.capsys.readouterr()
            res = Result(rc, out, err)
        if expect is not None:
            assert res.returncode == expect, (
                f"txlog {' '.join(args)} exited {res.returncode}\nstdout: {res.stdout}\n"
                f"stderr: {res.stderr}")
        return res

    def json(self, *args: str, input: str | None = None) -> Any:
        return json.loads(self(*args, "--json", input=input).stdout)

    def consume(self, topic: str, *extra: str) -> list[dict[str, Any]]:
        out = self("consume", topic, "--from-beginning", "--quiet", *extra).stdout
        return [json.loads(line) for line in out.splitlines()]


@pytest.fixture
def tx(tmp_path: Path, capsys: pytest.CaptureFixture[str],
       monkeypatch: pytest.MonkeyPatch) -> Txlog:
    """``txlog`` in this process, on a fresh local root."""
    return Txlog(str(tmp_path / "root"), in_process=capsys, monkeypatch=monkeypatch)


@pytest.fixture
def txp(tmp_path: Path) -> Txlog:
    """``txlog`` as a subprocess, on a fresh local root."""
    return Txlog(str(tmp_path / "root"))


def jsonl(*records: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


# -- help ------------------------------------------------------------------------------


def _command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = (),
                   ) -> list[tuple[str, ...]]:
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += _command_paths(sub, (*prefix, name))
    return paths


def test_every_command_has_useful_help(capsys: pytest.CaptureFixture[str]) -> None:
    paths = _command_paths(build_parser())
    assert ("transactions", "find-hanging") in paths and ("groups", "reset-offsets") in paths
    assert len(paths) >= 20
    for path in paths:
        with pytest.raises(SystemExit) as exc:
            main([*path, "--help"])
        assert exc.value.code == 0, path
        text = capsys.readouterr().out
        assert "examples:" in text, path
        example = text.split("examples:", 1)[1]
        assert "txlog " + " ".join(path) in example, f"{path}: no example of itself"
        assert "--json" in text and "--root" in text, path


def test_help_as_a_subprocess_and_bare_group() -> None:
    p = Txlog(None)("transactions", "abort", "--help")
    assert "--producer-epoch" in p.stdout and "examples:" in p.stdout
    p = Txlog(None)("transactions", expect=2)  # a group without its subcommand: usage
    assert "find-hanging" in p.stdout


def test_parse_duration() -> None:
    assert parse_duration_ms("15") == 15 * 60_000  # minutes, as kafka-transactions.sh
    assert parse_duration_ms("500ms") == 500
    assert parse_duration_ms("30s") == 30_000
    assert parse_duration_ms("2h") == 7_200_000
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration_ms("soon")


def test_values_render_as_text_or_marked_base64() -> None:
    assert json_value(b"caf\xc3\xa9") == "café"
    assert json_value(b"\xff\x00") == {"base64": "/wA="}
    assert json_value({"k": [b"\xff"]}) == {"k": [{"base64": "/w=="}]}
    assert bytes_from_json({"base64": "/wA="}, "v") == b"\xff\x00"
    assert bytes_from_json("café", "v") == "café".encode()
    assert bytes_from_json({"a": 1}, "v") == b'{"a":1}'
    assert bytes_from_json(None, "v") is None
    with pytest.raises(ValueError, match="base64"):
        bytes_from_json({"base64": "not base64!"}, "v")
    table = render([{"a": 1, "b": None, "c": b"\xff"}, {"a": 22, "b": None, "c": "x"}],
                   [("A", "a"), ("B", "b"), ("C", "c")])
    assert table.splitlines() == ["A   B  C", " 1  -  base64:/w==", "22  -  x"]


# -- errors ------------------------------------------------------------------------------


def test_errors_are_one_line_and_exit_codes_as_a_process(txp: Txlog) -> None:
    p = txp("consume", "nosuch", expect=1)  # the root does not exist yet
    assert p.stderr.startswith("txlog: error: no txlog root at ")
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    txp("topics", "create", "other")
    p = txp("consume", "nosuch", expect=1)
    assert p.stderr.startswith("txlog: error: unknown topic 'nosuch'")
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    p = Txlog(None)("topics", "list", expect=2)  # no root: a usage error
    assert "TXLOG_ROOT" in p.stderr


def test_errors(tx: Txlog) -> None:
    t = tx
    t("topics", "create", "t")
    p = t("topics", "create", "t", expect=1)
    assert p.stderr.startswith("txlog: error:") and "already exists" in p.stderr
    p = t("transactions", "describe", "--transactional-id", "nope", expect=1)
    assert "no transactional.id 'nope'" in p.stderr
    t("topics", "list", "--bogus", expect=2)
    t("topics", "list", "--storage-options", "{not json", expect=2)
    t("transactions", "abort", "--topic", "t", expect=2)
    p = t("topics", "list", "-X", "no.such.key=1", expect=1)
    assert "unknown configuration key" in p.stderr
    p = t("transactions", "abort", "--topic", "t", "--partition", "0", "--start-offset", "3",
          expect=1)
    assert "no open transaction" in p.stderr
    # A bad line aborts the whole transactional produce: nothing is committed.
    p = t("produce", "t", "--transactional-id", "bad-load",
          input=jsonl({"value": "a"}) + "{oops\n", expect=1)
    assert "line 2" in p.stderr and "aborted" in p.stderr
    assert t.consume("t") == []
    p = t("produce", "t", input=jsonl({"value": "a", "colour": "red"}), expect=1)
    assert "unknown fields ['colour']" in p.stderr


# -- topics, produce, consume ----------------------------------------------------------------


def test_topics_produce_consume_roundtrip(tx: Txlog) -> None:
    t = tx
    created = t.json("topics", "create", "orders", "--partitions", "2",
                       "--config", "retention.ms=86400000")
    assert created["partitions"] == 2 and created["config"]["retention.ms"] == 86_400_000
    records: list[dict[str, Any]] = [
        {"key": "k1", "value": "hello", "partition": 0},
        {"key": "k2", "value": {"base64": "/wABAg=="}, "headers": {"h": "v"}, "partition": 0},
        {"value": {"n": 1}, "partition": 1, "timestamp": 1_700_000_000_000},
        {"key": None, "value": None, "headers": [["a", {"base64": "/w=="}]], "partition": 1},
    ]
    summary = t.json("produce", "orders", "--transactional-id", "load-1",
                       input=jsonl(*records))
    assert summary["records"] == 4
    assert [p["records"] for p in summary["partitions"]] == [2, 2]
    got = t.consume("orders")
    by_p = {p: [r for r in got if r["partition"] == p] for p in (0, 1)}
    assert [(r["key"], r["value"]) for r in by_p[0]] == [
        ("k1", "hello"), ("k2", {"base64": "/wABAg=="})]  # binary keeps its marker
    assert by_p[0][1]["headers"] == [["h", "v"]]
    assert by_p[1][0]["value"] == '{"n":1}' and by_p[1][0]["timestamp"] == 1_700_000_000_000
    assert by_p[1][1]["value"] is None and by_p[1][1]["headers"] == [["a", {"base64": "/w=="}]]
    # Output of consume is accepted by produce (minus the read-only fields).
    again = [{k: r[k] for k in ("key", "value", "headers", "partition")} for r in got]
    t("produce", "orders", input=jsonl(*again))
    assert len(t.consume("orders")) == 8
    # Plain text lines, a partition and offset, max records.
    t("produce", "orders", "--format", "text", "--partition", "1", input="x\ny\n")
    tail = t.consume("orders", "--partition", "1", "--offset", "5")
    assert [r["value"] for r in tail] == ["x", "y"]
    assert len(t.consume("orders", "--max-records", "3")) == 3
    # Tables and JSON views of the topic.
    text = t("topics", "describe", "orders").stdout
    assert "Topic: orders" in text and "HighWatermark" in text and "LSO" in text
    desc = t.json("topics", "describe", "orders")[0]
    assert [p["high_watermark"] for p in desc["partition_info"]] == [5, 7]
    assert t.json("--json", "topics", "list")[0]["name"] == "orders"  # global --json
    t("topics", "delete", "orders")
    assert t.json("topics", "list") == []


def test_groups_lag_and_reset(tx: Txlog) -> None:
    t = tx
    t("topics", "create", "events")
    t("produce", "events", "--format", "text", input="".join(f"e{i}\n" for i in range(6)))
    got = t.consume("events", "--group", "audit", "--max-records", "4")
    assert [r["value"] for r in got] == ["e0", "e1", "e2", "e3"]
    assert [g["group"] for g in t.json("groups", "list")] == ["audit"]
    row = t.json("groups", "describe", "--group", "audit")[0]
    assert (row["current_offset"], row["log_end_offset"], row["lag"]) == (4, 6, 2)
    # The group resumes from its committed offset.
    assert [r["value"] for r in t.consume("events", "--group", "audit")] == ["e4", "e5"]
    dry = t("groups", "reset-offsets", "--group", "audit", "--topic", "events",
              "--to-offset", "1")
    assert "Dry run" in dry.stderr and "NEW-OFFSET" in dry.stdout
    assert t.json("groups", "describe", "--group", "audit")[0]["current_offset"] == 6
    t("groups", "reset-offsets", "--group", "audit", "--topic", "events:0",
        "--to-offset", "1", "--execute")
    assert t.json("groups", "describe", "--group", "audit")[0]["lag"] == 5
    t("groups", "reset-offsets", "--group", "audit", "--all-topics", "--shift-by",
        "-100", "--execute")  # clamped to the log start
    assert t.json("groups", "describe", "--group", "audit")[0]["current_offset"] == 0
    t("groups", "describe", "--group", "nobody", expect=1)


def test_maintain_and_describe_metrics(tx: Txlog) -> None:
    t = tx
    t("topics", "create", "t", "--config", "file.delete.delay.ms=0")
    for i in range(3):
        t("produce", "t", "--transactional-id", "w", input=jsonl({"value": f"v{i}"}))
    rep = t("maintain", "--progress", "--json")
    assert "#" in rep.stderr and "done" in rep.stderr  # the progress bar
    d = json.loads(rep.stdout)
    (pr,) = [p for p in d["partitions"] if p["topic"] == "t"]
    assert pr["compacted_batches"] == 3 and pr["segments_written"] == 1
    assert [r["value"] for r in t.consume("t")] == ["v0", "v1", "v2"]
    text = t("maintain").stdout  # nothing left to do; no bar when not a TTY
    assert "Nothing to retain" in text or "ObjectsDeleted" in text
    m = t.json("describe", "--metrics")["metrics"]
    assert m["partitions"]["t-0"]["lso_lag"] == 0 and m["open_transactions"] == 0
    assert m["store"]["requests"]["list"] > 0 and m["transaction_states"] == {
        "CompleteCommit": 1}
    text = t("describe", "--metrics").stdout
    assert "LsoLag" in text and "Object-store requests" in text


def test_installed_console_script(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "txlog"
    path = str(exe) if exe.exists() else shutil.which("txlog")
    assert path, "the txlog console script is not installed: pip install -e ."
    p = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60,
                       env=_env(None))
    assert p.returncode == 0 and p.stdout.startswith("txlog ")
    p = subprocess.run([path, "topics", "list", "--root", str(tmp_path)], capture_output=True,
                       text=True, timeout=60, env=_env(None))
    assert p.returncode == 0 and "(no topics)" in p.stdout


# -- hanging transactions: made on purpose, found and ended ------------------------------------

STUCK_CHILD = textwrap.dedent("""
    import sys, time, txlog
    log = txlog.connect(sys.argv[1])
    for tid, part in (("stuck-a", 0), ("stuck-b", 1)):
        p = log.producer(transactional_id=tid, transaction_timeout_ms=900_000)
        p.init_transactions()
        p.begin_transaction()
        p.send("orders", b"never-committed-" + tid.encode(), key=b"z", partition=part)
        p.flush()
        print(tid, p.producer_id, p.epoch, flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
def test_hanging_transaction_found_by_find_hanging_and_ended_by_abort(tx: Txlog, txp: Txlog,
                                                                      ) -> None:
    # Setup and checks run in-process (tx); find-hanging and abort as subprocesses (txp),
    # as an operator would run them, on the same root.
    t = tx
    root = txp.root
    assert root is not None and root == tx.root
    t("topics", "create", "orders", "--partitions", "2")
    before: list[dict[str, Any]] = [{"value": f"before-{i}", "partition": i % 2} for i in range(4)]
    t("produce", "orders", "--transactional-id", "loader-1", input=jsonl(*before))

    # A producer process begins transactions on both partitions, writes, and is SIGKILLed.
    child = subprocess.Popen([sys.executable, "-c", STUCK_CHILD, root], stdout=subprocess.PIPE,
                             text=True, env=_env(None))
    try:
        ids = {}
        for _ in range(2):
            tid, pid, epoch = child.stdout.readline().split()  # type: ignore[union-attr]
            ids[tid] = (int(pid), int(epoch))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    after: list[dict[str, Any]] = [{"value": f"after-{i}", "partition": i % 2} for i in range(4)]
    t("produce", "orders", "--transactional-id", "loader-2", input=jsonl(*after))

    # The open transactions hold both LSOs: committed data after them is not visible.
    desc = t.json("topics", "describe", "orders")[0]["partition_info"]
    assert [p["open_transactions"] for p in desc] == [1, 1]
    assert all(p["last_stable_offset"] < p["high_watermark"] for p in desc)
    assert sorted(r["value"] for r in t.consume("orders")) == sorted(
        r["value"] for r in before)

    # Within Kafka's default bound (15 minutes) nothing is reported yet...
    assert txp.json("transactions", "find-hanging") == []
    time.sleep(0.3)
    # ...with a bound shorter than their age, both are.
    hanging = txp.json("transactions", "find-hanging", "--max-transaction-timeout",
                       "200ms")
    assert sorted((h["kind"], h["transactional_id"], h["partition"]) for h in hanging) == [
        ("hanging", "stuck-a", 0), ("hanging", "stuck-b", 1)]
    a = next(h for h in hanging if h["transactional_id"] == "stuck-a")
    assert (a["producer_id"], a["producer_epoch"]) == ids["stuck-a"]
    assert a["start_offset"] == desc[0]["last_stable_offset"]
    text = t("transactions", "find-hanging", "--topic", "orders", "--partition", "0",
               "--max-transaction-timeout", "200ms").stdout
    assert "stuck-a" in text and "stuck-b" not in text and "StartOffset" in text
    listed = {x["transactional_id"]: x for x in t.json("transactions", "list")}
    assert listed["stuck-a"]["state"] == "Ongoing"
    producers = t.json("transactions", "describe-producers", "--topic", "orders",
                         "--partition", "0")
    assert {p["producer_id"]: p["current_txn_start_offset"] for p in producers}[
        a["producer_id"]] == a["start_offset"]

    # Abort one by partition and (producer id, epoch), the other by transactional.id.
    res = txp.json("transactions", "abort", "--topic", "orders", "--partition", "0",
                   "--producer-id", str(a["producer_id"]), "--producer-epoch",
                   str(a["producer_epoch"]))
    assert "aborted" in res["action"] and res["lso_after"] > res["lso_before"]
    res = txp.json("transactions", "abort", "--transactional-id", "stuck-b")
    assert res["action"].startswith("aborted") and res["partitions"] == ["orders-1"]

    # The LSO reached the high watermark; every committed record is there, nothing else.
    desc = t.json("topics", "describe", "orders")[0]["partition_info"]
    assert all(p["last_stable_offset"] == p["high_watermark"] for p in desc)
    assert [p["open_transactions"] for p in desc] == [0, 0]
    got = t.consume("orders")
    assert sorted(r["value"] for r in got) == sorted(r["value"] for r in before + after)
    assert not any(r["value"].startswith("never-committed") for r in got)
    assert t.json("transactions", "find-hanging", "--max-transaction-timeout",
                    "0ms") == []
    d = t.json("transactions", "describe", "--transactional-id", "stuck-a")
    assert d["state"] == "CompleteAbort" and d["last_abort_reason"] == "admin"
    # Nothing left to abort: a clear error, not a traceback.
    p = txp("transactions", "abort", "--transactional-id", "stuck-a", expect=1)
    assert "nothing to abort" in p.stderr

    # The transactional.id is usable again.
    log = txlog.connect(root)
    prod = log.producer(transactional_id="stuck-a")
    prod.init_transactions()
    prod.begin_transaction()
    prod.send("orders", b"later", partition=0)
    prod.commit_transaction()
    assert "later" in [r["value"] for r in t.consume("orders")]
