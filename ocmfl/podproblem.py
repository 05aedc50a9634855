"""Why a pod cannot run, in the kubelet's and scheduler's own words (pure).

Shared by the hub (the server pod: the ServerReady condition) and the agent (client pods: the
cluster's status row, through its reports). Only reasons that need someone to act count;
`ContainerCreating` and `PodInitializing` are progress, not problems.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

# Container waiting reasons a kubelet reports for a container that cannot start or keeps dying.
WAITING_PROBLEMS: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "ImageInspectError",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
MAX_PROBLEM: Final = 512  # characters kept of "Reason: message"


def _text(reason: str, message: str) -> str:
    return (f"{reason}: {message}" if message else reason)[:MAX_PROBLEM]


def pod_problem(pod: Mapping[str, Any]) -> str:
    """'Reason: message' of the first problem of a live pod, or '' when there is none.

    Unschedulable (PodScheduled=False, set by the scheduler) comes first, then the containers'
    waiting reasons in WAITING_PROBLEMS (init containers before the others).
    """
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return ""
    for cond in status.get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            return _text("Unschedulable", str(cond.get("message") or ""))
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = str(waiting.get("reason") or "")
            if reason in WAITING_PROBLEMS:
                name = cs.get("name") or "?"
                return _text(reason, f"container {name}: {waiting.get('message') or ''}".strip())
    return ""


def first_problem(pods: Iterable[Mapping[str, Any]]) -> str:
    """The first problem among pods (newest pod first: the one a Job is retrying)."""
    ordered = sorted(
        pods,
        key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""),
        reverse=True,
    )
    for pod in ordered:
        problem = pod_problem(pod)
        if problem:
            return problem
    return ""
