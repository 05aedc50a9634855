"""The hub's Prometheus /metrics over HTTP, for callers with the bearer token only.

The token lives in Secret `constants.METRICS_TOKEN_SECRET` (key `token`) in the hub's
namespace: the hub makes it at its first start (`ensure_token`) and keeps it across restarts;
Prometheus reads the same Secret (the chart's ServiceMonitor). Without the token /metrics
answers 401, so series that name tenants' namespaces and clusters are not open to anyone who
can reach the port.
"""

from __future__ import annotations

import base64
import hmac
import secrets
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from ocmfl import constants
from ocmfl.kube import Kube, path_of

TOKEN_BYTES = 32


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log line per scrape."""


def bearer_only(app: Callable[..., Iterable[bytes]], token: str) -> Callable[..., Iterable[bytes]]:
    """`app`, answering 401 to a request without `Authorization: Bearer <token>`."""
    expected = f"Bearer {token}".encode()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        got = str(environ.get("HTTP_AUTHORIZATION", "")).encode()
        if not hmac.compare_digest(got, expected):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Bearer realm="metrics"')],
            )
            return [
                b"send Authorization: Bearer <token>; the token is in Secret "
                + constants.METRICS_TOKEN_SECRET.encode()
                + b" (key token) in the hub's namespace\n"
            ]
        return app(environ, start_response)

    return guarded


def serve_metrics(
    registry: CollectorRegistry, host: str, port: int, token: str
) -> tuple[WSGIServer, threading.Thread]:
    """Serve `registry` at http://host:port/metrics (any path) for holders of `token`."""
    app = bearer_only(make_wsgi_app(registry), token)
    server = make_server(host, port, app, server_class=_Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread


def ensure_token(kube: Kube, namespace: str) -> str:
    """The /metrics token from the hub's Secret, made (random, 256 bits) when absent."""
    path = path_of("v1", "Secret", namespace, constants.METRICS_TOKEN_SECRET)
    secret = kube.get(path)
    if secret is None:
        token = secrets.token_urlsafe(TOKEN_BYTES)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": constants.METRICS_TOKEN_SECRET,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/part-of": "ocm-federated-learning"},
            },
            "stringData": {constants.METRICS_TOKEN_KEY: token},
        }
        if kube.create(path_of("v1", "Secret", namespace), body) is not None:
            return token
        secret = kube.get(path)  # made at the same moment by another replica: theirs
    data = ((secret or {}).get("data") or {}).get(constants.METRICS_TOKEN_KEY)
    if not data:
        raise ValueError(
            f"Secret {namespace}/{constants.METRICS_TOKEN_SECRET} has no key "
            f"{constants.METRICS_TOKEN_KEY}: delete it, and the hub makes a new one"
        )
    return base64.b64decode(data).decode()
