#!/usr/bin/env bash
# Re-resolves the Python dependencies of pyproject.toml in a throw-away environment and writes
# the exact versions to requirements.lock, which hack/setup.sh installs as constraints (so a
# fresh machine gets what CI tested). Run it after changing pyproject.toml's dependencies, or to
# take newer versions, then run `make test` and commit both files.
# `--keep`: keep every version the current lock pins and resolve only what is new (a pin that
# a new dependency cannot live with must be deleted from requirements.lock first).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
env_dir=$(mktemp -d)
trap 'rm -rf "$env_dir"' EXIT
python3 -m venv "$env_dir"
"$env_dir/bin/pip" install -q -U pip setuptools wheel
constraints=()
if [ "${1:-}" = "--keep" ]; then
  grep -v '^#' requirements.lock > "$env_dir/keep.txt"
  constraints=(-c "$env_dir/keep.txt")
fi
"$env_dir/bin/pip" install -q "${constraints[@]}" ".[hub,agent,workloads,cli,dev]"
{
  echo "# Exact versions for hack/setup.sh (pip constraints). Made by hack/lock.sh; do not edit."
  "$env_dir/bin/pip" freeze --exclude-editable | grep -Ev '^ocm-federated-learning( @|==)'
} > requirements.lock
echo "requirements.lock: $(grep -vc '^#' requirements.lock) packages"
