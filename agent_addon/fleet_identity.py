"""Fleet identities born on the cluster: the agent makes each federation's client keys here.

For every client namespace on this cluster (labelled by the federation's ManifestWork), the
agent keeps the Secret `constants.CLIENT_IDENTITY_SECRET` there: a Fleet TLS key and a
SuperNode key made on this cluster, and a Fleet certificate the hub's Fleet signer issued
for them (CSR with `constants.FLEET_SIGNER_NAME`; the SuperNode public key rides in the CSR).
Neither private key leaves the cluster. The client pod mounts the Secret and starts once it
exists. The SuperNode key is kept across renewals: the server registered its public key.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agent_addon.csr import (
    PendingCSR,
    RenewalError,
    await_signed,
    needs_renewal,
)
from ocmfl import constants, nodekeys, pki
from ocmfl.kube import Kube, KubeError, path_of
from ocmfl.names import cluster_side_name

log = logging.getLogger(__name__)

NODE_KEY: Final = "node.key"
CLIENT_NAMESPACES: Final = "/api/v1/namespaces"
CLIENT_SELECTOR: Final = f"{constants.LABEL_COMPONENT}=client"
APPLIED_WORKS: Final = "/apis/work.open-cluster-management.io/v1/appliedmanifestworks"
# Renew with 30 % of the lifetime left (the agent's own: 20 %): a new Fleet pair still has to
# reach the pod through the kubelet's Secret refresh (up to a minute or more) and the
# tunnel's nginx reload before the old one expires.
RENEW_AT_REMAINING: Final = 0.3


@dataclass(frozen=True)
class ClientNamespace:
    """One federation's client namespace on this cluster."""

    namespace: str
    federation_uid: str


def work_namespaces(applied_works: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """Namespace name -> (its uid, the ManifestWork's name) for every namespace OCM's work
    agent created or applied from a hub ManifestWork (the AppliedManifestWorks' resources)."""
    out = {}
    for amw in applied_works:
        work = (amw.get("spec") or {}).get("manifestWorkName") or ""
        for res in (amw.get("status") or {}).get("appliedResources") or []:
            if res.get("resource") == "namespaces" and not res.get("group"):
                out[str(res.get("name"))] = (str(res.get("uid") or ""), str(work))
    return out


def client_namespaces(
    items: Sequence[Mapping[str, Any]],
    cluster: str,
    applied_works: Sequence[Mapping[str, Any]] = (),
) -> list[ClientNamespace]:
    """The client namespaces of federations on `cluster`: labelled by a federation's work,
    named as that federation's client namespace (ocmfl.names.cluster_side_name of its namespace
    and name), and, this very namespace (by uid), applied by OCM's work agent from the
    ManifestWork of that name. Labels alone are anyone's to set who may create a namespace."""
    from_works = work_namespaces(applied_works)
    out = []
    for ns in items:
        meta = ns.get("metadata") or {}
        labels = meta.get("labels") or {}
        uid = labels.get(constants.LABEL_OWNER_UID)
        if not uid or labels.get(constants.LABEL_CLUSTER) != cluster:
            continue
        if meta.get("deletionTimestamp"):
            continue
        name = str(meta.get("name"))
        expected = cluster_side_name(
            str(labels.get(constants.LABEL_OWNER_NAMESPACE, "")),
            str(labels.get(constants.LABEL_OWNER_NAME, "")),
        )
        applied_uid, work = from_works.get(name, ("", ""))
        if name != expected or work != expected or applied_uid != meta.get("uid"):
            log.warning(
                "namespace %s carries the labels of federation %s but is not its client "
                "namespace from its ManifestWork (expected %s, applied by work %r): no identity",
                name, uid, expected, work or None,
            )  # fmt: skip
            continue
        out.append(ClientNamespace(name, uid))
    return out


def fleet_csr_object(
    cluster: str, federation_uid: str, key: pki.PrivateKey, node_public: bytes
) -> dict[str, Any]:
    """The CertificateSigningRequest asking for `cluster`'s Fleet identity in a federation."""
    request = pki.csr_to_pem(pki.create_fleet_csr(federation_uid, cluster, key, node_public))
    return {
        "apiVersion": constants.CSR_API_VERSION,
        "kind": "CertificateSigningRequest",
        "metadata": {
            "generateName": f"{constants.ADDON_NAME}-fleet-{cluster}-",
            # Our labels, not OCM's (see agent_addon.csr.csr_object).
            "labels": {
                constants.LABEL_CLUSTER: cluster,
                constants.LABEL_OWNER_UID: federation_uid,
            },
        },
        "spec": {
            "signerName": constants.FLEET_SIGNER_NAME,
            "request": base64.b64encode(request).decode(),
            "usages": ["digital signature", "key encipherment", "client auth"],
            "expirationSeconds": 24 * 3600,
        },
    }


def identity_secret(
    namespace: str, pair: pki.CertAndKey, node_private: bytes, ca: bytes
) -> dict[str, Any]:
    """The client namespace's identity Secret (what the client pod mounts)."""
    data = {
        pki.CERT_FILE: pair.cert_pem,
        pki.KEY_FILE: pair.key_pem,
        pki.CA_FILE: ca,
        NODE_KEY: node_private,
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": constants.CLIENT_IDENTITY_SECRET,
            "namespace": namespace,
            "labels": {constants.LABEL_COMPONENT: "client-identity"},
        },
        "data": {k: base64.b64encode(v).decode() for k, v in sorted(data.items())},
    }


