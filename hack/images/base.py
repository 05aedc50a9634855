"""Base images made from Debian's archive: no registry is reachable, so no `FROM python:...`.

``python``: ``debootstrap --variant=minbase`` of Debian trixie with python3, python3-venv and
python-is-python3, imported into podman, then made slim and current by ``base.Containerfile``
(squashed to one layer). ``python-torch``: that plus Debian's CPU-only torch
(``python-torch.Containerfile``), for the workload image.

Each image carries the hash of its recipe as a label; a recipe that has not changed is not
rebuilt, so a warm run takes well under a second per image.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hack.images import podman
from hack.images.podman import ImageError

HERE = Path(__file__).resolve().parent
SUITE = "trixie"
PACKAGES = ("python3", "python3-venv", "python-is-python3")
PYTHON_BASE = f"localhost/ocm-fl-base/python:3-{SUITE}"
TORCH_BASE = f"localhost/ocm-fl-base/python-torch:3-{SUITE}"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY_MIRROR = "http://deb.debian.org/debian-security"


@dataclass(frozen=True)
class Mirrors:
    main: str
    security: str


def _apt_uris() -> list[str]:
    """Archive URIs this machine's apt uses (one-line and deb822 sources)."""
    uris: list[str] = []
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        uris += re.findall(r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M)
        uris += [u for line in re.findall(r"^URIs:\s*(.+)$", text, re.M) for u in line.split()]
    return uris


def mirrors() -> Mirrors:
    """The Debian mirror apt is configured with here (``OCMFL_DEBIAN_MIRROR`` overrides)."""
    main = os.environ.get("OCMFL_DEBIAN_MIRROR")
    security = os.environ.get("OCMFL_DEBIAN_SECURITY_MIRROR")
    uris = _apt_uris()
    if not main:
        main = next((u.rstrip("/") for u in uris if re.search(r"/debian/?$", u)), DEFAULT_MIRROR)
    if not security:
        security = next(
            (u.rstrip("/") for u in uris if re.search(r"/debian-security/?$", u)),
            DEFAULT_SECURITY_MIRROR,
        )
    return Mirrors(main, security)


def python_key(m: Mirrors) -> str:
    h = hashlib.sha256()
    for part in (SUITE, m.main, m.security, " ".join(PACKAGES)):
        h.update(part.encode() + b"\0")
    h.update((HERE / "base.Containerfile").read_bytes())
    return h.hexdigest()[:32]


def torch_key(m: Mirrors) -> str:
    h = hashlib.sha256(python_key(m).encode())
    h.update((HERE / "python-torch.Containerfile").read_bytes())
    return h.hexdigest()[:32]


def _debootstrap() -> str:
    path = shutil.which("debootstrap")
    if path is None:
        raise ImageError("debootstrap not found: run `bash hack/install-system-deps.sh`")
    return path


def build_python_base(log_dir: Path, *, force: bool = False) -> float:
    """Build PYTHON_BASE unless its recipe is unchanged; returns seconds spent (0.0 if cached)."""
    m = mirrors()
    key = python_key(m)
    if not force and podman.cache_key(PYTHON_BASE) == key:
        return 0.0
    start = time.monotonic()
    log = log_dir / "base-python.log"
    log.write_text("")
    scratch = Path(tempfile.mkdtemp(prefix="ocm-fl-rootfs-", dir="/var/tmp"))
    rootfs_image = f"localhost/ocm-fl-base/rootfs:{key[:12]}"
    try:
        with log.open("ab") as fh:
            cmd = [
                _debootstrap(),
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(scratch / "rootfs"),
                m.main,
            ]
            fh.write(("$ " + " ".join(cmd) + "\n").encode())
            fh.flush()
            rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT)
        if rc != 0:
            raise ImageError(f"debootstrap {SUITE} from {m.main} failed (rc={rc}); log {log}")
        tar = subprocess.run(
            ["tar", "-C", str(scratch / "rootfs"), "--numeric-owner", "-c", "."],
            capture_output=True,
            check=True,
        ).stdout
        podman.run(["import", "-", rootfs_image], input_bytes=tar)
        shutil.rmtree(scratch, ignore_errors=True)
        podman.run(
            [
                "build",
                "--squash-all",
                "--network=host",
                "-f",
                str(HERE / "base.Containerfile"),
                "--build-arg",
                f"ROOTFS={rootfs_image}",
                "--build-arg",
                f"SUITE={SUITE}",
                "--build-arg",
                f"MIRROR={m.main}",
                "--build-arg",
                f"SECURITY_MIRROR={m.security}",
                "--label",
                f"{podman.CACHE_LABEL}={key}",
                "-t",
                PYTHON_BASE,
                str(HERE),
            ],
            log,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        subprocess.run(
            [podman.podman(), "rmi", "-f", rootfs_image], capture_output=True, check=False
        )
    return time.monotonic() - start


def build_torch_base(log_dir: Path, *, force: bool = False) -> float:
    """Build TORCH_BASE (PYTHON_BASE + Debian's CPU torch) unless unchanged; seconds spent."""
    key = torch_key(mirrors())
    if not force and podman.cache_key(TORCH_BASE) == key:
        return 0.0
    start = time.monotonic()
    log = log_dir / "base-python-torch.log"
    log.write_text("")
    podman.run(
        [
            "build",
            "--network=host",
            "-f",
            str(HERE / "python-torch.Containerfile"),
            "--build-arg",
            f"PYTHON_IMAGE={PYTHON_BASE}",
            "--label",
            f"{podman.CACHE_LABEL}={key}",
            "-t",
            TORCH_BASE,
            str(HERE),
        ],
        log,
    )
    return time.monotonic() - start
