#!/usr/bin/env bash
# Debian packages the project needs on a fresh machine (idempotent; skips when all are present).
set -euo pipefail
# Container tools (hack/images, the kubelet nodes of hack/controlplane): podman and buildah
# build the images, debootstrap makes their base from Debian's archive, containerd + runc run
# pods under a real kubelet, the CNI plugins and iptables give them networks, gcc builds the
# static pause binary of their sandboxes from Kubernetes' own pause.c.
pkgs=(nginx-light shellcheck util-linux iproute2
  podman buildah runc conmon uidmap debootstrap containerd containernetworking-plugins iptables
  gcc libc6-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# podman's defaults do not fit these machines: the open-files hard limit is 20000 and
# CAP_SYS_RESOURCE is missing (podman asks for 1048576), cgroups are v1/hybrid (crun refuses
# hybrid mode; runc works) and there is no systemd. A drop-in keeps any containers.conf as is.
conf=/etc/containers/containers.conf.d/50-ocm-fl.conf
want='[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"'
if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
  mkdir -p "$(dirname "$conf")"
  printf '%s\n' "$want" >"$conf"
fi
