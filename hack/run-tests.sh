#!/usr/bin/env bash
# Runs the whole suite: unit tests first (a unit failure shows in minutes, not after the planes),
# then two lanes at once: the fault drills, and attack, e2e and integration (real local control
# planes).
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
# Two lanes at once on their own planes: the fault drills (tests/drills, whose plane lives in
# $OCMFL_CP_DIR-drills) and everything else. Most of a plane test is waiting (rounds, timeouts,
# process starts): one lane at a time kept two cores about 40 % busy (docs/testing.md).
# The drills' output is shown when both have ended; the slowest tests of each are listed.
# Job control gives each lane a process group of its own, in which SIGINT is not ignored (it
# is, for a background job without it): Ctrl-C or a TERM to this script reaches both lanes as
# SIGINT, so each pytest ends its tests and stops their planes, as one run alone does. Their
# stdin is /dev/null: a background group that read the terminal would be stopped.
set -m
run drills --durations=15 tests/drills < /dev/null > "$reports/drills.log" 2>&1 &
drills=$!
run planes --durations=30 tests --ignore=tests/unit --ignore=tests/drills < /dev/null &
planes=$!
set +m
trap 'kill -INT -- "-$drills" "-$planes" 2>/dev/null' INT TERM

# A lane's exit status; `wait` returns early when a trapped signal comes, so wait again.
lane_wait() {
  local rc
  while :; do
    wait "$1"
    rc=$?
    kill -0 "$1" 2>/dev/null || return "$rc"
  done
}
lane_wait "$planes"
planes_rc=$?
lane_wait "$drills"
drills_rc=$?
echo "--- lane drills (run alongside the planes lane) ---"
cat "$reports/drills.log"
[ "$planes_rc" -eq 0 ] && [ "$drills_rc" -eq 0 ]
