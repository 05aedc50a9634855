"""Local metrics to the cluster's addon agent: a ClientApp mod, and the POST beneath it.

``agent_metrics`` is a Flower mod (``ClientApp(mods=[agent_metrics])``): after each train or
evaluate reply it picks loss, accuracy and sample count out of the reply's MetricRecord and
POSTs them to the local agent from a background thread, and it marks the reply with this
cluster's name so the server can keep metrics per cluster. When no agent endpoint is set, or
the agent is down, slow or answers an error, training carries on: nothing here raises or waits
for the agent. A POST that meets a transient failure (no answer, a refused connection, a 5xx) is
tried again a few times over about 9 s from that background thread (`RETRY_DELAYS_S`): a short
outage of the agent or of the pod network no longer loses the round's row.

Each POST carries the federation's token (the file the controller mounts into
the client pod, `OCMFL_CLIENT_TOKEN_FILE`) as `Authorization: Bearer`: the agent takes metrics
for a federation only with its token.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from flwr.app import ConfigRecord, Context, Message, MetricRecord
from flwr.clientapp.typing import ClientAppCallable

from ocmfl.constants import (
    CLIENT_TOKEN_DIR,
    CLIENT_TOKEN_KEY,
    ENV_CLIENT_TOKEN_FILE,
    ENV_FL_NAME,
    ENV_FL_NAMESPACE,
    ENV_FL_UID,
)
from workloads.sdk.node import agent_endpoint, cluster_name

log = logging.getLogger(__name__)

METRICS_PATH = "/v1/metrics"
DEFAULT_TIMEOUT_S = 1.0
# Pauses before the 2nd..5th try of a POST that failed transiently.
RETRY_DELAYS_S = (0.25, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class LocalMetrics:
    """One local fit or evaluate result, as the agent receives it."""

    cluster: str
    round: int
    phase: str  # "fit" | "evaluate"
    loss: float | None
    accuracy: float | None
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


def client_token() -> str | None:
    """The federation's token for the local agent: the file OCMFL_CLIENT_TOKEN_FILE names
    (default: where the controller mounts it), or None when there is none."""
    path = os.environ.get(ENV_CLIENT_TOKEN_FILE) or f"{CLIENT_TOKEN_DIR}/{CLIENT_TOKEN_KEY}"
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError:
        return None
    return token or None


def post_metrics(
    endpoint: str | None, metrics: LocalMetrics, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """POST ``metrics`` as JSON to ``endpoint``/v1/metrics once; True when the agent took it."""
    return _post_once(endpoint, metrics, timeout_s) == "taken"


def _post_once(endpoint: str | None, metrics: LocalMetrics, timeout_s: float) -> str:
    """One POST of `metrics`: see post_json."""
    return post_json(endpoint, METRICS_PATH, asdict(metrics), timeout_s)


def post_json(endpoint: str | None, path: str, payload: Mapping[str, Any], timeout_s: float) -> str:
    """One POST of `payload` (plus the resource's identity, with the federation's token) to
    the agent: "taken", "refused" (no endpoint, a bad URL, a 4xx: trying again cannot help)
    or "transient" (no answer, no connection, a 5xx)."""
    if not endpoint:
        return "refused"
    url = endpoint.rstrip("/") + path
    body = json.dumps({**payload, **resource_identity()}).encode()
    headers = {"Content-Type": "application/json"}
    token = client_token()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return "taken" if 200 <= int(response.status) < 300 else "refused"
    except urllib.error.HTTPError as exc:
        log.info("agent at %s answered %s", url, exc.code)
        return "transient" if exc.code >= 500 else "refused"
    except ValueError as exc:
        log.info("agent endpoint %s is not usable (%s)", url, exc)
        return "refused"
    except (urllib.error.URLError, OSError) as exc:
        log.info("agent at %s unavailable (%s); continuing", url, exc)
        return "transient"


def deliver_metrics(
    endpoint: str | None,
    metrics: LocalMetrics,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S,
) -> bool:
    """``post_metrics``, tried again after each of ``retry_delays_s`` while it fails
    transiently; True when the agent took it."""
    outcome = _post_once(endpoint, metrics, timeout_s)
    for delay in retry_delays_s:
        if outcome != "transient":
            break
        time.sleep(delay)
        outcome = _post_once(endpoint, metrics, timeout_s)
    if outcome != "taken":
        log.info("metrics of round %d (%s) not delivered", metrics.round, metrics.phase)
    return outcome == "taken"


# Every reply the mod passes on carries ConfigRecord CLIENT_RECORD {"cluster": name}: the
# server side (workloads.sdk.loop) keys per-cluster metrics by it.
CLIENT_RECORD = "ocmfl.client"
PHASES = {"train": "fit", "evaluate": "evaluate"}
SAMPLES_KEYS = ("num-examples", "num_examples", "samples")


def _pick(metrics: Mapping[str, Any], prefer: tuple[str, ...], word: str = "") -> float | None:
    """The value of the first key in ``prefer`` present, else (with ``word``) of the first
    key containing it: metric names are the app's choice."""
    numbers = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    for key in prefer:
        if key in numbers:
            return numbers[key]
    for key, value in numbers.items():
        if word and word in key.lower():
            return value
    return None


