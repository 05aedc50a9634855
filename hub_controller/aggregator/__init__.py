"""The aggregator, in the `ocm-fl-hub` process: agents' mTLS gRPC report streams
(`servicer.py`) folded into the report store (`store.py`) that the operator's status fold reads.
`handlers.py` starts it with kopf; `service.py` issues its server certificate from the hub CA,
trusts client certificates of the agent CA only, and serves Prometheus /metrics
(`metrics.py`)."""
