"""Mirror ClusterClaims from each managed cluster into its hub ManagedCluster status.

This is the registration agent's job in a real OCM deployment; here a watch per cluster keeps
`status.clusterClaims` current within a fraction of a second (test infrastructure).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from hack.controlplane.bootstrap import set_cluster_status
from ocmfl.constants import CLUSTER_GROUP
from ocmfl.kube import LIST, Kube, KubeError, Obj, list_watch

log = logging.getLogger(__name__)

CLAIMS_PATH = f"/apis/{CLUSTER_GROUP}/v1alpha1/clusterclaims"
RESERVED_CLAIMS = (
    "id.k8s.io",
    "kubeversion.open-cluster-management.io",
    "platform.open-cluster-management.io",
    "product.open-cluster-management.io",
)
SPOKE_ONLY_LABEL = "open-cluster-management.io/spoke-only"
MAX_CUSTOM_CLAIMS = 20


def claims_for_status(
    claims: Mapping[str, Obj], max_custom: int = MAX_CUSTOM_CLAIMS
) -> list[dict[str, str]]:
    """What the registration agent reports: reserved claims, then custom ones sorted by name
    and cut at `max_custom`; claims labelled spoke-only are never copied."""
    visible = {
        name: str(obj.get("spec", {}).get("value", ""))
        for name, obj in claims.items()
        if SPOKE_ONLY_LABEL not in (obj.get("metadata", {}).get("labels") or {})
    }
    reserved = [{"name": n, "value": visible[n]} for n in RESERVED_CLAIMS if n in visible]
    custom = sorted(n for n in visible if n not in RESERVED_CLAIMS)[:max_custom]
    return reserved + [{"name": n, "value": visible[n]} for n in custom]


class ClaimsMirror:
    """One thread: watch a cluster's ClusterClaims, patch the hub ManagedCluster on change."""

    def __init__(
        self, cluster: str, cluster_kube: Kube, hub_kube: Kube, stop: threading.Event
    ) -> None:
        self.cluster = cluster
        self.src = cluster_kube
        self.hub = hub_kube
        self.stop = stop
        self.claims: dict[str, Obj] = {}
        self.last: list[dict[str, str]] | None = None
        self.thread = threading.Thread(target=self._run, name=f"claims-{cluster}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _push(self) -> None:
        want = claims_for_status(self.claims)
        if want != self.last:
            set_cluster_status(self.hub, self.cluster, {"clusterClaims": want})
            self.last = want
            log.info("cluster %s: %d claims mirrored", self.cluster, len(want))

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                for etype, obj in list_watch(self.src, CLAIMS_PATH, stop=self.stop):
                    if etype == LIST:
                        self.claims = {o["metadata"]["name"]: o for o in obj.get("items", [])}
                    elif etype == "DELETED":
                        self.claims.pop(obj["metadata"]["name"], None)
                    else:
                        self.claims[obj["metadata"]["name"]] = obj
                    self._push()
            except (KubeError, OSError, ValueError) as e:
                log.warning("claims mirror %s: %s; retrying", self.cluster, e)
                self.last = None
                time.sleep(1.0)
            except Exception:  # keep mirroring whatever happens; the log says why
                log.exception("claims mirror %s crashed; retrying", self.cluster)
                self.last = None
                time.sleep(1.0)
