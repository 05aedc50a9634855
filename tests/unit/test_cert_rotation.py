"""Certificate rotation by time (issue 13, drill 5): the lifetime setting, when each renewal
is due, which changes make nginx reload, and the kubelet-like Secret volume refresh."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from agent_addon.csr import next_check_s
from hack.controlplane import podplan
from hub_controller import credentials_layout
from hub_controller.signer import fleet_server
from hub_controller.signer.policy import Deny, requested_lifetime
from ocmfl import certlife, pki
from workloads.fleet_tls import PairWatch

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def test_the_lifetime_setting_caps_leaf_lifetimes() -> None:
    assert certlife.lifetime_override({}) is None
    assert certlife.lifetime_override({certlife.ENV_CERT_LIFETIME: " "}) is None
    env = {certlife.ENV_CERT_LIFETIME: "60"}
    assert certlife.lifetime_override(env) == dt.timedelta(seconds=60)
    assert certlife.leaf_lifetime(dt.timedelta(days=7), env) == dt.timedelta(seconds=60)
    assert certlife.leaf_lifetime(dt.timedelta(seconds=10), env) == dt.timedelta(seconds=10)
    assert certlife.leaf_lifetime(dt.timedelta(days=7), {}) == dt.timedelta(days=7)


@pytest.mark.parametrize(
    ("value", "says"),
    [("1h", "not a whole number of seconds"), ("29", "below the minimum of 30 s"), ("-5", "30")],
)
def test_a_bad_lifetime_setting_names_the_variable_and_the_fix(value: str, says: str) -> None:
    with pytest.raises(certlife.CertLifetimeError) as err:
        certlife.lifetime_override({certlife.ENV_CERT_LIFETIME: value})
    assert certlife.ENV_CERT_LIFETIME in str(err.value)
    assert says in str(err.value)


def test_the_hub_refuses_to_start_with_a_bad_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from hub_controller.__main__ import main

    monkeypatch.setenv(certlife.ENV_CERT_LIFETIME, "5")
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


def test_signers_issue_no_longer_than_the_cap() -> None:
    cap = dt.timedelta(seconds=45)
    assert requested_lifetime({"expirationSeconds": 24 * 3600}, cap) == cap
    assert requested_lifetime({}, cap) == cap
    assert requested_lifetime({"expirationSeconds": 3600}) == dt.timedelta(hours=1)
    # The CSR API's own minimum still applies to what is asked.
    assert isinstance(requested_lifetime({"expirationSeconds": 60}, cap), Deny)


def test_a_short_certificate_is_backdated_by_a_share_of_its_lifetime() -> None:
    ca = pki.create_ca("t", key_kind="ec", now=NOW)
    short = pki.issue_server_cert(ca, dns_names=["x"], lifetime=dt.timedelta(seconds=60), now=NOW)
    assert short.cert.not_valid_before_utc == NOW - dt.timedelta(seconds=6)
    # Renewal at 30 % left is 42 s after issue, not at once (a 5 min backdate made it so).
    assert certlife.renew_in(short.cert, 0.3, NOW) == pytest.approx(60 - 0.3 * 66)
    long = pki.issue_server_cert(ca, dns_names=["x"], lifetime=dt.timedelta(days=1), now=NOW)
    assert long.cert.not_valid_before_utc == NOW - pki.CLOCK_SKEW
    assert certlife.renew_in(long.cert, 0.3, NOW + dt.timedelta(days=2)) == 0.0


def test_the_agent_checks_again_when_its_certificate_becomes_due(tmp_path: Path) -> None:
    ca = pki.create_ca("hub", key_kind="ec", now=NOW)
    assert next_check_s(tmp_path, 300) == 1.0  # nothing yet: soon
    pair = pki.issue_client_cert("c1", ca, lifetime=dt.timedelta(seconds=100), now=NOW)
    pki.save_tls_dir(tmp_path, pair, None)
    assert next_check_s(tmp_path, 300, now=NOW) == pytest.approx(100 - 0.2 * 110)
    assert next_check_s(tmp_path, 30, now=NOW) == 30  # never later than the interval
    assert next_check_s(tmp_path, 300, now=NOW + dt.timedelta(hours=1)) == 1.0  # overdue


def test_the_signer_renews_the_gateway_certificate_when_it_is_due() -> None:
    gateway = credentials_layout.GatewayNames(dns=("gw.example",))
    ca, _ = fleet_server.fleet_ca({}, "fleet", NOW)
    data = fleet_server.server_tls({}, ca, gateway, NOW, dt.timedelta(seconds=60))
    due = fleet_server.renew_in_s(data, NOW)
    assert due == pytest.approx(60 - 0.3 * 66)
    assert due is not None
    # Not yet due: kept. Due: a new gateway certificate, the CA and SuperLink pair kept.
    later = NOW + dt.timedelta(seconds=due - 1)
    assert fleet_server.server_tls(data, ca, gateway, later) == data
    renewed = fleet_server.server_tls(data, ca, gateway, NOW + dt.timedelta(seconds=due + 1))
    assert renewed[credentials_layout.GATEWAY_CERT] != data[credentials_layout.GATEWAY_CERT]
    assert renewed[credentials_layout.SUPERLINK_CERT] == data[credentials_layout.SUPERLINK_CERT]
    assert renewed[credentials_layout.CA] == data[credentials_layout.CA]
    assert fleet_server.renew_in_s({}, NOW) is None


def _volume(directory: Path, pair: pki.CertAndKey, ca: bytes) -> None:
    podplan.atomic_write(
        directory,
        {
            pki.CERT_FILE: (pair.cert_pem, 0o400),
            pki.KEY_FILE: (pair.key_pem, 0o400),
            pki.CA_FILE: (ca, 0o400),
        },
    )


def test_nginx_reloads_only_for_a_new_consistent_pair(tmp_path: Path) -> None:
    ca = pki.create_ca("fleet", key_kind="ec")
    ca_pem = pki.cert_to_pem(ca.cert)
    first = pki.issue_fleet_client_cert(ca, "uid", "c1")
    _volume(tmp_path, first, ca_pem)
    watch = PairWatch(tmp_path / pki.CERT_FILE, tmp_path / pki.KEY_FILE, tmp_path / pki.CA_FILE)
    assert watch.poll() is None  # what nginx started with
    second = pki.issue_fleet_client_cert(ca, "uid", "c1")
    _volume(tmp_path, second, ca_pem)
    assert watch.poll() == second.cert.serial_number
    assert watch.poll() is None  # once per new pair
    # A certificate whose key does not match (a torn update) is waited out, not loaded.
    third = pki.issue_fleet_client_cert(ca, "uid", "c1")
    _volume(tmp_path, pki.CertAndKey(third.cert, second.key), ca_pem)
    assert watch.poll() is None
    _volume(tmp_path, third, ca_pem)
    assert watch.poll() == third.cert.serial_number


def test_secret_volumes_are_written_and_refreshed_like_the_kubelet_does(tmp_path: Path) -> None:
    secrets = {"tls": {"tls.crt": "one", "tls.key": "k1"}}
    pod = {
        "metadata": {"namespace": "ns", "name": "p"},
        "spec": {"volumes": [{"name": "tls", "secret": {"secretName": "tls"}}]},
    }

    def lookup(kind: str, ns: str, name: str) -> dict[str, str] | None:
        return dict(secrets[name]) if name in secrets else None

    volumes = podplan.materialise_volumes(pod, tmp_path, lookup, "10.0.0.2", "10.0.0.1")
    vdir = volumes["tls"]
    held = (vdir / "tls.crt").resolve()  # a reader that resolved the path (the old tunnel)
    assert (vdir / "tls.crt").is_symlink() and (vdir / "..data").is_symlink()
    assert (vdir / "tls.crt").read_text() == "one"
    assert podplan.refresh_volumes(pod, tmp_path, lookup, "10.0.0.2", "10.0.0.1") == []
    secrets["tls"] = {"tls.crt": "two", "tls.key": "k2"}
    assert podplan.refresh_volumes(pod, tmp_path, lookup, "10.0.0.2", "10.0.0.1") == ["tls"]
    assert (vdir / "tls.crt").read_text() == "two"  # the mounted path follows the update
    assert not held.exists()  # the resolved one names a deleted directory
    assert sorted(p.name for p in vdir.iterdir() if not p.name.startswith("..")) == [
        "tls.crt",
        "tls.key",
    ]
    # A Secret that is gone keeps the files the pod has (as the kubelet does).
    del secrets["tls"]
    assert podplan.refresh_volumes(pod, tmp_path, lookup, "10.0.0.2", "10.0.0.1") == []
    assert (vdir / "tls.key").read_text() == "k2"
