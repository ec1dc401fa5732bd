#!/usr/bin/env bash
# The set-up: creates .venv (if missing) and installs txlog with its dev and delta extras into
# it, then .venv-latest (scripts/bootstrap-latest.sh) for the txlog-only Spark tests on the
# newest pyspark, Azurite (npm) into .tools/azurite, the jars of scripts/jars.txt into .jars/,
# and builds the connector's jar with Maven. Everything the tests use is installed here: they
# never download anything. Re-running is cheap: each step skips what is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.txlog-installed
here="$(pwd -P)"
# A .venv that is a link to another checkout's: installing this checkout into it would make
# that checkout's tests, Spark workers and benchmarks run this code (and its next bootstrap
# would take it back).
venv="$(cd .venv && pwd -P)"
if [ "$venv" != "$here/.venv" ]; then
  echo "bootstrap: .venv is $venv, another checkout's virtualenv; installing this" \
       "checkout into it would change what that checkout runs. Remove the link" \
       "(rm .venv) and run this again to get a virtualenv of its own." >&2
  exit 2
fi
# Where the venv's txlog comes from (isolated: neither PYTHONPATH nor this directory on the
# path): an install made from elsewhere is replaced by this checkout's.
installed="$("$here/.venv/bin/python" -I -c \
  'import importlib.util as u, os; s = u.find_spec("txlog"); print(os.path.dirname(os.path.dirname(os.path.realpath(s.origin))) if s and s.origin else "")' \
  2>/dev/null || true)"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$installed" != "$here" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev,delta]"
  # The build backend pyproject.toml names, so a wheel builds offline from .venv.
  .venv/bin/python -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' |
    xargs .venv/bin/python -m pip install --quiet
  touch "$stamp"
fi
scripts/bootstrap-latest.sh
# Azurite, the Azure Blob emulator the Azure tests start, at the version txlog.testing.servers
# pins (the tests only look for it; without it they skip, naming this script).
read -r azurite_want azurite_have < <(.venv/bin/python -c 'from txlog.testing import servers as s
print(s.AZURITE_VERSION, s.installed_azurite_version(s.azurite_prefix()) or "-")')
if [ "$azurite_have" != "$azurite_want" ]; then
  if command -v npm >/dev/null && command -v node >/dev/null; then
    mkdir -p .tools/azurite
    npm install --prefix .tools/azurite --no-audit --no-fund --save-exact --loglevel=error \
      "azurite@$azurite_want" >/dev/null
  else
    echo "bootstrap: no node/npm on the PATH, so Azurite $azurite_want is not installed and" \
         "the Azure tests will skip; install Node.js (20+) and npm, then run this again." >&2
  fi
fi
scripts/fetch-jars.sh
scripts/build-jar.sh
