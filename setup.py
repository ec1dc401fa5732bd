"""Build hook: a wheel or sdist carries the connector's jar built from these Java sources.

The jar (spark_ext/jars/txlog-spark.jar) is made by scripts/build-jar.sh and is not in git,
so without this check a wheel built before it, or after the Java sources changed, would
silently ship no jar or a stale one. Everything else is configured in pyproject.toml.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
JAR = HERE / "spark_ext" / "jars" / "txlog-spark.jar"
SOURCES = HERE / "spark_ext" / "java"
DIGEST_RESOURCE = "io/txlog/spark/build-digest.txt"


def source_digest() -> str:
    """The Java sources' digest as spark_ext.jvm_scan computes it (tests/packaging checks
    the two agree); this file cannot import spark_ext, whose imports need the runtime."""
    h = hashlib.sha256()
    for src in sorted(SOURCES.rglob("*.java")):
        h.update(src.relative_to(SOURCES).as_posix().encode())
        h.update(src.read_bytes())
    return h.hexdigest()[:16]


def check_jar() -> None:
    """Refuse to package without a jar built from the current sources."""
    try:
        with zipfile.ZipFile(JAR) as z:
            built = z.read(DIGEST_RESOURCE).decode().strip()
    except FileNotFoundError:
        problem = f"{JAR.relative_to(HERE)} does not exist"
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        problem = f"{JAR.relative_to(HERE)} is not a jar built by scripts/build-jar.sh ({exc})"
    else:
        digest = source_digest()
        if built == digest:
            return
        problem = (f"{JAR.relative_to(HERE)} was built from other Java sources (digest "
                   f"{built}, the sources' is {digest})")
    raise SystemExit(f"txlog: cannot package the JVM connector: {problem}. Run "
                     "scripts/build-jar.sh (or scripts/bootstrap.sh), then build again.")


class BuildPy(build_py):
    def run(self) -> None:
        # An editable install links the sources instead; the set-up makes one before the jar.
        if not getattr(self, "editable_mode", False):
            check_jar()
        super().run()


class Sdist(sdist):
    def run(self) -> None:
        check_jar()
        super().run()


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
