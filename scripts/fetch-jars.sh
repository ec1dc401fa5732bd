#!/usr/bin/env bash
# Fetches the third-party jars that tests, benchmarks and the demo put on Spark's classpath
# from Maven Central into .jars/, once (tests never download). scripts/jars.txt lists them,
# one group:artifact:version per line; transitive dependencies are listed explicitly.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.jars
mkdir -p "$dest"
plugin=org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy
while read -r coord _; do
  case "$coord" in '' | \#*) continue ;; esac
  IFS=: read -r _group artifact version <<<"$coord"
  [ -f "$dest/$artifact-$version.jar" ] && continue
  mvn -q -B -Dstyle.color=never "$plugin" -Dartifact="$coord" -DoutputDirectory="$dest"
done <scripts/jars.txt
