"""Each federation's Fleet CA, and the server certificates it signs, kept by the signer part.

A federation's Fleet CA (its certificate and key) lives in one of FLEET_CA_SHARDS Secrets in
the signer's own namespace (`credentials_layout.fleet_ca_secret_name`, entries by uid), never in
the tenant's namespace and never in the process that parses tenant specs: a tenant, or the
controller, can read the CA's certificate but can mint no client identity. The shards have
fixed names so that the chart grants the signer exactly those (the hub CA's and the agent CA's
Secrets share the namespace and stay unreadable through the API). A Fleet CA is made at the
first need (a server certificate or a cluster's Fleet CSR, hub_controller.signer.fleet) and
removed once its federation is gone (an ownerReference cannot cross namespaces).

The controller asks for the server certificates by labelling the federation's credentials
Secret (`LABEL_KEYS: tls`) and naming the gateway on it (`GATEWAY_NAMES_ANNOTATION`). The
signer watches FederatedLearnings (not Secrets: the chart's default RBAC gives it Secrets in
the tenants' namespaces only by name) and reads each one's credentials Secret. For a Secret
that is the credentials Secret of that federation, by name, namespace and owner uid
(`federation_of`), it writes into it the CA's certificate, the SuperLink's loopback pair and
the gateway's pair (`server_tls`), and renews them before they end. The
names come from the annotation: a tenant who edits it gets a gateway certificate that only
its own federation's clients trust, as before.

`federation_of`, `fleet_ca` and `server_tls` are pure; `FleetServerCerts` applies them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from hub_controller import credentials_layout as layout
from hub_controller.api import FLRef
from ocmfl import certlife, constants, pki, tasks
from ocmfl.kube import MERGE_PATCH, Kube, KubeError, path_of

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "ocm-fl-fleet-server-certs"
RECHECK_S: Final = 300.0  # renewals and gone federations' CAs are looked for at least this often
RETRY_S: Final = 5.0  # after a failed issue
WRITE_TRIES: Final = 5  # conflicting writes of a Fleet CA shard before giving up for now
FLEET_CA_COMPONENT: Final = "fleet-ca"


def fleet_ca_name(ref: FLRef) -> str:
    """Common name of a federation's Fleet CA (says whose it is; trust comes from the key)."""
    return f"ocm-fl-fleet-ca {ref.namespace}/{ref.name}"


def federation_of(secret: Mapping[str, Any], fl: Mapping[str, Any] | None) -> FLRef | str:
    """The federation whose credentials Secret `secret` is, or why it is not one: `fl` is the
    FederatedLearning it is read for (None: there is none). A Secret in another namespace than
    `fl`, whose controller ownerReference or owner label names another uid, or that is not
    `fl`'s credentials Secret by name, gets nothing."""
    meta = secret.get("metadata") or {}
    owners = [
        o
        for o in meta.get("ownerReferences") or []
        if o.get("controller") and o.get("kind") == constants.KIND
    ]
    if len(owners) != 1:
        return "it has no FederatedLearning as its controller owner"
    owner = owners[0]
    if fl is None:
        return f"its owner {owner.get('name')!r} does not exist"
    fl_meta = fl.get("metadata") or {}
    if fl_meta.get("namespace") != meta.get("namespace"):
        return f"it is not in its federation's namespace {fl_meta.get('namespace')!r}"
    if fl_meta.get("uid") != owner.get("uid") or fl_meta.get("name") != owner.get("name"):
        return f"its owner reference does not match FederatedLearning {owner.get('name')!r}"
    ref = FLRef(namespace=str(meta.get("namespace")), name=fl_meta["name"], uid=fl_meta["uid"])
    expected = layout.credentials_secret_name(layout.server_name(ref))
    if meta.get("name") != expected:
        return f"it is not that federation's credentials Secret ({expected})"
    if (meta.get("labels") or {}).get(constants.LABEL_OWNER_UID) != ref.uid:
        return f"its label {constants.LABEL_OWNER_UID} is not its owner's uid"
    return ref


