#!/usr/bin/env bash
# Re-resolves the Python dependencies of pyproject.toml in a throw-away environment and writes
# the exact versions to requirements.lock, which hack/setup.sh installs as constraints (so a
# fresh machine gets what CI tested). Run it after changing pyproject.toml's dependencies, or to
# take newer versions, then run `make test` and commit both files.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
env_dir=$(mktemp -d)
trap 'rm -rf "$env_dir"' EXIT
python3 -m venv "$env_dir"
"$env_dir/bin/pip" install -q -U pip setuptools wheel
"$env_dir/bin/pip" install -q ".[hub,agent,workloads,cli,dev]"
{
  echo "# Exact versions for hack/setup.sh (pip constraints). Made by hack/lock.sh; do not edit."
  "$env_dir/bin/pip" freeze --exclude-editable | grep -v '^ocm-federated-learning=='
} > requirements.lock
echo "requirements.lock: $(grep -vc '^#' requirements.lock) packages"
