"""Desired objects of one FederatedLearning (pure builders): its Placement, per-cluster
ManifestWorks, the server Job/Service/PVC and the credential Secrets."""