def fleet_ca(
    current: Mapping[str, bytes], common_name: str, now: dt.datetime
) -> tuple[pki.CertAndKey, bool]:
    """The stored Fleet CA while readable and not due for renewal, else a new one; and
    whether it is new (a new CA reissues everything it signs)."""
    try:
        ca = pki.load_cert_and_key(current[pki.CERT_FILE], current[pki.KEY_FILE])
    except (KeyError, ValueError):
        return pki.create_ca(common_name, key_kind="ec", now=now), True
    if pki.remaining_fraction(ca.cert, now) < layout.RENEW_BELOW:
        return pki.create_ca(common_name, key_kind="ec", now=now), True
    return ca, False


def server_tls(
    current: Mapping[str, bytes],
    ca: pki.CertAndKey,
    gateway: layout.GatewayNames,
    now: dt.datetime,
    gateway_lifetime: dt.timedelta = pki.DEFAULT_SERVER_LIFETIME,
) -> dict[str, bytes]:
    """The credentials Secret's server entries (`layout.SERVER_TLS`): those of `current`
    that `ca` issued and that are not due (the gateway's only while it names `gateway`),
    newly issued where not."""
    out: dict[str, bytes] = {layout.CA: pki.cert_to_pem(ca.cert)}
    if layout.fresh_cert(current, layout.SUPERLINK_CERT, ca.cert, now) and current.get(
        layout.SUPERLINK_KEY
    ):
        out[layout.SUPERLINK_CERT] = current[layout.SUPERLINK_CERT]
        out[layout.SUPERLINK_KEY] = current[layout.SUPERLINK_KEY]
    else:
        pair = pki.issue_server_cert(
            ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=now
        )
        out[layout.SUPERLINK_CERT], out[layout.SUPERLINK_KEY] = pair.cert_pem, pair.key_pem
    gw = layout.fresh_cert(current, layout.GATEWAY_CERT, ca.cert, now)
    if gw is not None and layout.names_match(gw, gateway) and current.get(layout.GATEWAY_KEY):
        out[layout.GATEWAY_CERT], out[layout.GATEWAY_KEY] = (
            current[layout.GATEWAY_CERT],
            current[layout.GATEWAY_KEY],
        )
    else:
        pair = pki.issue_server_cert(
            ca,
            dns_names=list(gateway.dns),
            ip_addresses=list(gateway.ips),
            now=now,
            lifetime=gateway_lifetime,
        )
        out[layout.GATEWAY_CERT], out[layout.GATEWAY_KEY] = pair.cert_pem, pair.key_pem
    return out


def renew_in_s(data: Mapping[str, bytes], now: dt.datetime) -> float | None:
    """Seconds until the first of the CA, SuperLink and gateway certificates in `data` is due
    for renewal; None when none is readable."""
    due = []
    for key in (layout.CA, layout.SUPERLINK_CERT, layout.GATEWAY_CERT):
        try:
            cert = pki.load_cert_pem(data[key])
        except (KeyError, ValueError):
            continue
        due.append(certlife.renew_in(cert, layout.RENEW_BELOW, now))
    return min(due) if due else None


def _fl_path(namespace: str, name: str) -> str:
    return path_of(constants.API_VERSION, constants.KIND, namespace, name)


