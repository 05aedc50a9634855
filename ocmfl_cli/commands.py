"""`ocm-fl`: the administrator's view of a FederatedLearning resource.

    ocm-fl status NAME [-n NS] [--context CTX] [--kubeconfig F]   header and one row per cluster
    ocm-fl watch NAME [--timeout S]      the same live, until Completed (exit 0) / Failed (exit 1)
    ocm-fl plot NAME -f metrics.png      loss and accuracy per round per cluster (status.history)
    ocm-fl model NAME                    where the trained model is (exit 1 when none yet)

Every command takes `-o json` (for scripts); the default text output is a table on a
terminal wide enough for it and plain key=value lines otherwise (logs, pipes, narrow
terminals: one record per line, never wrapped; paths are never cut). The rule is
`dashboard.as_table`, shared with the demo.

Everything is read from the resource through the Kubernetes API (any kubeconfig and
context; the namespace defaults to the context's). Rendering lives in
`ocmfl_cli.dashboard` (pure functions of the resource dict); the only door to the
cluster is `connect()`, which tests replace with a fake.

Exit codes: 0 ok; 1 the answer is "not (yet)": Failed, timed out, no model, no history;
2 the resource or the API cannot be reached (not found, unreachable, bad kubeconfig, refused).
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Protocol

import typer
from rich.console import Console
from rich.markup import escape

from ocmfl import constants
from ocmfl_cli import dashboard

EXIT_NOT_YET = 1
EXIT_UNREACHABLE = 2
EXIT_USAGE = 2  # as click's own usage errors
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCH_CHUNK_SECONDS = 300  # one watch request at most this long, then resumed

app = typer.Typer(
    name="ocm-fl",
    help="Inspect FederatedLearning resources on an OCM hub.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


# --- the door to the cluster ---------------------------------------------------------------


class CliError(Exception):
    """A failure shown to the user as one line, with exit code 2."""


class NotFoundError(CliError):
    def __init__(self, name: str, namespace: str) -> None:
        super().__init__(f"{constants.KIND.lower()} {name} not found in namespace {namespace}")


class Source(Protocol):
    """What the commands need from the API server."""

    @property
    def namespace(self) -> str:
        """The context's default namespace."""
        ...

    def get(self, name: str, namespace: str) -> dict[str, Any]:
        """The resource now; NotFoundError / CliError on failure."""
        ...

    def watch(self, name: str, namespace: str, timeout: float | None) -> Iterator[dict[str, Any]]:
        """The resource now, then after each change, until `timeout` seconds have passed."""
        ...


class KubeSource:
    """Source over the project's Kubernetes layer (ocmfl.kube)."""

    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        from kubernetes import config

        from ocmfl.kube import Kube

        try:
            self._kube = Kube(kubeconfig, context=context, field_manager="ocm-fl-cli")
        except (config.ConfigException, OSError) as e:
            raise CliError(f"cannot load {kubeconfig or 'the default kubeconfig'}: {e}") from e
        try:
            self._namespace = _context_namespace(kubeconfig, context)
        except config.ConfigException:  # in a pod, with the service account
            ns = SA_NAMESPACE_FILE.read_text().strip() if SA_NAMESPACE_FILE.exists() else ""
            self._namespace = ns or "default"
        self._server = self._kube.host

    @property
    def namespace(self) -> str:
        return self._namespace

    @staticmethod
    def _collection(namespace: str) -> str:
        from ocmfl.kube import path_of

        return path_of(constants.API_VERSION, constants.KIND, namespace)

    def _error(self, e: Any) -> CliError:
        if not e.status:
            return CliError(f"cannot reach the Kubernetes API at {self._server}: {e}")
        return CliError(
            f"Kubernetes API at {self._server} answered {e.status} {e.reason}"
            + (f": {e.message}" if e.message else "")
        )

    def get(self, name: str, namespace: str) -> dict[str, Any]:
        from ocmfl.kube import KubeError

        try:
            obj = self._kube.get(f"{self._collection(namespace)}/{name}")
        except KubeError as e:
            raise self._error(e) from e
        if obj is None:
            raise NotFoundError(name, namespace)
        return obj

    def watch(self, name: str, namespace: str, timeout: float | None) -> Iterator[dict[str, Any]]:
        from ocmfl.kube import LIST, KubeError, list_watch

        deadline = None if timeout is None else time.monotonic() + timeout
        events = list_watch(
            self._kube,
            self._collection(namespace),
            query={"fieldSelector": f"metadata.name={name}"},
            deadline=deadline,
            chunk_seconds=WATCH_CHUNK_SECONDS,
            relist_on_error=False,
        )
        try:
            for etype, obj in events:
                if etype == LIST:
                    items = obj.get("items") or []
                    if not items:
                        raise NotFoundError(name, namespace)
                    yield items[0]
                elif etype == "DELETED":
                    raise NotFoundError(name, namespace)
                else:
                    yield obj
        except KubeError as e:
            raise self._error(e) from e


