#!/usr/bin/env bash
# Install everything the test suite needs, then run all of it.
#
#   ./tests/run_all.sh            # from the repository root, on a fresh machine
#
# Installs: the gateway with its test extras (pip), Debian's kcat (apt-get),
# kafkajs (npm), the Tansu peer for the benchmark smoke test (pip, in the
# test extras). Fails loudly at the first step that goes wrong.
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

step "kafkajs (npm)"
(cd compat_tests/js && npm ci --no-audit --no-fund --loglevel=error)

step "lint"
python3 -m ruff check .

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
