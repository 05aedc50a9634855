"""Kubernetes access: ApiClient construction and a JSON REST client with list+watch.

`api_client` builds a kubernetes ApiClient from a kubeconfig file, else the pod's service
account. `Kube` is a tiny JSON REST client over such a client (auth, TLS from kubeconfig):
plain dicts in and out, no model (de)serialisation, so CRDs and status patches round-trip as
is. `Informer` keeps a listed and watched collection in memory.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import config
from kubernetes.client import ApiClient

Obj = dict[str, Any]
log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class KubeError(RuntimeError):
    """A non-2xx answer from the apiserver."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {body[:500]}")
        self.status = status
        self.body = body


class Kube:
    """JSON requests against one apiserver, authenticated by a kubeconfig file."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.api: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig
        )
        self.host: str = self.api.configuration.host

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    def _url(self, path: str, query: Mapping[str, Any] | None) -> str:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        return self.host + path + (("?" + urlencode(q)) if q else "")

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if content_type:
            h["Content-Type"] = content_type
        token = self.api.configuration.api_key.get("authorization")
        if token:
            h["Authorization"] = token
        return h

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
        resp = self.api.rest_client.pool_manager.request(
            method,
            self._url(path, query),
            headers=self._headers(content_type),
            body=None if body is None else json.dumps(body),
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

    def create(self, path: str, body: Obj, exist_ok: bool = True) -> Obj | None:
        """POST to a collection; with exist_ok a 409 returns None."""
        try:
            return self.request("POST", path, body)
        except KubeError as e:
            if e.status == 409 and exist_ok:
                return None
            raise

    def patch(self, path: str, body: Obj | list[Any], content_type: str = MERGE_PATCH) -> Obj:
        return self.request("PATCH", path, body, content_type=content_type)

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
        self, path: str, resource_version: str, timeout_seconds: int = 300
    ) -> Iterator[tuple[str, Obj]]:
        """Stream (type, object) watch events for a collection from `resource_version`."""
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        resp = self.api.rest_client.pool_manager.request(
            "GET",
            self._url(path, query),
            headers=self._headers(),
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
        finally:
            resp.release_conn()


class Informer:
    """List+watch a collection into an in-memory cache keyed by namespace/name.

    Runs in its own daemon thread; sets `wake` on every change; relists on errors and 410s.
    """

    def __init__(
        self, kube: Kube, path: str, wake: threading.Event, stop: threading.Event, name: str
    ) -> None:
        self.kube = kube
        self.path = path
        self.wake = wake
        self.stop = stop
        self.items: dict[str, Obj] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    @staticmethod
    def key(obj: Obj) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    def start(self) -> None:
        self.thread.start()

    def snapshot(self) -> list[Obj]:
        with self.lock:
            return list(self.items.values())

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                lst = self.kube.request("GET", self.path)
                with self.lock:
                    self.items = {self.key(o): o for o in lst.get("items", [])}
                self.synced.set()
                self.wake.set()
                rv = lst["metadata"]["resourceVersion"]
                while not self.stop.is_set():
                    for etype, obj in self.kube.watch(self.path, rv, timeout_seconds=240):
                        if etype == "ERROR":
                            raise KubeError(int(obj.get("code", 0)), "watch", str(obj))
                        rv = obj["metadata"]["resourceVersion"]
                        if etype == "BOOKMARK":
                            continue
                        with self.lock:
                            if etype == "DELETED":
                                self.items.pop(self.key(obj), None)
                            else:
                                self.items[self.key(obj)] = obj
                        self.wake.set()
                        if self.stop.is_set():
                            return
            except Exception as e:  # relist after any failure; the plane may be going down
                if self.stop.is_set():
                    return
                log.debug("informer %s: %s; relisting", self.path, e)
                time.sleep(0.5)


def api_client(kubeconfig: str | None = None) -> Any:
    """An ApiClient from `kubeconfig`, or from the pod's service account when None."""
    from kubernetes import client

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def custom_objects(kubeconfig: str | None = None) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api_client(kubeconfig))
