"""A stock Flower app: FedAvg's own loop, nothing from this project (no workloads.sdk)."""
