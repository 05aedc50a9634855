"""A real Prometheus (Debian's 2.42, installed by setup) scrapes the hub's /metrics with the
bearer token the endpoint asks for, loads the chart's alert rules and evaluates them live.

The hub's side is its own code: the controller's and the aggregator's gauges in one registry
(as `ocm-fl-hub` shares it), served by aggregator/metrics_http.py. The situations are set
through the same gauges the controller and aggregator set: a run waiting, a run failed, a run
stalled 700 s with a round timeout of 600 s and a cluster silent as long, and a healthy run.
promtool's rule tests (tests/unit/test_alert_rules.py) cover the `for:` durations.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.helm import helm_binary
from hack.testing import wait_for
from hub_controller.aggregator.metrics import AggregatorMetrics
from hub_controller.aggregator.metrics_http import serve_metrics
from hub_controller.api import FederatedLearningStatus, Phase, claim_placement, parse_spec
from hub_controller.operator.metrics import FederationMetrics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "ocm-federated-learning"
TOKEN = "s3cret-metrics-token"
NS = "team-a"
STALL_S = 700.0  # older than the round timeout below
ROUND_TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _chart_rules(tmp_path: Path) -> Path:
    """The chart's PrometheusRule groups, as a Prometheus rule file."""
    helm = helm_binary()
    assert helm is not None, "helm binary absent: run `make setup` (hack/tools/build-helm.sh)"
    out = subprocess.run(
        [helm, "template", "ocm-fl", str(CHART), "--set", "metrics.prometheusRule.enabled=true"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    [rule] = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PrometheusRule"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


@pytest.fixture
def hub_metrics() -> Iterator[str]:
    """The hub's /metrics with the four situations, at 127.0.0.1:<port>."""
    fed = FederationMetrics()
    agg = AggregatorMetrics(fed.registry)  # one registry, as in ocm-fl-hub
    server = {
        "rounds": 3,
        "minAvailableClients": 1,
        "app": {"path": "/opt/ocm-fl/apps/digits"},
        "timeouts": {"roundSeconds": ROUND_TIMEOUT_S},
    }
    client = {"dataClaim": "fl.data-path", "placement": claim_placement("fl.data-path")}
    s = parse_spec({"server": server, "client": client}, "any")
    now = time.time()

    def status(phase: Phase, round_: int = 0) -> FederatedLearningStatus:
        return FederatedLearningStatus(phase=phase, round=round_)

    fed.observe(NS, "waiting", status(Phase.WAITING), s, now)
    fed.observe(NS, "failed", status(Phase.FAILED), None, now)
    fed.observe(NS, "stalled", status(Phase.RUNNING, 1), s, now - STALL_S)
    fed.observe(NS, "healthy", status(Phase.RUNNING, 1), s, now)
    agg.last_report.labels("cluster1", NS, "stalled").set(now - STALL_S)
    agg.last_report.labels("cluster2", NS, "healthy").set(now)
    port = _free_port()
    http, _ = serve_metrics(fed.registry, "127.0.0.1", port, TOKEN)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        http.shutdown()
        http.server_close()


@pytest.fixture
def prometheus(tmp_path: Path, hub_metrics: str) -> Iterator[str]:
    """A Prometheus scraping `hub_metrics` once with the token and once without; its API URL."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: hack/install-system-deps.sh installs it"
    (tmp_path / "token").write_text(TOKEN)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(_chart_rules(tmp_path))],
        "scrape_configs": [
            {
                "job_name": "hub",
                "authorization": {"type": "Bearer", "credentials_file": str(tmp_path / "token")},
                "static_configs": [{"targets": [hub_metrics]}],
            },
            {"job_name": "hub-without-token", "static_configs": [{"targets": [hub_metrics]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            # Stops with the test run even when pytest itself is killed (as localfed's).
            "setpriv",
            "--pdeathsig",
            "TERM",
            "--",
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for(ready, 60, "Prometheus ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _api(url: str, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}/api/v1/{path}{query}", timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]


def _query(url: str, expr: str) -> list[dict[str, str]]:
    return [sample["metric"] for sample in _api(url, "query", query=expr)["result"]]


def test_prometheus_scrapes_the_hub_with_its_token_and_the_alerts_find_each_situation(
    prometheus: str,
) -> None:
    # The token opens /metrics; without it the scrape fails.
    def scraped() -> dict[str, dict[str, str]] | None:
        up = {m["job"]: m for m in _query(prometheus, "up == 1")}
        down = {m["job"] for m in _query(prometheus, "up == 0")}
        return up if "hub" in up and "hub-without-token" in down else None

    wait_for(scraped, 60, "the hub scraped with its token, and refused without")

    # Every rule of the chart loads and evaluates without error.
    def evaluated() -> dict[str, dict[str, Any]] | None:
        groups = _api(prometheus, "rules")["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        done = rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules.values())
        return rules if done and all(r["health"] == "ok" for r in rules.values()) else None

    rules = wait_for(evaluated, 60, "the chart's rules evaluated with health ok")
    assert set(rules) == {
        "OcmFlFederationWaitingTooLong",
        "OcmFlClusterNotReporting",
        "OcmFlRoundSlowerThanTimeout",
        "OcmFlFederationFailed",
    }

    # Each alert's expression, evaluated live by Prometheus, finds exactly its situation.
    def found(alert: str) -> set[tuple[str, ...]]:
        metrics = _query(prometheus, rules[alert]["query"])
        return {(m.get("cluster", ""), m["namespace"], m["name"]) for m in metrics}

    assert found("OcmFlFederationWaitingTooLong") == {("", NS, "waiting")}
    assert found("OcmFlFederationFailed") == {("", NS, "failed")}
    assert found("OcmFlRoundSlowerThanTimeout") == {("", NS, "stalled")}
    assert found("OcmFlClusterNotReporting") == {("cluster1", NS, "stalled")}

    # The failed run fires at once (for: 0m); the others are pending their `for:`.
    def alert_states() -> dict[str, str] | None:
        alerts = _api(prometheus, "alerts")["alerts"]
        states = {a["labels"]["alertname"]: a["state"] for a in alerts}
        return states if len(states) == 4 else None

    states = wait_for(alert_states, 60, "all four alerts active")
    assert states == {
        "OcmFlFederationWaitingTooLong": "pending",
        "OcmFlClusterNotReporting": "pending",
        "OcmFlRoundSlowerThanTimeout": "pending",
        "OcmFlFederationFailed": "firing",
    }
    alerts = {a["labels"]["alertname"]: a for a in _api(prometheus, "alerts")["alerts"]}
    assert f"{NS}/failed" in alerts["OcmFlFederationFailed"]["annotations"]["summary"]
