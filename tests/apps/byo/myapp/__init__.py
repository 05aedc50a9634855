"""My first app on the ocm-fl platform."""
