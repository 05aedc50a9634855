"""The hub's two CAs as the hub pod sees them, each a mounted kubernetes.io/tls Secret
(tls.crt, tls.key):

- the *hub CA* ($OCMFL_CA_DIR, Secret `ocm-fl-ca`): signs only the aggregator's server
  certificate; agents trust only it for the aggregator (its certificate reaches them through
  the AddOnDeploymentConfig);
- the *agent CA* ($OCMFL_AGENT_CA_DIR, Secret `ocm-fl-agent-ca`): signs only agent client
  certificates, through the project's CSR signer; the aggregator trusts only it for clients.
  It is never published to clusters.

Both are read through one `CADir`, again only when the files change (rotation). Both keys are
mounted only into the signer part (`ocm-fl-hub --role signer`); the controller part mounts
the agent CA's tls.crt alone (`trust_bundle` reads no key).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from ocmfl import constants, pki


class CAUnavailable(RuntimeError):
    """A CA directory is missing or unreadable; the message names the path and the fix."""


@dataclass(frozen=True)
class _Loaded:
    mtime: float
    pair: pki.CertAndKey


class CADir:
    """One mounted CA: loads it from its directory, again only when the files change."""

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        env: str = constants.ENV_CA_DIR,
        default: str = constants.HUB_CA_DIR,
        what: str = "hub CA",
    ) -> None:
        self.directory = Path(directory or os.environ.get(env) or default)
        self.env = env
        self.what = what
        self._lock = threading.Lock()
        self._cached: _Loaded | None = None

    @classmethod
    def hub(cls, directory: str | Path | None = None) -> CADir:
        """The hub CA (the aggregator's server certificate)."""
        return cls(directory, env=constants.ENV_CA_DIR, default=constants.HUB_CA_DIR)

    @classmethod
    def agent(cls, directory: str | Path | None = None) -> CADir:
        """The agent CA (agent client certificates, through the project's signer)."""
        return cls(
            directory,
            env=constants.ENV_AGENT_CA_DIR,
            default=constants.AGENT_CA_DIR,
            what="agent CA",
        )

    def available(self) -> bool:
        """Its certificate and key are there (what a signer needs)."""
        return (self.directory / pki.KEY_FILE).exists()

    def has_certificate(self) -> bool:
        """Its certificate is there (what a verifier needs; the key may be absent: the
        controller mounts only the agent CA's tls.crt)."""
        return (self.directory / pki.CERT_FILE).exists()

    def _load(self) -> _Loaded:
        cert, key = self.directory / pki.CERT_FILE, self.directory / pki.KEY_FILE
        with self._lock:
            try:
                mtime = max(cert.stat().st_mtime, key.stat().st_mtime)
                if self._cached and self._cached.mtime == mtime:
                    return self._cached
                pair = pki.load_cert_and_key(cert.read_bytes(), key.read_bytes())
            except (OSError, ValueError) as exc:
                raise CAUnavailable(
                    f"{self.what} not usable at {self.directory} ({exc}): mount its Secret "
                    f"there or set {self.env} (the Helm chart's ca-init hook creates it)"
                ) from exc
            self._cached = _Loaded(mtime, pair)
            return self._cached

    def get(self) -> pki.CertAndKey:
        """The CA certificate and key; CAUnavailable when they cannot be read."""
        return self._load().pair

    def trust_bundle(self) -> bytes:
        """PEM of every certificate in tls.crt (the CA first; an old CA appended to it stays
        trusted while certificates it issued are still in use). Reads no key."""
        path = self.directory / pki.CERT_FILE
        try:
            return pki.certs_to_pem(pki.load_certs_pem(path.read_bytes()))
        except (OSError, ValueError) as exc:
            raise CAUnavailable(
                f"{self.what} certificate not usable at {path} ({exc}): mount its Secret's "
                f"tls.crt there or set {self.env}"
            ) from exc
