#!/usr/bin/env bash
# Install everything the test suite needs, then run all of it.
#
#   ./tests/run_all.sh            # from the repository root, on a fresh machine
#   ./tests/run_all.sh ARGS...    # pytest ARGS on the default PySpark line only
#
# Installs: the gateway with its test extras (pip), Debian's kcat, chromium, curl,
# iproute2 and postgresql (apt-get; PostgreSQL for the throwaway servers of
# testkit/postgres.py), kafkajs and playwright-core with uPlot (npm), the Java
# client, Kafka Streams and the Apache Kafka broker (Maven, into a cache outside
# git), and the 4.x Java client and Kafka Streams beside them (same cache),
# PySpark 4 (pip, the `spark` extra inside the test extras), PySpark 3.5 (pip,
# the `spark35` extra's pin, in a virtualenv of its own: two pysparks cannot
# share one environment) and each line's Kafka connector (Maven, into the same
# cache), the Tansu peer for the benchmark smoke test (pip, in the test
# extras). Fails loudly at the first step that goes wrong.
#
# Runs pytest on everything with PySpark 4, then a named part of the
# compatibility suite on the PostgreSQL store, another on a cluster of three
# gateways over PostgreSQL, then the Spark tests
# (compat_tests/test_spark_*.py) again in the PySpark 3.5 virtualenv. With
# ARGS, only the first run; the lines for the others are printed.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "Python packages"
python3 -m pip install --quiet --upgrade pip
python3 -m pip install --quiet -e '.[test]'

# The pyspark pin of an extra in pyproject.toml: `spark` (4.x) or `spark35`.
pyspark_pin() {
  python3 - "$1" <<'PY'
import sys, tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
[pin] = [req for req in extras[sys.argv[1]] if req.startswith("pyspark==")]
print(pin.split("==")[1])
PY
}
SPARK_VERSION="$(pyspark_pin spark)"
SPARK35_VERSION="$(pyspark_pin spark35)"
SPARK35_VENV="${KAFKA_GATEWAY_SPARK35_VENV:-$HOME/.cache/kafka-gateway/venv-pyspark-$SPARK35_VERSION}"

step "PySpark $SPARK35_VERSION (the spark35 extra) in its own virtualenv: $SPARK35_VENV"
# --system-site-packages: the venv sees the gateway, pytest and the clients
# installed above; its own pyspark (and py4j) come first.
if [ ! -x "$SPARK35_VENV/bin/python" ]; then
  python3 -m venv --system-site-packages "$SPARK35_VENV" || {
    echo "error: python3 -m venv failed: install the venv module" \
         "(Debian: apt-get install -y python3-venv)" >&2
    exit 1
  }
fi
"$SPARK35_VENV/bin/python" -m pip install --quiet "pyspark==$SPARK35_VERSION"

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

step "PostgreSQL (Debian): the throwaway servers of testkit/postgres.py"
# Only the binaries are used: each test starts its own server (initdb in a
# temporary directory, as the postgres user, on a free port) and stops it.
# Debian's package also makes a "main" cluster; it is not started here (in a
# container policy-rc.d forbids it), and if the install started it, it is
# stopped: no system service is left running.
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
  if command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters --no-header | while read -r ver cluster _port status _rest; do
      if [ "$status" = online ]; then $SUDO pg_ctlcluster "$ver" "$cluster" stop; fi
    done
  fi
fi
python3 -c 'from testkit import postgres; print("PostgreSQL", postgres.version(), "in", postgres.bin_dir())'

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

step "JVM: Java 17, Maven, and the jars of compat_tests/jvm/pom.xml and kafka4/pom.xml"
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
python3 -c 'from testkit import jvm
for pom in jvm.LINES:
    print(f"Java client {jvm.kafka_version(pom)}: jars in", jvm.resolve(pom))'

step "Spark: each PySpark line's Kafka connector (compat_tests/jvm/spark/, spark35/)"
for line in "python3 $SPARK_VERSION" "$SPARK35_VENV/bin/python $SPARK35_VERSION"; do
  read -r python version <<<"$line"
  "$python" - "$version" <<'PY'
import sys
import pyspark
from spark_jobs import session
from testkit import jvm
if pyspark.__version__ != sys.argv[1]:
    raise SystemExit(f"error: {sys.executable} imports pyspark {pyspark.__version__} "
                     f"from {pyspark.__file__}, not the pinned {sys.argv[1]}")
lib = jvm.resolve(jvm.spark_pom(pyspark.__version__))
jars = session.cached_connector(pyspark.__version__)
if jars is None:
    raise SystemExit(f"error: {lib} has no connector for pyspark {pyspark.__version__}: "
                     "the pom's spark.version must equal the pinned pyspark")
print(f"pyspark {pyspark.__version__} ({sys.executable}); connector jars in {lib}:",
      " ".join(jar.name for jar in jars))
PY
done

step "lint"
python3 -m ruff check .

step "types"
# mypy, configured in pyproject.toml ([tool.mypy]: the modules it checks, and
# how strictly), in one run: strict on tablets/, txn/ and common/, and on the
# protocol layer's handlers (handle(HandlerContext, Request[<body>]) ->
# Response, checked against apis.ApiModule), their contract and the error
# model; the storage seam's callers checked against tablets/seam.py's
# Protocols. Any error fails the run here, before the tests.
python3 -m mypy

