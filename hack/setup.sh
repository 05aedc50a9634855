#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh machine: Debian packages, the Python environment,
# the Go-built control plane binaries (cached under ~/.cache/ocm-fl, so a second run is fast).
set -euo pipefail
started=$(date +%s)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash hack/install-system-deps.sh
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# Exact versions from requirements.lock (hack/lock.sh remakes it); reinstalled when either
# file changes.
stamp=.venv/.installed-$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q -U pip setuptools wheel
  .venv/bin/pip install -q -c requirements.lock -e '.[hub,agent,workloads,cli,dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# --kubelet: also kubelet, kube-proxy, kube-scheduler, kubectl, CoreDNS and the pause image, for
# the plane's real kubelet nodes (tests/e2e/test_e2e_containers.py).
.venv/bin/python -m hack.controlplane build --kubelet
# Base images from Debian's archive and every image in deploy/images (hack/images; cached by
# content: the first run takes about 10 minutes, a run with nothing changed a few seconds).
.venv/bin/python -m hack.images build
if [ -f hack/tools/build-helm.sh ]; then
  bash hack/tools/build-helm.sh
fi
# An S3-compatible server for the model store's S3 tests (tests/integration/test_s3_store.py).
bash hack/tools/build-versitygw.sh
echo "phase setup: $(($(date +%s) - started)) s"
