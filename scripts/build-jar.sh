#!/usr/bin/env bash
# Builds txlog's JVM connector for Spark with Maven (pom.xml) into spark_ext/jars/txlog-spark.jar,
# which the wheel ships (setup.py refuses to build a wheel or sdist without it, or with one of
# other Java sources); skipped when the jar was built from the current Java sources and is
# newer than pom.xml. The build runs the JUnit tests.
# Maven takes its artifacts from the local cache (~/.m2), fetching them on the first run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
jar=spark_ext/jars/txlog-spark.jar
read -r digest have < <("$PY" -c 'from spark_ext.jvm_scan import SHIPPED, _jar_digest, source_digest
print(source_digest(), _jar_digest(SHIPPED) or "-")')
if [ "$have" = "$digest" ] && [ "$jar" -nt pom.xml ]; then
  exit 0
fi
mkdir -p target/generated-resources/io/txlog/spark spark_ext/jars
printf '%s' "$digest" >target/generated-resources/io/txlog/spark/build-digest.txt
mvn -q -B -Dstyle.color=never package
cp target/txlog-spark-0.1.0.jar "$jar.tmp"
mv "$jar.tmp" "$jar"
