#!/usr/bin/env bash
# Debian packages the project needs on a fresh machine (idempotent; skips when all are present).
set -euo pipefail
# Container tools (hack/images, the kubelet nodes of hack/controlplane): podman and buildah
# build the images, debootstrap makes their base from Debian's archive, containerd + runc run
# pods under a real kubelet, the CNI plugins and iptables give them networks, gcc builds the
# static pause binary of their sandboxes from Kubernetes' own pause.c. prometheus (its
# promtool too) scrapes the hub's /metrics and evaluates the chart's alert rules in the tests.
pkgs=(nginx-light shellcheck util-linux iproute2
  podman buildah runc conmon uidmap debootstrap containerd containernetworking-plugins iptables
  gcc libc6-dev prometheus)
# One dpkg-query for all of them (a `dpkg -s` each took 0.5 s, paid by every `make demo`).
installed=$'\n'$(dpkg-query -W -f='${Package} ${Status}\n' "${pkgs[@]}" 2>/dev/null || true)$'\n'
missing=()
for p in "${pkgs[@]}"; do
  [[ $installed == *$'\n'"$p install ok installed"$'\n'* ]] || missing+=("$p")
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

# A kubelet (cAdvisor, its cert watcher, the plugin prober) and containerd each take inotify
# instances; with several planes and kopf processes the kernel default of 128 per user runs
# out and a kubelet node never gets Ready ("inotify_init: too many open files"). Raise it
# where the kernel lets us; say so where it does not.
for kv in fs.inotify.max_user_instances=8192 fs.inotify.max_user_watches=524288; do
  key=${kv%%=*} want_v=${kv#*=}
  have=$(sysctl -n "$key" 2>/dev/null || echo 0)
  if [ "$have" -lt "$want_v" ]; then
    sysctl -qw "$kv" 2>/dev/null || echo "warning: could not raise $key to $want_v (is $have); kubelet nodes may not get Ready" >&2
  fi
done
