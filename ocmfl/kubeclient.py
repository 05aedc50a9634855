"""One way to build a kubernetes ApiClient: a kubeconfig file, else in-cluster config."""

from __future__ import annotations

from typing import Any


def api_client(kubeconfig: str | None = None) -> Any:
    """An ApiClient from `kubeconfig`, or from the pod's service account when None."""
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def custom_objects(kubeconfig: str | None = None) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api_client(kubeconfig))