def _context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace set on `context` (else the current context) in the kubeconfig."""
    from kubernetes import config

    contexts, current = config.list_kube_config_contexts(kubeconfig)  # type: ignore[no-untyped-call]
    chosen = current
    if context is not None:
        chosen = next((c for c in contexts or [] if c.get("name") == context), None)
    ns = ((chosen or {}).get("context") or {}).get("namespace")
    return str(ns) if ns else "default"


def connect(kubeconfig: str | None, context: str | None) -> Source:
    """The one function that talks to the cluster (tests replace it with a fake)."""
    return KubeSource(kubeconfig, context)


# --- commands ------------------------------------------------------------------------------

NameArg = Annotated[str, typer.Argument(help="FederatedLearning name")]
NamespaceOpt = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="its namespace [default: the context's namespace]"),
]
ContextOpt = Annotated[str | None, typer.Option("--context", help="kubeconfig context")]
KubeconfigOpt = Annotated[
    str | None,
    typer.Option("--kubeconfig", help="kubeconfig file [default: $KUBECONFIG, ~/.kube/config]"),
]


class Output(StrEnum):
    TEXT = "text"
    JSON = "json"


OutputOpt = Annotated[
    Output,
    typer.Option(
        "--output",
        "-o",
        help="text: a table on a terminal, plain key=value lines otherwise; json: for scripts",
    ),
]


def _status_json(fl: dashboard.FL) -> dict[str, Any]:
    return {
        **dashboard.summary(fl),
        "conditions": dashboard.problem_conditions(fl),
        "clusters": dashboard.cluster_rows(fl),
    }


def _echo_json(data: Any, indent: int | None = 2) -> None:
    typer.echo(json.dumps(data, indent=indent))


def _echo_lines(lines: list[str]) -> None:
    for line in lines:
        typer.echo(line)


def _fail(message: str, code: int) -> typer.Exit:
    # The message is text, not markup: "[cli]" or an API error's brackets must print as is.
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


@dataclass(frozen=True)
class Target:
    """What every command gets: the resource (NAME, -n, --context, --kubeconfig) and how to
    answer (-o)."""

    name: str
    namespace: str | None = None
    context: str | None = None
    kubeconfig: str | None = None
    output: Output = Output.TEXT

    @property
    def json(self) -> bool:
        return self.output == Output.JSON

    def open(self) -> tuple[Source, str]:
        """The door to the cluster and the resource's namespace."""
        try:
            source = connect(self.kubeconfig, self.context)
            return source, self.namespace or source.namespace
        except CliError as e:
            raise _fail(str(e), EXIT_UNREACHABLE) from e

    def get(self) -> dict[str, Any]:
        """The resource now."""
        source, ns = self.open()
        try:
            return source.get(self.name, ns)
        except CliError as e:
            raise _fail(str(e), EXIT_UNREACHABLE) from e


_KW = inspect.Parameter.KEYWORD_ONLY
_TARGET = [
    inspect.Parameter("name", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=NameArg),
    inspect.Parameter("namespace", _KW, default=None, annotation=NamespaceOpt),
    inspect.Parameter("context", _KW, default=None, annotation=ContextOpt),
    inspect.Parameter("kubeconfig", _KW, default=None, annotation=KubeconfigOpt),
    inspect.Parameter("output", _KW, default=Output.TEXT, annotation=OutputOpt),
]


def command(fn: Callable[..., None]) -> Callable[..., None]:
    """Register `fn(target, **own_options)` as the command of its name: typer sees NAME, its
    own options and the options every command takes, and `fn` gets the latter as a Target."""
    own = list(inspect.signature(fn, eval_str=True).parameters.values())[1:]

    def run(**kwargs: Any) -> None:
        target = Target(**{p.name: kwargs.pop(p.name) for p in _TARGET})
        fn(target, **kwargs)

    run.__name__, run.__doc__ = fn.__name__, fn.__doc__
    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [_TARGET[0], *(p.replace(kind=_KW) for p in own), *_TARGET[1:]]
    )
    app.command(fn.__name__.removesuffix("_cmd"))(run)
    return fn


@command
def status(target: Target) -> None:
    """Phase, round/totalRounds, clients, accuracy, failing conditions, one row per cluster."""
    fl = target.get()
    if target.json:
        _echo_json(_status_json(fl))
    else:
        dashboard.print_dashboard(console, fl)


