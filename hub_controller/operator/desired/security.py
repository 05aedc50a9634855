"""Pod security shared by the server Job and the client Jobs: the `restricted` profile.

Both pods run the workload image as uid/gid WORKLOAD_UID, without privilege escalation or
capabilities, under the runtime's default seccomp profile and with a read-only root
filesystem. What the launchers, Flower and torch write goes to a scratch emptyDir at
SCRATCH_DIR (HOME and TMPDIR point there) or to the pod's other volumes. Neither launcher talks
to the Kubernetes API, so no service-account token is mounted.
"""

from __future__ import annotations

from typing import Any, Final

from ocmfl import constants

SCRATCH_VOLUME: Final = "scratch"
# Namespace labels that make the apiserver's Pod Security admission enforce `restricted`.
PSA_LEVEL: Final = "restricted"
PSA_LABELS: Final = {
    f"pod-security.kubernetes.io/{mode}": PSA_LEVEL for mode in ("enforce", "audit", "warn")
}


def pod_security_context() -> dict[str, Any]:
    """Pod-level securityContext: non-root uid/gid, fsGroup for the volumes, seccomp."""
    uid = constants.WORKLOAD_UID
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """Container-level securityContext: nothing beyond the process's own uid."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


def scratch_env() -> list[dict[str, str]]:
    """HOME and TMPDIR on the scratch volume (the root filesystem is read-only)."""
    return [
        {"name": "HOME", "value": constants.SCRATCH_DIR},
        {"name": "TMPDIR", "value": constants.SCRATCH_DIR},
    ]


def harden(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """Make a pod spec meet `restricted`: security contexts on the pod and every container,
    the scratch volume mounted in each, no service-account token. Returns `pod_spec`."""
    pod_spec["securityContext"] = pod_security_context()
    pod_spec["automountServiceAccountToken"] = False
    pod_spec.setdefault("volumes", []).append({"name": SCRATCH_VOLUME, "emptyDir": {}})
    for container in pod_spec.get("containers", []):
        container["securityContext"] = container_security_context()
        container.setdefault("volumeMounts", []).append(
            {"name": SCRATCH_VOLUME, "mountPath": constants.SCRATCH_DIR}
        )
        # Ours first: the tenant's env may not name these (api.reserved_env).
        container["env"] = [*scratch_env(), *container.get("env", [])]
    return pod_spec
