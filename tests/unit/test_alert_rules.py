"""The chart's alert rules (templates/prometheusrule.yaml) do what docs/install.md, "Alerts", says.

The chart is rendered with `metrics.prometheusRule.enabled=true`; its rule groups are written as
a Prometheus rule file, checked with `promtool check rules`, then evaluated with
`promtool test rules` against made-up series of the hub's metrics (the contract of
hub_controller's /metrics: ocmfl_federation_phase, _round_timeout_seconds,
_progress_timestamp_seconds and ocmfl_cluster_last_report_timestamp_seconds). For each alert
there is a situation where it must fire, with its labels and annotations, and one where it
must not; a Completed run fires nothing at all.

In promtool tests the clock starts at 0: `time()` at eval_time 12m is 720, so a timestamp
series with value 0 is 720 s old there.

helm comes from hack/tools/build-helm.sh (skip, saying so, when absent, as in test_deploy.py);
promtool from the Debian package prometheus (hack/install-system-deps.sh): a missing promtool
is a failure, not a skip.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "ocm-federated-learning"
NAMESPACE = "ocm-fl-system"
RELEASE = "ocm-fl"
ENABLED = "metrics.prometheusRule.enabled=true"
PHASES = ("Pending", "Waiting", "Running", "Completed", "Failed")
TIMEOUT = "ocmfl_federation_round_timeout_seconds"
PROGRESS = "ocmfl_federation_progress_timestamp_seconds"
LAST_REPORT = "ocmfl_cluster_last_report_timestamp_seconds"
ALERTS = (
    "OcmFlFederationWaitingTooLong",
    "OcmFlClusterNotReporting",
    "OcmFlRoundSlowerThanTimeout",
    "OcmFlFederationFailed",
)


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool not found on PATH: install the Debian package prometheus "
            "(bash hack/install-system-deps.sh)"
        )
    return path


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def render(helm: str, *sets: str) -> list[dict[str, Any]]:
    cmd = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        cmd += ["--set", s]
    res = _run(cmd)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def prometheus_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "PrometheusRule"]


def rule_file(helm: str, tmp_path: Path) -> Path:
    """The rendered PrometheusRule's groups as a Prometheus rule file."""
    (rule,) = prometheus_rules(render(helm, ENABLED))
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


# --- the series ----------------------------------------------------------------------------------


def phase_series(namespace: str, name: str, *spans: tuple[str, int]) -> list[dict[str, str]]:
    """ocmfl_federation_phase of one resource, one sample a minute: (phase, minutes) spans.

    As the hub exports it: 1 for the current phase, 0 for each of the others.
    """
    timeline = [phase for phase, minutes in spans for _ in range(minutes)]
    return [
        {
            "series": f'ocmfl_federation_phase{{namespace="{namespace}",name="{name}",'
            f'phase="{phase}"}}',
            "values": " ".join("1" if p == phase else "0" for p in timeline),
        }
        for phase in PHASES
    ]


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{selector}}}", "values": values}


def alert(severity: str, annotations: dict[str, str], **labels: str) -> dict[str, Any]:
    return {
        "exp_labels": {"severity": severity, **labels},
        "exp_annotations": annotations,
    }


def describe(namespace: str, name: str) -> str:
    return f"kubectl describe fl -n {namespace} {name}"


# --- one promtool test per alert ----------------------------------------------------------------


def waiting_too_long() -> dict[str, Any]:
    """fl/stuck waits 20 min: fires from 15 min (waitingFor) on; fl/quick waited only 10 min."""
    ann = {
        "summary": "FederatedLearning fl/stuck has been Waiting for more than 15m.",
        "description": "It still waits for its clusters. Look at its conditions and events: "
        f"{describe('fl', 'stuck')} (are the selected clusters' addon agents available, "
        "do they hold the data claim?).",
    }
    return {
        "interval": "1m",
        "input_series": [
            *phase_series("fl", "stuck", ("Pending", 1), ("Waiting", 20)),
            *phase_series("fl", "quick", ("Pending", 1), ("Waiting", 10), ("Running", 10)),
        ],
        "alert_rule_test": [
            {"eval_time": "14m", "alertname": "OcmFlFederationWaitingTooLong", "exp_alerts": []},
            {
                "eval_time": "17m",
                "alertname": "OcmFlFederationWaitingTooLong",
                "exp_alerts": [
                    alert("warning", ann, namespace="fl", name="stuck", phase="Waiting")
                ],
            },
        ],
    }


