"""`ocm-fl`: the administrator's view of a FederatedLearning resource.

    ocm-fl status NAME [-n NS] [--context CTX] [--kubeconfig F]   header and one row per cluster
    ocm-fl watch NAME [--timeout S]      the same live, until Completed (exit 0) / Failed (exit 1)
    ocm-fl plot NAME -o metrics.png      loss and accuracy per round per cluster (status.history)
    ocm-fl model NAME                    where the trained model is (exit 1 when none yet)

Everything is read from the resource through the Kubernetes API (any kubeconfig and
context; the namespace defaults to the context's). Rendering lives in
`ocmfl_cli.dashboard` (pure functions of the resource dict); the only door to the
cluster is `connect()`, which tests replace with a fake.

Exit codes: 0 ok; 1 the answer is "not (yet)": Failed, timed out, no model, no history;
2 the resource or the API cannot be reached (not found, unreachable, bad kubeconfig, refused).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Protocol

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from ocmfl import constants
from ocmfl_cli import dashboard

EXIT_NOT_YET = 1
EXIT_UNREACHABLE = 2
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCH_CHUNK_SECONDS = 300  # one watch request at most this long, then resumed
CONNECT_TIMEOUT_SECONDS = 10
PIPE_WIDTH = 200  # output width when stdout is not a terminal (rich would use 80)

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
    """Source over the kubernetes client (CustomObjectsApi)."""

    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        from kubernetes import client, config

        self._server = "?"
        try:
            api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context
            )
            self._namespace = _context_namespace(kubeconfig, context)
        except config.ConfigException as e:
            if kubeconfig is not None or context is not None or not SA_NAMESPACE_FILE.exists():
                where = kubeconfig or "the default kubeconfig"
                raise CliError(f"cannot load {where}: {e}") from e
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            api_client = client.ApiClient()
            self._namespace = SA_NAMESPACE_FILE.read_text().strip() or "default"
        self._server = str(api_client.configuration.host)
        self._api = client.CustomObjectsApi(api_client)

    @property
    def namespace(self) -> str:
        return self._namespace

    def _call(self, name: str, namespace: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, **kwargs)
        except ApiException as e:
            if e.status == 404:
                raise NotFoundError(name, namespace) from e
            raise CliError(_api_error(e, self._server)) from e
        except (HTTPError, OSError) as e:
            raise CliError(f"cannot reach the Kubernetes API at {self._server}: {e}") from e

    def get(self, name: str, namespace: str) -> dict[str, Any]:
        obj: dict[str, Any] = self._call(
            name,
            namespace,
            self._api.get_namespaced_custom_object,
            constants.GROUP,
            constants.VERSION,
            namespace,
            constants.PLURAL,
            name,
            _request_timeout=(CONNECT_TIMEOUT_SECONDS, 60),
        )
        return obj

    def watch(self, name: str, namespace: str, timeout: float | None) -> Iterator[dict[str, Any]]:
        from kubernetes import watch

        deadline = None if timeout is None else time.monotonic() + timeout
        obj = self.get(name, namespace)
        yield obj
        rv = str(obj["metadata"]["resourceVersion"])
        while True:
            left = WATCH_CHUNK_SECONDS if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return
            chunk = max(1, min(WATCH_CHUNK_SECONDS, int(left + 0.999)))
            stream = watch.Watch()  # type: ignore[no-untyped-call]
            events = stream.stream(  # type: ignore[no-untyped-call]
                self._api.list_namespaced_custom_object,
                constants.GROUP,
                constants.VERSION,
                namespace,
                constants.PLURAL,
                field_selector=f"metadata.name={name}",
                resource_version=rv,
                timeout_seconds=chunk,
                _request_timeout=(CONNECT_TIMEOUT_SECONDS, chunk + 30),
            )
            try:
                for event in self._events(name, namespace, events):
                    if event["type"] == "DELETED":
                        raise NotFoundError(name, namespace)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        rv = str(event["object"]["metadata"]["resourceVersion"])
                        yield event["object"]
            except _Expired:  # resourceVersion too old: read the object again
                obj = self.get(name, namespace)
                rv = str(obj["metadata"]["resourceVersion"])
                yield obj

    def _events(self, name: str, namespace: str, events: Any) -> Iterator[dict[str, Any]]:
        from kubernetes.client.exceptions import ApiException

        it = iter(events)
        while True:
            try:
                event: dict[str, Any] = self._call(name, namespace, next, it)
            except StopIteration:
                return
            except CliError as e:
                cause = e.__cause__
                if isinstance(cause, ApiException) and cause.status == 410:
                    raise _Expired from e
                raise
            yield event


class _Expired(Exception):
    pass


def _api_error(e: Any, server: str) -> str:
    message = ""
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = str(json.loads(e.body).get("message") or "")
    return f"Kubernetes API at {server} answered {e.status} {e.reason}" + (
        f": {message}" if message else ""
    )


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
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def _print(renderable: Any) -> None:
    """Print to stdout; wide when piped, so table rows do not fold for grep/less."""
    out = console
    if not console.is_terminal:
        out = Console(file=console.file, width=max(console.width, PIPE_WIDTH), highlight=False)
    out.print(renderable, soft_wrap=isinstance(renderable, Text))


def _fail(message: str, code: int) -> typer.Exit:
    # The message is text, not markup: "[cli]" or an API error's brackets must print as is.
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _open(kubeconfig: str | None, context: str | None, namespace: str | None) -> tuple[Source, str]:
    try:
        source = connect(kubeconfig, context)
        return source, namespace or source.namespace
    except CliError as e:
        raise _fail(str(e), EXIT_UNREACHABLE) from e


def _get(
    name: str, namespace: str | None, kubeconfig: str | None, context: str | None
) -> dict[str, Any]:
    source, ns = _open(kubeconfig, context, namespace)
    try:
        return source.get(name, ns)
    except CliError as e:
        raise _fail(str(e), EXIT_UNREACHABLE) from e


@app.command()
def status(
    name: NameArg,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Phase, round/totalRounds, clients, accuracy, failing conditions, one row per cluster."""
    fl = _get(name, namespace, kubeconfig, context)
    if as_json:
        out = {
            **dashboard.summary(fl),
            "conditions": dashboard.problem_conditions(fl),
            "clusters": dashboard.cluster_rows(fl),
        }
        typer.echo(json.dumps(out, indent=2))
        return
    _print(dashboard.render_dashboard(fl))


