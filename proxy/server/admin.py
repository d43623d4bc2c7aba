"""The admin app: /metrics (prometheus_client's own aiohttp exposition: content negotiation, OpenMetrics and
gzip included), /healthz, /readyz (200 only while every tokenizer is loaded: the proxy relays either way,
but says when it is not measuring), POST /reload (also on SIGHUP).
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from proxy.server.metrics import Metrics
from proxy.server.pool import AnalysisPool

log = logging.getLogger("islwatch.proxy")

POOL = web.AppKey("pool", AnalysisPool)
# Serialises reloads (SIGHUP and POST /reload may race).
RELOAD_LOCK = web.AppKey("reload_lock", asyncio.Lock)


def build_admin(pool: AnalysisPool, metrics: Metrics) -> web.Application:
    admin = web.Application()
    admin[POOL] = pool
    admin[RELOAD_LOCK] = asyncio.Lock()
    admin.router.add_get("/metrics", make_aiohttp_handler(metrics.registry))
    admin.router.add_get("/healthz", healthz)
    admin.router.add_get("/readyz", readyz)
    admin.router.add_post("/reload", reload_view)
    return admin


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    models = {r.label: ("error: " + r.error if r.error else "loaded") for r in pool.reports}
    if pool.ready:
        return web.json_response({"status": "ready", "tokenizers": models})
    return web.json_response(
        {"status": "loading" if not models else "error", "tokenizers": models}, status=503
    )


async def reload_tokenizers(admin: web.Application) -> tuple[bool, dict[str, str]]:
    """Load every tokenizer again from disk (SIGHUP, POST /reload); the old ones serve until it succeeds."""
    async with admin[RELOAD_LOCK]:
        pool = admin[POOL]
        log.info("reloading tokenizers")
        reports = await pool.reload()
    result = {r.label: ("error: " + r.error if r.error else "loaded") for r in reports}
    return all(not r.error for r in reports), result


async def reload_view(request: web.Request) -> web.Response:
    ok, result = await reload_tokenizers(request.app)
    return web.json_response(
        {"status": "reloaded" if ok else "failed", "tokenizers": result}, status=200 if ok else 500
    )