@command
def watch(
    target: Target,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=0, help="give up after this many seconds (exit 1)"),
    ] = None,
) -> None:
    """Follow the resource until its run ends: Completed (exit 0) or Failed (exit 1).

    On a terminal, a live dashboard (where the cluster table does not fit, followed by the
    clusters as whole records); otherwise one summary line per change and the final status
    as plain lines; with `-o json`, one JSON object per change."""
    from rich.live import Live

    source, ns = target.open()
    view = dashboard.LiveView({"metadata": {"name": target.name, "namespace": ns}})

    def follow(show: Callable[[], None]) -> None:
        for fl in source.watch(target.name, ns, timeout):
            view.fl = fl
            show()
            if dashboard.finished(fl):
                return

    try:
        if target.json:
            follow(lambda: _echo_json(_status_json(view.fl), indent=None))
        elif console.is_terminal:
            with Live(view, console=console, refresh_per_second=1) as live:
                follow(live.refresh)
            if not dashboard.table_fits(console, dashboard.render_clusters(view.fl)):
                dashboard.print_lines(console, dashboard.plain_lines(view.fl)[1:])
        else:
            lines: list[str] = []

            def log_change() -> None:
                line = dashboard.summary_line(view.fl)
                if not lines or lines[-1] != line:
                    lines.append(line)
                    typer.echo(line)

            follow(log_change)
            _echo_lines(dashboard.plain_lines(view.fl)[1:])
    except CliError as e:
        raise _fail(str(e), EXIT_UNREACHABLE) from e
    last = dashboard.summary(view.fl)
    if last["phase"] == "Completed":
        return
    if last["phase"] == "Failed":
        raise _fail(f"{last['name']} failed: {last['message'] or '-'}", EXIT_NOT_YET)
    waited = f"after {timeout:g}s" if timeout is not None else "(watch ended)"
    raise _fail(
        f"timed out {waited}: {last['name']} is {last['phase']}, round {last['round']}",
        EXIT_NOT_YET,
    )


@command
def plot(
    target: Target,
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="image file to write (.png, .svg, .pdf)"),
    ] = None,
) -> None:
    """Loss and accuracy per round per cluster (from status.history): an image (--file),
    and with `-o json` the same series as JSON."""
    if file is None and not target.json:
        raise _fail("give --file PATH for the image, or -o json for the numbers", EXIT_USAGE)
    fl = target.get()
    written = None
    try:
        if file is not None:
            written = dashboard.plot_history(fl, file)
        elif not any(dashboard.history_series(fl).values()):
            raise dashboard.NoHistoryError(f"no per-round metrics yet: {dashboard.summary(fl)}")
    except dashboard.NoHistoryError as e:
        raise _fail(str(e), EXIT_NOT_YET) from e
    except ModuleNotFoundError as e:  # an install without the `cli` extra's matplotlib
        raise _fail(
            f"ocm-fl plot needs matplotlib ({e}): pip install 'ocm-federated-learning[cli]'",
            EXIT_UNREACHABLE,
        ) from e
    if target.json:
        series = dashboard.history_series(fl)
        _echo_json({"file": str(written) if written else None, "series": series})
    else:
        typer.echo(f"wrote {written}")


@command
def model(target: Target) -> None:
    """Where the trained model is: path, round, sha256, metrics (exit 1 if none yet)."""
    fl = target.get()
    info = dashboard.model_info(fl)
    table = dashboard.render_model(fl)
    if info is None or table is None:
        s = dashboard.summary(fl)
        raise _fail(
            f"no model yet: {s['name']} has no status.model (phase {s['phase']}, "
            f"round {s['round']})",
            EXIT_NOT_YET,
        )
    if target.json:
        _echo_json(info)
        return
    console.print(table, soft_wrap=True)  # never wrapped: the path and digest stay whole


@command
def logs(
    target: Target,
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", "-c", help="only this cluster [default: every cluster]"),
    ] = None,
) -> None:
    """The last lines of a failed client's log, per cluster, as its agent sent them when its
    ClientApp raised (exit 1 if there are none)."""
    fl = target.get()
    rows = [r for r in (fl.get("status") or {}).get("clusters") or [] if r.get("clientLog")]
    known = {r.get("name") for r in (fl.get("status") or {}).get("clusters") or []}
    if cluster is not None:
        if cluster not in known:
            raise _fail(
                f"cluster {cluster!r} is not in {target.name}'s status.clusters "
                f"(it has {len(known)}): check --cluster",
                EXIT_USAGE,
            )
        rows = [r for r in rows if r.get("name") == cluster]
    if not rows:
        where = f"cluster {cluster}" if cluster else "any cluster"
        raise _fail(
            f"no client log from {where}: no ClientApp there has raised, or the cluster's "
            "admin switched client logs off (addon variable CLIENT_LOGS=off)",
            EXIT_NOT_YET,
        )
    if target.json:
        _echo_json({r["name"]: r["clientLog"] for r in rows})
        return
    for i, row in enumerate(rows):
        if i:
            typer.echo("")
        typer.echo(f"==> {row['name']} <==")
        typer.echo(row["clientLog"])


if __name__ == "__main__":
    app()
