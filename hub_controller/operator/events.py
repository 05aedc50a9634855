"""Pure: the Kubernetes Events one reconcile pass tells about a resource, so that
`kubectl describe fl` reads as the run's story.

From the status before and after the pass: the phase change (a Warning when the run failed),
and each cluster whose row changed into Running (its client joined the training), Left,
Blocked (its work was refused) or Failed. Refusals of the whole resource (InvalidSpec,
PolicyViolation, Refused) are told where they are decided, in handlers.reconcile.

A pass that changes many clusters at once (a fan-out to thousands) tells one Event per kind
of change, naming the first few clusters and counting the rest, so the hub's event rate stays
bounded by the number of passes, not by the number of clusters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from hub_controller.api import ClusterPhase, ClusterStatus, FederatedLearningStatus, Phase

NAMED_PER_EVENT: Final = 5  # clusters named in one Event; the rest are counted
EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class StoryEvent:
    """One Event to post on the resource."""

    type: EventType
    reason: str
    message: str


# Row changes worth an Event: new phase -> (type, reason, what happened).
_CLUSTER_CHANGES: Final[dict[ClusterPhase, tuple[EventType, str, str]]] = {
    ClusterPhase.RUNNING: ("Normal", "ClusterJoined", "its client joined the training"),
    ClusterPhase.LEFT: ("Normal", "ClusterLeft", "left the federation"),
    ClusterPhase.BLOCKED: ("Warning", "ClusterBlocked", "refused to apply its work"),
    ClusterPhase.FAILED: ("Warning", "ClusterFailed", "its client failed"),
}


def story(
    previous: FederatedLearningStatus | None, new: FederatedLearningStatus
) -> list[StoryEvent]:
    """The Events for the change from `previous` (None: first pass) to `new`."""
    events: list[StoryEvent] = []
    if previous is None or new.phase != previous.phase:
        kind: EventType = "Warning" if new.phase == Phase.FAILED else "Normal"
        events.append(StoryEvent(kind, new.phase.value, new.message or new.phase.value))
    before = {row.name: row.phase for row in previous.clusters} if previous else {}
    changed: dict[ClusterPhase, list[ClusterStatus]] = {}
    for row in new.clusters:
        # `previous` is the status as written, so a restarted hub does not tell a change
        # again; a row beyond the status's row bound is not told at all.
        if row.phase in _CLUSTER_CHANGES and before.get(row.name) != row.phase:
            changed.setdefault(row.phase, []).append(row)
    for phase, rows in changed.items():
        kind, reason, what = _CLUSTER_CHANGES[phase]
        events.append(StoryEvent(kind, reason, _message(rows, what)))
    return events


def _message(rows: list[ClusterStatus], what: str) -> str:
    """One cluster: its name, what happened and its row's reason. Several: the first few
    names (with their reasons) and a count of the others."""
    if len(rows) == 1:
        row = rows[0]
        return f"cluster {row.name}: {what}" + (f" ({row.reason})" if row.reason else "")
    named = ", ".join(
        row.name + (f" ({row.reason})" if row.reason else "") for row in rows[:NAMED_PER_EVENT]
    )
    more = len(rows) - NAMED_PER_EVENT
    tail = f" and {more} more" if more > 0 else ""
    return f"{len(rows)} clusters: {what}: {named}{tail}"
