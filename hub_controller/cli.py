"""`ocm-fl`: the administrator's view of a FederatedLearning resource.

    ocm-fl status NAME [-n NS] [--context CTX]     phase, rounds, one row per cluster
    ocm-fl watch NAME                               the same, live, until Completed/Failed
    ocm-fl plot NAME -o metrics.png                 per-cluster loss/accuracy as a chart
    ocm-fl model NAME                               the trained model artifact

Everything is read from the resource's status through the Kubernetes API (any kubeconfig
and context); the formatting functions are pure and take the resource as a dict.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ocmfl import constants

FL = Mapping[str, Any]
TERMINAL_PHASES = frozenset({"Completed", "Failed"})
_PHASE_STYLE = {
    "Completed": "bold green",
    "Failed": "bold red",
    "Running": "cyan",
    "Succeeded": "green",
    "NoData": "yellow",
}

app = typer.Typer(
    name="ocm-fl",
    help="Inspect FederatedLearning resources on an OCM hub.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


# --- pure: from the resource dict to what is shown ---------------------------------------


def _status(fl: FL) -> Mapping[str, Any]:
    return fl.get("status") or {}


def _fmt(value: Any, spec: str = "") -> str:
    if value is None or value == "":
        return "-"
    if spec and isinstance(value, int | float):
        return format(value, spec)
    return str(value)


def summary(fl: FL) -> dict[str, str]:
    """One-line facts: phase, round/total, clients, accuracy, message."""
    st = _status(fl)
    total = st.get("totalRounds") or (fl.get("spec") or {}).get("server", {}).get("rounds")
    return {
        "name": f"{fl['metadata'].get('namespace', '')}/{fl['metadata']['name']}",
        "phase": str(st.get("phase") or "Pending"),
        "round": f"{st.get('round', 0)}/{_fmt(total)}",
        "clients": _fmt(st.get("clients")),
        "accuracy": _fmt(st.get("accuracy"), ".4f"),
        "message": str(st.get("message") or ""),
    }


def cluster_rows(fl: FL) -> list[dict[str, str]]:
    """One row per selected cluster, sorted by name."""
    rows = []
    for c in sorted(_status(fl).get("clusters") or [], key=lambda c: str(c.get("name"))):
        rows.append(
            {
                "cluster": str(c.get("name")),
                "phase": str(c.get("phase") or "-"),
                "round": _fmt(c.get("round")),
                "samples": _fmt(c.get("samples")),
                "loss": _fmt(c.get("loss"), ".4f"),
                "accuracy": _fmt(c.get("accuracy"), ".4f"),
                "data": _fmt(c.get("dataPath")),
                "last report": _fmt(c.get("lastReportTime")),
                "reason": str(c.get("reason") or ""),
            }
        )
    return rows


def condition_rows(fl: FL) -> list[dict[str, str]]:
    """The status conditions, as shown."""
    return [
        {
            "type": str(c.get("type")),
            "status": str(c.get("status")),
            "reason": str(c.get("reason") or ""),
            "message": str(c.get("message") or ""),
        }
        for c in _status(fl).get("conditions") or []
    ]


def model_info(fl: FL) -> dict[str, Any] | None:
    """The model artifact (path, round, sha256, metrics), or None before there is one."""
    model = _status(fl).get("model")
    return dict(model) if model else None


def plot_series(fl: FL) -> dict[str, dict[str, float]]:
    """{"loss": {cluster: value}, "accuracy": {cluster: value}} from the per-cluster rows."""
    series: dict[str, dict[str, float]] = {"loss": {}, "accuracy": {}}
    for c in _status(fl).get("clusters") or []:
        for key in series:
            value = c.get(key)
            if isinstance(value, int | float):
                series[key][str(c.get("name"))] = float(value)
    return series


def render(fl: FL) -> Group:
    """The rich renderable of `ocm-fl status`."""
    s = summary(fl)
    head = Text.assemble(
        (s["name"], "bold"),
        "  phase ",
        (s["phase"], _PHASE_STYLE.get(s["phase"], "")),
        f"  round {s['round']}  clients {s['clients']}  accuracy {s['accuracy']}",
    )
    parts: list[Any] = [head]
    if s["message"]:
        parts.append(Text(s["message"], style="dim"))
    rows = cluster_rows(fl)
    if rows:
        table = Table(title="clusters", title_justify="left")
        for col in rows[0]:
            table.add_column(col, overflow="fold", no_wrap=col in ("cluster", "phase"))
        for row in rows:
            table.add_row(
                *(
                    Text(v, style=_PHASE_STYLE.get(v, "")) if k == "phase" else v
                    for k, v in row.items()
                )
            )
        parts.append(table)
    conditions = condition_rows(fl)
    if conditions:
        ctable = Table(title="conditions", title_justify="left")
        for col in conditions[0]:
            ctable.add_column(col, overflow="fold")
        for row in conditions:
            ctable.add_row(*row.values())
        parts.append(ctable)
    model = model_info(fl)
    if model:
        parts.append(Text(f"model: {model.get('path')} (round {_fmt(model.get('round'))})"))
    return Group(*parts)


def plot(fl: FL, out: Path) -> Path:
    """Write a bar chart of each cluster's latest loss and accuracy to `out` (PNG, SVG...).

    The status holds each cluster's latest values only (no per-round history), so this is a
    snapshot; run it after Completed for the final numbers.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = plot_series(fl)
    s = summary(fl)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key in zip(axes, ("loss", "accuracy"), strict=True):
        values = series[key]
        names = sorted(values)
        ax.bar(
            names, [values[n] for n in names], color="tab:blue" if key == "loss" else "tab:green"
        )
        ax.set_title(f"{key} per cluster")
        ax.set_xlabel("cluster")
        if key == "accuracy":
            ax.set_ylim(0, 1)
            overall = _status(fl).get("accuracy")
            if isinstance(overall, int | float):
                ax.axhline(float(overall), color="black", linestyle="--", label="federated")
                ax.legend()
        if not names:
            ax.text(0.5, 0.5, "no reports yet", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(f"{s['name']}  {s['phase']}  round {s['round']}")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


# --- I/O edge: the Kubernetes API --------------------------------------------------------


def _api(kubeconfig: str | None, context: str | None) -> Any:
    from kubernetes import client, config

    if kubeconfig is None and context is None:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return client.CustomObjectsApi()
        except config.ConfigException:
            pass
    api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context
    )
    return client.CustomObjectsApi(api_client)


