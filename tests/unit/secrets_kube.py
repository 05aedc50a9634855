"""An in-memory Secret API for unit tests of code that keeps one Secret current."""

from __future__ import annotations

import copy
from typing import Any

from ocmfl.kube import KubeError


class SecretsKube:
    """The Secret API as the issuer and the aggregator use it: get, create, put (with
    resourceVersion conflicts, as the apiserver answers them)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes = 0

    def get(self, path: str) -> dict[str, Any] | None:
        found = self.objects.get(path)
        return copy.deepcopy(found) if found is not None else None

    def create(self, path: str, body: dict[str, Any], exist_ok: bool = True) -> dict[str, Any]:
        full = f"{path}/{body['metadata']['name']}"
        if full in self.objects:
            raise KubeError(409, "Conflict", "exists")
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = "1"
        self.objects[full] = body
        self.writes += 1
        return body

    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        current = self.objects[path]
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified")
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
        self.objects[path] = body
        self.writes += 1
        return body