def metrics_of_reply(
    msg: Message, reply: Message, cluster: str, duration_s: float
) -> LocalMetrics | None:
    """What the agent gets for one reply, or None when there is nothing to report (an error
    reply, a message type other than train/evaluate, no round or no sample count)."""
    phase = PHASES.get(str(msg.metadata.message_type).split(".")[0])
    if phase is None or reply.has_error() or not reply.has_content():
        return None
    config = msg.content.config_records.get("config") or ConfigRecord()
    server_round = config.get("server-round")
    if isinstance(server_round, bool) or not isinstance(server_round, int) or server_round < 1:
        return None
    records = list(reply.content.metric_records.values())
    metrics: Mapping[str, Any] = records[0] if records else MetricRecord()
    samples = _pick(metrics, SAMPLES_KEYS)
    if samples is None:
        return None
    prefix = "train" if phase == "fit" else "eval"
    loss = _pick(metrics, (f"{prefix}-loss", f"{prefix}_loss", "loss"), "loss")
    accuracy = _pick(metrics, (f"{prefix}-accuracy", f"{prefix}_accuracy", "accuracy"), "acc")
    if accuracy is not None and not 0.0 <= accuracy <= 1.0:
        accuracy = None  # the agent only takes a fraction; a percentage would be refused
    return LocalMetrics(
        cluster=cluster,
        round=server_round,
        phase=phase,
        loss=loss,
        accuracy=accuracy,
        samples=int(samples),
        duration_s=max(0.0, duration_s),
    )


def post_in_background(
    endpoint: str, metrics: LocalMetrics, timeout_s: float = DEFAULT_TIMEOUT_S
) -> threading.Thread:
    """Deliver from a non-daemon thread: the reply goes out at once, and the ClientApp
    process still delivers the metrics before it exits (tries included, at most about
    ``5 * timeout_s`` + 3.75 s later)."""
    thread = threading.Thread(
        target=deliver_metrics, args=(endpoint, metrics, timeout_s), name="ocmfl-metrics"
    )
    thread.start()
    return thread


def agent_metrics(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower ClientApp mod: report each train/evaluate reply's metrics to the local agent
    and mark the reply with this cluster's name. Never fails the reply."""
    started = time.monotonic()
    reply = call_next(msg, context)
    try:
        cluster = cluster_name(context)
        marked = reply.has_content() and CLIENT_RECORD in reply.content.config_records
        if cluster and not reply.has_error() and reply.has_content() and not marked:
            reply.content[CLIENT_RECORD] = ConfigRecord({"cluster": cluster})
        endpoint = agent_endpoint(context)
        local = metrics_of_reply(msg, reply, cluster, time.monotonic() - started)
        if endpoint and local is not None:
            post_in_background(endpoint, local)
    except Exception as exc:  # reporting must never cost the round
        log.info("metrics for the agent skipped: %s", exc)
    return reply
