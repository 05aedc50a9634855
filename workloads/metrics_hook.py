"""Best-effort POST of local training metrics to the cluster's addon agent.

The ClientApp calls ``post_metrics`` after each fit/evaluate. When no agent endpoint is set,
or the agent is down, slow or answers an error, training carries on: nothing here raises.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass

from ocmfl.constants import ENV_FL_NAME, ENV_FL_NAMESPACE, ENV_FL_UID

log = logging.getLogger(__name__)

METRICS_PATH = "/v1/metrics"
DEFAULT_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class LocalMetrics:
    """One local fit or evaluate result, as the agent receives it."""

    cluster: str
    round: int
    phase: str  # "fit" | "evaluate"
    loss: float
    accuracy: float
    samples: int
    duration_s: float


def resource_identity() -> dict[str, str]:
    """The FederatedLearning this client serves, from the env the controller sets; the agent
    needs it whenever more than one FL client runs on its cluster."""
    pairs = (
        ("fl_namespace", ENV_FL_NAMESPACE),
        ("fl_name", ENV_FL_NAME),
        ("fl_uid", ENV_FL_UID),
    )
    return {key: os.environ[var] for key, var in pairs if os.environ.get(var)}


def post_metrics(
    endpoint: str | None, metrics: LocalMetrics, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """POST ``metrics`` as JSON to ``endpoint``/v1/metrics; True when the agent took it."""
    if not endpoint:
        return False
    url = endpoint.rstrip("/") + METRICS_PATH
    body = json.dumps({**asdict(metrics), **resource_identity()}).encode()
    try:
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return 200 <= int(response.status) < 300
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log.info("metrics agent at %s unavailable (%s); continuing", url, exc)
        return False
