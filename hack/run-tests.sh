#!/usr/bin/env bash
# Runs the whole suite: unit tests first (a unit failure shows in minutes, not after the planes),
# then integration (real local control plane), attack, federation, drills and e2e.
# Arguments, when given, go to one pytest run instead (e.g. `bash hack/run-tests.sh -m attack`).
# pytest's exit code 5 ("no tests collected") is a failure here, as it should be, and so is a
# skip (OCMFL_NO_SKIPS=1, tests/conftest.py): the set-up installs every tool a test needs.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
export OCMFL_NO_SKIPS=1

# Every test's duration, per phase, as JUnit XML (the log lists only the slowest).
reports=${OCMFL_TEST_REPORTS:-$root/out/test-reports}
mkdir -p "$reports"

run() {
  local phase=$1 start rc
  shift
  start=$(date +%s)
  .venv/bin/pytest -p no:cacheprovider --timeout=900 --junitxml="$reports/$phase.xml" "$@"
  rc=$?
  echo "phase ${phase}: $(($(date +%s) - start)) s (pytest exit ${rc})"
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
    return 1
  fi
  return "$rc"
}

if [ "$#" -gt 0 ]; then
  run pytest "$@"
  exit $?
fi
run unit --durations=10 tests/unit || exit $?
# The 30 slowest tests are listed at the end: CI must stay under 45 min warm.
run planes --durations=30 tests --ignore=tests/unit
