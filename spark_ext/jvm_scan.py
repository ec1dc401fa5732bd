"""txlog's JVM connector (Java, in ``spark_ext/java``): its jar, loading it into a session,
and the planned scan that ``spark_ext.read(..., engine="jvm")`` hands a plan to.

``format("txlog")`` is the connector's ``txlog.DefaultSource``, which asks txlog's Python
planner for each plan (docs/spark.md); :func:`plan_to_dataframe` is the side path that
plans here, once, and hands the plan to ``io.txlog.spark.PlannedScanProvider``. Both read
with the same classes: exactly the planned rows of each batch object, the derived columns
(topic, partition, offset, timestamp, timestampType) added by the scan itself, no row
passing through Python. A Kafka-shaped object small enough to be read whole (8 MiB) is
decoded by txlog's own Parquet decoder (``DirectObject.java``;
``spark.hadoop.txlog.scan.decoder=parquet`` turns it off); other objects (typed topics,
larger objects, encodings or codecs that decoder does not take) are read by Spark's
vectorized Parquet reader.

The jar is built by Maven (``pom.xml``, ``scripts/build-jar.sh``) and shipped in the wheel
as ``spark_ext/jars/txlog-spark.jar``; :func:`jar` returns it when it was built from these
Java sources. Where it was not (a source checkout whose sources changed since), :func:`jar`
builds one with the JDK's ``javac`` against the running pyspark, once per source digest
and pyspark version, into ``$TXLOG_CACHE_DIR`` (default ``~/.cache/txlog``). With
neither it raises ``JvmScanUnavailable``: ``spark_ext.read`` then scans with SQL
(:mod:`spark_ext.native`), and a session without the jar serves ``format("txlog")`` with
the Python data source. For a cluster, add the path ``python -m spark_ext.jvm_scan``
prints to ``spark.jars`` or ``--jars``.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_ext import hadoop_conf, jar_digest, plan_file
from spark_ext.read_plan import BatchPlan

if TYPE_CHECKING:
    import numpy as np
    from pyspark.sql import DataFrame, SparkSession

    from txlog.storage import ObjectStore

PROVIDER = "io.txlog.spark.PlannedScanProvider"
SOURCES = jar_digest.SOURCES
_BUILD_LOCK = threading.Lock()
log = logging.getLogger(__name__)


class JvmScanUnavailable(Exception):
    """The JVM scan cannot be used here; the message says why (callers fall back)."""


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def _javac() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    found = shutil.which("javac")
    if found is None:
        raise JvmScanUnavailable("no javac (a JDK 17+) on the PATH or in JAVA_HOME")
    return found


def _sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.java"))


@functools.cache  # every read compares it with the loaded build; the sources do not change
def _digest() -> str:
    """The Java sources' digest (SOURCES, which tests point elsewhere)."""
    return jar_digest.source_digest(SOURCES)


def source_digest() -> str:
    """The digest scripts/build-jar.sh writes into the Maven-built jar."""
    return _digest()


def cache_dir() -> Path:
    return Path(os.environ.get("TXLOG_CACHE_DIR") or Path.home() / ".cache" / "txlog")


#: The Maven-built jar (scripts/build-jar.sh), shipped in the wheel.
SHIPPED = Path(__file__).resolve().parent / "jars" / "txlog-spark.jar"
DIGEST_RESOURCE = jar_digest.DIGEST_RESOURCE
_jar_digest = jar_digest.jar_digest


def jar() -> Path:
    """The connector's jar: the shipped one when it was built from these sources, else one
    built now with ``javac`` against the running pyspark (once per source and version)."""
    digest = _digest()
    if SHIPPED.is_file() and _jar_digest(SHIPPED) == digest:
        return SHIPPED
    import pyspark

    target = cache_dir() / f"txlog-spark-{digest}-{pyspark.__version__}.jar"
    if target.is_file():
        return target
    with _BUILD_LOCK:
        if target.is_file():
            return target
        try:
            _build(target, digest)
        except OSError as exc:  # an unwritable cache, a full disk
            raise JvmScanUnavailable(f"cannot build {target}: {exc}") from None
    return target


