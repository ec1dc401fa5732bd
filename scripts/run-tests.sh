#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs into .venv (and
# .venv-latest), then runs lint, type checks and pytest on pyspark 4.2 with Delta Lake, then
# the Spark tests again on the newest pyspark (.venv-latest; the Delta tests skip there).
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
# The Azure contract tests run against Azurite, npm-installed into the test cache on
# first use (about 20 s); TXLOG_TEST_INSTALL_AZURITE=0 skips them instead.
export TXLOG_TEST_INSTALL_AZURITE="${TXLOG_TEST_INSTALL_AZURITE:-1}"
echo "== ruff";  .venv/bin/ruff check txlog spark_ext tests scripts
echo "== mypy";  .venv/bin/mypy
echo "== pytest"; .venv/bin/python -m pytest ${FAST[@]+"${FAST[@]}"} "$@"
if [[ ${#FAST[@]} -gt 0 ]]; then exit 0; fi  # the fast lane runs no Spark test
echo "== pytest, spark tests on the newest pyspark (.venv-latest)"
export PYSPARK_PYTHON="$PWD/.venv-latest/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv-latest/bin/python"
# Exit status 5: the arguments selected no Spark test, which is fine for this lane.
# The slow Spark tests (kills, clusters) run in the first lane only.
.venv-latest/bin/python -m pytest -m "spark and not slow" "$@" || [ $? -eq 5 ]
