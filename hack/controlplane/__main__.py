"""CLI: ``python -m hack.controlplane build|up|down|status|supervise``."""

from hack.controlplane.cli import main

raise SystemExit(main())
