"""Pure: the FL client's phase on this cluster from its pods and jobs (camelCase dicts)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ocmfl import constants
from ocmfl.podproblem import first_problem
from ocmfl.reports import ClientPhase
from ocmfl.status.v1 import report_pb2

RunKey = tuple[str, str]  # (fl namespace, fl name) on the hub


def run_of(obj: Mapping[str, Any]) -> tuple[RunKey, str] | None:
    """The hub FederatedLearning (namespace, name) and uid a client object belongs to."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    ns, name = labels.get(constants.LABEL_OWNER_NAMESPACE), labels.get(constants.LABEL_OWNER_NAME)
    if not ns or not name:
        return None
    return (ns, name), labels.get(constants.LABEL_OWNER_UID, "")


def _condition(obj: Mapping[str, Any], kind: str) -> bool:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return True
    return False


def derive_client_phase(
    pods: Iterable[Mapping[str, Any]], jobs: Iterable[Mapping[str, Any]]
) -> ClientPhase | None:
    """ClientPhase of one run's client objects, or None when there are none.

    A Job's Complete/Failed condition decides; otherwise pods: any Running -> RUNNING,
    any Pending -> PENDING, all Succeeded -> SUCCEEDED, else FAILED if one failed.
    """
    jobs, pods = (
        list(jobs),
        [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")],
    )
    if any(_condition(j, "Failed") for j in jobs):
        return report_pb2.CLIENT_PHASE_FAILED
    if jobs and all(_condition(j, "Complete") for j in jobs):
        return report_pb2.CLIENT_PHASE_SUCCEEDED
    phases = [(p.get("status") or {}).get("phase", "Pending") for p in pods]
    if not phases:
        return report_pb2.CLIENT_PHASE_PENDING if jobs else None
    if "Running" in phases:
        return report_pb2.CLIENT_PHASE_RUNNING
    if "Pending" in phases or "Unknown" in phases:
        return report_pb2.CLIENT_PHASE_PENDING
    if all(p == "Succeeded" for p in phases):
        return report_pb2.CLIENT_PHASE_SUCCEEDED
    if "Failed" in phases and not jobs:
        return report_pb2.CLIENT_PHASE_FAILED
    return report_pb2.CLIENT_PHASE_PENDING  # a Job retrying after a failed pod


def phases_by_run(
    pods: Iterable[Mapping[str, Any]], jobs: Iterable[Mapping[str, Any]]
) -> dict[RunKey, tuple[str, ClientPhase, str]]:
    """(uid, ClientPhase, problem) for every run that has client objects on this cluster;
    the problem is why its client pod cannot run (ocmfl.podproblem), "" when none."""
    grouped: dict[RunKey, tuple[str, list[Mapping[str, Any]], list[Mapping[str, Any]]]] = {}
    for kind, objs in (("pod", pods), ("job", jobs)):
        for obj in objs:
            owner = run_of(obj)
            if owner is None:
                continue
            key, uid = owner
            entry = grouped.setdefault(key, (uid, [], []))
            (entry[1] if kind == "pod" else entry[2]).append(obj)
    out: dict[RunKey, tuple[str, ClientPhase, str]] = {}
    for key, (uid, p, j) in grouped.items():
        phase = derive_client_phase(p, j)
        if phase is not None:
            ended = phase in (report_pb2.CLIENT_PHASE_SUCCEEDED, report_pb2.CLIENT_PHASE_FAILED)
            out[key] = (uid, phase, "" if ended else first_problem(p))
    return out


TERMINAL_POD_PHASES = ("Succeeded", "Failed")


def runs_by_pod_ip(pods: Iterable[Mapping[str, Any]]) -> dict[str, tuple[RunKey, str]]:
    """Address of each live client pod -> the run (and uid) it belongs to.

    An address two live pods of different runs share (hostNetwork) is left out: it does not
    say who is talking.
    """
    out: dict[str, tuple[RunKey, str]] = {}
    shared: set[str] = set()
    for pod in pods:
        status = pod.get("status") or {}
        ip = status.get("podIP")
        owner = run_of(pod)
        if not ip or owner is None or status.get("phase") in TERMINAL_POD_PHASES:
            continue
        if ip in out and out[ip][0] != owner[0]:
            shared.add(ip)
        out[ip] = owner
    return {ip: run for ip, run in out.items() if ip not in shared}
