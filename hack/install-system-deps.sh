#!/usr/bin/env bash
# Debian packages the project needs on a fresh machine (idempotent; skips when all are present).
set -euo pipefail
pkgs=(nginx-light shellcheck util-linux iproute2)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
