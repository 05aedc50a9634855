"""Hold the SuperNode's empty PullMessages at the cluster-side tunnel (a long poll).

Flower 1.42's SuperNode sleeps a fixed 3 s after every PullMessages that returns no message
(`flwr.supernode.start_client_internal`, no setting), so a message the ServerApp pushes waits
0-3 s before its SuperNode sees it. The tunnel (`workloads.fleet_proxy.fleet_tunnel_conf`)
routes only ``/v1/fleet/pull-messages`` to this poller on the pod's loopback; the poller sends
the identical request (same body, same node-auth headers: Flower signs a timestamp that stays
valid for 300 s and keeps no replay list) upstream through the tunnel's internal listener, and
while the answer carries no message re-sends it, first after `interval_s`, then at doubling
intervals up to `max_interval_s`, for up to `hold_s`. It answers with the first answer that
carries a message (or a reconnect), the first error as it came, or the last empty answer at
the end of the hold. mTLS to the gateway stays nginx's; node authentication stays the
SuperNode's.

The SuperLink marks a pulled message delivered, so the poller re-sends only while the
SuperNode's connection is still open (checked before each send), and a message that comes
back after the connection closed is kept and handed to the next pull with the same request
body (the restarted SuperNode of the same node) within `KEEP_S`, never dropped silently.
"""

from __future__ import annotations

import http.client
import http.server
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

from workloads.fleet_proxy import PULL_PATH

HOLD_S = 10.0  # well under the SuperNode's 30 s HTTP timeout (flwr ProtobufClient)
INTERVAL_S = 0.15  # the first re-sends: a message pushed soon after is seen at once
# The interval doubles up to this while the hold goes on, so an idle SuperNode costs the
# SuperLink about one pull a second (Flower alone: one every 3 s), not one every 0.15 s:
# every pull is a request the SuperLink serves, for each of the federation's clusters.
MAX_INTERVAL_S = 1.0
UPSTREAM_TIMEOUT_S = 15.0  # one upstream call; hold + this stays under Flower's 30 s
KEEP_S = 120.0  # how long a message pulled for a closed connection waits for the next pull

# Not forwarded either way: they describe one connection, not the request.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
        "date",
        "server",
    }
)


@dataclass(frozen=True)
class Answer:
    """An upstream HTTP answer as it came."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


def carries_message(answer: Answer) -> bool:
    """Whether a pull answer is worth returning at once: an error, anything not parseable as
    a PullMessagesResponse, a message or a reconnect."""
    if answer.status != 200:
        return True
    from flwr.proto.fleet_pb2 import PullMessagesResponse

    resp = PullMessagesResponse()
    try:
        resp.ParseFromString(answer.body)
    except Exception:
        return True
    return bool(resp.messages_list) or resp.HasField("reconnect")


def downstream_closed(sock: socket.socket) -> bool:
    """Whether the peer closed `sock` (nginx sends nothing after the request, so readable
    means end of stream or a reset)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


@dataclass
class LongPoller:
    """The poller's settings, counters and the message kept for a vanished connection."""

    upstream: str  # host:port of the tunnel's internal plain listener on loopback
    hold_s: float = HOLD_S
    interval_s: float = INTERVAL_S
    max_interval_s: float = MAX_INTERVAL_S
    upstream_timeout_s: float = UPSTREAM_TIMEOUT_S
    sends: int = 0  # upstream requests made (tests and logs)
    kept: int = 0  # answers with a message kept for a closed connection
    _kept: tuple[bytes, Answer, float] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, body: bytes, headers: list[tuple[str, str]]) -> Answer:
        """One upstream pull; a connection failure or timeout is a 502/504 like nginx's."""
        host, _, port = self.upstream.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=self.upstream_timeout_s)
        with self._lock:
            self.sends += 1
        try:
            conn.putrequest("POST", PULL_PATH, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            kept = tuple((k, v) for k, v in resp.getheaders() if k.lower() not in _HOP)
            return Answer(resp.status, resp.reason, kept, data)
        except TimeoutError:
            return Answer(504, "Gateway Timeout", (), b"long poll: upstream timed out")
        except OSError as exc:
            return Answer(502, "Bad Gateway", (), f"long poll: upstream {exc}".encode())
        finally:
            conn.close()

    def take_kept(self, body: bytes) -> Answer | None:
        """The message kept for an earlier connection that sent this same request, if fresh."""
        with self._lock:
            if self._kept is None:
                return None
            kept_body, answer, at = self._kept
            if time.monotonic() - at > KEEP_S:
                self._kept = None
                return None
            if kept_body != body:
                return None
            self._kept = None
            return answer

    def keep(self, body: bytes, answer: Answer) -> None:
        with self._lock:
            self._kept = (body, answer, time.monotonic())
            self.kept += 1
        print(
            f"ocm-fl long poll: the SuperNode closed its pull before a message arrived; "
            f"kept for its next pull ({KEEP_S:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    def hold(self, body: bytes, headers: list[tuple[str, str]], sock: socket.socket) -> Answer:
        """Pull until a message comes, the hold ends or the downstream `sock` closes; the
        answer to write back (the caller keeps it instead if `sock` closed meanwhile)."""
        kept = self.take_kept(body)
        if kept is not None:
            return kept
        deadline = time.monotonic() + self.hold_s
        answer = self.send(body, headers)
        interval = self.interval_s
        while not carries_message(answer):
            if deadline - time.monotonic() < self.interval_s:
                break
            next_at = min(time.monotonic() + interval, deadline)  # the last one at the end
            interval = min(self.max_interval_s, interval * 2)
            # wait out the interval, waking early if the SuperNode hangs up
            wait = next_at - time.monotonic()
            if wait > 0:
                select.select([sock], [], [], wait)
            if downstream_closed(sock):
                return answer  # not re-sent: nobody would get the message
            answer = self.send(body, headers)
        return answer


def _make_handler(poller: LongPoller) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            if self.path != PULL_PATH:  # the tunnel routes nothing else here
                self.send_error(404, "only " + PULL_PATH)
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP]
            answer = poller.hold(body, headers, self.connection)
            if downstream_closed(self.connection):
                if answer.status == 200 and carries_message(answer):
                    poller.keep(body, answer)
                self.close_connection = True
                return
            self.send_response(answer.status, answer.reason)
            for name, value in answer.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # nginx logs the SuperNode's request

    return Handler


@dataclass
class LongPollServer:
    """A running poller on 127.0.0.1 (a daemon thread of the launcher)."""

    poller: LongPoller
    server: http.server.ThreadingHTTPServer

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_long_poll(poller: LongPoller) -> LongPollServer:
    """Serve `poller` on a free loopback port in a daemon thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(poller))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="fleet-long-poll", daemon=True).start()
    return LongPollServer(poller, server)
