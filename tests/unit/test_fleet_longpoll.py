"""The PullMessages long poll (workloads.fleet_longpoll) against a fake upstream over real HTTP
on loopback: Flower's own protobuf answers, the poller's real server thread."""

from __future__ import annotations

import http.client
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from flwr.proto.fleet_pb2 import PullMessagesRequest, PullMessagesResponse
from flwr.proto.message_pb2 import Message
from flwr.proto.node_pb2 import Node

from workloads.fleet_longpoll import LongPoller, LongPollServer, start_long_poll
from workloads.fleet_proxy import PULL_PATH

EMPTY = PullMessagesResponse().SerializeToString()
WITH_MESSAGE = PullMessagesResponse(messages_list=[Message()]).SerializeToString()
REQUEST = PullMessagesRequest(node=Node(node_id=7)).SerializeToString()
RAW_PULL = (
    f"POST {PULL_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(REQUEST)}\r\n\r\n".encode()
    + REQUEST
)
AUTH = {"flwr-public-key-bin": "cHVi", "flwr-signature-bin": "c2ln", "flwr-timestamp": "t1"}


@dataclass
class Upstream:
    """What the fake SuperLink (behind the tunnel) saw and will answer."""

    message_at: float = float("inf")  # monotonic time from which a pull gets a message
    status: int = 200
    delay_s: float = 0.0  # before each answer
    seen: list[tuple[float, bytes, dict[str, str]]] = field(default_factory=list)

    def pulls_after(self, t: float) -> int:
        return sum(1 for at, _, _ in self.seen if at > t)


@pytest.fixture
def upstream() -> Iterator[tuple[Upstream, str]]:
    state = Upstream()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.seen.append((time.monotonic(), body, dict(self.headers.items())))
            time.sleep(state.delay_s)
            if state.status != 200:
                payload = b"refused"
            else:
                payload = WITH_MESSAGE if time.monotonic() >= state.message_at else EMPTY
            self.send_response(state.status)
            self.send_header("Content-Type", "application/protobuf")
            self.send_header("X-Upstream", "fake")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def poll(upstream: tuple[Upstream, str]) -> Iterator[LongPollServer]:
    server = start_long_poll(LongPoller(upstream=upstream[1], hold_s=3.0, interval_s=0.15))
    yield server
    server.stop()


def _pull(address: str, path: str = PULL_PATH) -> tuple[http.client.HTTPResponse, bytes, float]:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    start = time.monotonic()
    headers = {"Content-Type": "application/protobuf", **AUTH}
    conn.request("POST", path, body=REQUEST, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp, body, time.monotonic() - start


def test_a_message_that_appears_during_the_hold_is_returned_at_the_next_resend(
    upstream: tuple[Upstream, str], poll: LongPollServer
) -> None:
    state, _ = upstream
    state.message_at = time.monotonic() + 1.0
    resp, body, _ = _pull(poll.address)
    assert resp.status == 200
    assert body == WITH_MESSAGE
    # Counted, not timed: the pull that found the message was the last one (at most one send
    # began after the message appeared), so it was answered at that re-send and did not hold on.
    assert state.pulls_after(state.message_at) <= 1, state.seen
    # ...and that was inside the hold (3 s), not at its end: the message came at 1 s.
    assert state.seen[-1][0] - state.seen[0][0] < 3.0, state.seen
    # every re-send is the SuperNode's request as it came: body and node-auth headers
    assert len(state.seen) >= 3
    for _, body_seen, headers in state.seen:
        assert body_seen == REQUEST
        for name, value in AUTH.items():
            assert headers[name] == value
    assert resp.getheader("X-Upstream") == "fake"


def test_an_empty_hold_returns_the_last_empty_answer_at_its_end(
    upstream: tuple[Upstream, str], poll: LongPollServer
) -> None:
    state, _ = upstream
    resp, body, took = _pull(poll.address)
    assert resp.status == 200
    assert body == EMPTY
    assert 2.5 <= took < 6.0  # the 3 s hold, not Flower's 30 s timeout
    # Re-sent meanwhile, soon at first, then at doubling gaps of at most 1 s: an idle
    # SuperNode costs the SuperLink about a pull a second, not one every 0.15 s.
    gaps = [b[0] - a[0] for a, b in zip(state.seen, state.seen[1:], strict=False)]
    assert len(gaps) >= 3 and gaps[0] < 0.5, gaps
    assert all(g < 1.0 + 0.5 for g in gaps) and max(gaps) >= 0.9, gaps
    assert len(state.seen) <= 6, gaps  # 0.15 s apart all the way would be about 20


def test_an_upstream_error_is_returned_at_once_as_it_came(
    upstream: tuple[Upstream, str], poll: LongPollServer
) -> None:
    state, _ = upstream
    state.status = 401
    resp, body, _ = _pull(poll.address)
    assert (resp.status, body) == (401, b"refused")
    assert len(state.seen) == 1


def test_an_unreachable_upstream_is_a_bad_gateway() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
        server = start_long_poll(LongPoller(upstream=dead, hold_s=3.0))
        try:
            resp, _, took = _pull(server.address)
        finally:
            server.stop()
    assert resp.status == 502
    assert took < 2.0


def test_only_the_pull_route_is_served(
    poll: LongPollServer, upstream: tuple[Upstream, str]
) -> None:
    resp, _, _ = _pull(poll.address, "/v1/fleet/push-messages")
    assert resp.status == 404
    assert upstream[0].seen == []


def test_a_closed_downstream_stops_the_resends(
    upstream: tuple[Upstream, str], poll: LongPollServer
) -> None:
    state, _ = upstream
    host, _, port = poll.address.rpartition(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(RAW_PULL)
        time.sleep(0.6)
    closed = time.monotonic()
    time.sleep(1.0)
    assert len(state.seen) >= 2  # it was holding
    assert state.pulls_after(closed + 0.2) == 0  # at most one send in flight when it closed


def test_a_message_pulled_after_the_supernode_hung_up_goes_to_its_next_pull(
    upstream: tuple[Upstream, str], poll: LongPollServer
) -> None:
    state, _ = upstream
    state.delay_s = 0.8  # the upstream call is in flight when the SuperNode goes
    state.message_at = time.monotonic()
    host, _, port = poll.address.rpartition(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(RAW_PULL)
        time.sleep(0.3)
    time.sleep(0.8)
    assert poll.poller.kept == 1
    sent = len(state.seen)
    resp, body, _ = _pull(poll.address)  # the restarted SuperNode of the same node
    assert (resp.status, body) == (200, WITH_MESSAGE)
    assert len(state.seen) == sent  # handed over, not pulled again
