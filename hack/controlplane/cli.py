"""Command line of the local control plane (test infrastructure)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from hack.controlplane import (
    build,
    kubelet,
    kubelet_images,
    kubelet_spec,
    plane,
    processes,
    supervisor,
)
from hack.images.podman import ImageError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hack.controlplane",
        description="Local OCM control plane (test infrastructure)",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_build = sub.add_parser(
        "build", help="build etcd, kube-apiserver, controller-manager, OCM (cached)"
    )
    p_build.add_argument(
        "--kubelet",
        action="store_true",
        help="also what `up --kubelet` needs: kubelet, kube-proxy, kube-scheduler, kubectl, "
        "CoreDNS and the pause image",
    )
    p_up = sub.add_parser("up", help="start the plane (reuses a healthy one)")
    p_up.add_argument("--clusters", type=int, default=2)
    p_up.add_argument(
        "--no-ocm",
        action="store_true",
        help="Kubernetes and local nodes only (no OCM controllers or agents, no clusters)",
    )
    p_up.add_argument(
        "--kubelet",
        action="store_true",
        help="real kubelet + containerd nodes running the images (hack.images) as containers",
    )
    sub.add_parser("down", help="stop everything and remove the state")
    p_st = sub.add_parser("status", help="what runs, ports, memory")
    p_st.add_argument("--json", action="store_true")
    p_sv = sub.add_parser("supervise", help=argparse.SUPPRESS)
    p_sv.add_argument("--state-dir", required=True)
    args = ap.parse_args(argv)

    try:
        if args.cmd == "build":
            times = build.build_all(echo=True)
            for name, secs in times.items():
                print(f"{name}: {'cached' if secs == 0 else f'{secs:.0f}s'}")
            crds = build.crd_files()
            print(f"OCM CRDs: {len(crds)} files from {crds[0].parents[2]}")
            if args.kubelet:
                secs = kubelet.build_binaries()
                print(f"kubelet nodes: {'cached' if secs == 0 else f'{secs:.0f}s'}")
                kubelet_images.ensure_pause_image(build.log_dir() / "pause-image.log")
                print(f"pause image: {kubelet_spec.PAUSE_IMAGE}")
            return 0
        if args.cmd == "up":
            st = plane.up(
                args.clusters,
                echo=True,
                ocm=not args.no_ocm,
                kubelet=args.kubelet,
            )
            print(plane.status_report()[1])
            for k, v in plane.kubeconfig_env(st).items():
                print(f"export {k}={v}")
            return 0
        if args.cmd == "down":
            print("stopped" if plane.down() else "nothing was running; state cleaned")
            return 0
        if args.cmd == "status":
            if args.json:
                loaded = processes.State.load()
                print(json.dumps(asdict(loaded) if loaded else None, indent=2))
                return 0 if loaded else 1
            ok, text = plane.status_report()
            print(text)
            return 0 if ok else 1
        if args.cmd == "supervise":
            return supervisor.run(Path(args.state_dir))
    except (
        build.BuildError,
        processes.ComponentFailed,
        plane.PlaneError,
        kubelet_spec.NodeError,
        ImageError,
    ) as e:
        print(f"error: {e}")
        return 1
    return 2
