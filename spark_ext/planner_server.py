"""The planner process txlog's JVM connector starts on the driver (``io.txlog.spark.Planner``):
``python -m spark_ext.planner_server`` reads one JSON request per line on stdin and writes
one JSON answer per line (:func:`spark_ext.jvm_plan.answer`); it ends when stdin closes,
that is when the driver JVM exits.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
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
