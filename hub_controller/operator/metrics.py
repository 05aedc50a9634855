"""Prometheus metrics of the FederatedLearning controller: each resource's phase, rounds and
last progress, so alerts can tell when a run waits too long, stalls or fails (the chart's
PrometheusRule, docs/install.md "Alerts"). They share one registry, and so the hub's
`/metrics`, with the aggregator's per-cluster series (aggregator/metrics.py).

Series are per resource (namespace, name) and go when the resource is deleted (`forget`).
"""

from __future__ import annotations

import contextlib
import threading

from prometheus_client import CollectorRegistry, Gauge

from hub_controller.api import FederatedLearningSpec, FederatedLearningStatus, Phase

PHASES = tuple(p.value for p in Phase)
Key = tuple[str, str]


class FederationMetrics:
    """The controller's gauges, set once per reconcile pass from the status it wrote."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ["namespace", "name"]
        self.phase = Gauge(
            "ocmfl_federation_phase",
            "1 for the resource's current phase, 0 for the other phases",
            [*labels, "phase"],
            registry=self.registry,
        )
        self.round = Gauge("ocmfl_federation_round", "Rounds done", labels, registry=self.registry)
        self.rounds_requested = Gauge(
            "ocmfl_federation_rounds_requested",
            "Rounds asked for (spec.server.rounds)",
            labels,
            registry=self.registry,
        )
        self.round_timeout = Gauge(
            "ocmfl_federation_round_timeout_seconds",
            "How long a round may take (spec.server.timeouts.roundSeconds)",
            labels,
            registry=self.registry,
        )
        self.progress = Gauge(
            "ocmfl_federation_progress_timestamp_seconds",
            "Unix time of the run's last progress: it became Running, or its round went up "
            "(or the hub started while it ran)",
            labels,
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._seen: dict[Key, tuple[str, int]] = {}

    def observe(
        self,
        namespace: str,
        name: str,
        status: FederatedLearningStatus,
        spec: FederatedLearningSpec | None,
        now: float,
    ) -> None:
        """The resource's status as written at unix time `now`; `spec` None when it is
        invalid (its phase is then all there is to say)."""
        key = (namespace, name)
        phase = status.phase.value
        with self._lock:
            before = self._seen.get(key)
            self._seen[key] = (phase, status.round)
        for value in PHASES:
            self.phase.labels(namespace, name, value).set(1 if value == phase else 0)
        self.round.labels(namespace, name).set(status.round)
        if spec is not None:
            self.rounds_requested.labels(namespace, name).set(spec.server.rounds)
            self.round_timeout.labels(namespace, name).set(spec.server.timeouts.round_seconds)
        progressed = before is None or (
            phase == Phase.RUNNING and (before[0] != phase or status.round > before[1])
        )
        if progressed:
            self.progress.labels(namespace, name).set(now)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the resource's series (it was deleted)."""
        with self._lock:
            known = self._seen.pop((namespace, name), None)
        if known is None:
            return
        for value in PHASES:
            self.phase.remove(namespace, name, value)
        for gauge in (self.round, self.rounds_requested, self.round_timeout, self.progress):
            # An invalid spec never set rounds_requested or round_timeout.
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)
