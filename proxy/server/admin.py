"""The admin app: /metrics (exposition.py: prometheus_client's encoders in a thread, renders shared and
spaced so that scrapes cannot stall traffic; content negotiation, OpenMetrics and gzip included), /healthz,
/readyz (200 only while every tokenizer is loaded and an analysis worker runs with them: the proxy relays
either way, but says when it is not measuring, and why, in `analysis`; with `upstream_health_path`, also only
while the upstream's health path answers 200, so a server bound to loopback in the pod is probed through
islwatch), POST /reload (also on SIGHUP). exposition.AdminGate caps the requests in flight and checks the
bearer token when one is set.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from proxy.server.exposition import AdminGate, Exposition
from proxy.server.metrics import Metrics
from proxy.server.pool import AnalysisPool
from proxy.server.processes import WorkerExited
from proxy.server.server_probe import ServerProbe

log = logging.getLogger("islwatch.proxy")

POOL = web.AppKey("pool", AnalysisPool)
# Serialises reloads (SIGHUP and POST /reload may race).
RELOAD_LOCK = web.AppKey("reload_lock", asyncio.Lock)
UPSTREAM_HEALTH = web.AppKey("upstream_health", str)  # the upstream's health URL; absent: not checked
HEALTH_SESSION = web.AppKey("health_session", aiohttp.ClientSession)
METRICS = web.AppKey("metrics", Metrics)
PROBE = web.AppKey("probe", ServerProbe)
HEALTH_TIMEOUT_SECONDS = 2.0  # below the kubelet's default probe timeout budget (periodSeconds 5)


def build_admin(
    pool: AnalysisPool,
    metrics: Metrics,
    upstream_health: str | None = None,
    probe: ServerProbe | None = None,
    max_requests: int = 64,
    token: str | None = None,
) -> web.Application:
    admin = web.Application(middlewares=[AdminGate(max_requests, token, metrics).middleware])
    admin[POOL] = pool
    admin[METRICS] = metrics
    if probe is not None:
        admin[PROBE] = probe
    admin[RELOAD_LOCK] = asyncio.Lock()
    if upstream_health is not None:
        admin[UPSTREAM_HEALTH] = upstream_health
        admin.cleanup_ctx.append(_health_session)
    exposition = Exposition(metrics.registry)
    admin.on_cleanup.append(lambda _: _closed(exposition))
    admin.router.add_get("/metrics", exposition.handle)
    admin.router.add_get("/healthz", healthz)
    admin.router.add_get("/readyz", readyz)
    admin.router.add_post("/reload", reload_view)
    return admin


async def _closed(exposition: Exposition) -> None:
    exposition.close()


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _health_session(app: web.Application) -> AsyncIterator[None]:
    timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_SECONDS)
    app[HEALTH_SESSION] = aiohttp.ClientSession(timeout=timeout, trust_env=False)
    yield
    await app[HEALTH_SESSION].close()


async def upstream_state(app: web.Application) -> str | None:
    """None when the upstream's health is not checked; "ok", or why not (content-free)."""
    url = app.get(UPSTREAM_HEALTH)
    if url is None:
        return None
    try:
        async with app[HEALTH_SESSION].get(url, allow_redirects=False) as resp:
            return "ok" if resp.status == 200 else f"status {resp.status}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return type(exc).__name__


async def readyz(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    models = {r.label: ("error: " + r.error if r.error else "loaded") for r in pool.reports}
    upstream = await upstream_state(request.app)
    problem = pool.problem()
    body: dict[str, object] = {"tokenizers": models, "workers_live": pool.workers_loaded}
    if problem is not None:
        body["analysis"] = problem[1]
    if pool.changed_on_restart:  # measuring, but not every worker runs the same tokenizer until a reload
        body["tokenizer_changed_on_restart"] = sorted(pool.changed_on_restart)
    if PROBE in request.app:  # the probe's verdict per model: information, never a reason to be unready
        parity = request.app[METRICS].server_parity
        body["server_parity"] = {
            m: ("ok" if parity[m] else "differs") if m in parity else "unknown" for m in models
        }
        lines = request.app[PROBE].lines  # why it differs: which probes, the server's template kwargs
        differs = {m: lines[m] for m in models if m in parity and not parity[m] and m in lines}
        if differs:
            body["server_parity_detail"] = differs
    if upstream is not None:
        body["upstream"] = upstream
    if problem is None and upstream in (None, "ok"):
        return web.json_response({"status": "ready", **body})
    status = "upstream_not_ready" if problem is None else problem[0]
    return web.json_response({"status": status, **body}, status=503)


async def reload_tokenizers(admin: web.Application) -> tuple[bool, dict[str, str]]:
    """Load every tokenizer again from disk (SIGHUP, POST /reload); the old ones serve until it succeeds."""
    async with admin[RELOAD_LOCK]:
        pool = admin[POOL]
        log.info("reloading tokenizers")
        try:
            reports = await pool.reload()
        except WorkerExited as exc:  # a new worker crashed while loading: the current ones keep serving
            log.error("reload failed: %s", exc)
            return False, {label: f"error: {exc}" for label in {r.label for r in pool.reports}}
    result = {r.label: ("error: " + r.error if r.error else "loaded") for r in reports}
    return all(not r.error for r in reports), result


async def reload_view(request: web.Request) -> web.Response:
    ok, result = await reload_tokenizers(request.app)
    return web.json_response(
        {"status": "reloaded" if ok else "failed", "tokenizers": result}, status=200 if ok else 500
    )