def _build(target: Path, digest: str) -> None:
    javac = _javac()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="txlog-javac-") as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "--release", "17", "-nowarn", "-cp", str(_pyspark_jars() / "*"),
               "-d", str(classes), *map(str, _sources())]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise JvmScanUnavailable(f"javac failed ({done.returncode}): "
                                     f"{(done.stderr or done.stdout).strip()[-2000:]}")
        # A jar is a zip; writing it here needs no `jar` tool. Renamed into place so that
        # concurrent builders (several test processes) never see half a jar.
        part = Path(tmp) / "out.jar"
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            z.writestr(DIGEST_RESOURCE, digest)
            for cls in sorted(classes.rglob("*.class")):
                z.write(cls, cls.relative_to(classes).as_posix())
        staged = target.with_suffix(f".{os.getpid()}.tmp")
        try:
            shutil.copyfile(part, staged)
            os.replace(staged, target)
        finally:
            staged.unlink(missing_ok=True)


def ensure_loaded(spark: SparkSession) -> None:
    """Make this build of the provider loadable in ``spark`` from the calling thread, or
    raise ``JvmScanUnavailable`` saying why."""
    jvm = _client_context(spark)._jvm
    session = spark._jsparkSession
    assert jvm is not None
    have = _loaded_build(jvm)
    if have is None:
        # ADD JAR sets the class loader of the JVM thread that ran it only: a read from
        # another Python thread (another py4j thread) must be given the session's loader.
        try:
            loader = session.sharedState().jarClassLoader()
            jvm.java.lang.Thread.currentThread().setContextClassLoader(loader)
        except Exception as exc:
            log.debug("could not set the session's class loader: %s", exc)
        have = _loaded_build(jvm)
    if have is None:
        path = jar()
        try:
            session.sessionState().resourceLoader().addJar(str(path))  # what ADD JAR runs
        except Exception as exc:
            raise JvmScanUnavailable(f"adding {path} to the session failed: {exc}") from None
        have = _loaded_build(jvm)
        if have is None:
            raise JvmScanUnavailable(f"{PROVIDER} is not loadable after adding {path}")
    if have != _digest():
        raise JvmScanUnavailable(
            f"another build of txlog's JVM scan ({have}) is on this session's classpath, not "
            f"this txlog's ({_digest()}); remove the old jar from spark.jars, or use the one "
            "`python -m spark_ext.jvm_scan` prints")


def _loaded_build(jvm: Any) -> str | None:
    """The digest of the build of the provider that this thread's class loader sees."""
    try:
        return str(jvm.io.txlog.spark.BuildInfo.digest())
    except Exception:  # py4j: an unknown class is a package, and calling it fails
        return None


def leaf_parallelism(spark: SparkSession) -> int:
    """How many input partitions Spark aims a file scan at (its leaf nodes' default
    parallelism): spark.sql.leafNodeDefaultParallelism, else the default parallelism."""
    given = spark.conf.get("spark.sql.leafNodeDefaultParallelism", None)  # checked by Spark
    return max(1, int(given) if given else _client_context(spark).defaultParallelism)


def _client_context(spark: SparkSession) -> Any:
    """The session's SparkContext, or JvmScanUnavailable where the client has none."""
    try:
        return spark.sparkContext
    except Exception as exc:  # Spark Connect: the client has no JVM to load a jar into
        raise JvmScanUnavailable(f"this session has no JVM on the client side "
                                 f"({type(exc).__name__}: {exc})") from None


def plan_to_dataframe(spark: SparkSession, store: ObjectStore, plan: BatchPlan,
                      group_ids: np.ndarray, *, fail_on_data_loss: bool = True,
                      ) -> DataFrame:
    """The planned slices, in input partitions ``group_ids``, as one DataFrame read by
    the JVM scan."""
    ensure_loaded(spark)
    shape = plan.shape
    batch = spark.conf.get("spark.sql.parquet.columnarReaderBatchSize", "4096")
    where = hadoop_conf.prepare(spark, store)
    path = plan_file.write(plan.arrays, group_ids, where)
    try:
        reader = (spark.read.format(PROVIDER)
                  .option("txlog.schema", shape.schema_json)
                  .option("txlog.kind", "kafka" if shape.kafka_shaped else "typed")
                  .option("txlog.batchSize", str(batch))
                  .option("txlog.failOnDataLoss", str(fail_on_data_loss).lower())
                  .option("txlog.planFile", path))
        return reader.load()  # reads the plan, and deletes it
    except BaseException:
        plan_file.discard(path)  # a load that failed before reading it
        raise


def main() -> None:
    """Build the jar and print its path (for ``spark.jars`` on a cluster)."""
    try:
        print(jar())
    except JvmScanUnavailable as exc:
        print(f"cannot build the txlog JVM scan: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
