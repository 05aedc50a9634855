"""Prometheus metrics of the aggregator (one set per registry, so tests stay isolated).

Label sets stay bounded: refusals are counted by reason only (a fixed list), and the
per-federation series (cluster, namespace, name) exist only for reports the aggregator
accepted (their federation has a work on that cluster), at most `max_series` of them; past
that, accepted reports count under the label value OTHER.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge

REJECT_REASONS = (
    "no_identity",  # no or unreadable client certificate identity
    "cluster_mismatch",  # report names another cluster than the certificate
    "not_registered",  # not an accepted ManagedCluster with the addon enabled
    "invalid",  # a field failed validation
    "not_in_scope",  # no ManifestWork of that federation (uid) on the reporting cluster
    "hub_starting",  # the hub has not seen its ManifestWorks yet: come back later
    "too_many_streams",  # the cluster has its maximum of open streams
    "rate_limited",  # the cluster sends faster than its rate limit
    "run_rows",  # the run has its maximum of rows
    "store_full",  # the store has its maximum of rows or runs
)
OTHER = "_other"


class AggregatorMetrics:
    """Counters and gauges for reports received, rejected and the latest values."""

    def __init__(self, registry: CollectorRegistry | None = None, max_series: int = 5_000) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_series = max_series
        self._series: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
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
        self.last_report = Gauge(
            "ocmfl_cluster_last_report_timestamp_seconds",
            "Unix time of the last report accepted from a cluster's agent for a federation",
            labels,
            registry=self.registry,
        )
        self.final = Gauge(
            "ocmfl_cluster_final",
            "1 once a cluster's final report of the run (its client ended) was accepted",
            labels,
            registry=self.registry,
        )
        self.awaiting = Gauge(
            "ocmfl_reports_awaiting_status",
            "Accepted reports not acknowledged yet: the resource's status does not hold them",
            registry=self.registry,
        )
        self.streams = Gauge(
            "ocmfl_agent_streams", "Open agent report streams", registry=self.registry
        )
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)

    def series(self, cluster: str, namespace: str, name: str) -> tuple[str, str, str]:
        """The label values for an accepted report: its own while fewer than `max_series`
        federation series exist, else (OTHER, OTHER, OTHER)."""
        labels = (cluster, namespace, name)
        with self._lock:
            if labels in self._series:
                return labels
            if len(self._series) < self.max_series:
                self._series.add(labels)
                return labels
        return (OTHER, OTHER, OTHER)
