"""The project's CSR signers, in the `ocm-fl-hub` process: agent identities (`policy.py`
decides, pure; `handlers.py` applies decisions, signing with the agent CA) and Fleet
identities (`fleet.py`). Both trust a requester only with a hub credential OCM issued to that
cluster's agent through the cluster's own registration agent (`hub_identity.py`, pure;
`ledger.py` records them on the ManagedClusterAddOns and warns about forged ones)."""