def current_identity(secret: Mapping[str, Any] | None) -> tuple[bytes | None, bool]:
    """(the SuperNode private key to keep, whether the certificate is still good)."""
    if not secret:
        return None, False
    data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    node = data.get(NODE_KEY)
    try:
        if node:
            nodekeys.public_key_of(node)
        pair = pki.load_cert_and_key(data[pki.CERT_FILE], data[pki.KEY_FILE])
        return node, not needs_renewal(pair.cert, threshold=RENEW_AT_REMAINING)
    except (KeyError, ValueError):
        return node, False


def split_chain(pem: bytes) -> tuple[bytes, bytes]:
    """(leaf certificate, the issuing Fleet CA) from the signer's answer."""
    certs = pki.load_certs_pem(pem)
    if len(certs) < 2:
        raise RenewalError("the Fleet signer answered without its CA certificate")
    return pki.cert_to_pem(certs[0]), pki.certs_to_pem(certs[1:])


class FleetIdentities:
    """Keeps every client namespace's identity Secret present and fresh."""

    def __init__(self, cluster: str, local: Kube, hub: Kube, *, timeout_s: float = 60.0) -> None:
        self.cluster = cluster
        self.local = local
        self.hub = hub
        self.timeout_s = timeout_s
        # namespace -> (failures, loop time before which not to try again): a denied CSR
        # (say, the work is not visible on the hub yet) is retried with backoff, not spammed.
        self._backoff: dict[str, tuple[int, float]] = {}
        # namespace/federation uid -> its Fleet CSR not signed yet: waited for again, not
        # replaced by a new one.
        self._pending: dict[str, PendingCSR] = {}

    async def ensure(self, target: ClientNamespace) -> bool:
        """Make or renew one namespace's identity; True when it wrote a new one."""
        path = path_of("v1", "Secret", target.namespace, constants.CLIENT_IDENTITY_SECRET)
        node, fresh = current_identity(await asyncio.to_thread(self.local.get, path))
        if fresh:
            return False

        def create() -> tuple[dict[str, Any], PendingCSR]:
            keep = node or nodekeys.generate_keypair()[0]  # a SuperNode key kept across renewals
            key = pki.generate_key()
            body = fleet_csr_object(
                self.cluster, target.federation_uid, key, nodekeys.public_key_of(keep)
            )
            return body, PendingCSR("", key, keep)

        pem, mine = await await_signed(
            self.hub, self.cluster, self._pending, f"{target.namespace}/{target.federation_uid}",
            create,
            timeout_s=self.timeout_s, poll_s=0.5, label="Fleet CSR",
        )  # fmt: skip
        name, key, node = mine.name, mine.key, mine.node
        assert node is not None
        leaf, ca = split_chain(pem)
        pair = pki.load_cert_and_key(leaf, pki.key_to_pem(key))
        uris = pki.uris_of(pair.cert)
        if uris != [pki.fleet_uri(target.federation_uid, self.cluster)]:
            raise RenewalError(f"Fleet CSR {name}: the certificate names {uris}")
        secret = identity_secret(target.namespace, pair, node, ca)
        await asyncio.to_thread(self.local.apply, secret)
        log.info("Fleet identity for %s written (federation %s)", target.namespace,
                 target.federation_uid)  # fmt: skip
        return True

    async def sync(self) -> None:
        """One pass over all client namespaces of this cluster."""
        found = await asyncio.to_thread(
            self.local.get, CLIENT_NAMESPACES, {"labelSelector": CLIENT_SELECTOR}
        )
        labelled = (found or {}).get("items") or []
        # The AppliedManifestWorks only when some namespace claims a federation: a cluster
        # without federations costs one list per pass, as before.
        applied = await asyncio.to_thread(self.local.get, APPLIED_WORKS) if labelled else None
        now = asyncio.get_running_loop().time()
        targets = client_namespaces(labelled, self.cluster, (applied or {}).get("items") or [])
        for gone in set(self._backoff) - {t.namespace for t in targets}:
            del self._backoff[gone]
        for gone in set(self._pending) - {f"{t.namespace}/{t.federation_uid}" for t in targets}:
            del self._pending[gone]
        for target in targets:
            failures, not_before = self._backoff.get(target.namespace, (0, 0.0))
            if now < not_before:
                continue
            try:
                await self.ensure(target)
                self._backoff.pop(target.namespace, None)
            except (RenewalError, KubeError, ValueError) as e:
                delay = min(2.0 * 2**failures, 60.0)
                self._backoff[target.namespace] = (failures + 1, now + delay)
                log.warning("Fleet identity for %s: %s (retry in %.0fs)", target.namespace, e,
                            delay)  # fmt: skip

    async def run(self, interval_s: float = 2.0) -> None:
        while True:
            try:
                await self.sync()
            except KubeError as e:
                log.warning("Fleet identities: %s", e)
            except Exception:
                log.exception("Fleet identities failed")
            await asyncio.sleep(interval_s)
