"""Build the images in deploy/images/ with the Dockerfiles a user builds them with.

Only the base image differs from a user's build: here it comes from Debian's archive
(hack/images/base.py) and is passed as the Dockerfile's own build argument; the Dockerfiles
keep their public defaults. Each image is labelled with a hash of everything its build reads
(Dockerfile, build arguments, base image id, the files its COPY lines name, minus
.dockerignore); an image whose hash is unchanged is not rebuilt.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from hack.images import base, podman
from ocmfl import constants

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ROOT / "deploy" / "images"
# pip inside a build goes through this machine's TLS-intercepting egress proxy; Debian's pip
# uses the system bundle, so the host's bundle is mounted (read-only, never copied in).
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@dataclass(frozen=True)
class DeployImage:
    """One Dockerfile in deploy/images and how it is built here."""

    name: str  # addon, workload
    tag: str  # the image name the chart, the controller and the local nodes use
    base_args: dict[str, str] = field(default_factory=dict)  # build arg -> base image here
    args: dict[str, str] = field(default_factory=dict)  # other build args set here

    @property
    def dockerfile(self) -> Path:
        return DOCKERFILES / f"{self.name}.Dockerfile"


# PyTorch's CPU wheel index (the Dockerfile's default) is not reachable here. The base image
# already has Debian's CPU torch; pip only adds the versions of torch's own dependencies that
# its metadata pins (e.g. sympy), from the index pip uses for everything else.
PYPI_INDEX = "https://pypi.org/simple"

IMAGES: tuple[DeployImage, ...] = (
    DeployImage("addon", constants.ADDON_IMAGE, {"PYTHON_IMAGE": base.PYTHON_BASE}),
    DeployImage(
        "workload",
        constants.WORKLOAD_IMAGE,
        {"PYTHON_IMAGE": base.TORCH_BASE},
        {"TORCH_INDEX": PYPI_INDEX},
    ),
)


def by_name(name: str) -> DeployImage:
    for img in IMAGES:
        if img.name == name:
            return img
    raise KeyError(f"no image {name!r}; known: {', '.join(i.name for i in IMAGES)}")


def dockerfile_instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def copy_sources(dockerfile: Path) -> list[str]:
    """Context paths the Dockerfile's COPY lines read (COPY --from=<stage> excluded)."""
    srcs: list[str] = []
    for word, rest in dockerfile_instructions(dockerfile):
        if word not in ("COPY", "ADD"):
            continue
        parts = rest.split()
        if any(p.startswith("--from") for p in parts):
            continue
        args = [p for p in parts if not p.startswith("--")]
        srcs += args[:-1]
    return srcs


def _ignore_patterns() -> list[str]:
    f = ROOT / ".dockerignore"
    if not f.is_file():
        return []
    lines = (ln.strip() for ln in f.read_text().splitlines())
    return [ln.rstrip("/") for ln in lines if ln and not ln.startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        bare = pat[3:] if pat.startswith("**/") else None
        for pre in prefixes:
            if fnmatch.fnmatchcase(pre, pat):
                return True
            if bare is not None and fnmatch.fnmatchcase(pre.rsplit("/", 1)[-1], bare):
                return True
    return False


def context_files(dockerfile: Path) -> list[Path]:
    """Every file the build copies from the context, sorted, .dockerignore applied."""
    patterns = _ignore_patterns()
    files: set[Path] = set()
    for src in copy_sources(dockerfile):
        p = ROOT / src
        found = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
        files.update(f for f in found if not _ignored(str(f.relative_to(ROOT)), patterns))
    return sorted(files)


def build_args(img: DeployImage) -> dict[str, str]:
    return {**img.base_args, **img.args}


def content_key(img: DeployImage) -> str:
    """Hash of everything the build of `img` reads."""
    h = hashlib.sha256(img.dockerfile.read_bytes())
    for k, v in sorted(img.base_args.items()):
        h.update(f"{k}={v}={podman.image_id(v)}\0".encode())
    for k, v in sorted(img.args.items()):
        h.update(f"{k}={v}\0".encode())
    for f in context_files(img.dockerfile):
        h.update(str(f.relative_to(ROOT)).encode() + b"\0")
        h.update(f"{os.stat(f).st_mode & 0o111}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:32]


def build(img: DeployImage, log_dir: Path, *, force: bool = False) -> float:
    """Build one image unless its content key is unchanged; seconds spent (0.0 if cached)."""
    key = content_key(img)
    if not force and podman.cache_key(img.tag) == key:
        return 0.0
    start = time.monotonic()
    log = log_dir / f"image-{img.name}.log"
    log.write_text("")
    args = ["build", "--network=host", "-f", str(img.dockerfile)]
    for k, v in build_args(img).items():
        args += ["--build-arg", f"{k}={v}"]
    if CA_BUNDLE.is_file():
        args += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    args += ["--label", f"{podman.CACHE_LABEL}={key}", "-t", img.tag, str(ROOT)]
    before = podman.inspect(img.tag)
    podman.run(args, log)
    if before is not None and before["Id"] != podman.image_id(img.tag):
        # The image this one replaces is now untagged; the layer cache keeps what is reused.
        subprocess.run([podman.podman(), "rmi", before["Id"]], capture_output=True, check=False)
    return time.monotonic() - start