# pytest exits 5 when it collected nothing: that is a failure too.
run_pytest() {
  local status=0
  "$@" || status=$?
  if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure" >&2
    status=1
  fi
  return "$status"
}
# Produce, consume and groups again on a cluster of three gateways over one
# PostgreSQL database (KAFKA_GATEWAY_TEST_STORE=postgresql-cluster: every
# gateway a test starts is the first of three; a start fails unless all
# three list the three in Metadata). Which modules and tests, and why the
# others are not here: docs/cluster.md, "Checked with real clients".
PG_CLUSTER_TESTS=(
  compat_tests/test_confluent_kafka.py compat_tests/test_kafka_python.py
  compat_tests/test_aiokafka.py compat_tests/test_kafkajs.py compat_tests/test_kcat.py
  compat_tests/test_java_client.py
  compat_tests/test_groups_confluent.py compat_tests/test_groups_aiokafka.py
  compat_tests/test_groups_java.py compat_tests/test_groups_kafkajs.py
  compat_tests/test_txn_confluent.py compat_tests/test_txn_kafka_python.py
  compat_tests/test_txn_java.py compat_tests/test_streams_java.py
  compat_tests/test_spark_reshard.py
  # The CLI's commands through one of the three (kafka_gateway/cluster_client.py
  # routes them to the leaders and coordinators; about 40 s).
  compat_tests/test_cli.py compat_tests/test_cli_groups.py
  # The exactly-once chaos check with kill -9 of one gateway among its faults
  # (about 2 min; its Java-worker twin stays in the main run only, for time).
  compat_tests/test_reshard_chaos.py::test_reshard_exactly_once_under_chaos
)
# Tests deselected on three gateways: none now (docs/cluster.md, "Checked
# with real clients"); the list stays, for a test that must be, with its why.
PG_CLUSTER_DESELECT=(
)
SPARK_TESTS=(compat_tests/test_spark_*.py)  # the jobs, reshard, Spark's Kafka source
SPARK35_PYTEST=(env "KAFKA_GATEWAY_EXPECT_PYSPARK=$SPARK35_VERSION" "$SPARK35_VENV/bin/python"
                -m pytest -q -p no:cacheprovider)

step "tests (PySpark $SPARK_VERSION; the Java client and Kafka Streams 3.4.1 and 4.x)"
status=0
run_pytest env "KAFKA_GATEWAY_EXPECT_PYSPARK=$SPARK_VERSION" \
  python3 -m pytest -q -p no:cacheprovider "$@" || status=$?

# A named part of the compatibility suite again, every gateway on the
# PostgreSQL store (testkit/pg_store_mode.py: one throwaway PostgreSQL for the
# run, one database per data directory; a gateway not on it fails its start).
# Which modules, and why the others are not here: docs/cluster.md, "Checked
# with real clients". Runs of a scenario against Apache Kafka alone are
# deselected there (compat_tests/conftest.py).
PG_STORE_TESTS=(
  compat_tests/test_txn_confluent.py compat_tests/test_txn_kafka_python.py
  compat_tests/test_txn_java.py compat_tests/test_txn_pending_limits_clients.py
  compat_tests/test_cli.py
  compat_tests/test_confluent_kafka.py compat_tests/test_kafka_python.py
  compat_tests/test_aiokafka.py
  compat_tests/test_groups_confluent.py compat_tests/test_groups_kafka_python.py
  compat_tests/test_groups_aiokafka.py compat_tests/test_groups_java.py
  compat_tests/test_compaction_clients.py compat_tests/test_compaction_kill.py
  compat_tests/test_compaction_differential.py compat_tests/test_compaction_streams.py
)
if [ "$#" -eq 0 ]; then
  step "the compatibility suite's transactions, produce, consume, groups and compacted topics on the PostgreSQL store"
  run_pytest env KAFKA_GATEWAY_TEST_STORE=postgresql \
    python3 -m pytest -q -p no:cacheprovider "${PG_STORE_TESTS[@]}" || status=$?

  step "the compatibility suite's produce, consume, groups, transactions, Streams EOS and the Spark reshard on three gateways over PostgreSQL"
  run_pytest env KAFKA_GATEWAY_TEST_STORE=postgresql-cluster \
    python3 -m pytest -q -p no:cacheprovider "${PG_CLUSTER_TESTS[@]}" "${PG_CLUSTER_DESELECT[@]}" \
    || status=$?

  step "the Spark tests again on PySpark $SPARK35_VERSION ($SPARK35_VENV)"
  run_pytest "${SPARK35_PYTEST[@]}" "${SPARK_TESTS[@]}" || status=$?
else
  step "not run with arguments: the PostgreSQL store's part, and PySpark $SPARK35_VERSION's:"
  echo "KAFKA_GATEWAY_TEST_STORE=postgresql python3 -m pytest -q -p no:cacheprovider ${PG_STORE_TESTS[*]}"
  echo "KAFKA_GATEWAY_TEST_STORE=postgresql-cluster python3 -m pytest -q -p no:cacheprovider" \
       "$(printf '%q ' "${PG_CLUSTER_TESTS[@]}" "${PG_CLUSTER_DESELECT[@]}")"
  echo "${SPARK35_PYTEST[*]} ${SPARK_TESTS[*]}"
fi
exit "$status"
