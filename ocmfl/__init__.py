"""Shared pieces of the OCM federated-learning addon: constants, PKI helpers, wire stubs."""
