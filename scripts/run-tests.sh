#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs into .venv (and
# .venv-latest), then runs lint, type checks and pytest on pyspark 4.2 with Delta Lake, then
# the Spark tests again on the newest pyspark (.venv-latest; the Delta tests skip there).
# Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
# The Azure contract tests run against Azurite, npm-installed into the test cache on
# first use (about 20 s); TXLOG_TEST_INSTALL_AZURITE=0 skips them instead.
export TXLOG_TEST_INSTALL_AZURITE="${TXLOG_TEST_INSTALL_AZURITE:-1}"
echo "== ruff";  .venv/bin/ruff check txlog spark_ext tests scripts
echo "== mypy";  .venv/bin/mypy
echo "== pytest"; .venv/bin/python -m pytest "$@"
echo "== pytest, spark tests on the newest pyspark (.venv-latest)"
export PYSPARK_PYTHON="$PWD/.venv-latest/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv-latest/bin/python"
# Exit status 5: the arguments selected no Spark test, which is fine for this lane.
# The slow Spark tests (kills, clusters) run in the first lane only.
.venv-latest/bin/python -m pytest -m "spark and not slow" "$@" || [ $? -eq 5 ]
