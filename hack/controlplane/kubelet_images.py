"""The images real kubelet nodes run (test infrastructure): the sandbox ("pause") image built
from Kubernetes' own pause.c, and one containerd image store per set of image ids that every
node gets a hard-linked copy of (no import per node).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from hack.controlplane import build
from hack.controlplane.kubelet_spec import NODES_ROOT, PAUSE_IMAGE, NodeError


def ensure_pause_image(log_file: Path) -> None:
    """The sandbox ("pause") image: Kubernetes' own pause.c, static, in an image FROM scratch."""
    from hack.images import podman

    if podman.inspect(PAUSE_IMAGE) is not None:
        return
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{build.KUBERNETES_VERSION}"],
        cwd=build.GOMOD_DIR / "kubernetes",
        env=build._go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    src = Path(json.loads(proc.stdout or "{}").get("Dir", "/nonexistent")) / "build/pause/linux"
    if not (src / "pause.c").is_file():
        raise NodeError(f"pause.c not found in the Kubernetes module ({src}): {proc.stderr}")
    work = log_file.parent / "pause-build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run(
        [
            "gcc",
            "-Os",
            "-static",
            "-Wall",
            '-DVERSION="v3.10.1"',
            "-o",
            str(work / "pause"),
            str(src / "pause.c"),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(["strip", str(work / "pause")], check=False, capture_output=True)
    (work / "Containerfile").write_text(
        'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n'
    )
    podman.run(["build", "-t", PAUSE_IMAGE, str(work)], log_file)
    shutil.rmtree(work, ignore_errors=True)


STORE_ROOT = NODES_ROOT / "image-store"
SEED_REF = "seed.ocm-fl.local/keep"  # the previous store's images while the new ones import
# Bumped when the store's layout or recipe changes, so an old store is not reused.
STORE_FORMAT = "1"
# The bolt databases containerd writes in place: every node gets its own copy of these, and
# hard links to everything else (content blobs and unpacked layers are never written again).
STORE_DATABASES = (
    "io.containerd.metadata.v1.bolt/meta.db",
    "io.containerd.snapshotter.v1.overlayfs/metadata.db",
)


def store_key(images: dict[str, str]) -> str:
    """Key of the image store for these images (name -> image id)."""
    h = hashlib.sha256(STORE_FORMAT.encode() + b"\0")
    for name, image_id in sorted(images.items()):
        h.update(f"{name}={image_id}\0".encode())
    return h.hexdigest()[:16]


def _store_containerd_config(d: Path) -> str:
    return f"""version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/ttrpc.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"""


def _build_store(images: list[str], out: Path, log_file: Path, seed: Path | None) -> None:
    """Import and unpack `images` (from podman's store) once into a containerd root at out/root.

    A containerd of its own, in a private mount namespace (the unpack mounts stay there), with
    only what an import needs (no CRI); stopped afterwards. `seed`, the previous store's root,
    is hard-linked in first: layers it already holds (the torch base, the dependencies) are
    not unpacked again, only the changed ones; containerd drops what the old images alone used.
    """
    from hack.images import podman

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if seed is not None:
        copy_store(seed, tmp / "root")
    (tmp / "containerd.toml").write_text(_store_containerd_config(tmp))
    with log_file.open("ab") as fh:
        ctrd = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "containerd",
                "--config",
                str(tmp / "containerd.toml"),
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while not (tmp / "containerd.sock").exists():
            if ctrd.poll() is not None or time.monotonic() > deadline:
                raise NodeError(f"containerd for the image store did not start; log {log_file}")
            time.sleep(0.1)

        def ctr(*args: str, stdin: IO[bytes] | None = None) -> subprocess.CompletedProcess[str]:
            cmd = ["ctr", "--address", str(tmp / "containerd.sock"), "-n", "k8s.io", *args]
            return subprocess.run(cmd, stdin=stdin, capture_output=True, text=True, check=False)

        # An import replaces the old image of the same name at once, and containerd's garbage
        # collector can then drop the old image's layers before the new one's unpack claims the
        # ones they share ("parent snapshot ... does not exist"): keep the seed's images
        # referenced under names of their own until every import is done.
        kept = []
        for i, old in enumerate(ctr("images", "ls", "-q").stdout.split()):
            kept.append(f"{SEED_REF}/{i}:seed")
            ctr("images", "tag", old, kept[-1])
        for image in images:
            start = time.monotonic()
            save = subprocess.Popen(
                [podman.podman(), "save", "--format", "docker-archive", image],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            res = ctr("images", "import", "-", stdin=save.stdout)
            assert save.stdout is not None
            save.stdout.close()
            save_err = save.communicate()[1].decode(errors="replace")
            if save.returncode != 0 or res.returncode != 0:
                raise NodeError(
                    f"podman save {image} | ctr import: {save_err.strip()} {res.stderr.strip()}"
                )
            with log_file.open("a") as log:
                log.write(f"imported {image} in {time.monotonic() - start:.1f}s\n")
        if kept:
            ctr("images", "rm", *kept)  # now containerd drops what only the old images used
    finally:
        os.killpg(ctrd.pid, signal.SIGTERM)
        try:
            ctrd.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(ctrd.pid, signal.SIGKILL)
            ctrd.wait()
    for name in ("state", "opt", "containerd.sock", "ttrpc.sock", "containerd.toml"):
        path = tmp / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    (tmp / "images.json").write_text(json.dumps(images))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


@contextlib.contextmanager
def image_store(images: list[str], log_file: Path) -> Iterator[Path]:
    """A containerd root holding `images`, imported and unpacked once per set of image ids.

    Importing the 1.5 GB workload image into one containerd takes minutes here; every node
    instead gets a hard-linked copy of this root (`copy_store`), which takes about a second.
    The store stays under NODES_ROOT for the next plane until an image changes; then the new
    one replaces it. While the yielded path is in use a shared lock keeps it in place.
    """
    from hack.images import podman

    STORE_ROOT.mkdir(parents=True, exist_ok=True)
    key = store_key({i: podman.image_id(i) for i in images})
    store = STORE_ROOT / key
    with (STORE_ROOT / "store.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (store / "images.json").is_file():
            seeds = [d for d in STORE_ROOT.iterdir() if (d / "images.json").is_file()]
            seed = max(seeds, key=lambda d: d.stat().st_mtime, default=None)
            try:
                _build_store(images, store, log_file, None if seed is None else seed / "root")
            except NodeError as err:
                if seed is None:
                    raise
                # Seen once: containerd refused a seeded import ("parent snapshot ... does not
                # exist"); the seed only saves time, so build the store from nothing instead.
                with log_file.open("a") as fh:
                    fh.write(f"seeded import failed ({err}); importing without a seed\n")
                _build_store(images, store, log_file, None)
            for old in STORE_ROOT.iterdir():
                if old.is_dir() and old != store:
                    shutil.rmtree(old, ignore_errors=True)
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield store / "root"


def copy_store(store_root: Path, dest: Path) -> None:
    """A node's containerd root: hard links to the store, own copies of its databases."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(store_root), str(dest)], check=True, capture_output=True)
    for rel in STORE_DATABASES:
        db = dest / rel
        if db.is_file():
            tmp = db.with_name(db.name + ".copy")
            shutil.copy2(db, tmp)
            os.replace(tmp, db)


def node_images() -> list[str]:
    """Images every node gets: those hack.images built (OCMFL_KUBELET_IMAGES: a comma list)."""
    from hack.images import deploy, podman

    env = os.environ.get("OCMFL_KUBELET_IMAGES")
    names = [n for n in env.split(",") if n] if env is not None else [i.tag for i in deploy.IMAGES]
    return [n for n in names if podman.inspect(n) is not None]
