"""The planner process txlog's JVM connector starts on the driver (``io.txlog.spark.Planner``):
``python -m spark_ext.planner_server`` reads one JSON request per line on stdin and writes
one JSON answer per line (:func:`spark_ext.jvm_plan.answer`); it ends when stdin closes,
that is when the driver JVM exits, and then removes the scan plans it wrote that the JVM
did not read (:mod:`spark_ext.plan_file`).  On start it removes those of planners that
were killed before they could (:mod:`spark_ext.plan_owner`).
"""

from __future__ import annotations

import json
import os
import signal
import sys


def _stopped(signum: int, frame: object) -> None:
    # Stopped (the JVM restarts a planner that failed): the scan plans the JVM did not
    # read go too (none were written if the module is not loaded yet); then out at once,
    # as the default action would.
    plans = sys.modules.get("spark_ext.plan_file")
    if plans is not None:
        plans.remove_unread()
    os._exit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _stopped)
    from spark_ext import plan_owner

    # Plans left by planners killed before they could remove them (SIGKILL, a crash):
    # nobody will read them now.  A live planner's are left alone.
    plan_owner.sweep()
    # The answers own stdout: anything else printed (a library's message) goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    from spark_ext.jvm_plan import answer

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except ValueError as exc:
            reply = {"error": {"type": "txlog.errors.ConfigError",
                               "message": f"the planner got a line that is not JSON: {exc}"}}
        else:
            reply = answer(req)
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
