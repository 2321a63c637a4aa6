#!/usr/bin/env bash
# Install everything the test suite needs, then run all of it.
#
#   ./tests/run_all.sh            # from the repository root, on a fresh machine
#
# Installs: the gateway with its test extras (pip), Debian's kcat, chromium, curl
# and iproute2 (apt-get), kafkajs and playwright-core with uPlot (npm), the Java
# client, Kafka Streams and the Apache Kafka broker (Maven, into a cache outside
# git), PySpark (pip, the `spark` extra inside the test extras) and Spark's Kafka
# connector (Maven, into the same cache), the Tansu peer for the benchmark smoke
# test (pip, in the test extras). Fails loudly at the first step that goes wrong.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "Python packages"
python3 -m pip install --quiet --upgrade pip
python3 -m pip install --quiet -e '.[test]'

step "kcat (Debian)"
if ! command -v kcat >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq kcat >/dev/null
fi
kcat -V | head -1

step "the README's tools: curl; ip (iproute2) for the README test's network namespace"
for tool in curl:curl ip:iproute2 unshare:util-linux; do
  if ! command -v "${tool%%:*}" >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${tool##*:}" >/dev/null
  fi
done

step "kafkajs (npm)"
(cd compat_tests/js && npm ci --no-audit --no-fund --loglevel=error)

step "the web console's browser test: Debian's chromium, playwright-core (npm)"
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
(cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)

step "JVM: Java 17, Maven, and the jars of compat_tests/jvm/pom.xml"
if ! command -v javac >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
fi
for tool in java javac mvn; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "error: $tool is missing: install Java 17 and Maven" \
         "(Debian: apt-get install -y openjdk-17-jdk-headless maven)" >&2
    exit 1
  }
done
java -version 2>&1 | head -1
python3 -c 'from testkit import jvm; print("jars in", jvm.resolve())'

step "Spark: pyspark and its Kafka connector (compat_tests/jvm/spark/pom.xml)"
python3 - <<'PY'
import pyspark
from spark_jobs import session
from testkit import jvm
lib = jvm.resolve(jvm.SPARK_POM)
jars = session.cached_connector(pyspark.__version__)
if jars is None:
    raise SystemExit(f"error: {lib} has no connector for pyspark {pyspark.__version__}: "
                     "the pom's spark.version must equal the pinned pyspark")
print(f"pyspark {pyspark.__version__}; connector jars in {lib}:",
      " ".join(jar.name for jar in jars))
PY

step "lint"
python3 -m ruff check .

step "types"
# mypy, configured in pyproject.toml ([tool.mypy]: the packages it checks, and
# which of them are strict). Any error fails the run here, before the tests.
python3 -m mypy

step "tests"
set +e
python3 -m pytest -q -p no:cacheprovider "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
