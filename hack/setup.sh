#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh machine: Debian packages, the Python environment,
# the Go-built control plane binaries (cached under ~/.cache/ocm-fl, so a second run is fast).
set -euo pipefail
started=$(date +%s)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash hack/install-system-deps.sh
# .venv: this clone's code over the exact versions of requirements.lock, kept once per lock
# under ~/.cache/ocm-fl/venv (hack/venv.sh; hack/lock.sh remakes the lock).
bash hack/venv.sh
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
