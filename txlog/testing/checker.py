"""A Jepsen-style checker for histories of txlog clients (pure: no I/O, stdlib only).

A *history* is a list of operations.  Clients record each operation twice, as events: an
``invoke`` before the call and a completion (``ok``, ``fail`` or ``info``) after it;
:func:`pair_events` turns those events into :class:`Op` records, with outcome ``unknown``
when the completion is ``info`` or missing (the process was SIGKILLed mid-call).

Operations (``Op.f``) and their ``value``:

``txn``
    One transaction: ``{"txn_id", "sends": [[topic, partition|None, value], ...],
    "acks": [[topic, partition, offset, value], ...], "consumed": [value, ...]}``.
    Every sent value is unique in the history.  ``acks`` are offsets the producer learned
    (optional).  ``consumed`` lists input values a consume-transform-produce transaction
    read (it commits their offsets; each may be processed by at most one committed
    transaction).  Outcome ``ok``: commit_transaction returned; ``fail``: the transaction
    is known to be aborted (abort_transaction returned, or commit raised an error that
    means "aborted"); ``unknown``: anything else.
``poll``
    One ``poll()`` of a consumer: ``{"session", "isolation", "records": [[topic,
    partition, offset, value], ...], "before": {"topic:p": position}, "after": {...},
    "lso": {"topic:p": last_stable_offset after the poll}}``.  A session is one consumer
    instance reading forward without seeking.
``final_read``
    After the run, a full read of every partition: ``{"isolation", "records": [...]}``.
``final_state``
    After the final sweep: ``{"partitions": {"topic:p": {"lso", "hw", "open": [...]}}}``.
any ``f``
    A completion with ``"unexpected": true`` (an exception that is not a txlog error
    escaped a txlog call) is reported as ``unexpected_error``.

Anomalies (``Anomaly.kind``):

* ``lost_write``: a transaction acknowledged as committed has values missing from the
  final read_committed read;
* ``aborted_read``: a read_committed read returned a value whose transaction failed, or
  did not commit (it is absent from the final read_committed read);
* ``phantom_read``: a read returned a value no client ever sent;
* ``duplicate``: one value at two offsets, or one input consumed by two committed
  transactions (exactly-once processing violated);
* ``inconsistent_offsets``: two values at one offset (across reads and acks);
* ``nonmonotonic_poll``: within a session, a poll returned an offset at or below one
  already returned, or started below where the previous poll left the position;
* ``poll_skip``: a read_committed poll moved its position past a committed value without
  returning it;
* ``read_past_lso``: a read_committed poll returned an offset at or past the LSO;
* ``torn_txn``: a transaction (or an idempotent send of one batch) visible on some of its
  partitions (or values) only;
* ``stuck_lso``: after the final sweep a partition's LSO is below its high watermark;
* ``unexpected_error``: see above;
* ``hung_client``: a ``worker_exit`` operation with ``"hung": true`` (a client process
  that did not stop by itself).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OK = "ok"
FAIL = "fail"
UNKNOWN = "unknown"

READ_COMMITTED = "read_committed"

LOST_WRITE = "lost_write"
ABORTED_READ = "aborted_read"
PHANTOM_READ = "phantom_read"
DUPLICATE = "duplicate"
INCONSISTENT_OFFSETS = "inconsistent_offsets"
NONMONOTONIC_POLL = "nonmonotonic_poll"
POLL_SKIP = "poll_skip"
READ_PAST_LSO = "read_past_lso"
TORN_TXN = "torn_txn"
STUCK_LSO = "stuck_lso"
UNEXPECTED_ERROR = "unexpected_error"
HUNG_CLIENT = "hung_client"

#: Every anomaly kind, in report order.
ANOMALY_KINDS = (LOST_WRITE, ABORTED_READ, PHANTOM_READ, DUPLICATE, INCONSISTENT_OFFSETS,
                 NONMONOTONIC_POLL, POLL_SKIP, READ_PAST_LSO, TORN_TXN, STUCK_LSO,
                 UNEXPECTED_ERROR, HUNG_CLIENT)

# A position in a partition log: (topic, partition, offset).
Pos = tuple[str, int, int]


@dataclass
class Op:
    """One operation: its invocation and outcome."""

    process: str
    f: str
    outcome: str  # ok | fail | unknown
    value: dict[str, Any] = field(default_factory=dict)
    invoke_ms: int = 0
    complete_ms: int | None = None
    id: str = ""
    error: str | None = None
    unexpected: bool = False


@dataclass
class Anomaly:
    kind: str
    detail: str
    ops: list[str] = field(default_factory=list)  # ids of the operations involved
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "ops": self.ops, "data": self.data}


@dataclass
class CheckResult:
    anomalies: list[Anomaly]
    stats: dict[str, Any]

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(ANOMALY_KINDS, 0)
        for a in self.anomalies:
            out[a.kind] = out.get(a.kind, 0) + 1
        return out


def tp_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def parse_tp_key(key: str) -> tuple[str, int]:
    topic, _, p = key.rpartition(":")
    return topic, int(p)


# -- events -> ops ------------------------------------------------------------------------


def pair_events(events: Iterable[Mapping[str, Any]]) -> list[Op]:
    """Pair ``invoke`` events with their completions (by ``id``, else per process in order).

    Event fields: ``process``, ``type`` (invoke|ok|fail|info), ``f``, ``id``, ``time`` (ms),
    ``value`` (merged: completion keys override invocation keys), ``error``,
    ``unexpected``.  An invocation without a completion, or completed with ``info``, has
    outcome ``unknown``.  A completion without an invocation is taken as it is.
    """
    ops: list[Op] = []
    open_by_id: dict[str, Op] = {}
    open_by_process: dict[str, list[Op]] = defaultdict(list)
    for n, ev in enumerate(events):
        typ = ev.get("type")
        process = str(ev.get("process", "?"))
        oid = str(ev.get("id") or f"{process}#{n}")
        value = dict(ev.get("value") or {})
        if typ == "invoke":
            op = Op(process, str(ev.get("f", "?")), UNKNOWN, value, int(ev.get("time", 0)),
                    None, oid)
            ops.append(op)
            open_by_id[oid] = op
            open_by_process[process].append(op)
            continue
        if typ not in ("ok", "fail", "info"):
            raise ValueError(f"event {n} has unknown type {typ!r}")
        op_or_none = open_by_id.pop(oid, None) if ev.get("id") else None
        if op_or_none is None and not ev.get("id") and open_by_process[process]:
            op_or_none = open_by_process[process][-1]
            open_by_id.pop(op_or_none.id, None)
        if op_or_none is None:
            op = Op(process, str(ev.get("f", "?")), UNKNOWN, {}, int(ev.get("time", 0)), None,
                    oid)
            ops.append(op)
        else:
            op = op_or_none
            if op in open_by_process[process]:
                open_by_process[process].remove(op)
        op.value.update(value)
        op.complete_ms = int(ev.get("time", 0))
        op.outcome = {"ok": OK, "fail": FAIL, "info": UNKNOWN}[typ]
        op.error = ev.get("error")
        op.unexpected = bool(ev.get("unexpected", False))
    return ops


# -- the checker ---------------------------------------------------------------------------


class _Checker:
    def __init__(self, ops: Sequence[Op]) -> None:
        self.ops = list(ops)
        self.anomalies: list[Anomaly] = []
        self.txns = [o for o in self.ops if o.f == "txn"]
        self.polls = [o for o in self.ops if o.f == "poll" and o.outcome == OK]
        self.finals = [o for o in self.ops if o.f == "final_read" and o.outcome == OK]
        self.states = [o for o in self.ops if o.f == "final_state" and o.outcome == OK]
        self.writer: dict[str, Op] = {}
        for t in self.txns:
            for v in self._values(t):
                other = self.writer.get(v)
                if other is not None and other is not t:
                    raise ValueError(
                        f"value {v!r} is sent by two operations ({other.id}, {t.id}): "
                        "the history's values must be unique")
                self.writer[v] = t
        rc = [o for o in self.finals if o.value.get("isolation", READ_COMMITTED) == READ_COMMITTED]
        self.have_final = bool(rc)
        self.committed: set[str] = set()
        # Final committed offsets per partition, sorted, for skip checks.
        self.committed_offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
        for o in rc:
            for t_, p, off, v in o.value.get("records", ()):
                self.committed.add(v)
                self.committed_offsets[(t_, int(p))].append(int(off))
        for offs in self.committed_offsets.values():
            offs.sort()
        self.committed_at: dict[Pos, str] = {}
        for o in rc:
            for t_, p, off, v in o.value.get("records", ()):
                self.committed_at[(t_, int(p), int(off))] = v

    def add(self, kind: str, detail: str, ops: Iterable[Op] = (), **data: Any) -> None:
        self.anomalies.append(Anomaly(kind, detail, [o.id for o in ops], data))

    @staticmethod
    def _values(t: Op) -> list[str]:
        return [s[2] for s in t.value.get("sends", ())]

    def txn_committed(self, t: Op) -> bool:
        """Did ``t`` commit, as far as the final read shows?"""
        return any(v in self.committed for v in self._values(t))

    # -- checks --------------------------------------------------------------------------

    def run(self) -> CheckResult:
        self.check_unexpected()
        self.check_offsets_and_duplicates()
        if self.have_final:
            self.check_txns()
        self.check_polls()
        self.check_final_reads()
        self.check_exactly_once()
        self.check_final_state()
        return CheckResult(self.anomalies, self.stats())

    def check_unexpected(self) -> None:
        for o in self.ops:
            if o.unexpected:
                self.add(UNEXPECTED_ERROR, f"{o.f} of {o.process} raised {o.error}", [o])
            if o.f == "worker_exit" and o.value.get("hung"):
                self.add(HUNG_CLIENT, f"client {o.value.get('worker')} hung: {o.error}", [o])

    def check_offsets_and_duplicates(self) -> None:
        at: dict[Pos, dict[str, Op]] = defaultdict(dict)
        where: dict[str, dict[Pos, Op]] = defaultdict(dict)
        for o in self.ops:
            recs: list[Any] = []
            if o.f in ("poll", "final_read") and o.outcome == OK:
                recs = list(o.value.get("records", ()))
            elif o.f == "txn":
                recs = list(o.value.get("acks", ()))
            for t_, p, off, v in recs:
                pos = (t_, int(p), int(off))
                at[pos].setdefault(v, o)
                where[v].setdefault(pos, o)
        for pos, vals in sorted(at.items()):
            if len(vals) > 1:
                self.add(INCONSISTENT_OFFSETS,
                         f"{pos[0]}:{pos[1]} offset {pos[2]} holds {sorted(vals)}",
                         vals.values(), position=list(pos), values=sorted(vals))
        for v, poss in sorted(where.items()):
            if len(poss) > 1:
                self.add(DUPLICATE, f"value {v!r} at {len(poss)} offsets: {sorted(poss)}",
                         poss.values(), value=v, positions=[list(p) for p in sorted(poss)])

    def check_txns(self) -> None:
        for t in self.txns:
            vals = self._values(t)
            if not vals:
                continue
            seen = [v for v in vals if v in self.committed]
            missing = [v for v in vals if v not in self.committed]
            if t.outcome == OK and missing:
                self.add(LOST_WRITE,
                         f"transaction {t.id} ({t.value.get('txn_id')}) was acknowledged but "
                         f"{len(missing)} of its {len(vals)} values are not readable: "
                         f"{missing[:5]}", [t], missing=missing)
            elif t.outcome == FAIL and seen:
                self.add(ABORTED_READ,
                         f"transaction {t.id} ({t.value.get('txn_id')}) failed "
                         f"({t.error}) but {len(seen)} of its values are committed: {seen[:5]}",
                         [t], values=seen)
            if seen and missing and t.value.get("atomic", True):
                self.add(TORN_TXN,
                         f"transaction {t.id} ({t.value.get('txn_id')}, outcome {t.outcome}) "
                         f"is partly visible: {len(seen)} of {len(vals)} values; missing "
                         f"{missing[:5]}", [t], seen=seen, missing=missing)

    def _check_read_value(self, o: Op, t_: str, p: int, off: int, v: str, rc: bool) -> None:
        w = self.writer.get(v)
        if w is None:
            self.add(PHANTOM_READ, f"{o.f} {o.id} read {v!r} at {t_}:{p}@{off}, which no "
                                   "client sent", [o], value=v)
            return
        if not rc:
            return
        if w.outcome == FAIL:
            self.add(ABORTED_READ, f"{o.f} {o.id} read {v!r} at {t_}:{p}@{off}, written by "
                                   f"failed transaction {w.id} ({w.error})", [o, w], value=v)
        elif self.have_final and not self.txn_committed(w):
            self.add(ABORTED_READ, f"{o.f} {o.id} read {v!r} at {t_}:{p}@{off}, written by "
                                   f"transaction {w.id} (outcome {w.outcome}) that never "
                                   "committed", [o, w], value=v)

    def check_final_reads(self) -> None:
        # Aborted values in the final read_committed read are reported per transaction by
        # check_txns; here only values nobody sent.
        for o in self.finals:
            for t_, p, off, v in o.value.get("records", ()):
                if v not in self.writer:
                    self.add(PHANTOM_READ, f"final read found {v!r} at {t_}:{p}@{off}, which "
                                           "no client sent", [o], value=v)

    def check_polls(self) -> None:
        sessions: dict[tuple[str, str], list[Op]] = defaultdict(list)
        for o in self.polls:
            sessions[(o.process, str(o.value.get("session", "")))].append(o)
        for polls in sessions.values():
            polls.sort(key=lambda o: (o.invoke_ms, o.id))
            last_off: dict[tuple[str, int], int] = {}
            last_after: dict[str, int] = {}
            for o in polls:
                v = o.value
                rc = v.get("isolation", READ_COMMITTED) == READ_COMMITTED
                before = {k: int(x) for k, x in (v.get("before") or {}).items()}
                after = {k: int(x) for k, x in (v.get("after") or {}).items()}
                lso = {k: int(x) for k, x in (v.get("lso") or {}).items()}
                for k, pos in before.items():
                    prev = last_after.get(k)
                    if prev is not None and pos < prev:
                        self.add(NONMONOTONIC_POLL,
                                 f"poll {o.id} started {k} at {pos}, below {prev} where the "
                                 "previous poll of its session left it", [o])
                    elif prev is not None and pos > prev and rc and self.have_final:
                        # The position moved between polls (e.g. a failed poll advanced it).
                        self._check_skips(o, {k: prev}, {k: pos}, {}, between=True)
                returned: dict[tuple[str, int], list[int]] = defaultdict(list)
                for t_, p, off, val in v.get("records", ()):
                    tp = (t_, int(p))
                    off = int(off)
                    prev_off = last_off.get(tp)
                    if prev_off is not None and off <= prev_off:
                        self.add(NONMONOTONIC_POLL,
                                 f"poll {o.id} returned {t_}:{p}@{off} after offset {prev_off} "
                                 "in the same session", [o], value=val)
                    last_off[tp] = off
                    returned[tp].append(off)
                    k = tp_key(*tp)
                    if rc and k in lso and off >= lso[k]:
                        self.add(READ_PAST_LSO,
                                 f"poll {o.id} returned {t_}:{p}@{off} at or past the LSO "
                                 f"{lso[k]}", [o], value=val)
                    self._check_read_value(o, t_, int(p), off, val, rc)
                if rc and self.have_final:
                    self._check_skips(o, before, after, returned)
                last_after.update(after)

    def _check_skips(self, o: Op, before: dict[str, int], after: dict[str, int],
                     returned: dict[tuple[str, int], list[int]], between: bool = False,
                     ) -> None:
        for k, lo in before.items():
            hi = after.get(k)
            if hi is None or hi <= lo:
                continue
            tp = parse_tp_key(k)
            offs = self.committed_offsets.get(tp, [])
            i, j = bisect.bisect_left(offs, lo), bisect.bisect_left(offs, hi)
            got = set(returned.get(tp, ()))
            skipped = [x for x in offs[i:j] if x not in got]
            if skipped:
                how = ("between the previous poll of its session and" if between
                       else "during")
                self.add(POLL_SKIP,
                         f"{k} moved from {lo} to {hi} {how} poll {o.id} without returning "
                         f"committed offsets {skipped[:10]}", [o],
                         skipped=[[x, self.committed_at.get((tp[0], tp[1], x))]
                                  for x in skipped[:10]])

    def check_exactly_once(self) -> None:
        if not self.have_final:
            return
        by_input: dict[str, list[Op]] = defaultdict(list)
        for t in self.txns:
            consumed = t.value.get("consumed") or ()
            if consumed and self.txn_committed(t):
                for v in consumed:
                    by_input[v].append(t)
        for v, ts in sorted(by_input.items()):
            if len(ts) > 1:
                self.add(DUPLICATE,
                         f"input {v!r} was processed by {len(ts)} committed transactions: "
                         f"{[t.id for t in ts]}", ts, value=v)

    def check_final_state(self) -> None:
        for o in self.states:
            for k, s in sorted((o.value.get("partitions") or {}).items()):
                if int(s["lso"]) < int(s["hw"]):
                    self.add(STUCK_LSO,
                             f"{k}: LSO {s['lso']} below high watermark {s['hw']} after the "
                             f"final sweep; open: {s.get('open')}", [o], partition=k,
                             lso=s["lso"], hw=s["hw"], open=s.get("open"))

    def stats(self) -> dict[str, Any]:
        outcomes: dict[str, int] = defaultdict(int)
        for t in self.txns:
            outcomes[t.outcome] += 1
        return {
            "ops": len(self.ops),
            "txns": len(self.txns),
            "txn_outcomes": dict(outcomes),
            "txns_committed": sum(1 for t in self.txns if self.txn_committed(t)),
            "polls": len(self.polls),
            "values_sent": len(self.writer),
            "values_committed": len(self.committed),
            "final_read": self.have_final,
        }


def check(ops: Sequence[Op]) -> CheckResult:
    """Every anomaly in a history of operations (see the module docstring)."""
    return _Checker(ops).run()


def check_events(events: Iterable[Mapping[str, Any]]) -> CheckResult:
    """:func:`check` of raw invoke/complete events."""
    return check(pair_events(events))
