"""The wheel and sdist carry the connector's jar built from the checkout's Java sources, and
refuse to build without one (setup.py). Builds run offline: the venv's setuptools, no build
isolation, on a copy of the checkout's files."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from spark_ext import jvm_scan

REPO = Path(__file__).resolve().parents[2]
JAR = Path("spark_ext") / "jars" / "txlog-spark.jar"
BUILD = ("import setuptools.build_meta as b, sys\n"
         "print(getattr(b, sys.argv[1])(sys.argv[2]))")


def _copy_checkout(dest: Path, *, with_jar: bool) -> Path:
    """The files git would give a fresh clone (tracked and not ignored), plus the jar."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True, timeout=60).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    if with_jar:
        assert (REPO / JAR).is_file(), f"no {JAR}: run scripts/bootstrap.sh (it builds the jar)"
        (dest / JAR).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / JAR, dest / JAR)
    return dest


def _build(tree: Path, hook: str, out: Path) -> subprocess.CompletedProcess[str]:
    out.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-c", BUILD, hook, str(out)], cwd=tree,
                          capture_output=True, text=True, timeout=300, check=False)


def _digest_of(jar_bytes: bytes) -> str:
    with zipfile.ZipFile(io.BytesIO(jar_bytes)) as z:
        return z.read(jvm_scan.DIGEST_RESOURCE).decode().strip()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _copy_checkout(tmp_path_factory.mktemp("checkout"), with_jar=True)


def test_the_wheel_carries_the_jar_built_from_these_sources(
        checkout: Path, tmp_path: Path) -> None:
    done = _build(checkout, "build_wheel", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    wheel = tmp_path / done.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        assert JAR.as_posix() in z.namelist()
        assert _digest_of(z.read(JAR.as_posix())) == jvm_scan.source_digest()


def test_the_sdist_carries_the_jar_built_from_these_sources(
        checkout: Path, tmp_path: Path) -> None:
    done = _build(checkout, "build_sdist", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    sdist = tmp_path / done.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("/" + JAR.as_posix()))
        data = t.extractfile(member)
        assert data is not None
        assert _digest_of(data.read()) == jvm_scan.source_digest()


@pytest.mark.parametrize("hook", ["build_wheel", "build_sdist"])
def test_packaging_without_the_jar_fails_and_says_how_to_build_it(
        tmp_path: Path, hook: str) -> None:
    tree = _copy_checkout(tmp_path / "tree", with_jar=False)
    done = _build(tree, hook, tmp_path / "out")
    assert done.returncode != 0
    assert "txlog-spark.jar does not exist" in done.stderr
    assert "scripts/build-jar.sh" in done.stderr
    assert not list((tmp_path / "out").iterdir())


def test_packaging_a_jar_of_other_sources_fails(tmp_path: Path) -> None:
    tree = _copy_checkout(tmp_path / "tree", with_jar=True)
    source = sorted((tree / "spark_ext" / "java").rglob("*.java"))[0]
    source.write_text(source.read_text() + "\n// changed after the jar was built\n")
    done = _build(tree, "build_wheel", tmp_path / "out")
    assert done.returncode != 0
    assert "was built from other Java sources" in done.stderr
    assert "scripts/build-jar.sh" in done.stderr
