"""SDK metrics: the ClientApp mod and its POST to the agent; never blocks or fails training."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from ocmfl.constants import ENV_CLIENT_TOKEN_FILE, ENV_FL_NAME, ENV_FL_NAMESPACE, ENV_FL_UID
from workloads.sdk import agent_metrics
from workloads.sdk.metrics import (
    CLIENT_RECORD,
    LocalMetrics,
    deliver_metrics,
    metrics_of_reply,
    post_metrics,
)

SAMPLE = LocalMetrics("cluster1", 2, "fit", 0.5, 0.8, 100, 1.5)


@pytest.fixture
def agent() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            entry = {"path": self.path, "body": json.loads(body)}
            if self.headers.get("Authorization"):
                entry["authorization"] = self.headers["Authorization"]
            received.append(entry)
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


# --- the ClientApp mod ---------------------------------------------------------------------
@pytest.fixture(autouse=True)
def flower_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower 1.42 stamps messages with the process's task identity (set by its runtime)."""
    for attr in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, attr, 1)


def _context(node_config: dict[str, Any]) -> Context:
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})


def _train_message(server_round: int = 3) -> Message:
    content = RecordDict({"config": ConfigRecord({"server-round": server_round, "lr": 0.1})})
    return Message(content, dst_node_id=7, message_type="train")


def _reply_with(metrics: dict[str, Any]) -> Any:
    def handler(msg: Message, _context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    return handler


def test_the_mod_reports_each_reply_and_marks_it_with_the_cluster(
    agent: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in (ENV_FL_NAME, ENV_FL_NAMESPACE, ENV_FL_UID):
        monkeypatch.delenv(var, raising=False)
    endpoint, received = agent
    context = _context({"cluster-name": "cluster1", "agent-endpoint": endpoint})
    msg = _train_message(3)
    metrics = {"train_loss": 0.25, "train_acc": 0.9, "num-examples": 40}
    reply = agent_metrics(msg, context, _reply_with(metrics))
    assert reply.content.config_records[CLIENT_RECORD]["cluster"] == "cluster1"
    assert dict(reply.content.metric_records["metrics"]) == metrics  # untouched
    for thread in threading.enumerate():
        if thread.name == "ocmfl-metrics":
            thread.join(5)
    [post] = received
    body = post["body"]
    assert (body["cluster"], body["round"], body["phase"]) == ("cluster1", 3, "fit")
    assert (body["loss"], body["accuracy"], body["samples"]) == (0.25, 0.9, 40)


def test_the_mod_never_fails_or_waits_for_an_absent_agent() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)  # accepts, never answers
        context = _context(
            {"cluster-name": "c", "agent-endpoint": f"http://127.0.0.1:{s.getsockname()[1]}"}
        )
        started = time.monotonic()
        reply = agent_metrics(_train_message(), context, _reply_with({"num-examples": 1}))
        assert time.monotonic() - started < 0.5
        assert not reply.has_error()


def test_what_the_agent_gets_from_a_reply() -> None:
    msg = _train_message(2)
    reply = _reply_with({"loss": 1.5, "accuracy": 42.0, "num-examples": 10})(msg, _context({}))
    local = metrics_of_reply(msg, reply, "c1", 0.5)
    assert local is not None and local.loss == 1.5 and local.samples == 10
    assert local.accuracy is None  # 42 is not a fraction: left out, not refused by the agent
    no_round = Message(
        RecordDict({"config": ConfigRecord({})}), dst_node_id=7, message_type="train"
    )
    assert metrics_of_reply(no_round, reply, "c1", 0.5) is None
    no_samples = _reply_with({"loss": 1.0})(msg, _context({}))
    assert metrics_of_reply(msg, no_samples, "c1", 0.5) is None
    query = Message(msg.content, dst_node_id=7, message_type="query")
    assert metrics_of_reply(query, reply, "c1", 0.5) is None


def test_posts_carry_the_federations_token_from_the_mounted_file(
    agent: tuple[str, list[dict[str, Any]]], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, received = agent
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    monkeypatch.setenv(ENV_CLIENT_TOKEN_FILE, str(token))
    assert post_metrics(url, SAMPLE)
    assert received[-1]["authorization"] == "Bearer s3cret-token"
    monkeypatch.setenv(ENV_CLIENT_TOKEN_FILE, str(tmp_path / "absent"))
    assert post_metrics(url, SAMPLE)
    assert "authorization" not in received[-1]


def _flaky_agent(statuses: list[int]) -> tuple[HTTPServer, list[int]]:
    """An agent answering each POST with the next of ``statuses`` (the last one repeats)."""
    answered: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            status = statuses[min(len(answered), len(statuses) - 1)]
            answered.append(status)
            self.send_response(status)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, answered


@pytest.mark.parametrize(
    ("statuses", "delivered", "posts"),
    [
        ([503, 503, 202], True, 3),  # the agent could not check the token yet: tried again
        ([401], False, 1),  # refused: trying again cannot help
        ([500], False, 3),  # still failing after every try: given up, not raised
    ],
)
def test_transient_failures_are_tried_again(
    statuses: list[int], delivered: bool, posts: int
) -> None:
    server, answered = _flaky_agent(statuses)
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        assert deliver_metrics(endpoint, SAMPLE, retry_delays_s=(0.01, 0.01)) is delivered
        assert len(answered) == posts
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_reach_an_agent_that_comes_up_after_the_first_try() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens yet: connection refused
    received: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            received.append(1)
            self.send_response(202)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    def start_agent() -> None:
        time.sleep(0.3)
        server = HTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        done.wait(10)
        server.shutdown()
        server.server_close()

    done = threading.Event()
    threading.Thread(target=start_agent, daemon=True).start()
    try:
        ok = deliver_metrics(f"http://127.0.0.1:{port}", SAMPLE, retry_delays_s=(0.5, 1.0, 2.0))
    finally:
        done.set()
    assert ok and received == [1]
