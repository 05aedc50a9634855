"""Code generators run by developers (not shipped): the CRD from the API models (`crdgen`)
and the API reference (`apidoc`). Tests fail when their committed output drifts."""
