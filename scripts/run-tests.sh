#!/usr/bin/env bash
# The whole test suite, from a fresh clone: the set-up (scripts/bootstrap.sh) installs what it
# needs, then this runs lint, type checks, the connector's JUnit tests (Maven, offline), and
# pytest on pyspark 4.2 with Delta Lake, then the Spark tests again on the newest pyspark
# (.venv-latest; the Delta tests skip there). Nothing here downloads: only the set-up does.
# Extra arguments go to both pytest runs.
#   scripts/run-tests.sh          the full suite (what CI runs)
#   scripts/run-tests.sh --fast   the fast lane (docs/testing.md): no slow, Spark or server
#                                 tests, stores in memory and on local disk only, fewer races
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=()
if [[ "${1:-}" == "--fast" ]]; then
    shift
    FAST=(-m "not slow and not spark and not s3 and not gcs")
    export TXLOG_TEST_BACKENDS="${TXLOG_TEST_BACKENDS:-memory,local}"
    export TXLOG_TEST_RACE_SCALE="${TXLOG_TEST_RACE_SCALE:-0.2}"  # a fifth of the racing trials
fi
scripts/bootstrap.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
echo "== ruff";  .venv/bin/ruff check txlog spark_ext tests scripts
echo "== mypy";  .venv/bin/mypy
if [[ ${#FAST[@]} -eq 0 ]]; then  # the fast lane starts no JVM
  # Against the classes the set-up's build left in target/ (recompiled only if stale), offline:
  # the set-up's build fetched every artifact these need.
  echo "== junit"; mvn -o -q -B -Dstyle.color=never test
fi
echo "== pytest"; .venv/bin/python -m pytest --durations=30 ${FAST[@]+"${FAST[@]}"} "$@"
if [[ ${#FAST[@]} -gt 0 ]]; then exit 0; fi  # the fast lane runs no Spark test
echo "== pytest, spark tests on the newest pyspark (.venv-latest)"
export PYSPARK_PYTHON="$PWD/.venv-latest/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv-latest/bin/python"
# Exit status 5: the arguments selected no Spark test, which is fine for this lane.
# The slow Spark tests (kills, clusters) run in the first lane only.
.venv-latest/bin/python -m pytest -m "spark and not slow" "$@" || [ $? -eq 5 ]
