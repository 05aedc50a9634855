"""The controller's only Kubernetes writer: server-side apply, create, delete, list, patch.

A thin layer over `kubernetes.client.ApiClient.call_api` for the few kinds the controller
touches (no discovery). API errors are mapped: transient ones (conflicts, throttling, server
errors, network) to `kopf.TemporaryError`, 404 on delete to success, others to `KubeError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import kopf
import urllib3

FIELD_MANAGER: Final = "ocm-fl-hub"

# (apiVersion, kind) -> (plural, namespaced)
KINDS: Final[dict[tuple[str, str], tuple[str, bool]]] = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "Service"): ("services", True),
    ("v1", "PersistentVolumeClaim"): ("persistentvolumeclaims", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "Pod"): ("pods", True),
    ("batch/v1", "Job"): ("jobs", True),
    ("cluster.open-cluster-management.io/v1beta1", "Placement"): ("placements", True),
    ("work.open-cluster-management.io/v1", "ManifestWork"): ("manifestworks", True),
    ("federation-ai.open-cluster-management.io/v1alpha1", "FederatedLearning"): (
        "federatedlearnings",
        True,
    ),
}
_TRANSIENT = {409, 429, 500, 502, 503, 504}


class KubeError(Exception):
    """A non-transient API error (e.g. 422 invalid object, 403 forbidden)."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"{status} {reason}: {body[:500]}")
        self.status = status


def resource_path(api_version: str, kind: str, namespace: str | None, name: str | None) -> str:
    """REST path of a collection (name None) or one object."""
    plural, namespaced = KINDS[(api_version, kind)]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespaced:
        if not namespace:
            raise ValueError(f"{kind} {name} needs a namespace")
        base += f"/namespaces/{namespace}"
    path = f"{base}/{plural}"
    return f"{path}/{name}" if name else path


class Kube:
    """Calls the API through a kubernetes ApiClient (blocking; kopf runs sync handlers in
    threads)."""

    def __init__(self, api_client: Any) -> None:
        self._api = api_client

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        try:
            request = self._api.param_serialize(
                method,
                path,
                query_params=query or [],
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(*request)
            response.read()
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise kopf.TemporaryError(f"{method} {path}: {exc}", delay=5) from exc
        status = int(response.status)
        text = response.data.decode("utf-8") if response.data else ""
        if status in _TRANSIENT:
            raise kopf.TemporaryError(f"{method} {path}: {status} {text[:300]}", delay=5)
        if not 200 <= status < 300:
            raise KubeError(status, str(response.reason), text)
        return json.loads(text) if text else {}

    def apply(self, obj: Mapping[str, Any]) -> Any:
        """Server-side apply `obj` as our field manager (taking over conflicting fields)."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        return self._call(
            "PATCH",
            path,
            body=dict(obj),
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )

    def create(self, obj: Mapping[str, Any]) -> bool:
        """Create `obj`; False when it already exists."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), None)
        try:
            self._call("POST", path, body=dict(obj), query=[("fieldManager", FIELD_MANAGER)])
        except kopf.TemporaryError:
            if self.get(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]):
                return False
            raise
        return True

    def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self._call(
                "GET", resource_path(api_version, kind, namespace, name)
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """Delete (background propagation); False when it was already gone."""
        try:
            self._call(
                "DELETE",
                resource_path(api_version, kind, namespace, name),
                body={"propagationPolicy": "Background"},
            )
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str
    ) -> list[dict[str, Any]]:
        """Objects of a kind matching a label selector (namespace None = all namespaces)."""
        plural, namespaced = KINDS[(api_version, kind)]
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        path = (
            f"{base}/namespaces/{namespace}/{plural}"
            if namespaced and namespace
            else f"{base}/{plural}"
        )
        result = self._call("GET", path, query=[("labelSelector", label_selector)])
        items: list[dict[str, Any]] = list(result.get("items") or [])
        return items

    def merge_patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
    ) -> Any:
        return self._call(
            "PATCH",
            resource_path(api_version, kind, namespace, name),
            body=dict(patch),
            content_type="application/merge-patch+json",
        )
