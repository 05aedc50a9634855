"""The project's CSR signer for agent identities, in the `ocm-fl-hub` process when
OCMFL_RUN_CSR_SIGNER=true: `policy.py` decides (pure), `handlers.py` applies decisions."""
