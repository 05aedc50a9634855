"""Test helpers: a throwaway CA writing mounted-Secret-style cert directories.

Used by unit tests, integration tests and benchmarks; never by production code.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from ocmfl import pki


class TestPKI:
    """A CA plus helpers that write tls.crt/tls.key/ca.crt directories under `root`."""

    __test__ = False  # not a pytest class

    def __init__(self, root: str | Path, *, key_kind: pki.KeyKind = "ec") -> None:
        self.root = Path(root)
        self.ca = pki.create_ca("ocm-fl-test-ca", key_kind=key_kind)

    def server_dir(
        self, name: str = "server", *, lifetime: dt.timedelta = pki.DEFAULT_SERVER_LIFETIME
    ) -> Path:
        pair = pki.issue_server_cert(
            self.ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], lifetime=lifetime
        )
        return pki.save_tls_dir(self.root / name, pair, self.ca.cert)

    def client_dir(
        self,
        cluster: str,
        name: str | None = None,
        *,
        lifetime: dt.timedelta = pki.DEFAULT_CLIENT_LIFETIME,
        now: dt.datetime | None = None,
    ) -> Path:
        pair = pki.issue_client_cert(cluster, self.ca, lifetime=lifetime, now=now)
        return pki.save_tls_dir(self.root / (name or f"client-{cluster}"), pair, self.ca.cert)

    def rotate_client(self, directory: Path, cluster: str) -> pki.CertAndKey:
        """Overwrite a client directory with a fresh key and certificate."""
        pair = pki.issue_client_cert(cluster, self.ca)
        pki.save_tls_dir(directory, pair, self.ca.cert)
        return pair

    def rotate_server(self, directory: Path) -> pki.CertAndKey:
        pair = pki.issue_server_cert(self.ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
        pki.save_tls_dir(directory, pair, self.ca.cert)
        return pair
