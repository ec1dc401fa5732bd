"""Build hook: a wheel or sdist carries the connector's jar built from these Java sources.

The jar (spark_ext/jars/txlog-spark.jar) is made by scripts/build-jar.sh and is not in git,
so without this check a wheel built before it, or after the Java sources changed, would
silently ship no jar or a stale one. Everything else is configured in pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
JAR = HERE / "spark_ext" / "jars" / "txlog-spark.jar"


def _jar_digest_module() -> types.ModuleType:
    """spark_ext/jar_digest.py, loaded by its path: importing the spark_ext package would
    need the runtime's dependencies, which a build does not have."""
    spec = importlib.util.spec_from_file_location(
        "txlog_jar_digest", HERE / "spark_ext" / "jar_digest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_jar() -> None:
    """Refuse to package without a jar built from the current sources."""
    digests = _jar_digest_module()
    built = digests.jar_digest(JAR)
    digest = digests.source_digest()
    if built == digest:
        return
    if not JAR.exists():
        problem = f"{JAR.relative_to(HERE)} does not exist"
    elif built is None:
        problem = f"{JAR.relative_to(HERE)} is not a jar built by scripts/build-jar.sh"
    else:
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