@app.command()
def watch(
    name: NameArg,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=0, help="give up after this many seconds (exit 1)"),
    ] = None,
) -> None:
    """Follow the resource live until Completed (exit 0) or Failed (exit 1)."""
    from rich.live import Live

    source, ns = _open(kubeconfig, context, namespace)
    view = dashboard.LiveView({"metadata": {"name": name, "namespace": ns}})

    def follow(refresh: Callable[[], None]) -> None:
        for fl in source.watch(name, ns, timeout):
            view.fl = fl
            refresh()
            if dashboard.phase(fl) in dashboard.TERMINAL_PHASES:
                return

    try:
        if console.is_terminal:
            with Live(view, console=console, refresh_per_second=1) as live:
                follow(live.refresh)
        else:  # piped: no cursor tricks, print the final state once
            follow(lambda: None)
            _print(view)
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


@app.command("plot")
def plot_cmd(
    name: NameArg,
    out: Annotated[Path, typer.Option("--output", "-o", help="image file (.png, .svg, .pdf)")],
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Loss and accuracy per round per cluster (from status.history), written to a file."""
    fl = _get(name, namespace, kubeconfig, context)
    try:
        written = dashboard.plot_history(fl, out)
    except dashboard.NoHistoryError as e:
        raise _fail(str(e), EXIT_NOT_YET) from e
    except ModuleNotFoundError as e:  # an install without the `cli` extra's matplotlib
        raise _fail(
            f"ocm-fl plot needs matplotlib ({e}): pip install 'ocm-federated-learning[cli]'",
            EXIT_UNREACHABLE,
        ) from e
    console.print(f"wrote {written}", highlight=False)


@app.command()
def model(
    name: NameArg,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Where the trained model is: path, round, sha256, metrics (exit 1 if none yet)."""
    fl = _get(name, namespace, kubeconfig, context)
    info = dashboard.model_info(fl)
    table = dashboard.render_model(fl)
    if info is None or table is None:
        s = dashboard.summary(fl)
        raise _fail(
            f"no model yet: {s['name']} has no status.model (phase {s['phase']}, "
            f"round {s['round']})",
            EXIT_NOT_YET,
        )
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    _print(table)


if __name__ == "__main__":
    app()
