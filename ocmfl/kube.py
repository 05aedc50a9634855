"""The one way this project talks to Kubernetes: a JSON REST client and a list+watch helper.

`Kube` sends requests through the kubernetes package's ApiClient (its kubeconfig, TLS and
token handling) and takes and returns plain dicts: no model (de)serialisation, so custom
resources, status patches and server-side apply round-trip as they are. A kubeconfig's
relative client-certificate/client-key paths are resolved against the kubeconfig's own
directory (as OCM's mounted hub kubeconfig has them), and when those files change (OCM renews
them) the pooled connections are dropped, so the next request presents the new certificate.
Every failure is a `KubeError`; `KubeError.transient` says whether retrying later can help.
`list_watch` lists a collection and follows it, relisting after a 410 or a broken stream;
`Informer` keeps such a collection in memory on a thread of its own.

The hub controller, the aggregator, the CSR signer, the agent, the admin CLI and the local
control plane all use it; it is blocking (callers in an event loop run it in threads).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import urllib3
from kubernetes import config
from kubernetes.client import ApiClient

Obj = dict[str, Any]
log = logging.getLogger(__name__)

MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"
# Answers worth retrying: conflicts, throttling, server errors; 0 = no answer at all.
TRANSIENT: Final = frozenset({0, 409, 429, 500, 502, 503, 504})

# (apiVersion, kind) -> (plural, namespaced): the kinds `path_of` knows (no discovery).
KINDS: Final[dict[tuple[str, str], tuple[str, bool]]] = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "Service"): ("services", True),
    ("v1", "PersistentVolumeClaim"): ("persistentvolumeclaims", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "Pod"): ("pods", True),
    ("batch/v1", "Job"): ("jobs", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("certificates.k8s.io/v1", "CertificateSigningRequest"): (
        "certificatesigningrequests",
        False,
    ),
    ("cluster.open-cluster-management.io/v1", "ManagedCluster"): ("managedclusters", False),
    ("cluster.open-cluster-management.io/v1beta1", "Placement"): ("placements", True),
    ("work.open-cluster-management.io/v1", "ManifestWork"): ("manifestworks", True),
    ("addon.open-cluster-management.io/v1alpha1", "ManagedClusterAddOn"): (
        "managedclusteraddons",
        True,
    ),
    ("addon.open-cluster-management.io/v1alpha1", "AddOnDeploymentConfig"): (
        "addondeploymentconfigs",
        True,
    ),
    ("federation-ai.open-cluster-management.io/v1alpha1", "FederatedLearning"): (
        "federatedlearnings",
        True,
    ),
}


class KubeError(RuntimeError):
    """A request that failed: a non-2xx answer (`status`), or no answer at all (status 0)."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {body[:500]}" if status else reason)
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def transient(self) -> bool:
        """True when the same request may succeed later (conflict, throttling, outage)."""
        return self.status in TRANSIENT

    @property
    def message(self) -> str:
        """The apiserver's own message (a Status object's `message`), else the body."""
        try:
            return str(json.loads(self.body).get("message") or self.body)
        except (ValueError, AttributeError):
            return self.body


class Encoded(dict[str, Any]):
    """A JSON object that carries its own encoding (`text`, made once by whoever built it),
    sent as is instead of being encoded again on every request. Not to be mutated: `text`
    would no longer say what it holds."""

    def __init__(self, obj: Mapping[str, Any], text: str) -> None:
        super().__init__(obj)
        self.text = text


def encode_body(body: Any) -> str:
    """The request body's JSON: an `Encoded` object's own text, else json.dumps."""
    return body.text if isinstance(body, Encoded) else json.dumps(body)


def path_of(
    api_version: str, kind: str, namespace: str | None = None, name: str | None = None
) -> str:
    """REST path of a collection (name None; all namespaces when namespace is None) or of
    one object, for a kind in KINDS."""
    plural, namespaced = KINDS[(api_version, kind)]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespaced and namespace:
        base += f"/namespaces/{namespace}"
    elif namespaced and name:
        raise ValueError(f"{kind} {name} needs a namespace")
    path = f"{base}/{plural}"
    return f"{path}/{name}" if name else path


def object_path(obj: Mapping[str, Any]) -> str:
    """REST path of the object `obj` describes (apiVersion, kind, metadata)."""
    meta = obj["metadata"]
    return path_of(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])


def api_client(kubeconfig: str | None = None, context: str | None = None) -> ApiClient:
    """An ApiClient from `kubeconfig`, else $KUBECONFIG or ~/.kube/config when they exist,
    else the pod's service account."""
    from kubernetes import client

    path = kubeconfig or os.environ.get("KUBECONFIG") or ""
    default = Path.home() / ".kube" / "config"
    if not path and (context is not None or default.exists()):
        path = str(default)
    if path:
        made: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context
        )
        return made
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


