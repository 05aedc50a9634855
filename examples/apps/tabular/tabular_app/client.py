"""The ClientApp Flower loads: thin (no torch import), it runs tabular_app.client_app in the
cluster's long-lived worker when there is one (ocm-fl-client starts it), else in this process."""

from workloads.sdk import forwarding_client_app

app = forwarding_client_app("tabular_app.client_app:app")
