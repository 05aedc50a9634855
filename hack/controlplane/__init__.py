"""Local OCM control plane for integration tests and the demo (TEST INFRASTRUCTURE).

Real etcd, kube-apiservers, kube-controller-managers, OCM's registration controller, placement
controller and addon manager, and on every cluster OCM's registration agent (joined from a
bootstrap kubeconfig, accepted as clusteradm does: clusteradm.py) and work agent, built from
the Go module registry; a supervisor process stands in for kubelet (local nodes, unless
`kubelet=True`). Entry points: `up`, `down`, `status_report`.
"""

from hack.controlplane.plane import (
    ControlPlane,
    PlaneError,
    down,
    kubeconfig_env,
    session,
    status_report,
    up,
)
from hack.controlplane.processes import ComponentFailed, State

__all__ = [
    "ComponentFailed",
    "ControlPlane",
    "PlaneError",
    "State",
    "down",
    "kubeconfig_env",
    "session",
    "status_report",
    "up",
]