class Kube:
    """JSON requests against one apiserver (see the module docstring)."""

    def __init__(
        self,
        kubeconfig: str | None = None,
        *,
        context: str | None = None,
        field_manager: str = "ocm-fl",
        api: ApiClient | None = None,
    ) -> None:
        self.api: ApiClient = api if api is not None else api_client(kubeconfig, context)
        self.host: str = self.api.configuration.host
        self.field_manager = field_manager
        cfg = self.api.configuration
        # Client certificate files (a kubeconfig's client-certificate/client-key, absolute
        # or relative to the kubeconfig): a new connection reads them, a pooled one keeps the
        # certificate it was opened with, so a change drops the pool (`_follow_rotation`).
        self._tls_files = tuple(Path(p) for p in (cfg.cert_file, cfg.key_file) if p)
        self._tls_lock = threading.Lock()
        self._tls_seen = self._tls_signature()
        self.tls_reloads = 0

    def _tls_signature(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            stats = [os.stat(p) for p in self._tls_files]
        except OSError:
            return None  # mid-rotation or gone: keep what we have
        return tuple((st.st_mtime_ns, st.st_size, st.st_ino) for st in stats)

    def _follow_rotation(self) -> None:
        """Drop pooled connections once the client certificate files changed (new
        connections load the files anew)."""
        if not self._tls_files:
            return
        seen = self._tls_signature()
        with self._tls_lock:
            if seen is None or seen == self._tls_seen:
                return
            self._tls_seen = seen
            self.tls_reloads += 1
        self.api.rest_client.pool_manager.clear()
        log.info("client certificate %s changed: reconnecting with it", self._tls_files[0])

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    def _url(self, path: str, query: Mapping[str, Any] | None) -> str:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        return self.host + path + (("?" + urlencode(q)) if q else "")

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if content_type:
            h["Content-Type"] = content_type
        # auth_settings() re-reads a rotated service-account token through the client's hook.
        for auth in self.api.configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                h[auth["key"]] = auth["value"]
        return h

    def _send(
        self, method: str, url: str, headers: dict[str, str], **kw: Any
    ) -> urllib3.BaseHTTPResponse:
        self._follow_rotation()
        try:
            return self.api.rest_client.pool_manager.request(method, url, headers=headers, **kw)
        except (OSError, urllib3.exceptions.HTTPError) as e:
            raise KubeError(0, f"{method} {url}: no answer from the Kubernetes API: {e}", "") from e

    def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Any] | None = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Obj:
        """One request; returns the decoded JSON answer; raises KubeError on failure."""
        resp = self._send(
            method,
            self._url(path, query),
            self._headers(content_type),
            body=None if body is None else encode_body(body),
            timeout=urllib3.Timeout(total=timeout),
            preload_content=True,
        )
        if not 200 <= resp.status < 300:
            raise KubeError(resp.status, str(resp.reason), resp.data.decode(errors="replace"))
        return json.loads(resp.data) if resp.data else {}

    def get(self, path: str, query: Mapping[str, Any] | None = None) -> Obj | None:
        """GET; None on 404."""
        try:
            return self.request("GET", path, query=query)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    def list_objects(self, path: str, label_selector: str | None = None) -> list[Obj]:
        """The items of a collection (optionally those matching a label selector)."""
        answer = self.request("GET", path, query={"labelSelector": label_selector})
        items: list[Obj] = list(answer.get("items") or [])
        return items

    def create(self, path: str, body: Obj, exist_ok: bool = True) -> Obj | None:
        """POST to a collection; with exist_ok a 409 returns None."""
        try:
            return self.request("POST", path, body, query={"fieldManager": self.field_manager})
        except KubeError as e:
            if e.status == 409 and exist_ok:
                return None
            raise

    def put(self, path: str, body: Obj) -> Obj:
        return self.request("PUT", path, body, query={"fieldManager": self.field_manager})

    def patch(self, path: str, body: Obj | list[Any], content_type: str = MERGE_PATCH) -> Obj:
        return self.request(
            "PATCH",
            path,
            body,
            query={"fieldManager": self.field_manager},
            content_type=content_type,
        )

    def apply(self, obj: Mapping[str, Any], path: str | None = None) -> Obj:
        """Server-side apply `obj` as this client's field manager, taking over conflicts
        (`path`: the object's REST path, for a kind KINDS does not know)."""
        return self.request(
            "PATCH",
            path or object_path(obj),
            obj if isinstance(obj, Encoded) else dict(obj),
            query={"fieldManager": self.field_manager, "force": "true"},
            content_type=APPLY_PATCH,
        )

    def delete(
        self, path: str, query: Mapping[str, Any] | None = None, body: Obj | None = None
    ) -> Obj | None:
        """DELETE; None on 404."""
        try:
            return self.request("DELETE", path, body, query=query)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    def watch(
        self,
        path: str,
        resource_version: str,
        timeout_seconds: int = 300,
        query: Mapping[str, Any] | None = None,
    ) -> Iterator[tuple[str, Obj]]:
        """Stream (type, object) watch events for a collection from `resource_version`."""
        q = {
            **(query or {}),
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        resp = self._send(
            "GET",
            self._url(path, q),
            self._headers(),
            timeout=urllib3.Timeout(connect=10, read=timeout_seconds + 30),
            preload_content=False,
        )
        if resp.status != 200:
            data = resp.read().decode(errors="replace")
            resp.release_conn()
            raise KubeError(resp.status, str(resp.reason), data)
        buf = b""
        try:
            for chunk in resp.stream(65536, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        ev = json.loads(line)
                        yield ev["type"], ev["object"]
        except (OSError, urllib3.exceptions.HTTPError) as e:
            raise KubeError(0, f"watch {path}: stream broken: {e}", "") from e
        finally:
            resp.release_conn()


LIST: Final = "LIST"  # list_watch event: the collection as (re)listed, {"items": [...]}


def list_watch(
    kube: Kube,
    path: str,
    *,
    stop: threading.Event | None = None,
    query: Mapping[str, Any] | None = None,
    deadline: float | None = None,
    chunk_seconds: int = 240,
    relist_on_error: bool = True,
    retry_delay: float = 0.5,
) -> Iterator[tuple[str, Obj]]:
    """List a collection, then follow it: yields (LIST, list object) after every (re)list,
    then ("ADDED" | "MODIFIED" | "DELETED", object) events.

    Relists after a 410 Gone; after any other failure too when `relist_on_error` (after
    `retry_delay`), else raises it. Ends when `stop` is set or at `deadline` (monotonic).
    """

    def stopped() -> bool:
        return (stop is not None and stop.is_set()) or (
            deadline is not None and time.monotonic() >= deadline
        )

    while not stopped():
        try:
            listing = kube.request("GET", path, query=query)
            yield LIST, listing
            rv = str(listing["metadata"]["resourceVersion"])
            while not stopped():
                left = chunk_seconds if deadline is None else deadline - time.monotonic()
                seconds = max(1, min(chunk_seconds, int(left + 0.999)))
                for etype, obj in kube.watch(path, rv, timeout_seconds=seconds, query=query):
                    if etype == "ERROR":
                        raise KubeError(int(obj.get("code") or 0), "watch", json.dumps(obj))
                    rv = str(obj["metadata"]["resourceVersion"])
                    if etype != "BOOKMARK":
                        yield etype, obj
                    if stopped():
                        return
        except KubeError as e:
            if stopped():
                return
            if e.status != 410 and not relist_on_error:
                raise
            log.debug("list+watch %s: %s; relisting", path, e)
            if e.status != 410:
                if stop is not None:
                    stop.wait(retry_delay)
                else:
                    time.sleep(retry_delay)


def object_key(obj: Obj) -> str:
    """namespace/name of an object (cluster-scoped: /name)."""
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


class Informer:
    """A collection kept in memory by `list_watch` on a daemon thread, keyed by
    namespace/name; `wake` is set after every change."""

    def __init__(
        self,
        kube: Kube,
        path: str,
        wake: threading.Event,
        stop: threading.Event,
        name: str,
        query: Mapping[str, Any] | None = None,
    ) -> None:
        self.kube = kube
        self.path = path
        self.query = query
        self.wake = wake
        self.stop = stop
        self.items: dict[str, Obj] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.on_change: Callable[[], None] = wake.set
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def snapshot(self) -> list[Obj]:
        with self.lock:
            return list(self.items.values())

    def _run(self) -> None:
        for etype, obj in list_watch(self.kube, self.path, stop=self.stop, query=self.query):
            if self.stop.is_set():  # the watch answered after stop(): nobody listens any more
                return
            with self.lock:
                if etype == LIST:
                    self.items = {object_key(o): o for o in obj.get("items") or []}
                elif etype == "DELETED":
                    self.items.pop(object_key(obj), None)
                else:
                    self.items[object_key(obj)] = obj
            self.synced.set()
            self.on_change()
