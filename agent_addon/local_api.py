"""The agent's local HTTP API: POST /v1/metrics from the FL client, GET /healthz.

With a `TokenCheck` (the agent has its cluster's API), a post counts only when it carries the
token of the federation it is for (401 without one, 403 with another)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agent_addon.phase import RunKey
from agent_addon.state import (
    AgentState,
    BadRequest,
    Forbidden,
    Unauthorized,
    parse_metrics_post,
)
from agent_addon.tokens import TokenCheck, bearer_token
from ocmfl.kube import KubeError
from ocmfl.reports import ROUND_PHASE_NAMES

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024


def make_app(
    state: AgentState,
    health: Callable[[], dict[str, Any]],
    sender: Callable[[str], tuple[RunKey, str] | None] | None = None,
    tokens: TokenCheck | None = None,
    persist: Callable[[], None] | None = None,
) -> web.Application:
    """aiohttp app; `health()` returns the JSON shown on /healthz; `sender(address)` names
    the run of the client pod at a peer address (None: not a known client pod); `tokens`
    checks each post's token (None: no check, for an agent without its cluster's API);
    `persist()` saves the pending reports before a post is answered 202, so an accepted
    report survives the agent being killed right after (fault drill 8)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)

    async def post_metrics(request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as e:
            return web.json_response({"error": f"body is not JSON: {e}"}, status=400)
        who = sender(request.remote) if sender is not None and request.remote else None
        try:
            post = parse_metrics_post(
                body, cluster=state.cluster, runs=state.active_runs(), sender=who
            )
            if tokens is not None:
                presented = bearer_token(request.headers.get("Authorization"))
                run = (post.fl_namespace, post.fl_name)
                uid = await asyncio.to_thread(tokens.verify, run, presented)
                if uid and post.fl_uid and uid != post.fl_uid:
                    raise Forbidden(f"fl_uid: {run[0]}/{run[1]} here is uid {uid}")
                post = dataclasses.replace(post, fl_uid=uid or post.fl_uid)
            report = state.on_metrics(post)
            if persist is not None:
                persist()
        except KubeError as e:
            log.warning("cannot check the token of a metrics post: %s", e)
            return web.json_response({"error": f"cannot check the token now: {e}"}, status=503)
        except Unauthorized as e:
            log.warning("refused metrics from %s: %s", request.remote, e)
            return web.json_response({"error": str(e)}, status=401)
        except Forbidden as e:
            log.warning("refused metrics from %s: %s", request.remote, e)
            return web.json_response({"error": str(e)}, status=403)
        except BadRequest as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response(
            {
                "accepted": True,
                "sequence": report.sequence,
                "phase": ROUND_PHASE_NAMES[report.metrics[0].phase],
            },
            status=202,
        )

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True, **health()})

    app.router.add_post("/v1/metrics", post_metrics)
    app.router.add_get("/healthz", healthz)
    return app
