"""The aggregator's server certificate: the signer part issues it into a Secret from the hub CA
and renews it there; the aggregator takes it from that Secret (it holds no CA key)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from secrets_kube import SecretsKube

from hub_controller.aggregator.server_cert import SecretServerCert
from hub_controller.ca import CADir
from hub_controller.signer import aggregator_cert as ac
from ocmfl import constants, pki
from ocmfl.kube import KubeError

NS = "open-cluster-management-hub"
NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


def issuer_for(tmp_path: Path, kube: SecretsKube, address: str = "hub.example:9443") -> Any:
    ca = pki.create_ca("hub")
    ca_dir = CADir.hub(pki.save_tls_dir(tmp_path / "hub-ca", ca, None))
    clock = [NOW]
    issuer = ac.AggregatorCertIssuer(
        kube,
        ca_dir,
        ac.ServerNames.for_address(address),
        NS,
        clock=lambda: clock[0],
    )
    return issuer, ca, clock


@pytest.mark.parametrize(
    ("address", "dns", "ips"),
    [
        ("hub.example:9443", ("localhost", "hub.example"), ("127.0.0.1",)),
        ("10.1.2.3:9443", ("localhost",), ("127.0.0.1", "10.1.2.3")),
        ("[fd00::1]:9443", ("localhost",), ("127.0.0.1", "fd00::1")),
        ("", ("localhost",), ("127.0.0.1",)),
    ],
)
def test_the_certificate_names_the_address_agents_dial(
    address: str, dns: tuple[str, ...], ips: tuple[str, ...]
) -> None:
    assert ac.ServerNames.for_address(address) == ac.ServerNames(dns=dns, ips=ips)


def test_issued_once_into_a_tls_secret_that_the_aggregator_reads(tmp_path: Path) -> None:
    kube = SecretsKube()
    issuer, ca, _ = issuer_for(tmp_path, kube)
    source = SecretServerCert(kube, NS)
    assert source.read() is None  # before the signer: nothing
    delay = issuer.ensure()
    secret = kube.get(f"/api/v1/namespaces/{NS}/secrets/{constants.AGGREGATOR_TLS_SECRET}")
    assert secret is not None and secret["type"] == "kubernetes.io/tls"
    read = source.read()
    assert read is not None
    pair = pki.load_cert_and_key(*read)
    assert pki.verify_issued_by(pair.cert, ca.cert)
    # Renewed when 30 % of the 7-day lifetime is left, checked at least every RECHECK_S.
    assert delay == ac.RECHECK_S
    assert issuer.ensure() == ac.RECHECK_S and kube.writes == 1  # valid: not issued again
    assert ac.problem(dict(zip(("tls.crt", "tls.key"), read, strict=True)),
                      issuer.names, ca.cert, NOW) is None  # fmt: skip


def test_renewed_when_due_for_another_ca_or_other_names(tmp_path: Path) -> None:
    kube = SecretsKube()
    issuer, ca, clock = issuer_for(tmp_path, kube)
    issuer.ensure()
    first = SecretServerCert(kube, NS).read()
    assert first is not None
    cert = pki.load_cert_pem(first[0])
    # Due: 30 % of the lifetime left.
    clock[0] = cert.not_valid_after_utc - (cert.not_valid_after_utc - NOW) * 0.29
    data = {pki.CERT_FILE: first[0], pki.KEY_FILE: first[1]}
    assert ac.problem(data, issuer.names, ca.cert, clock[0]) == "due for renewal"
    issuer.ensure()
    second = SecretServerCert(kube, NS).read()
    assert second is not None and second != first and kube.writes == 2
    # Another address: the names are wrong.
    other = ac.ServerNames.for_address("other.example:9443")
    assert "not the address's" in str(ac.problem(data, other, ca.cert, NOW))
    # A rotated hub CA: the old certificate is not its.
    assert ac.problem(data, issuer.names, pki.create_ca("hub-2").cert, NOW) == (
        "not issued by the current hub CA"
    )
    assert ac.problem({}, issuer.names, ca.cert, NOW) == "no certificate yet"
    # A lowered lifetime setting applies at once, not at the old certificate's renewal.
    short = dt.timedelta(seconds=40)
    assert "longer than the configured lifetime (40 s)" in str(
        ac.problem(data, issuer.names, ca.cert, NOW, short)
    )
    broken = {pki.CERT_FILE: first[0], pki.KEY_FILE: pki.key_to_pem(pki.generate_key())}
    assert str(ac.problem(broken, issuer.names, ca.cert, NOW)).startswith("unreadable")


def test_a_concurrent_writer_makes_the_update_fail_not_overwrite(tmp_path: Path) -> None:
    kube = SecretsKube()
    issuer, _, clock = issuer_for(tmp_path, kube)
    issuer.ensure()
    path = issuer.path
    stale = kube.get(path)
    assert stale is not None
    kube.put(path, stale)  # someone else wrote in between
    original_get = kube.get
    kube.get = lambda p: stale if p == path else original_get(p)
    clock[0] = NOW + dt.timedelta(days=7)
    with pytest.raises(KubeError):
        issuer.ensure()


def test_the_controller_role_registers_no_signer_handler() -> None:
    """`ocm-fl-hub --role controller` imports the operator and the aggregator: none of the
    signer's kopf modules may come with them (their startup handlers would run there, and
    the issuer would look for a CA key the controller must not have)."""
    import subprocess
    import sys

    code = (
        "import sys, hub_controller.operator.handlers, hub_controller.aggregator.handlers\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('hub_controller.signer'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    kopf_modules = {"handlers", "fleet", "ledger", "addon_status", "aggregator_cert"}
    assert not {m.rsplit(".", 1)[-1] for m in out} & kopf_modules, out
