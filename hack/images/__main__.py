"""`python -m hack.images build|sizes` (`make images`): base images and deploy/images, cached."""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
import time
from pathlib import Path

from hack.images import base, deploy, podman


def log_dir() -> Path:
    d = Path.home() / ".cache" / "ocm-fl" / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def build_all(names: list[str] | None = None, *, force: bool = False) -> dict[str, float]:
    """Build the base images, then the named deploy images (all by default); seconds each.

    One builder at a time per machine (an flock): a second one waits, then finds the images
    the first one built cached instead of building them again beside it.
    """
    with (log_dir() / "images.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_all(names, force=force)


def _build_all(names: list[str] | None, *, force: bool) -> dict[str, float]:
    logs = log_dir()
    times: dict[str, float] = {}
    wanted = [deploy.by_name(n) for n in names] if names else list(deploy.IMAGES)
    times["base/python"] = base.build_python_base(logs, force=force)
    if any(base.TORCH_BASE in img.base_args.values() for img in wanted):
        times["base/python-torch"] = base.build_torch_base(logs, force=force)
    for img in wanted:
        times[img.name] = deploy.build(img, logs, force=force)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hack.images", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_build = sub.add_parser("build", help="build what changed (base images, deploy/images)")
    p_build.add_argument("names", nargs="*", help="addon, workload (default: all)")
    p_build.add_argument("--force", action="store_true", help="rebuild even when cached")
    p_sizes = sub.add_parser("sizes", help="size of every built image")
    p_sizes.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            start = time.monotonic()
            for name, secs in build_all(args.names or None, force=args.force).items():
                print(f"{name}: {'cached' if secs == 0 else f'built in {secs:.0f}s'}", flush=True)
            print(f"images ready in {time.monotonic() - start:.1f}s")
            return 0
        sizes = {
            name: podman.size_bytes(name)
            for name in (base.PYTHON_BASE, base.TORCH_BASE, *(i.tag for i in deploy.IMAGES))
            if podman.inspect(name) is not None
        }
        if args.json:
            print(json.dumps(sizes, indent=2))
        else:
            for name, size in sizes.items():
                print(f"{size / 1e6:8.1f} MB  {name}")
        return 0
    except podman.ImageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
