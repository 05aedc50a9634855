#!/usr/bin/env bash
# Builds versitygw (an S3-compatible server; the S3 model-store tests run against it) from the
# Go module registry at the version pinned in hack/tools/gomod/versitygw/go.mod, into
# ~/.cache/ocm-fl/bin/versitygw-<version>/versitygw. Skips the build when that binary exists.
# Prints the binary's path on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
mod="$root/hack/tools/gomod/versitygw"
version=$(awk '$1 == "github.com/versity/versitygw" {print $2; exit}' "$mod/go.mod")
if [ -z "$version" ]; then
  echo "build-versitygw.sh: no github.com/versity/versitygw version in $mod/go.mod" >&2
  exit 1
fi
out="${OCMFL_CACHE:-$HOME/.cache/ocm-fl}/bin/versitygw-$version"
if [ -x "$out/versitygw" ]; then
  echo "$out/versitygw"
  exit 0
fi
mkdir -p "$out"
cd "$mod"
echo "building versitygw $version into $out (first time only)" >&2
# -mod=mod: the wrapper's go.sum is the pin; a fresh module cache downloads what it lists.
GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/versitygw.tmp" \
  github.com/versity/versitygw/cmd/versitygw
mv "$out/versitygw.tmp" "$out/versitygw"
echo "$out/versitygw"
