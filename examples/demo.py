"""The local demo federation: `make demo` (or `.venv/bin/python -m examples.demo`).

A real local OCM control plane (hub + 3 managed clusters: real kube-apiservers; OCM's
registration, placement and addon controllers; on each cluster OCM's registration agent, joined
from a bootstrap kubeconfig and accepted, and its work agent; hack/controlplane), the hub
controller with its aggregator and CSR signers, the chart's addon enabled on every cluster (OCM
deploys and registers the agent), digits partitions on two clusters with ClusterClaims
pointing at them (the third has no data and is not chosen), and examples/federatedlearning.yaml
(the digits example app, examples/apps/digits) applied. Progress is shown live; at the end
the model path, accuracy before/after on held-out data (scored by the app's ServerApp) and a
PNG of loss/accuracy per round per cluster. Exit code 0 only if training completed.
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from hack import controlplane as cp
from hack.controlplane.plane import cluster_names
from hack.localfed import (
    LocalFederation,
    apply_policy,
    claim_data,
    create_fl,
    wait_fl,
    write_partitions,
)
from ocmfl.kube import Kube
from ocmfl_cli.dashboard import (
    LiveView,
    NoHistoryError,
    logfmt,
    plain_lines,
    plot_history,
    print_dashboard,
    print_lines,
    print_table,
    summary_line,
)
from workloads.sdk import ModelStore

EXAMPLE = Path(__file__).resolve().parent / "federatedlearning.yaml"
POLICY = Path(__file__).resolve().parent / "federationpolicy.yaml"
NAMESPACE = "fl"
DEMO_PLANE_DIR = "/dev/shm/ocm-fl-demo-cp"
# How often the demo reads the resource: the end shows up at most this late.
FOLLOW_S = 0.5


def demo_resource(rounds: int, min_clients: int, test_dir: Path | None = None) -> dict[str, Any]:
    """examples/federatedlearning.yaml with the demo's rounds; with `test_dir`, the digits app
    also scores each round's model on that held-out data. The model store is the hub's: a
    HostPath directory of the resource's own under the admin's root (LocalFederation.store_dir)."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    server = body["spec"]["server"]
    server["rounds"] = rounds
    server["minAvailableClients"] = min_clients
    if test_dir is not None:
        server["app"]["runConfig"]["test-dir"] = str(test_dir)
    return body


