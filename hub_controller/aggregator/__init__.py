"""Hub-side aggregator: agents' mTLS report streams -> ReportStore -> FederatedLearning status."""

from hub_controller.aggregator.metrics import AggregatorMetrics
from hub_controller.aggregator.registry import (
    ClusterRegistry,
    InMemoryClusterRegistry,
    KubernetesClusterRegistry,
)
from hub_controller.aggregator.servicer import (
    AggregatorServer,
    ReloadingServerCredentials,
    StatusServicer,
)
from hub_controller.aggregator.store import (
    ClusterReport,
    ReportStore,
    RoundRow,
    merge_cluster_rows,
    status_rows,
)
from hub_controller.aggregator.writer import KubernetesStatusClient, StatusClient, StatusWriter

__all__ = [
    "AggregatorMetrics",
    "AggregatorServer",
    "ClusterRegistry",
    "ClusterReport",
    "InMemoryClusterRegistry",
    "KubernetesClusterRegistry",
    "KubernetesStatusClient",
    "ReloadingServerCredentials",
    "ReportStore",
    "RoundRow",
    "StatusClient",
    "StatusServicer",
    "StatusWriter",
    "merge_cluster_rows",
    "status_rows",
]