def load_fl(
    name: str, namespace: str, kubeconfig: str | None, context: str | None
) -> dict[str, Any]:
    """GET the FederatedLearning resource."""
    api = _api(kubeconfig, context)
    obj: dict[str, Any] = api.get_namespaced_custom_object(
        constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name
    )
    return obj


def watch_fl(
    name: str, namespace: str, kubeconfig: str | None, context: str | None
) -> Iterator[dict[str, Any]]:
    """The resource now, then on every change (a watch on that one object)."""
    from kubernetes import watch

    api = _api(kubeconfig, context)
    yield api.get_namespaced_custom_object(
        constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name
    )
    while True:
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        for event in stream.stream(  # type: ignore[no-untyped-call]
            api.list_namespaced_custom_object,
            constants.GROUP,
            constants.VERSION,
            namespace,
            constants.PLURAL,
            field_selector=f"metadata.name={name}",
            timeout_seconds=300,
        ):
            if event["type"] in ("ADDED", "MODIFIED"):
                yield event["object"]
            elif event["type"] == "DELETED":
                return


# Swappable in tests: (name, namespace, kubeconfig, context) -> resource / stream.
Loader = Callable[[str, str, str | None, str | None], dict[str, Any]]
Watcher = Callable[[str, str, str | None, str | None], Iterator[dict[str, Any]]]
loader: Loader = load_fl
watcher: Watcher = watch_fl


# --- commands ------------------------------------------------------------------------------

NameArg = Annotated[str, typer.Argument(help="FederatedLearning name")]
NamespaceOpt = Annotated[str, typer.Option("--namespace", "-n", help="its namespace")]
ContextOpt = Annotated[str | None, typer.Option("--context", help="kubeconfig context")]
KubeconfigOpt = Annotated[
    str | None, typer.Option("--kubeconfig", envvar="KUBECONFIG", help="kubeconfig file")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def _get(name: str, namespace: str, kubeconfig: str | None, context: str | None) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        return loader(name, namespace, kubeconfig, context)
    except ApiException as e:
        if e.status == 404:
            console.print(f"[red]FederatedLearning {namespace}/{name} not found[/red]")
            raise typer.Exit(2) from e
        raise


@app.command()
def status(
    name: NameArg,
    namespace: NamespaceOpt = "default",
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Phase, round, clients and one row per cluster."""
    fl = _get(name, namespace, kubeconfig, context)
    if as_json:
        typer.echo(json.dumps({**summary(fl), "clusters": cluster_rows(fl)}, indent=2))
        return
    console.print(render(fl))


@app.command()
def watch(
    name: NameArg,
    namespace: NamespaceOpt = "default",
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Follow the status live until Completed or Failed (exit 0 / 1)."""
    from rich.live import Live

    phase = ""
    with Live(console=console, auto_refresh=False) as live:
        for fl in watcher(name, namespace, kubeconfig, context):
            live.update(render(fl), refresh=True)
            phase = summary(fl)["phase"]
            if phase in TERMINAL_PHASES:
                break
    if phase == "Failed":
        raise typer.Exit(1)


@app.command("plot")
def plot_cmd(
    name: NameArg,
    out: Annotated[Path, typer.Option("--output", "-o", help="image file (.png, .svg, ...)")],
    namespace: NamespaceOpt = "default",
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Chart each cluster's latest loss and accuracy."""
    fl = _get(name, namespace, kubeconfig, context)
    console.print(f"wrote {plot(fl, out)}")


@app.command()
def model(
    name: NameArg,
    namespace: NamespaceOpt = "default",
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Where the trained model is, its round, digest and metrics (exit 1 if none yet)."""
    fl = _get(name, namespace, kubeconfig, context)
    info = model_info(fl)
    if info is None:
        console.print(f"no model yet (phase {summary(fl)['phase']})")
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    table = Table(show_header=False)
    for key in ("path", "round", "sha256"):
        table.add_row(key, _fmt(info.get(key)))
    for key, value in sorted((info.get("metrics") or {}).items()):
        table.add_row(key, _fmt(value, ".4f"))
    console.print(table)


if __name__ == "__main__":
    app()
