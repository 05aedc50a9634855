"""The hub side of the addon.

Everything here runs in the hub process `ocm-fl-hub` (one Deployment; `__main__.py`), except
`bootstrap/`, which runs at install time:

- `operator/`: the kopf controller of FederatedLearning (indexes -> observed -> membership ->
  desired -> apply -> status fold);
- `aggregator/`: the agents' mTLS gRPC report stream and the report store the fold reads;
- `signer/`: the CSR signers for agent identities (agent CA) and Fleet identities, and the
  ledger of the hub credentials OCM issued to each cluster's agent;
- `bootstrap/`: the CA hook the Helm chart runs as a Job, and the AddOnTemplate registration
  and RBAC rules the chart carries;
- shared by the parts: `api.py` (the FederatedLearning API), `policy.py` (the namespace's
  FederationPolicy), `membership.py` (which clusters take part), `reports.py` (per-cluster
  report state), `ca.py` (the mounted CAs).
"""
