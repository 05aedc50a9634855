#!/usr/bin/env bash
# Runs the whole suite: unit, integration (real local control plane), federation and e2e.
# pytest's exit code 5 ("no tests collected") is a failure here, as it should be.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
# The 30 slowest tests are listed at the end: CI must stay under 45 min warm.
.venv/bin/pytest -p no:cacheprovider --timeout=900 --durations=30 "$@" tests
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
