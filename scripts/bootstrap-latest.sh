#!/usr/bin/env bash
# Creates .venv-latest: txlog with its dev extras on the newest pyspark (without delta-spark,
# whose newest release supports pyspark only up to the version .venv has). scripts/run-tests.sh
# runs the txlog-only Spark tests in it as a second lane.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
LATEST_PYSPARK=4.3.0
venv=.venv-latest
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
stamp="$venv/.txlog-installed"
here="$(pwd -P)"
installed="$("$here/$venv/bin/python" -I -c \
  'import importlib.util as u, os; s = u.find_spec("txlog"); print(os.path.dirname(os.path.dirname(os.path.realpath(s.origin))) if s and s.origin else "")' \
  2>/dev/null || true)"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$0" -nt "$stamp" ] \
   || [ "$installed" != "$here" ]; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e ".[dev]" "pyspark==$LATEST_PYSPARK"
  touch "$stamp"
fi
