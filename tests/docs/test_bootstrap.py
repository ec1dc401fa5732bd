"""scripts/bootstrap.sh, the installer both README commands start with: it must not install
this checkout into another checkout's virtualenv (a linked ``.venv``), which would make that
checkout's tests, Spark workers and benchmarks run this code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_linked_venv_of_another_checkout_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other" / ".venv" / "bin"
    other.mkdir(parents=True)
    # Not a real interpreter: a regression would run pip through it, and must not install
    # anything anywhere; the script only records that it was called.
    calls = tmp_path / "calls"
    fake = other / "python"
    fake.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n')
    fake.chmod(0o755)
    mine = tmp_path / "mine"
    (mine / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "bootstrap.sh", mine / "scripts" / "bootstrap.sh")
    shutil.copy(REPO / "pyproject.toml", mine / "pyproject.toml")
    (mine / ".venv").symlink_to(other.parent)
    before = sorted(p.name for p in other.parent.iterdir())
    out = subprocess.run(["bash", str(mine / "scripts" / "bootstrap.sh")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHON=sys.executable))
    assert out.returncode == 2, out.stderr
    assert "another checkout's virtualenv" in out.stderr
    assert "rm .venv" in out.stderr
    assert sorted(p.name for p in other.parent.iterdir()) == before  # nothing installed
    assert not calls.exists()  # not even run
