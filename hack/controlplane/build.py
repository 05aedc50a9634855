"""Build the control-plane binaries from the Go module registry, cached by version.

Binaries land in ``~/.cache/ocm-fl/bin/<component>-<version>/`` (override the root with
``OCMFL_BIN_DIR``); a component whose binaries all exist is skipped, so a warm run takes seconds.
The wrapper modules in ``hack/controlplane/gomod/`` pin every version (go.mod + go.sum).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ETCD_VERSION = "v3.6.16"
KUBERNETES_VERSION = "v1.35.4"
OCM_VERSION = "v1.2.0"
OCM_API_MODULE = "open-cluster-management.io/api"
OCM_API_VERSION = "v1.2.0"  # must match the OCM release the controllers come from

GOMOD_DIR = Path(__file__).resolve().parent / "gomod"
GO_ENV = {"GONOSUMDB": "open-cluster-management.io,sigs.k8s.io/about-api", "GOFLAGS": "-mod=mod"}

# Substrings in `go` output that mean the module proxy refused or lacks a module version.
_REFUSED_MARKERS = (
    "403 Forbidden",
    "404 Not Found",
    "410 Gone",
    "unknown revision",
    "invalid version",
    "reading https://",
    "dial tcp",
    "no such host",
)


class BuildError(RuntimeError):
    """A component could not be built; the message names it and points at its log."""


def bin_root() -> Path:
    """Root of the version-keyed binary cache."""
    env = os.environ.get("OCMFL_BIN_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ocm-fl" / "bin"


@dataclass(frozen=True)
class Component:
    """One `go build` invocation producing one or more binaries in one directory."""

    name: str
    version: str
    module_dir: str  # under gomod/
    packages: tuple[str, ...]
    ldflags: str

    @property
    def out_dir(self) -> Path:
        return bin_root() / f"{self.name}-{self.version}"

    @property
    def binaries(self) -> dict[str, Path]:
        """Binary name -> path (the last element of each package path, or the output name)."""
        if len(self.packages) == 1 and self.name == "etcd":
            return {"etcd": self.out_dir / "etcd"}
        return {p.rsplit("/", 1)[-1]: self.out_dir / p.rsplit("/", 1)[-1] for p in self.packages}

    def built(self) -> bool:
        return all(p.is_file() and os.access(p, os.X_OK) for p in self.binaries.values())

    def build_command(self) -> list[str]:
        # A single package is built to a file path; several go to a directory (trailing slash).
        out = str(self.out_dir / "etcd") if self.name == "etcd" else f"{self.out_dir}/"
        return ["go", "build", "-trimpath", "-ldflags", self.ldflags, "-o", out, *self.packages]


def _k8s_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    return (
        f"-s -w -X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor}"
    )


COMPONENTS: tuple[Component, ...] = (
    Component("etcd", ETCD_VERSION, "etcd", ("go.etcd.io/etcd/server/v3",), "-s -w"),
    Component(
        "kubernetes",
        KUBERNETES_VERSION,
        "kubernetes",
        ("k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager"),
        _k8s_ldflags(KUBERNETES_VERSION),
    ),
    Component(
        "ocm",
        OCM_VERSION,
        "ocm",
        tuple(
            f"open-cluster-management.io/ocm/cmd/{c}"
            for c in ("placement", "work", "addon", "registration")
        ),
        "-s -w",
    ),
)


def binary(name: str) -> Path:
    """Path of a built binary by name (`etcd`, `kube-apiserver`, `placement`, `work`, ...)."""
    for comp in COMPONENTS:
        if name in comp.binaries:
            return comp.binaries[name]
    raise KeyError(name)


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "Go toolchain not found on PATH: install Go >= 1.26 (https://go.dev/dl/) to build "
            "etcd, kube-apiserver and the OCM controllers"
        )
    return go


def _go_env() -> dict[str, str]:
    return {**os.environ, **GO_ENV}


def log_dir() -> Path:
    d = bin_root().parent / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def build_component(comp: Component, *, force: bool = False) -> float:
    """Build one component unless already built; returns seconds spent (0.0 when skipped)."""
    if comp.built() and not force:
        return 0.0
    cmd = comp.build_command()
    cmd[0] = _go()
    comp.out_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir() / f"build-{comp.name}-{comp.version}.log"
    start = time.monotonic()
    with log.open("w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        rc = subprocess.call(
            cmd, cwd=GOMOD_DIR / comp.module_dir, env=_go_env(), stdout=fh, stderr=subprocess.STDOUT
        )
    if rc != 0:
        text = log.read_text(errors="replace")
        tail = "\n".join(text.splitlines()[-15:])
        if any(m in text for m in _REFUSED_MARKERS):
            raise BuildError(
                f"{comp.name} {comp.version}: the Go module registry refused or lacks a module "
                f"(see {log}):\n{tail}"
            )
        raise BuildError(
            f"{comp.name} {comp.version}: go build failed (rc={rc}, log {log}):\n{tail}"
        )
    if not comp.built():
        raise BuildError(
            f"{comp.name} {comp.version}: go build succeeded but binaries missing "
            f"in {comp.out_dir} (log {log})"
        )
    return time.monotonic() - start


def build_all(*, force: bool = False, echo: bool = False) -> dict[str, float]:
    """Build every component (skipping cached ones); returns seconds per component."""
    times: dict[str, float] = {}
    for comp in COMPONENTS:
        if echo:
            state = "cached" if comp.built() and not force else "building"
            print(f"{comp.name} {comp.version}: {state} -> {comp.out_dir}", flush=True)
        times[comp.name] = build_component(comp, force=force)
    return times


def missing_binaries() -> list[str]:
    """Names of binaries not yet built."""
    return [n for c in COMPONENTS for n, p in c.binaries.items() if not p.is_file()]


# --- CRDs from the OCM api module ----------------------------------------------------------

# Relative to the api module root; the set the hub needs and the subset each cluster needs.
HUB_CRDS: tuple[str, ...] = (
    "cluster/v1/0000_00_clusters.open-cluster-management.io_managedclusters.crd.yaml",
    "cluster/v1beta2/0000_00_clusters.open-cluster-management.io_managedclustersets.crd.yaml",
    "cluster/v1beta2/0000_01_clusters.open-cluster-management.io_managedclustersetbindings.crd.yaml",
    "cluster/v1beta1/0000_02_clusters.open-cluster-management.io_placements.crd.yaml",
    "cluster/v1beta1/0000_03_clusters.open-cluster-management.io_placementdecisions.crd.yaml",
    "cluster/v1alpha1/0000_05_clusters.open-cluster-management.io_addonplacementscores.crd.yaml",
    "cluster/v1alpha1/0000_02_clusters.open-cluster-management.io_clusterclaims.crd.yaml",
    "work/v1/0000_00_work.open-cluster-management.io_manifestworks.crd.yaml",
    "work/v1/0000_01_work.open-cluster-management.io_appliedmanifestworks.crd.yaml",
    "work/v1alpha1/0000_00_work.open-cluster-management.io_manifestworkreplicasets.crd.yaml",
    # Addon CRDs: the v1alpha1-only files (the stored version). The v1beta1 files also serve
    # v1beta1 but with conversion strategy None (fields silently not renamed) unless the addon
    # webhook is run, so they are not used here.
    "addon/v1alpha1/0000_00_addon.open-cluster-management.io_clustermanagementaddons.crd.yaml",
    "addon/v1alpha1/0000_01_addon.open-cluster-management.io_managedclusteraddons.crd.yaml",
    "addon/v1alpha1/0000_02_addon.open-cluster-management.io_addondeploymentconfigs.crd.yaml",
    "addon/v1alpha1/0000_03_addon.open-cluster-management.io_addontemplates.crd.yaml",
)
CLUSTER_CRDS: tuple[str, ...] = (
    "cluster/v1alpha1/0000_02_clusters.open-cluster-management.io_clusterclaims.crd.yaml",
    "work/v1/0000_01_work.open-cluster-management.io_appliedmanifestworks.crd.yaml",
)


def api_module_dir() -> Path:
    """Download (or find in the module cache) the OCM api module; return its directory."""
    proc = subprocess.run(
        [_go(), "mod", "download", "-json", f"{OCM_API_MODULE}@{OCM_API_VERSION}"],
        cwd=GOMOD_DIR / "ocm",
        env=_go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or not info.get("Dir"):
        raise BuildError(
            f"OCM CRDs: `go mod download {OCM_API_MODULE}@{OCM_API_VERSION}` failed: "
            f"{info.get('Error') or proc.stderr.strip()}"
        )
    return Path(info["Dir"])


def crd_files(hub: bool = True) -> list[Path]:
    """Absolute paths of the CRD YAMLs for the hub (or for a managed cluster)."""
    root = api_module_dir()
    paths = [root / rel for rel in (HUB_CRDS if hub else CLUSTER_CRDS)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise BuildError(f"OCM CRDs missing from {OCM_API_MODULE}@{OCM_API_VERSION}: {missing}")
    return paths