@dataclass
class FleetCAs:
    """The federations' Fleet CAs, in the FLEET_CA_SHARDS Secrets of the signer's namespace
    (`namespace`); each write keeps the Secret's resourceVersion, so concurrent writers (the
    Fleet signer, this module) never lose each other's entries: a conflict is read again."""

    kube: Kube
    namespace: str
    clock: Callable[[], dt.datetime] = pki.utcnow

    def path(self, shard: int | None = None) -> str:
        name = None if shard is None else layout.fleet_ca_secret_name(shard)
        return path_of("v1", "Secret", self.namespace, name)

    def get(self, ref: FLRef) -> pki.CertAndKey:
        """The federation's Fleet CA: the stored one, else a new one stored now (renewed when
        due). KubeError when it cannot be stored (then nothing is signed with it)."""
        shard = layout.fleet_ca_shard(ref.uid)
        cert_key, key_key, owner_key = layout.fleet_ca_keys(ref.uid)
        for _ in range(WRITE_TRIES):
            secret = self.kube.get(self.path(shard))
            data = layout.secret_data(secret)
            stored = {pki.CERT_FILE: data.get(cert_key, b""), pki.KEY_FILE: data.get(key_key, b"")}
            ca, new = fleet_ca(stored, fleet_ca_name(ref), self.clock())
            if not new:
                return ca
            entries = {
                cert_key: pki.cert_to_pem(ca.cert),
                key_key: pki.key_to_pem(ca.key),
                owner_key: f"{ref.namespace}/{ref.name}".encode(),
            }
            if self._write(shard, secret, {**data, **entries}):
                log.info("Fleet CA made for %s", ref)
                return ca
        raise KubeError(409, "Conflict", f"Fleet CA shard {shard} kept changing")

    def _write(
        self, shard: int, secret: Mapping[str, Any] | None, data: Mapping[str, bytes]
    ) -> bool:
        """Store `data` as the shard's whole content; False when another writer was first."""
        encoded = layout.encoded_data(data)
        try:
            if secret is None:
                body = {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "metadata": {
                        "name": layout.fleet_ca_secret_name(shard),
                        "namespace": self.namespace,
                        "labels": {constants.LABEL_COMPONENT: FLEET_CA_COMPONENT},
                    },
                    "data": encoded,
                }
                return self.kube.create(self.path(), body) is not None
            self.kube.put(self.path(shard), {**secret, "data": encoded})
        except KubeError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def sweep(self) -> list[str]:
        """Remove the Fleet CAs whose federation is gone (no FederatedLearning of that
        namespace, name and uid); returns their uids."""
        gone: list[str] = []
        for shard in range(layout.FLEET_CA_SHARDS):
            secret = self.kube.get(self.path(shard))
            data = layout.secret_data(secret)
            dead = []
            for key, owner in data.items():
                if not key.endswith(".owner"):
                    continue
                uid = key[: -len(".owner")]
                ns, _, name = owner.decode(errors="replace").partition("/")
                fl = self.kube.get(_fl_path(ns, name)) if ns and name else None
                if fl is None or fl["metadata"].get("uid") != uid:
                    dead.append(uid)
            if not dead:
                continue
            drop = {k for uid in dead for k in layout.fleet_ca_keys(uid)}
            # A conflict leaves them for the next sweep.
            if self._write(shard, secret, {k: v for k, v in data.items() if k not in drop}):
                log.info("Fleet CAs of gone federations removed: %s", ", ".join(dead))
                gone += dead
        return gone


