"""The hub's asyncio work writer (aiohttp, `operator/writer.py`) against the real apiserver:
create, a taken name checked for its owner, apply, a refusal reported as such, deletes."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from hack.controlplane.plane import ControlPlane
from hub_controller.api import FLRef
from hub_controller.operator import reconcile as reconciler
from hub_controller.operator.desired import works as works_mod
from hub_controller.operator.writer import AioKube, Writer
from ocmfl import constants
from ocmfl.kube import Kube, path_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REF = FLRef(namespace="tenant", name="digits", uid="uid-writer")


@pytest.fixture
def writer(control_plane: ControlPlane) -> Iterator[tuple[Writer, Kube]]:
    kube = Kube(control_plane.hub_kubeconfig, field_manager=reconciler.FIELD_MANAGER)
    aio = AioKube(kube, reconciler.WRITE_CONCURRENCY)
    w = Writer.on_own_loop(aio, reconciler.WRITE_CONCURRENCY)
    yield w, kube
    w.submit(lambda _: aio.close()).result()
    w.loop.call_soon_threadsafe(w.loop.stop)
    kube.close()


def work(namespace: str, name: str, uid: str) -> dict[str, Any]:
    labels = {
        constants.LABEL_OWNER_NAMESPACE: REF.namespace,
        constants.LABEL_OWNER_NAME: REF.name,
        constants.LABEL_OWNER_UID: uid,
    }
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "c", "namespace": "default"}, "data": {"k": uid}}  # fmt: skip
    return {
        "apiVersion": works_mod.WORK_API_VERSION,
        "kind": "ManifestWork",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"workload": {"manifests": [cm]}},
    }


def write(w: Writer, obj: dict[str, Any], new: bool) -> str | None:
    return w.submit(functools.partial(reconciler._write_work, REF, obj, new)).result()


def test_works_are_created_checked_applied_refused_and_deleted(
    writer: tuple[Writer, Kube], namespace: str
) -> None:
    w, kube = writer
    path = path_of(works_mod.WORK_API_VERSION, "ManifestWork", namespace, "fl")
    assert write(w, work(namespace, "fl", REF.uid), new=True) is None
    assert kube.get(path) is not None
    # The index did not show it (new): the 409 is checked, ours, so applied (the change lands).
    changed = work(namespace, "fl", REF.uid)
    changed["spec"]["workload"]["manifests"][0]["data"]["k"] = "changed"
    assert write(w, changed, new=True) is None
    got = kube.get(path) or {}
    assert got["spec"]["workload"]["manifests"][0]["data"] == {"k": "changed"}
    # Another owner's work at a name: never overwritten, its owner returned.
    assert write(w, work(namespace, "other", "uid-other"), new=True) is None
    taken = work(namespace, "other", REF.uid)
    assert write(w, taken, new=True) == "uid-other"
    other = kube.get(path_of(works_mod.WORK_API_VERSION, "ManifestWork", namespace, "other"))
    assert (other or {})["metadata"]["labels"][constants.LABEL_OWNER_UID] == "uid-other"
    # A refusal (422, an invalid name) is ObjectRefused naming the object, not a bare error.
    bad = work(namespace, "Not_A_Name", REF.uid)
    with pytest.raises(reconciler.ObjectRefused) as refused:
        write(w, bad, new=True)
    assert refused.value.status == 422
    assert f"ManifestWork {namespace}/Not_A_Name" in refused.value.message
    # Deletes, concurrently; a work already gone is no error.
    paths = [path, path, path_of(works_mod.WORK_API_VERSION, "ManifestWork", namespace, "other")]
    w.run_all([functools.partial(reconciler.delete_object, p) for p in paths])
    assert kube.get(path) is None
