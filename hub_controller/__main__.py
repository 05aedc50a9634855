"""`ocm-fl-hub`: the hub process. kopf runs, by `--role` ($OCMFL_HUB_ROLE):

- `controller`: the FederatedLearning controller (hub_controller.operator) and the agents'
  report aggregator (hub_controller.aggregator). It parses tenant specs and serves gRPC, and
  holds no CA key: the aggregator's certificate comes from a Secret the signer keeps, and
  client certificates are checked against the agent CA's certificate alone;
- `signer`: the CSR signers for agent and Fleet identities, the hub-identity ledger they check
  requesters against, the aggregator's certificate, and each federation's Fleet CA and server
  certificates (hub_controller.signer). Only this part reads the hub CA's, the agent CA's and
  the Fleet CAs' keys;
- `all` (the default): both, in one process (the local plane's hub).

The chart runs `controller` and `signer` as two Deployments. OCMFL_RUN_CSR_SIGNER=false leaves
the agent signer out (agents then get no identity); any other value, or none, runs it.

Cluster-wide by default. `--namespace` (repeatable, globs allowed) limits the namespaced
watches, which include the ManifestWorks in the cluster namespaces: list those too (or a glob
that matches them), or run cluster-wide.
"""

from __future__ import annotations

import argparse
import logging
import os

from ocmfl import certlife, constants

ROLES = ("all", "controller", "signer")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ocm-fl-hub", description=__doc__)
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only these namespaces (repeatable); default: all",
    )
    parser.add_argument(
        "--role",
        choices=ROLES,
        default=os.environ.get(constants.ENV_HUB_ROLE) or "all",
        help="which parts to run (default: $OCMFL_HUB_ROLE, else all)",
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--no-aggregator",
        action="store_true",
        help="do not run the report aggregator in this process (it starts only when the agent "
        "CA's certificate is mounted anyway)",
    )
    parser.add_argument(
        "--liveness", default=None, help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    args = parser.parse_args(argv)
    try:  # a bad setting stops the hub at start, not at its first certificate
        certlife.lifetime_override()
    except certlife.CertLifetimeError as e:
        parser.error(str(e))
    namespaces = list(args.namespace)
    env_namespaces = os.environ.get(constants.ENV_WATCH_NAMESPACES, "")
    namespaces += [n.strip() for n in env_namespaces.split(",") if n.strip()]

    import kopf

    # Importing a part's handlers module registers its kopf handlers (startup handlers run in
    # import order: the signer's aggregator certificate before the aggregator looks for it).
    import hub_controller.membership_indexes

    if args.role in ("all", "signer"):
        if os.environ.get(constants.ENV_RUN_CSR_SIGNER, "").strip().lower() != "false":
            import hub_controller.signer.handlers
        # Always: client Fleet identities come only through this signer (keys made on
        # clusters), and both signers trust requesters only through the ledger.
        import hub_controller.signer.addon_status
        import hub_controller.signer.aggregator_cert
        import hub_controller.signer.fleet
        import hub_controller.signer.fleet_server
        import hub_controller.signer.ledger
    if args.role in ("all", "controller"):
        import hub_controller.operator.handlers

        if not args.no_aggregator:
            import hub_controller.aggregator.handlers  # noqa: F401

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    kopf.run(
        # The operator's own ManifestWork streams follow the same namespaces as kopf.
        memo=kopf.Memo(namespaces=namespaces),
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
    )


if __name__ == "__main__":
    main()