def cluster_not_reporting() -> dict[str, Any]:
    """Round timeout 600 s. At 12 min (720 s): in the Running fl/digits, c1 last reported at
    0 (720 s ago: fires), c2 at 620 (100 s ago: quiet); in the Completed fl/done, c1 last
    reported at 0 too, but a finished run is not watched."""
    ann = {
        "summary": "Cluster c1 has not reported for FederatedLearning fl/digits for longer "
        "than a round's timeout.",
        "description": "Its last accepted report is 12m 0s old. Look at "
        f"{describe('fl', 'digits')} and at the addon agent and FL client on cluster c1.",
    }
    return {
        "interval": "1m",
        "input_series": [
            *phase_series("fl", "digits", ("Running", 16)),
            *phase_series("fl", "done", ("Completed", 16)),
            series(TIMEOUT, "600x15", namespace="fl", name="digits"),
            series(TIMEOUT, "600x15", namespace="fl", name="done"),
            series(LAST_REPORT, "0x15", cluster="c1", namespace="fl", name="digits"),
            series(LAST_REPORT, "620x15", cluster="c2", namespace="fl", name="digits"),
            series(LAST_REPORT, "0x15", cluster="c1", namespace="fl", name="done"),
        ],
        "alert_rule_test": [
            # 10 min: exactly the timeout, not longer; 11 min: longer, but not yet for 1 min.
            {"eval_time": "10m", "alertname": "OcmFlClusterNotReporting", "exp_alerts": []},
            {"eval_time": "11m", "alertname": "OcmFlClusterNotReporting", "exp_alerts": []},
            {
                "eval_time": "12m",
                "alertname": "OcmFlClusterNotReporting",
                "exp_alerts": [alert("warning", ann, cluster="c1", namespace="fl", name="digits")],
            },
        ],
    }


def round_slower_than_timeout() -> dict[str, Any]:
    """Round timeout 600 s. fl/stuck made no progress since 0: 720 s at 12 min, fires;
    fl/moving finishes a round every 5 min (last progress 600, 120 s ago): quiet."""
    ann = {
        "summary": "FederatedLearning fl/stuck has made no round progress for longer than "
        "its round timeout.",
        "description": "Its last progress is 12m 0s old. Look at "
        f"{describe('fl', 'stuck')} and at its server Job's logs.",
    }
    return {
        "interval": "1m",
        "input_series": [
            *phase_series("fl", "stuck", ("Running", 16)),
            *phase_series("fl", "moving", ("Running", 16)),
            series(TIMEOUT, "600x15", namespace="fl", name="stuck"),
            series(TIMEOUT, "600x15", namespace="fl", name="moving"),
            series(PROGRESS, "0x15", namespace="fl", name="stuck"),
            series(PROGRESS, "0x4 300x4 600x4 900", namespace="fl", name="moving"),
        ],
        "alert_rule_test": [
            # 10 min: exactly the timeout, not longer; 11 min: longer, but not yet for 1 min.
            {"eval_time": "10m", "alertname": "OcmFlRoundSlowerThanTimeout", "exp_alerts": []},
            {"eval_time": "11m", "alertname": "OcmFlRoundSlowerThanTimeout", "exp_alerts": []},
            {
                "eval_time": "12m",
                "alertname": "OcmFlRoundSlowerThanTimeout",
                "exp_alerts": [alert("warning", ann, namespace="fl", name="stuck")],
            },
        ],
    }


