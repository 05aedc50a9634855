"""Prometheus metrics of the aggregator (one set per registry, so tests stay isolated)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REJECT_REASONS = (
    "no_identity",  # no or unreadable client certificate identity
    "cluster_mismatch",  # report names another cluster than the certificate
    "not_registered",  # not an accepted ManagedCluster with the addon enabled
    "invalid",  # a field failed validation
)


class AggregatorMetrics:
    """Counters and gauges for reports received, rejected and the latest values."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ["cluster", "namespace", "name"]
        self.reports = Counter(
            "ocmfl_reports_received",
            "Reports accepted from agents",
            labels,
            registry=self.registry,
        )
        self.rejected = Counter(
            "ocmfl_reports_rejected",
            "Reports or streams refused, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.last_round = Gauge(
            "ocmfl_cluster_round",
            "Latest round a cluster reported",
            labels,
            registry=self.registry,
        )
        self.accuracy = Gauge(
            "ocmfl_cluster_accuracy",
            "Latest local accuracy a cluster reported",
            labels,
            registry=self.registry,
        )
        self.loss = Gauge(
            "ocmfl_cluster_loss",
            "Latest local loss a cluster reported",
            labels,
            registry=self.registry,
        )
        self.streams = Gauge(
            "ocmfl_agent_streams", "Open agent report streams", registry=self.registry
        )
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
