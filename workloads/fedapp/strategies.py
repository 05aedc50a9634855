"""FedAvg / FedProx that keep each client's metrics by cluster and fail on too few results.

Flower's strategies carry on (and the run ends "completed") when clients fail; here a round
with fewer successful replies than ``min_clients`` raises, so the ServerApp, and with it the
run, fails.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg, FedProx

from workloads.fedapp.settings import RunSettings

CLIENT_RECORD = "client"


class TooFewResultsError(RuntimeError):
    """A round ended with fewer successful client replies than the minimum."""


def cluster_of(msg: Message) -> str:
    """The cluster name a reply carries (node id when the client did not say)."""
    record = msg.content.config_records.get(CLIENT_RECORD)
    if record is not None and "cluster" in record:
        return str(record["cluster"])
    return f"node-{msg.metadata.src_node_id}"


def split_replies(
    replies: Iterable[Message], min_clients: int, phase: str, server_round: int
) -> tuple[list[Message], dict[str, dict[str, Any]]]:
    """Valid replies and per-cluster metrics; raise TooFewResultsError below the minimum."""
    valid: list[Message] = []
    errors: list[str] = []
    for msg in replies:
        if msg.has_error():
            errors.append(f"node {msg.metadata.src_node_id}: {msg.error.reason}")
        else:
            valid.append(msg)
    if len(valid) < min_clients:
        detail = "; ".join(errors) if errors else "no reply before the round timeout"
        raise TooFewResultsError(
            f"round {server_round} {phase}: {len(valid)} successful client results, "
            f"minimum is {min_clients} ({detail})"
        )
    per_cluster: dict[str, dict[str, Any]] = {}
    for msg in valid:
        metrics = msg.content.metric_records.get("metrics") or MetricRecord()
        per_cluster[cluster_of(msg)] = {k: v for k, v in metrics.items()}
    return valid, per_cluster


class TrackingFedAvg(FedAvg):
    """FedAvg (weighted by num-examples) with per-round, per-cluster metrics and the
    min-results rule. Calls to the parent go through super(), so TrackingFedProx gets the
    same tracking on top of FedProx."""

    def __init__(self, min_clients: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.min_clients = min_clients
        self.train_by_round: dict[int, dict[str, dict[str, Any]]] = {}
        self.evaluate_by_round: dict[int, dict[str, dict[str, Any]]] = {}

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the minimum, record per-cluster metrics, then average."""
        valid, per = split_replies(replies, self.min_clients, "train", server_round)
        self.train_by_round[server_round] = per
        return super().aggregate_train(server_round, valid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Check the minimum, record per-cluster metrics, then average."""
        if self.fraction_evaluate == 0.0:
            return None
        valid, per = split_replies(replies, self.min_clients, "evaluate", server_round)
        self.evaluate_by_round[server_round] = per
        return super().aggregate_evaluate(server_round, valid)


class TrackingFedProx(TrackingFedAvg, FedProx):
    """FedProx (clients add mu/2 ||w - w_global||^2) with the same tracking (MRO:
    TrackingFedAvg -> FedProx -> FedAvg)."""


def make_strategy(settings: RunSettings) -> TrackingFedAvg | TrackingFedProx:
    """The strategy the run settings ask for."""
    common: dict[str, Any] = {
        "fraction_train": settings.fraction_train,
        "fraction_evaluate": settings.fraction_evaluate,
        "min_train_nodes": settings.min_clients,
        "min_evaluate_nodes": settings.min_clients if settings.fraction_evaluate > 0 else 0,
        "min_available_nodes": settings.min_clients,
    }
    if settings.strategy == "fedprox":
        return TrackingFedProx(settings.min_clients, proximal_mu=settings.proximal_mu, **common)
    return TrackingFedAvg(settings.min_clients, **common)
