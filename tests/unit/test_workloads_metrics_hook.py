"""Local metrics hook: posts to the agent when there is one, never blocks training."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from ocmfl.constants import ENV_FL_NAME, ENV_FL_NAMESPACE, ENV_FL_UID
from workloads.metrics_hook import LocalMetrics, post_metrics

SAMPLE = LocalMetrics("cluster1", 2, "fit", 0.5, 0.8, 100, 1.5)


@pytest.fixture
def agent() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append({"path": self.path, "body": json.loads(body)})
            self.send_response(202)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


def test_metrics_reach_the_agent_as_json(
    agent: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in (ENV_FL_NAME, ENV_FL_NAMESPACE, ENV_FL_UID):
        monkeypatch.delenv(var, raising=False)
    endpoint, received = agent
    assert post_metrics(endpoint, SAMPLE) is True
    assert received == [{
        "path": "/v1/metrics",
        "body": {"cluster": "cluster1", "round": 2, "phase": "fit", "loss": 0.5,
                 "accuracy": 0.8, "samples": 100, "duration_s": 1.5},
    }]  # fmt: skip


def test_metrics_name_the_federatedlearning_they_belong_to(
    agent: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two FL clients on one cluster: the agent can only attribute reports that say whose.
    monkeypatch.setenv(ENV_FL_NAMESPACE, "team")
    monkeypatch.setenv(ENV_FL_NAME, "digits")
    monkeypatch.setenv(ENV_FL_UID, "u-1")
    endpoint, received = agent
    assert post_metrics(endpoint, SAMPLE) is True
    body = received[0]["body"]
    assert (body["fl_namespace"], body["fl_name"], body["fl_uid"]) == ("team", "digits", "u-1")


def test_no_endpoint_means_no_post() -> None:
    assert post_metrics(None, SAMPLE) is False
    assert post_metrics("", SAMPLE) is False


def test_absent_agent_does_not_raise() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    assert post_metrics(f"http://127.0.0.1:{port}", SAMPLE) is False


def test_hanging_agent_is_abandoned_after_the_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)  # accepts connections, never answers
        started = time.monotonic()
        ok = post_metrics(f"http://127.0.0.1:{s.getsockname()[1]}", SAMPLE, timeout_s=0.3)
        assert ok is False and time.monotonic() - started < 2.0


def test_malformed_endpoint_does_not_raise() -> None:
    assert post_metrics("not a url", SAMPLE) is False
