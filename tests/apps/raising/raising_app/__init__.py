"""An app whose ClientApp always raises: the platform must fail the run with its message."""