def held_out_scores(fl: dict[str, Any], models: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(initial, final) server-side metrics on the held-out data, from the manifest of the
    resource's model store `models` (the app evaluates before round 1 and after every round)."""
    store = ModelStore(models, str(fl["metadata"]["uid"]))
    manifest = store.manifest()
    starts = (manifest.get("info") or {}).get("starts") or [{}]
    final = manifest.get("final") or {}
    return dict(starts[0].get("server") or {}), dict(
        (final.get("metrics") or {}).get("server") or {}
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.demo", description=__doc__)
    p.add_argument("--clusters", type=int, default=3, help="managed clusters (>= 2)")
    p.add_argument("--data-clusters", type=int, default=2, help="clusters that get data")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/ocm-fl-demo"))
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("--keep", action="store_true", help="leave everything running at the end")
    p.add_argument(
        "--plane-dir",
        type=Path,
        default=Path(os.environ.get("OCMFL_DEMO_CP_DIR") or DEMO_PLANE_DIR),
        help=f"the local plane's state dir (default $OCMFL_DEMO_CP_DIR or {DEMO_PLANE_DIR})",
    )
    a = p.parse_args(argv)
    # SIGTERM/SIGHUP unwind like Ctrl-C, so the finally below stops everything we started.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    if not 1 <= a.data_clusters <= a.clusters:
        p.error("--data-clusters must be between 1 and --clusters")
    console = Console()
    started = time.monotonic()
    workdir = a.workdir.resolve()
    state_dir = a.plane_dir

    body = demo_resource(a.rounds, a.data_clusters, workdir / "data" / "test")
    claim = body["spec"]["client"]["dataClaim"]
    with_data = cluster_names(a.clusters)[: a.data_clusters]
    # The data files need no plane: written while it starts (mostly waiting on its processes).
    data_pool = ThreadPoolExecutor(1)
    partitions = data_pool.submit(write_partitions, workdir / "data", with_data)
    data_pool.shutdown(wait=False)

    console.rule("[bold]1/5 local OCM control plane")
    state = cp.up(a.clusters, state_dir=state_dir, echo=True)
    plane = cp.ControlPlane.from_state(state)
    fed = LocalFederation(plane, workdir / "federation")
    hub = Kube(plane.hub_kubeconfig)
    ok = False
    try:
        console.rule("[bold]2/5 hub controller, aggregator, signers; the addon on every cluster")
        fed.start()
        say(console, f"aggregator (mTLS gRPC) on {fed.aggregator_address}; logs in {workdir}")
        for cluster in fed.clusters:
            say(
                console,
                f"  agent {cluster}: deployed by OCM, hub kubeconfig from its registration agent, "
                "identity from the hub's signer",
            )

        console.rule("[bold]3/5 data stays on its cluster: partitions + ClusterClaims")
        paths = partitions.result()
        claim_data(plane, paths, claim)
        for cluster in plane.clusters:
            where = paths.get(cluster)
            say(console, f"  {cluster}: {claim}={where}" if where else f"  {cluster}: no data")

        console.rule("[bold]4/5 FederatedLearning applied; training")
        name = body["metadata"]["name"]
        # The admin's word first: what namespace fl may use (else the resource is refused).
        apply_policy(hub, NAMESPACE, yaml.safe_load(POLICY.read_text())["spec"])
        say(console, f"  FederationPolicy default in {NAMESPACE}: {POLICY.name}")
        create_fl(hub, NAMESPACE, body, grant=False)
        final = follow(console, hub, name, a.timeout, fed)

        console.rule("[bold]5/5 result")
        status = final.get("status") or {}
        ok = status.get("phase") == "Completed"
        report(console, final, workdir, ok, fed.store_dir(final) if ok else workdir)
        console.print(f"wall time {time.monotonic() - started:.0f}s")
    finally:
        hub.close()
        if a.keep:
            say(
                console,
                f"left running (--keep): KUBECONFIG={plane.hub_kubeconfig} "
                f"ocm-fl status digits -n {NAMESPACE}; stop with "
                f"OCMFL_CP_DIR={state_dir} .venv/bin/python -m hack.controlplane down",
            )
        else:
            fed.stop()
            cp.down(state_dir)
    return 0 if ok else 1


def follow(
    console: Console, hub: Kube, name: str, timeout: float, fed: LocalFederation
) -> dict[str, Any]:
    """Show the run until it ends: live on a terminal; in a log or pipe, a line per change."""
    if console.is_terminal:
        view = LiveView({"metadata": {"name": name, "namespace": NAMESPACE}})
        with Live(view, console=console, refresh_per_second=2):

            def update(obj: dict[str, Any]) -> None:
                view.fl = obj

            final = wait_fl(hub, NAMESPACE, name, timeout, update, fed, FOLLOW_S)
        print_dashboard(console, final)  # where the table does not fit: records, whole
        return final
    logged: list[str] = []

    def log_change(obj: dict[str, Any]) -> None:
        line = summary_line(obj)
        if not logged or logged[-1] != line:
            logged.append(line)
            print(line, flush=True)

    final = wait_fl(hub, NAMESPACE, name, timeout, log_change, fed, FOLLOW_S)
    for line in plain_lines(final)[1:]:
        print(line, flush=True)
    return final


def say(console: Console, text: str) -> None:
    """One line of plain text (no markup), never wrapped: paths in it stay whole in a pipe,
    a log or a narrow terminal."""
    print_lines(console, [text])


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def report(console: Console, fl: dict[str, Any], workdir: Path, ok: bool, store: Path) -> None:
    """Model, accuracy before/after on held-out data, plot. The scores are a table on a
    terminal wide enough for it, else one record per line (dashboard.print_table); paths are
    printed whole on one line."""
    status = fl.get("status") or {}
    if not ok:
        console.print(
            Text(f"training did not complete: {status.get('message')}", style="red"),
            soft_wrap=True,
        )
        return
    model = status.get("model") or {}
    path = Path(str(model.get("path") or ""))
    title = "global model on held-out data (never seen by any cluster)"
    table = Table(title=title)
    table.add_column("model")
    table.add_column("accuracy", justify="right", no_wrap=True)
    table.add_column("loss", justify="right", no_wrap=True)
    records = []
    before, after = held_out_scores(fl, store)
    for label, scores in (("initial", before), (f"final (round {model.get('round')})", after)):
        if scores:
            acc, loss = f"{scores['test-accuracy']:.3f}", f"{scores['test-loss']:.3f}"
            table.add_row(label, acc, loss)
            records.append(logfmt([("held-out", label), ("accuracy", acc), ("loss", loss)]))
    print_table(console, table, [f"{title}:", *records])
    say(console, f"model: {path} sha256 {model.get('sha256')}")
    try:
        png = plot_history(fl, workdir / "metrics.png")
        say(console, f"loss/accuracy per round per cluster: {png}")
    except NoHistoryError as exc:
        console.print(Text(f"no plot: {exc}", style="yellow"), soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
