#!/usr/bin/env bash
# Runs the whole suite: the unit tests in front (a unit failure shows and stops the run in about a
# minute), and at the same time two lanes of tests on real local control planes.
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

# The full suite leaves a few slow plane tests to other commits, each covered on every commit
# by others (hack/rotation.py, docs/testing.md "Rotation"); OCMFL_ROTATION=all runs them all.
export OCMFL_ROTATION=${OCMFL_ROTATION:-commit}

# Two lanes on real local control planes, started at once with the unit tests:
# - drills: the fault drills (their plane in $OCMFL_CP_DIR-drills), then the container test
#   (real kubelets, its own plane in $OCMFL_CP_DIR-kubelet); it is here for balance, both lanes
#   take about as long (docs/testing.md);
# - planes: attack, e2e and integration, on the session plane and $OCMFL_CP_DIR-e2e.
# Most of a plane test is waiting (rounds, timeouts, process starts): one lane at a time kept two
# cores about 40 % busy. The unit tests need no plane and are mostly CPU: they run in front while
# the lanes start their planes, and a unit failure stops both lanes within seconds.
# Job control gives each lane a process group of its own, in which SIGINT is not ignored (it
# is, for a background job without it): Ctrl-C or a TERM to this script, or a unit failure,
# reaches each lane as SIGINT, so its pytest ends its tests and stops its planes, as one run
# alone does. Their stdin is /dev/null: a background group that read the terminal would be
# stopped. Each lane writes its own log; the planes lane's is shown as it grows once the unit
# tests are done, the drills lane's when both have ended.
set -m
run drills --durations=15 tests/drills tests/e2e/test_e2e_containers.py \
  < /dev/null > "$reports/drills.log" 2>&1 &
drills=$!
run planes --durations=30 tests --ignore=tests/unit --ignore=tests/drills \
  --ignore=tests/e2e/test_e2e_containers.py < /dev/null > "$reports/planes.log" 2>&1 &
planes=$!
set +m
stop_lanes() { kill -INT -- "-$drills" "-$planes" 2>/dev/null; }
trap stop_lanes INT TERM

# A lane's exit status; `wait` returns early when a trapped signal comes, so wait again.
lane_wait() {
  local rc
  while :; do
    wait "$1"
    rc=$?
    kill -0 "$1" 2>/dev/null || return "$rc"
  done
}

run unit --durations=10 tests/unit < /dev/null
unit_rc=$?
if [ "$unit_rc" -ne 0 ]; then
  echo "unit tests failed: stopping both lanes" >&2
  stop_lanes
fi
tail -n +1 -f --pid="$planes" "$reports/planes.log"
lane_wait "$planes"
planes_rc=$?
lane_wait "$drills"
drills_rc=$?
echo "--- lane drills (run alongside the planes lane) ---"
cat "$reports/drills.log"
[ "$unit_rc" -eq 0 ] && [ "$planes_rc" -eq 0 ] && [ "$drills_rc" -eq 0 ]
