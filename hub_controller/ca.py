"""The hub CA as the hub pod sees it: the chart mounts its Secret (tls.crt, tls.key) at
$OCMFL_CA_DIR. The operator issues per-resource credentials from it, the aggregator its server
certificate and the signer agent certificates; all three read it through one `HubCA`."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ocmfl import constants, pki


class HubCAUnavailable(RuntimeError):
    """The hub CA directory is missing or unreadable; the message names the path and fix."""


class HubCA:
    """Loads the CA from its directory, again only when the files change (rotation)."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(
            directory or os.environ.get(constants.ENV_CA_DIR) or constants.HUB_CA_DIR
        )
        self._lock = threading.Lock()
        self._cached: tuple[float, pki.CertAndKey] | None = None

    def available(self) -> bool:
        return (self.directory / pki.KEY_FILE).exists()

    def get(self) -> pki.CertAndKey:
        """The CA certificate and key; HubCAUnavailable when they cannot be read."""
        cert, key = self.directory / pki.CERT_FILE, self.directory / pki.KEY_FILE
        with self._lock:
            try:
                mtime = max(cert.stat().st_mtime, key.stat().st_mtime)
                if self._cached and self._cached[0] == mtime:
                    return self._cached[1]
                pair = pki.load_cert_and_key(cert.read_bytes(), key.read_bytes())
            except (OSError, ValueError) as exc:
                raise HubCAUnavailable(
                    f"hub CA not usable at {self.directory} ({exc}): mount the CA Secret there "
                    f"or set {constants.ENV_CA_DIR} (the Helm chart's ca-init hook creates it)"
                ) from exc
            self._cached = (mtime, pair)
            return pair
