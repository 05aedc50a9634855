"""Drill 6: the hub controller (and its aggregator, same process) SIGKILLed mid-training.

What must hold (docs/reliability.md): the run completes with every round; no duplicate
ManifestWorks or server Jobs; the clusters' status rows never lose their values (the hub's
report store starts empty after the restart: every status version written is checked, through
a watch); reports are matched by uid, so a re-created resource of the same name starts clean.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from examples.demo import demo_resource
from hack import controlplane as cp
from hack.localfed import FL_PATH, LocalFederation, create_fl, get_fl, prepare_data, wait_fl
from hack.testing import wait_for
from ocmfl import constants
from ocmfl.kube import Kube
from tests.drills.drills_support import StatusRecorder, restore

pytestmark = [pytest.mark.drill, pytest.mark.timeout(900)]

NS = "drill-restart"
NAME = "restart"
OWNER = f"{constants.LABEL_OWNER_NAMESPACE}={NS},{constants.LABEL_OWNER_NAME}={NAME}"


def _rows(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in (obj.get("status") or {}).get("clusters") or []}


def _full(row: dict[str, Any]) -> bool:
    """A row with every value the fold must keep: round, loss and samples."""
    return bool(row.get("round") and row.get("loss") is not None and row.get("samples"))


def _count(hub: Kube, path: str) -> int:
    return len((hub.get(path, {"labelSelector": OWNER}) or {}).get("items") or [])


def test_drill_controller_killed_mid_training(
    plane: cp.ControlPlane, fed: LocalFederation, hub: Kube, tmp_path: Path
) -> None:
    clusters = plane.clusters[:2]
    body = demo_resource(rounds=3, min_clients=2)
    body["metadata"]["name"] = NAME
    prepare_data(plane, tmp_path / "data", clusters, body["spec"]["client"]["dataClaim"])
    with StatusRecorder(plane.hub_kubeconfig, NS) as rec:
        uid = create_fl(hub, NS, body)["metadata"]["uid"]

        def reported() -> dict[str, Any] | None:
            obj = get_fl(hub, NS, NAME) or {}
            rows = _rows(obj)
            ok = len(rows) == 2 and all(_full(r) for r in rows.values())
            return obj if ok else None

        before = wait_for(reported, 600, "both clusters' rows with a round, a loss and samples")
        assert before["status"]["phase"] == "Running", before["status"]
        kill_at = time.monotonic()
        fed.kill("hub", signal.SIGKILL)
        try:
            fed.start_hub()
        finally:
            restore(fed)
        restarted = time.monotonic()
        final = wait_fl(hub, NS, NAME, 600, fed=fed)
        status = final["status"]
        assert status["phase"] == "Completed", status.get("message")
        assert status["round"] == status["totalRounds"] == 3
        # Every round counted once: one global history row per round.
        rounds = sorted(h["round"] for h in status.get("history") or [] if h["cluster"] == "global")
        assert rounds == [1, 2, 3], status.get("history")

        # No duplicates: one server Job, one work per cluster.
        assert _count(hub, f"/apis/batch/v1/namespaces/{NS}/jobs") == 1
        for c in clusters:
            path = f"/apis/{constants.WORK_GROUP}/v1/namespaces/{c}/manifestworks"
            assert _count(hub, path) == 1, c
        # Rows never lost their values: no version after the first full one (round, loss and
        # samples on both rows; with evaluation folded into train a round's evaluate report
        # can arrive before its fit report, which carries the samples) has a row of a cluster
        # with data whose round, loss or samples went missing.
        versions = rec.of(uid)
        first = next(
            i
            for i, v in enumerate(versions)
            if len(_rows(v)) == 2 and all(_full(r) for r in _rows(v).values())
        )
        for v in versions[first:]:
            for name, row in _rows(v).items():
                assert _full(row), (name, row)
        print(
            f"\nDRILL 6: hub down {restarted - kill_at:.1f}s (kill to listening again); run "
            f"Completed {time.monotonic() - restarted:.1f}s after the restart; "
            f"{len(versions)} status versions, none lost a row's values"
        )

        # Re-created under the same name: a new uid, clean rows and history.
        hub.delete(f"{FL_PATH.format(ns=NS)}/{NAME}")
        wait_for(lambda: get_fl(hub, NS, NAME) is None, 180, "old resource deleted")
        body["spec"]["server"]["rounds"] = 1
        again = create_fl(hub, NS, body)
        new_uid = again["metadata"]["uid"]
        assert new_uid != uid

        def waiting_with_rows() -> dict[str, Any] | None:
            obj = get_fl(hub, NS, NAME) or {}
            return obj if len(_rows(obj)) == 2 else None

        fresh = wait_for(waiting_with_rows, 120, "the re-created resource's rows")
        hub.delete(f"{FL_PATH.format(ns=NS)}/{NAME}")
        wait_for(lambda: get_fl(hub, NS, NAME) is None, 180, "re-created resource deleted")
        # None of its versions showed the old run's values (rounds 2 and 3 only the old run
        # had; this one runs a single round).
        versions = rec.of(new_uid)
        assert versions and fresh["metadata"]["uid"] == new_uid
        for v in versions:
            for row in _rows(v).values():
                assert (row.get("round") or 0) <= 1, row
            assert all(h["round"] <= 1 for h in (v.get("status") or {}).get("history") or [])
