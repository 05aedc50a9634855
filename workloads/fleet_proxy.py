"""nginx configurations that put mutual TLS around Flower's Fleet API.

Flower's SuperLink never asks for a client certificate and serves its unauthenticated Control
and Runtime APIs on the same port as the Fleet API. So the SuperLink listens on the server
pod's loopback only, and two nginx instances carry the traffic between clusters and hub:

* hub side (`fleet_gateway_conf`, next to the SuperLink in the server pod): terminates
  TLS, requires a client certificate from the federation's Fleet CA whose subject names a
  cluster's Fleet identity,
  forwards only ``/v1/fleet/`` to the SuperLink (over TLS, verifying it), and answers 403
  to anything else;
* cluster side (`fleet_tunnel_conf`, next to each SuperNode): the SuperNode cannot present a
  client certificate (it has no option for one), so it speaks TLS to this tunnel on the pod's
  loopback (a throwaway certificate made at start), and the tunnel opens the mutually
  authenticated connection to the gateway with the cluster's certificate. Optionally the
  SuperNode's PullMessages goes to a local long poller first (`workloads.fleet_longpoll`).

Both are pure functions returning the text of an nginx.conf; they run unprivileged (every
writable path is under `run_dir`) and log to stdout/stderr.
"""

from __future__ import annotations

from dataclasses import dataclass

from ocmfl import constants

FLEET_PATH = "/v1/fleet/"
PULL_PATH = FLEET_PATH + "pull-messages"  # the one call the tunnel may hold (long poll)

# A client certificate must be a Fleet identity: CN=fleet:<name> (ocmfl.pki.fleet_subject).
_CLUSTER_DN_REGEX = f"(^|,)CN={constants.FLEET_CN_PREFIX}[a-z0-9]"


@dataclass(frozen=True)
class TLSFiles:
    """PEM files as mounted in the container."""

    cert: str
    key: str
    ca: str


def _preamble(run_dir: str) -> str:
    return f"""worker_processes 1;
pid {run_dir}/nginx.pid;
error_log stderr notice;
events {{ worker_connections 512; }}
http {{
    client_body_temp_path {run_dir}/client_body;
    proxy_temp_path {run_dir}/proxy;
    fastcgi_temp_path {run_dir}/fastcgi;
    uwsgi_temp_path {run_dir}/uwsgi;
    scgi_temp_path {run_dir}/scgi;
    log_format fleet '$remote_addr "$ssl_client_s_dn" $ssl_client_serial "$request" $status '
                     '$request_time';
    access_log /dev/stdout fleet;
    server_tokens off;
    client_max_body_size 64m;
"""


def _proxy_common() -> str:
    # Flower's Fleet API is HTTP/1.1 + protobuf with long-lived requests (pull/heartbeat):
    # no buffering, generous timeouts, keep-alive to the upstream.
    return """            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
"""


def fleet_gateway_conf(
    *,
    listen: str,
    server_tls: TLSFiles,
    superlink_address: str,
    superlink_ca: str,
    superlink_server_name: str = "localhost",
    run_dir: str = "/var/run/ocm-fl-proxy",
) -> str:
    """The hub-side gateway: mTLS in, Fleet API only, TLS to the SuperLink.

    `server_tls.ca` is the CA that client certificates must chain to (the federation's Fleet
    CA).
    nginx 1.22 checks an upstream certificate against DNS names only (an IP SAN never
    matches), so the SuperLink certificate must carry `superlink_server_name` as a DNS SAN.
    """
    return (
        _preamble(run_dir)
        + f"""    server {{
        listen {listen} ssl;
        ssl_certificate {server_tls.cert};
        ssl_certificate_key {server_tls.key};
        ssl_client_certificate {server_tls.ca};
        ssl_verify_client on;
        ssl_verify_depth 2;
        ssl_protocols TLSv1.2 TLSv1.3;

        location {FLEET_PATH} {{
            if ($ssl_client_s_dn !~ "{_CLUSTER_DN_REGEX}") {{
                return 403;
            }}
            proxy_pass https://{superlink_address};
            proxy_ssl_trusted_certificate {superlink_ca};
            proxy_ssl_verify on;
            proxy_ssl_name {superlink_server_name};
            proxy_set_header X-Ocm-Fl-Client-Dn $ssl_client_s_dn;
{_proxy_common()}        }}
        location / {{
            return 403;
        }}
    }}
}}
"""
    )


def fleet_tunnel_conf(
    *,
    listen: str,
    gateway_address: str,
    gateway_server_name: str,
    client_tls: TLSFiles,
    listen_tls: TLSFiles | None = None,
    long_poll: tuple[str, str] | None = None,
    run_dir: str = "/var/run/ocm-fl-proxy",
) -> str:
    """The cluster-side tunnel: the pod's loopback in, mTLS to the hub gateway out.

    `client_tls.ca` verifies the gateway's server certificate; `cert`/`key` are the cluster's
    identity. `listen` must be a loopback address of the pod. With `listen_tls` the loopback
    side is TLS too (Flower refuses SuperNode authentication over plain HTTP).

    With `long_poll` = (poller, internal), both loopback host:port: the SuperNode's
    PullMessages goes to the poller (`workloads.fleet_longpoll`), which re-sends it to the
    gateway through a second listener on `internal` that carries only that route, over the
    same mTLS as every other call.
    """
    local = (
        f"""        listen {listen} ssl;
        ssl_certificate {listen_tls.cert};
        ssl_certificate_key {listen_tls.key};
"""
        if listen_tls
        else f"        listen {listen};\n"
    )
    to_gateway = f"""            proxy_pass https://{gateway_address};
            proxy_ssl_certificate {client_tls.cert};
            proxy_ssl_certificate_key {client_tls.key};
            proxy_ssl_trusted_certificate {client_tls.ca};
            proxy_ssl_verify on;
            proxy_ssl_verify_depth 2;
            proxy_ssl_name {gateway_server_name};
            proxy_ssl_server_name on;
            proxy_ssl_protocols TLSv1.2 TLSv1.3;
{_proxy_common()}"""
    held = ""
    internal = ""
    if long_poll is not None:
        poller, internal_listen = long_poll
        # the poller reads the whole (small) body first, so nginx sends it with a length
        held = f"""        location = {PULL_PATH} {{
            proxy_pass http://{poller};
{_proxy_common().replace("proxy_request_buffering off", "proxy_request_buffering on")}        }}
"""
        # the poller's re-sends: not logged one by one (several a second while idle)
        internal = f"""    server {{
        listen {internal_listen};
        access_log off;
        location = {PULL_PATH} {{
{to_gateway}        }}
        location / {{
            return 403;
        }}
    }}
"""
    return (
        _preamble(run_dir)
        + f"""    server {{
{local}
{held}        location {FLEET_PATH} {{
{to_gateway}        }}
        location / {{
            return 403;
        }}
    }}
{internal}}}
"""
    )


def nginx_command(conf_path: str) -> list[str]:
    """The container command that runs nginx in the foreground with a rendered config."""
    return ["nginx", "-c", conf_path, "-g", "daemon off;"]
