"""The Jepsen-style checker (txlog.testing.checker) on hand-made histories: a clean one, and one
per anomaly kind.  Pure: no store, no processes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from txlog.testing import checker
from txlog.testing.checker import FAIL, OK, UNKNOWN, Op, check, pair_events

# -- builders -------------------------------------------------------------------------------


def txn(oid: str, outcome: str, sends: list[tuple[str, int | None, str]], *,
        acks: list[tuple[str, int, int, str]] = (), consumed: list[str] = (),  # type: ignore[assignment]
        error: str | None = None) -> Op:
    return Op("p1", "txn", outcome, {"txn_id": "t1", "sends": [list(s) for s in sends],
                                     "acks": [list(a) for a in acks],
                                     "consumed": list(consumed)}, id=oid, error=error)


def poll(oid: str, t: int, records: list[tuple[str, int, int, str]], before: dict[str, int],
         after: dict[str, int], lso: dict[str, int] | None = None, session: str = "s1",
         isolation: str = "read_committed", process: str = "c1") -> Op:
    return Op(process, "poll", OK, {"session": session, "isolation": isolation,
                                    "records": [list(r) for r in records], "before": before,
                                    "after": after, "lso": lso if lso is not None else after},
              invoke_ms=t, id=oid)


def final(records: list[tuple[str, int, int, str]], isolation: str = "read_committed") -> Op:
    return Op("final", "final_read", OK, {"isolation": isolation,
                                          "records": [list(r) for r in records]},
              id=f"final-{isolation}")


def state(parts: dict[str, tuple[int, int]]) -> Op:
    return Op("final", "final_state", OK, {"partitions": {
        k: {"lso": lso, "hw": hw, "open": []} for k, (lso, hw) in parts.items()}},
        id="final-state")


def clean_history() -> list[Op]:
    """Three transactions on a:0 and a:1, markers between, read in two polls.

    a:0  0 v1 (T1)  1 COMMIT  2 v3 (T2, aborted)  3 ABORT  4 v4 (T3)  5 COMMIT
    a:1  0 v2 (T1)  1 COMMIT
    """
    return [
        txn("T1", OK, [("a", 0, "v1"), ("a", 1, "v2")],
            acks=[("a", 0, 0, "v1"), ("a", 1, 0, "v2")]),
        txn("T2", FAIL, [("a", 0, "v3")], error="aborted by the client"),
        txn("T3", UNKNOWN, [("a", 0, "v4")]),
        poll("P1", 10, [("a", 0, 0, "v1"), ("a", 1, 0, "v2")],
             {"a:0": 0, "a:1": 0}, {"a:0": 2, "a:1": 2}),
        poll("P2", 20, [("a", 0, 4, "v4")], {"a:0": 2, "a:1": 2}, {"a:0": 6, "a:1": 2}),
        poll("U1", 15, [("a", 0, 0, "v1"), ("a", 0, 2, "v3")], {"a:0": 0}, {"a:0": 3},
             session="u1", isolation="read_uncommitted", process="c2"),
        final([("a", 0, 0, "v1"), ("a", 0, 4, "v4"), ("a", 1, 0, "v2")]),
        final([("a", 0, 0, "v1"), ("a", 0, 2, "v3"), ("a", 0, 4, "v4"), ("a", 1, 0, "v2")],
              "read_uncommitted"),
        state({"a:0": (6, 6), "a:1": (2, 2)}),
    ]


def kinds(ops: list[Op]) -> dict[str, int]:
    return {k: n for k, n in check(ops).counts().items() if n}


def find(ops: list[Op], oid: str) -> Op:
    return next(o for o in ops if o.id == oid)


# -- the clean history -------------------------------------------------------------------


def test_clean_history_has_no_anomalies() -> None:
    res = check(clean_history())
    assert res.valid, [a.detail for a in res.anomalies]
    assert res.stats["txns"] == 3
    assert res.stats["txns_committed"] == 2
    assert res.stats["txn_outcomes"] == {OK: 1, FAIL: 1, UNKNOWN: 1}
    assert res.stats["final_read"] is True


def test_unknown_outcome_may_go_either_way() -> None:
    ops = clean_history()
    # T3 (unknown) aborted instead: drop v4 everywhere; still valid.
    ops = [o for o in ops if o.id != "P2"]
    for o in ops:
        if o.f == "final_read":
            o.value["records"] = [r for r in o.value["records"] if r[3] != "v4"]
    assert kinds(ops) == {}


# -- one test per anomaly kind -------------------------------------------------------------


def test_lost_write() -> None:
    ops = clean_history()
    for o in ops:
        if o.f == "final_read" and o.value["isolation"] == "read_committed":
            o.value["records"] = [r for r in o.value["records"] if r[3] != "v2"]
    res = check(ops)
    got = kinds(ops)
    assert got[checker.LOST_WRITE] == 1
    assert got[checker.TORN_TXN] == 1  # T1 is visible on a:0 but not on a:1
    lost = next(a for a in res.anomalies if a.kind == checker.LOST_WRITE)
    assert lost.ops == ["T1"] and lost.data["missing"] == ["v2"]


def test_aborted_read_in_poll() -> None:
    ops = clean_history()
    find(ops, "P2").value["records"].insert(0, ["a", 0, 2, "v3"])
    res = check(ops)
    assert kinds(ops) == {checker.ABORTED_READ: 1}
    assert res.anomalies[0].ops == ["P2", "T2"]


def test_aborted_read_in_final_read() -> None:
    ops = clean_history()
    find(ops, "final-read_committed").value["records"].append(["a", 0, 2, "v3"])
    # Also a skip: poll P2 moved a:0 over offset 2, which the final read says is committed.
    assert kinds(ops) == {checker.ABORTED_READ: 1, checker.POLL_SKIP: 1}


def test_read_of_a_transaction_that_never_committed() -> None:
    """Outcome unknown, absent from the final read, yet a read_committed poll saw it."""
    ops = clean_history()
    ops.append(txn("T4", UNKNOWN, [("a", 1, "v5")]))
    find(ops, "P2").value["records"].append(["a", 1, 2, "v5"])
    find(ops, "P2").value["after"]["a:1"] = 3
    find(ops, "P2").value["lso"]["a:1"] = 3
    assert kinds(ops) == {checker.ABORTED_READ: 1}


def test_read_uncommitted_may_see_aborted_data() -> None:
    ops = clean_history()
    assert find(ops, "U1").value["records"][1][3] == "v3"
    assert kinds(ops) == {}


def test_phantom_read() -> None:
    ops = clean_history()
    find(ops, "U1").value["records"].append(["a", 0, 7, "nobody-sent-this"])
    assert kinds(ops) == {checker.PHANTOM_READ: 1}


def test_duplicate_value_at_two_offsets() -> None:
    ops = clean_history()
    for o in ops:
        if o.f == "final_read":
            o.value["records"].append(["a", 1, 2, "v1"])
    got = kinds(ops)
    assert got == {checker.DUPLICATE: 1}


def test_duplicate_processing_of_one_input() -> None:
    """Exactly-once: one input consumed by two committed transactions."""
    ops = clean_history()
    ops += [txn("C1", OK, [("out", 0, "x1")], consumed=["v1"]),
            txn("C2", UNKNOWN, [("out", 0, "x2")], consumed=["v1"])]
    for o in ops:
        if o.f == "final_read":
            o.value["records"] += [["out", 0, 0, "x1"], ["out", 0, 2, "x2"]]
    res = check(ops)
    assert kinds(ops) == {checker.DUPLICATE: 1}
    assert res.anomalies[0].ops == ["C1", "C2"]


def test_input_consumed_twice_but_committed_once_is_fine() -> None:
    ops = clean_history()
    ops += [txn("C1", OK, [("out", 0, "x1")], consumed=["v1"]),
            txn("C2", FAIL, [("out", 0, "x2")], consumed=["v1"])]
    for o in ops:
        if o.f == "final_read":
            o.value["records"].append(["out", 0, 0, "x1"])
    assert kinds(ops) == {}


def test_inconsistent_offsets_between_reads() -> None:
    ops = clean_history()
    find(ops, "U1").value["records"][0] = ["a", 0, 0, "v4"]  # v1's offset holds v4 here
    got = kinds(ops)
    assert got[checker.INCONSISTENT_OFFSETS] == 1
    assert got[checker.DUPLICATE] == 1  # v4 is also at two offsets


def test_inconsistent_offsets_between_ack_and_read() -> None:
    ops = clean_history()
    find(ops, "T1").value["acks"][1] = ["a", 1, 0, "v2"]
    find(ops, "T2").value["acks"] = [["a", 1, 0, "v3"]]  # claims v2's offset
    assert checker.INCONSISTENT_OFFSETS in kinds(ops)


def test_nonmonotonic_poll_offsets() -> None:
    ops = clean_history()
    p2 = find(ops, "P2")
    p2.value["records"] = [["a", 0, 0, "v1"], ["a", 0, 4, "v4"]]  # v1 again
    res = check(ops)
    assert checker.NONMONOTONIC_POLL in kinds(ops)
    assert any(a.kind == checker.NONMONOTONIC_POLL and a.ops == ["P2"] for a in res.anomalies)


def test_nonmonotonic_poll_position() -> None:
    ops = clean_history()
    ops.append(poll("P3", 30, [], {"a:0": 1, "a:1": 2}, {"a:0": 1, "a:1": 2}))
    assert kinds(ops) == {checker.NONMONOTONIC_POLL: 1}


def test_poll_skip_within_a_poll() -> None:
    ops = clean_history()
    find(ops, "P1").value["records"] = [["a", 0, 0, "v1"]]  # a:1 moved past v2 silently
    assert kinds(ops) == {checker.POLL_SKIP: 1}


def test_poll_skip_between_polls() -> None:
    """A failed poll advanced the position: the next successful poll starts past v4."""
    ops = clean_history()
    p2 = find(ops, "P2")
    p2.value.update(records=[], before={"a:0": 6, "a:1": 2})
    res = check(ops)
    assert kinds(ops) == {checker.POLL_SKIP: 1}
    assert res.anomalies[0].data["skipped"] == [[4, "v4"]]


def test_sessions_are_independent() -> None:
    """A new session (new consumer) may start again from the beginning."""
    ops = clean_history()
    ops.append(poll("P9", 40, [("a", 0, 0, "v1")], {"a:0": 0}, {"a:0": 1}, session="s2"))
    assert kinds(ops) == {}


def test_read_past_lso() -> None:
    ops = clean_history()
    find(ops, "P2").value["lso"] = {"a:0": 4, "a:1": 2}
    res = check(ops)
    assert kinds(ops) == {checker.READ_PAST_LSO: 1}
    assert "LSO 4" in res.anomalies[0].detail


def test_torn_transaction_with_unknown_outcome() -> None:
    ops = clean_history()
    ops.append(txn("T5", UNKNOWN, [("a", 1, "w1"), ("b", 0, "w2")]))
    find(ops, "final-read_committed").value["records"].append(["b", 0, 0, "w2"])
    res = check(ops)
    assert kinds(ops) == {checker.TORN_TXN: 1}
    torn = res.anomalies[0]
    assert torn.data == {"seen": ["w2"], "missing": ["w1"]}


def test_idempotent_sends_in_separate_batches_may_land_apart() -> None:
    """Without a transaction, sends the linger thread may put in separate batches are not
    atomic (torture seed 1319, local: one landed, the next failed); one batch is."""
    for atomic, expected in ((False, {}), (True, {checker.TORN_TXN: 1})):
        ops = clean_history()
        t = txn("I1", UNKNOWN, [("b", 0, "w1"), ("b", 0, "w2")])
        t.value.update(txn_id=None, mode="idempotent", atomic=atomic)
        ops.append(t)
        find(ops, "final-read_committed").value["records"].append(["b", 0, 0, "w1"])
        assert kinds(ops) == expected, atomic


def test_stuck_lso() -> None:
    ops = clean_history()
    find(ops, "final-state").value["partitions"]["a:1"]["lso"] = 1
    assert kinds(ops) == {checker.STUCK_LSO: 1}


def test_unexpected_error_and_hung_client() -> None:
    ops = clean_history()
    ops.append(Op("p2", "txn", UNKNOWN, {"sends": []}, id="X", error="KeyError: 3",
                  unexpected=True))
    ops.append(Op("nemesis", "worker_exit", UNKNOWN, {"worker": "p3.0", "hung": True},
                  id="H", error="still running"))
    assert kinds(ops) == {checker.UNEXPECTED_ERROR: 1, checker.HUNG_CLIENT: 1}


def test_every_kind_is_exercised() -> None:
    """Guard: the tests above cover every kind the checker reports."""
    covered = {checker.LOST_WRITE, checker.ABORTED_READ, checker.PHANTOM_READ,
               checker.DUPLICATE, checker.INCONSISTENT_OFFSETS, checker.NONMONOTONIC_POLL,
               checker.POLL_SKIP, checker.READ_PAST_LSO, checker.TORN_TXN,
               checker.STUCK_LSO, checker.UNEXPECTED_ERROR, checker.HUNG_CLIENT}
    assert covered == set(checker.ANOMALY_KINDS)


def test_values_must_be_unique() -> None:
    ops = clean_history()
    ops.append(txn("T9", OK, [("a", 0, "v1")]))
    with pytest.raises(ValueError, match="unique"):
        check(ops)


def test_without_a_final_read_only_local_checks_run() -> None:
    ops = [o for o in clean_history() if o.f != "final_read"]
    res = check(ops)
    assert res.valid and res.stats["final_read"] is False


# -- events -> ops ----------------------------------------------------------------------------


def test_pair_events() -> None:
    events: list[dict[str, Any]] = [
        {"type": "invoke", "process": "p", "f": "txn", "id": "p#1", "time": 1,
         "value": {"sends": [["a", 0, "v"]]}},
        {"type": "ok", "process": "p", "f": "txn", "id": "p#1", "time": 2,
         "value": {"acks": [["a", 0, 0, "v"]]}},
        {"type": "invoke", "process": "p", "f": "txn", "id": "p#2", "time": 3, "value": {}},
        {"type": "info", "process": "p", "f": "txn", "id": "p#2", "time": 4,
         "error": "StorageError: timeout"},
        {"type": "invoke", "process": "q", "f": "txn", "id": "q#1", "time": 5, "value": {}},
        {"type": "invoke", "process": "r", "f": "poll", "id": "r#1", "time": 6, "value": {}},
        {"type": "fail", "process": "r", "f": "poll", "id": "r#1", "time": 7,
         "error": "boom", "unexpected": True},
    ]
    ops = {o.id: o for o in pair_events(copy.deepcopy(events))}
    assert ops["p#1"].outcome == OK
    assert ops["p#1"].value == {"sends": [["a", 0, "v"]], "acks": [["a", 0, 0, "v"]]}
    assert (ops["p#1"].invoke_ms, ops["p#1"].complete_ms) == (1, 2)
    assert ops["p#2"].outcome == UNKNOWN and ops["p#2"].error == "StorageError: timeout"
    assert ops["q#1"].outcome == UNKNOWN and ops["q#1"].complete_ms is None  # killed
    assert ops["r#1"].outcome == FAIL and ops["r#1"].unexpected
    with pytest.raises(ValueError, match="unknown type"):
        pair_events([{"type": "bogus"}])


def test_recorder_round_trip(tmp_path: Any) -> None:
    from txlog.testing.harness.history import HISTORY_SUFFIX, Recorder, load_events

    rec = Recorder(tmp_path / f"p.0{HISTORY_SUFFIX}", "p.0")
    oid = rec.invoke("txn", {"txn_id": "t", "sends": [["a", 0, "v1"]]})
    rec.complete(oid, "txn", "ok", {"acks": [["a", 0, 0, "v1"]]})
    rec.invoke("txn", {"txn_id": "t", "sends": [["a", 0, "v2"]]})  # then "killed"
    rec.close()
    with open(tmp_path / f"p.0{HISTORY_SUFFIX}", "ab") as f:
        f.write(b'{"type": "ok", "trunc')  # a torn last line is skipped
    final_rec = Recorder(tmp_path / f"final{HISTORY_SUFFIX}", "final")
    fid = final_rec.invoke("final_read", {"isolation": "read_committed"})
    final_rec.complete(fid, "final_read", "ok", {"records": [["a", 0, 0, "v1"]]})
    final_rec.close()
    ops = pair_events(load_events(tmp_path))
    assert [o.outcome for o in ops if o.f == "txn"] == [OK, UNKNOWN]
    assert check(ops).valid
