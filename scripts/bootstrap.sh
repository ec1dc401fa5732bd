#!/usr/bin/env bash
# Creates .venv (if missing) and installs txlog with its dev extras into it.
# Re-running is cheap: pip skips what is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.txlog-installed
# Where the venv's txlog comes from, looked up from / so this directory is not on the path:
# a .venv shared with another clone (a symlink) whose bootstrap ran last imports that
# clone's code, and every test subprocess, Spark worker and benchmark here would run it.
here="$(pwd -P)"
installed="$(cd / && "$here/.venv/bin/python" -c \
  'import importlib.util as u, os; s = u.find_spec("txlog"); print(os.path.dirname(os.path.dirname(os.path.realpath(s.origin))) if s and s.origin else "")' \
  2>/dev/null || true)"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$installed" != "$here" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  touch "$stamp"
fi