@dataclass
class FleetServerCerts:
    """Issues and renews the server certificates in every federation's credentials Secret;
    `memo.fleet_server_certs`."""

    kube: Kube
    cas: FleetCAs
    clock: Callable[[], dt.datetime] = pki.utcnow
    # The federations seen, (namespace, name) -> their metadata (kopf's events fill it), and
    # those whose credentials Secret has not asked yet -> how many looks found nothing.
    federations: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pending: dict[tuple[str, str], int] = field(default_factory=dict)
    refused: dict[tuple[str, str], str] = field(default_factory=dict)
    last_sweep: float = float("-inf")
    wake: asyncio.Event | None = field(default=None, repr=False)
    loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def ensure(self, secret: Mapping[str, Any], fl: Mapping[str, Any] | None) -> float | None:
        """Issue what `secret` (a credentials Secret) lacks or holds due, when it is `fl`'s
        (`federation_of`); seconds until its first certificate is due (None: nothing issued,
        it asks for nothing or is not a genuine request)."""
        meta = secret.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        annotation = (meta.get("annotations") or {}).get(layout.GATEWAY_NAMES_ANNOTATION)
        if annotation is None:
            return None
        ref = federation_of(secret, fl)
        try:
            names = layout.GatewayNames.from_annotation(annotation)
        except ValueError as exc:
            ref = f"annotation {layout.GATEWAY_NAMES_ANNOTATION}: {exc}"
        if isinstance(ref, str):
            if self.refused.get(key) != ref:  # said once per reason, not on every pass
                log.warning("no server certificates for Secret %s/%s: %s", *key, ref)
                self.refused[key] = ref
            return None
        self.refused.pop(key, None)
        now = self.clock()
        current = layout.secret_data(dict(secret))
        ca = self.cas.get(ref)
        lifetime = certlife.leaf_lifetime(pki.DEFAULT_SERVER_LIFETIME)
        data = server_tls(current, ca, names, now, lifetime)
        if any(current.get(k) != v for k, v in data.items()):
            path = path_of("v1", "Secret", key[0], key[1])
            self.kube.patch(path, {"data": layout.encoded_data(data)}, MERGE_PATCH)
            log.info("server certificates issued for %s (gateway %s)", ref, names)
        return renew_in_s(data, now)

    def ensure_federation(self, fl: Mapping[str, Any]) -> float | None:
        """`ensure` for the credentials Secret of federation `fl` (as read or as its event
        shows it), which the signer reads by name: it may not watch Secrets in the tenants'
        namespaces (the chart's namespaced RBAC)."""
        meta = fl.get("metadata") or {}
        ref = FLRef(namespace=meta["namespace"], name=meta["name"], uid=meta.get("uid", ""))
        key = (ref.namespace, ref.name)
        self.federations[key] = {"metadata": {k: meta.get(k) for k in ("namespace", "name", "uid")}}
        name = layout.credentials_secret_name(layout.server_name(ref))
        secret = self.kube.get(path_of("v1", "Secret", ref.namespace, name))
        due = None if secret is None else self.ensure(secret, fl)
        if due is None:
            self.pending[key] = self.pending.get(key, 0) + 1
        else:
            self.pending.pop(key, None)
        return due

    def forget(self, namespace: str, name: str) -> None:
        """A federation deleted: its CA goes at the next sweep, which runs now."""
        self.federations.pop((namespace, name), None)
        self.pending.pop((namespace, name), None)
        self.last_sweep = float("-inf")
        self.poke()

    def ensure_all(self) -> float:
        """`ensure_federation` for every federation seen, and, at most every RECHECK_S or
        after a deletion, the sweep of gone federations' CAs; seconds until the next look (at
        most RECHECK_S; sooner while a federation's request has not come, backing off)."""
        delay = RECHECK_S
        for key, fl in sorted(self.federations.items()):
            due = self.ensure_federation(fl)
            if due is not None:
                delay = min(delay, due)
            elif key in self.pending:
                delay = min(delay, RETRY_S * 2 ** min(self.pending[key] - 1, 6))
        if time.monotonic() - self.last_sweep >= RECHECK_S:
            self.cas.sweep()
            self.last_sweep = time.monotonic()
        return delay

    async def keep(self) -> None:
        """Renew when due and sweep, for the life of the process."""
        self.wake, self.loop = asyncio.Event(), asyncio.get_running_loop()
        while True:
            try:
                delay = await asyncio.to_thread(self.ensure_all)
            except (KubeError, OSError, ValueError):
                log.exception("keeping the Fleet server certificates failed; retrying")
                delay = RETRY_S
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), max(delay, 1.0))

    def poke(self) -> None:
        """Wake `keep` now (from any thread)."""
        if self.loop is not None and self.wake is not None:
            self.loop.call_soon_threadsafe(self.wake.set)


@kopf.on.startup()
async def start_fleet_server_certs(memo: kopf.Memo, **_: Any) -> None:
    namespace = os.environ.get(constants.ENV_POD_NAMESPACE) or constants.HUB_NAMESPACE
    kube = Kube(field_manager=FIELD_MANAGER)
    certs = FleetServerCerts(kube, FleetCAs(kube, namespace))
    memo.fleet_server_certs = certs
    certs.task = asyncio.create_task(certs.keep())


@kopf.on.cleanup()
async def stop_fleet_server_certs(memo: kopf.Memo, **_: Any) -> None:
    certs: FleetServerCerts | None = memo.get("fleet_server_certs")
    if certs is not None:
        await tasks.cancel(certs.task)


@kopf.on.event(constants.GROUP, constants.VERSION, constants.PLURAL)
def federation_changed(
    type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Any event of a FederatedLearning (the controller writes its status right after it
    asks for certificates): issue what its credentials Secret asks for at once; deleted: its
    CA goes (kopf runs sync handlers in its thread pool)."""
    certs: FleetServerCerts = memo.fleet_server_certs
    if type == "DELETED":
        certs.forget(str(body.metadata.namespace), str(body.metadata.name))
        return
    key = (str(body.metadata.namespace), str(body.metadata.name))
    try:
        certs.ensure_federation(dict(body))
    except KubeError as exc:  # the renewal loop tries again
        logger.warning("server certificates for %s: %s; retrying", body.metadata.name, exc)
    if certs.pending.get(key) == 1:
        certs.poke()  # newly waiting for its request: the loop looks again soon, backing off
