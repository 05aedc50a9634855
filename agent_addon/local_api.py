"""The agent's local HTTP API: POST /v1/metrics from the FL client, POST /v1/client-log from
its launcher (the log's last lines when its ClientApp raised), GET /healthz.

With a `TokenCheck` (the agent has its cluster's API), a post counts only when it carries the
token of the federation it is for (401 without one, 403 with another)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from agent_addon.phase import RunKey
from agent_addon.state import (
    AgentState,
    BadRequest,
    ClientLogPost,
    Forbidden,
    MetricsPost,
    PostScope,
    Unauthorized,
    parse_client_log_post,
    parse_metrics_post,
)
from agent_addon.tokens import TokenCheck, bearer_token
from ocmfl.constants import CLIENT_LOG_PATH
from ocmfl.kube import KubeError
from ocmfl.reports import ROUND_PHASE_NAMES
from ocmfl.status.v1 import report_pb2

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
CLIENT_LOGS_OFF_REASON = (
    "client logs are switched off on this cluster (its admin set the addon variable "
    "CLIENT_LOGS to off)"
)
_Post = TypeVar("_Post", MetricsPost, ClientLogPost)


def make_app(
    state: AgentState,
    health: Callable[[], dict[str, Any]],
    sender: Callable[[str], tuple[RunKey, str] | None] | None = None,
    tokens: TokenCheck | None = None,
    persist: Callable[[], None] | None = None,
    client_logs: bool = True,
) -> web.Application:
    """aiohttp app; `health()` returns the JSON shown on /healthz; `sender(address)` names
    the run of the client pod at a peer address (None: not a known client pod); `tokens`
    checks each post's token (None: no check, for an agent without its cluster's API);
    `persist()` saves the pending reports before a post is answered 202, so an accepted
    report survives the agent being killed right after (fault drill 8). `client_logs` False
    (the cluster's admin switched client logs off) drops every POST /v1/client-log."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)

    async def accept(
        request: web.Request,
        parse: Callable[[Any, PostScope], _Post],
        apply: Callable[[_Post], report_pb2.Report],
        what: str,
    ) -> web.Response | report_pb2.Report:
        """Parse a client pod's post, check its federation's token, apply it: the report it
        made, or the error response."""
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as e:
            return web.json_response({"error": f"body is not JSON: {e}"}, status=400)
        who = sender(request.remote) if sender is not None and request.remote else None
        try:
            post = parse(body, PostScope(state.cluster, state.active_runs(), who))
            if tokens is not None:
                presented = bearer_token(request.headers.get("Authorization"))
                run = (post.fl_namespace, post.fl_name)
                uid = await asyncio.to_thread(tokens.verify, run, presented)
                if uid and post.fl_uid and uid != post.fl_uid:
                    raise Forbidden(f"fl_uid: {run[0]}/{run[1]} here is uid {uid}")
                post = dataclasses.replace(post, fl_uid=uid or post.fl_uid)
            report = apply(post)
            if persist is not None:
                persist()
        except KubeError as e:
            log.warning("cannot check the token of a %s post: %s", what, e)
            return web.json_response({"error": f"cannot check the token now: {e}"}, status=503)
        except Unauthorized as e:
            log.warning("refused %s from %s: %s", what, request.remote, e)
            return web.json_response({"error": str(e)}, status=401)
        except Forbidden as e:
            log.warning("refused %s from %s: %s", what, request.remote, e)
            return web.json_response({"error": str(e)}, status=403)
        except BadRequest as e:
            return web.json_response({"error": str(e)}, status=400)
        return report

    async def post_metrics(request: web.Request) -> web.Response:
        got = await accept(request, parse_metrics_post, state.on_metrics, "metrics")
        if isinstance(got, web.Response):
            return got
        return web.json_response(
            {
                "accepted": True,
                "sequence": got.sequence,
                "phase": ROUND_PHASE_NAMES[got.metrics[0].phase],
            },
            status=202,
        )

    async def post_client_log(request: web.Request) -> web.Response:
        if not client_logs:
            # The cluster's admin keeps client logs on this cluster (they can carry data).
            await request.read()
            return web.json_response(
                {"accepted": False, "reason": CLIENT_LOGS_OFF_REASON}, status=200
            )
        got = await accept(request, parse_client_log_post, state.on_client_log, "client log")
        if isinstance(got, web.Response):
            return got
        return web.json_response({"accepted": True, "sequence": got.sequence}, status=202)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True, **health()})

    app.router.add_post("/v1/metrics", post_metrics)
    app.router.add_post(CLIENT_LOG_PATH, post_client_log)
    app.router.add_get("/healthz", healthz)
    return app
