"""Install-time pieces: the CA hook the Helm chart runs as a Job (`python -m
hub_controller.bootstrap.ca_init`), the AddOnTemplate registration and the RBAC rules the chart
grants (checked against the chart by tests/unit/test_deploy.py)."""
