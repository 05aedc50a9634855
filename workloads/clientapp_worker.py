"""``python -m workloads.clientapp_worker``: the long-lived ClientApp worker (workloads.sdk.worker).

Its own module, so that running it does not execute workloads.sdk.worker a second time as
``__main__`` (the SDK package imports that module).
"""

import sys

from workloads.sdk.worker import main

if __name__ == "__main__":
    sys.exit(main())
