"""Where the helm binary is: the one hack/tools/build-helm.sh built, else helm on PATH."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOMOD = ROOT / "hack" / "tools" / "gomod" / "helm" / "go.mod"


def pinned_version() -> str:
    """The helm version pinned in the wrapper module (e.g. v3.22.0)."""
    m = re.search(r"^\s*helm\.sh/helm/v3 (v\S+)", GOMOD.read_text(), re.M)
    if not m:
        raise ValueError(f"{GOMOD} pins no helm.sh/helm/v3 version")
    return m.group(1)


def helm_binary() -> str | None:
    """Path of the built helm (~/.cache/ocm-fl/bin/helm-<version>/helm), else PATH, else None."""
    cache_dir = Path(os.environ.get("OCMFL_CACHE", Path.home() / ".cache" / "ocm-fl"))
    built = cache_dir / "bin" / f"helm-{pinned_version()}" / "helm"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    return shutil.which("helm")
