"""The agent's local HTTP API: POST /v1/metrics from the FL client, GET /healthz."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agent_addon.phase import RunKey
from agent_addon.state import AgentState, BadRequest, Forbidden, parse_metrics_post
from ocmfl.reports import ROUND_PHASE_NAMES

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024


def make_app(
    state: AgentState,
    health: Callable[[], dict[str, Any]],
    sender: Callable[[str], tuple[RunKey, str] | None] | None = None,
) -> web.Application:
    """aiohttp app; `health()` returns the JSON shown on /healthz; `sender(address)` names
    the run of the client pod at a peer address (None: not a known client pod)."""
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
            report = state.on_metrics(post)
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
