"""The FederatedLearning controller (kopf), in the `ocm-fl-hub` process.

`handlers.py` holds the kopf handlers (importing it registers them), `indexes.py` the kopf
indexes of related objects; the rest is pure: `observed.py` reads API objects, `desired/`
builds the objects to apply, `fold.py` computes the status.
"""
