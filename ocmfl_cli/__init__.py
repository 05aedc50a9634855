"""`ocm-fl`, the administrator's CLI (its own extra, `.[cli]`; not in the addon image).

`commands.py` holds the commands and the only door to the cluster; `dashboard.py` renders a
FederatedLearning resource (pure; also used by the local demo).
"""
