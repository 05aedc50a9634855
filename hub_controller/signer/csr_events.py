"""One CSR event, handled with retries: shared by the agent signer and the Fleet signer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from ocmfl.kube import Kube, KubeError, path_of

CSR_API_VERSION: Final = "certificates.k8s.io/v1"
ATTEMPTS: Final = 5  # a transient API failure is retried this often, then left to the next event


def handle_with_retries(
    kube: Kube,
    csr: dict[str, Any],
    handle: Callable[[dict[str, Any]], str | None],
    logger: Any,
    label: str,
) -> None:
    """Run `handle` on `csr` until it returns None (done).

    A transient API failure, or `handle` returning a reason to wait, is retried up to
    ATTEMPTS times with a growing pause, each time on the CSR as it is now (what failed may
    have changed it; a CSR deleted meanwhile ends it). A lasting failure, or a wait that
    outlives the attempts, is logged and left to the CSR's next event.
    """
    name = csr["metadata"]["name"]
    path = path_of(CSR_API_VERSION, "CertificateSigningRequest", None, name)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            if attempt > 1:
                fresh = kube.get(path)
                if fresh is None:
                    return
                csr = fresh
            waiting = handle(csr)
            if waiting is None:
                return
            if attempt == ATTEMPTS:
                logger.warning("%s %s: %s", label, name, waiting)
                return
        except KubeError as exc:
            if not exc.transient or attempt == ATTEMPTS:
                logger.error("%s %s: %s", label, name, exc)
                return
        time.sleep(attempt)