def federation_failed() -> dict[str, Any]:
    """fl/broken runs 3 min, then Failed: critical at once (for: 0m)."""
    ann = {
        "summary": "FederatedLearning fl/broken has Failed.",
        "description": f"Its status says why (reason and message): {describe('fl', 'broken')}",
    }
    return {
        "interval": "1m",
        "input_series": phase_series("fl", "broken", ("Running", 3), ("Failed", 5)),
        "alert_rule_test": [
            {"eval_time": "2m", "alertname": "OcmFlFederationFailed", "exp_alerts": []},
            {
                "eval_time": "3m",
                "alertname": "OcmFlFederationFailed",
                "exp_alerts": [
                    alert("critical", ann, namespace="fl", name="broken", phase="Failed")
                ],
            },
        ],
    }


def completed_run() -> dict[str, Any]:
    """A whole run, Pending 1 min, Waiting 5, Running 10 (3 rounds), then Completed for 20 min
    with every timestamp long stale: at 35 min no alert fires, or is even pending."""
    fl = {"namespace": "fl", "name": "digits"}
    return {
        "interval": "1m",
        "input_series": [
            *phase_series(
                "fl", "digits", ("Pending", 1), ("Waiting", 5), ("Running", 10), ("Completed", 20)
            ),
            series(TIMEOUT, "600x35", **fl),
            series("ocmfl_federation_rounds_requested", "3x35", **fl),
            # Rounds done at 9, 12 and 15 min; progress: Running at 6 min (360 s), then each round.
            series("ocmfl_federation_round", "0x8 1x2 2x2 3x21", **fl),
            series(PROGRESS, "0x5 360x2 540x2 720x2 900x22", **fl),
            # c1 reports every minute while Running, then falls silent.
            series(LAST_REPORT, "0x5 360+60x9 900x20", cluster="c1", **fl),
        ],
        "alert_rule_test": [
            {"eval_time": "35m", "alertname": name, "exp_alerts": []} for name in ALERTS
        ],
        "promql_expr_test": [{"expr": "ALERTS", "eval_time": "35m", "exp_samples": []}],
    }


# --- tests ---------------------------------------------------------------------------------------


def test_no_prometheus_rule_by_default(helm: str) -> None:
    assert prometheus_rules(render(helm)) == []


def test_chart_lints_clean_with_prometheus_rule(helm: str) -> None:
    cmd = [helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--set", ENABLED]
    res = _run(cmd)
    assert res.returncode == 0, res.stdout + res.stderr


def test_prometheus_rule_rendered(helm: str) -> None:
    (rule,) = prometheus_rules(
        render(
            helm,
            ENABLED,
            "metrics.prometheusRule.labels.release=prometheus",
            "metrics.prometheusRule.waitingFor=30m",
        )
    )
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE
    labels = rule["metadata"]["labels"]
    assert labels["release"] == "prometheus"
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert labels["app.kubernetes.io/part-of"] == "ocm-federated-learning"
    (group,) = rule["spec"]["groups"]
    assert group["name"] == "ocm-federated-learning"
    rules = {r["alert"]: r for r in group["rules"]}
    assert tuple(rules) == ALERTS
    assert rules["OcmFlFederationWaitingTooLong"]["for"] == "30m"
    for r in rules.values():
        assert r["labels"]["severity"] in ("warning", "critical")
        # Helm left the alert templates to Prometheus, and each says where to look.
        for text in r["annotations"].values():
            assert "{{ $labels.namespace }}" in text
        assert "kubectl describe fl -n" in r["annotations"]["description"]


def test_promtool_checks_the_rules(helm: str, promtool: str, tmp_path: Path) -> None:
    res = _run([promtool, "check", "rules", str(rule_file(helm, tmp_path))])
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in res.stdout, res.stdout


def test_promtool_evaluates_each_alert(helm: str, promtool: str, tmp_path: Path) -> None:
    rules = rule_file(helm, tmp_path)
    tests = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            waiting_too_long(),
            cluster_not_reporting(),
            round_slower_than_timeout(),
            federation_failed(),
            completed_run(),
        ],
    }
    test_file = tmp_path / "alerts_test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False, width=1000))
    res = _run([promtool, "test", "rules", str(test_file)])
    assert res.returncode == 0, f"promtool test rules failed:\n{res.stdout}{res.stderr}"
