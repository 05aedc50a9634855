#!/usr/bin/env bash
# Builds versitygw (an S3-compatible server; the S3 model-store tests run against it) from the
# Go module registry at the version pinned in hack/tools/gomod/versitygw/go.mod, into
# ~/.cache/ocm-fl/bin/versitygw-<version>/versitygw. Skips the build when that binary exists.
# Prints the binary's path on stdout.
set -euo pipefail
# shellcheck source=SCRIPTDIR/gotool.sh
. "$(dirname "$0")/gotool.sh"
pinned_tool versitygw github.com/versity/versitygw
cd "$mod"
# -mod=mod: the wrapper's go.sum is the pin; a fresh module cache downloads what it lists.
GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/versitygw.tmp" \
  github.com/versity/versitygw/cmd/versitygw
mv "$out/versitygw.tmp" "$out/versitygw"
echo "$out/versitygw"
