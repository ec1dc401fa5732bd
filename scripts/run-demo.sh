#!/usr/bin/env bash
# The main job: an end-to-end exactly-once pipeline on a local directory and local Spark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
exec .venv/bin/python scripts/demo.py "$@"
