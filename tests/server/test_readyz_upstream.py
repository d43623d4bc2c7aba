"""`upstream_health_path`: /readyz says ready only while the upstream's health path answers 200 too, so a
server bound to loopback in the pod reaches the kubelet's readiness through islwatch (deploy/k8s)."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.server.app import run_proxy
from tests.conftest import load_builtin
from tests.server.helpers import proxy_config, serve_app


def upstream_with_health(state: dict[str, int]) -> web.Application:
    async def health(request: web.Request) -> web.Response:
        return web.Response(status=state["status"])

    app = web.Application()
    app.router.add_get("/health", health)
    return app


async def readyz(session: aiohttp.ClientSession, admin_url: str) -> tuple[int, dict[str, Any]]:
    async with session.get(admin_url + "/readyz") as r:
        return r.status, await r.json()


async def test_readyz_follows_the_upstream_health() -> None:
    load_builtin()  # the default tokenizer, converted once for the session
    state = {"status": 503}
    async with serve_app(upstream_with_health(state)) as up:
        cfg = proxy_config(up, upstream_health_path="/health")
        async with run_proxy(cfg, CollectorRegistry()) as (_, admin_url, _), aiohttp.ClientSession() as s:
            status, body = await readyz(s, admin_url)
            assert (status, body["status"], body["upstream"]) == (503, "upstream_not_ready", "status 503")
            assert body["tokenizers"] == {"default": "loaded"}
            state["status"] = 200
            status, body = await readyz(s, admin_url)
            assert (status, body["status"], body["upstream"]) == (200, "ready", "ok")


async def test_readyz_reports_an_unreachable_upstream() -> None:
    async with serve_app(upstream_with_health({"status": 200})) as up:
        pass  # the server is gone: its port refuses connections now
    cfg = proxy_config(up, upstream_health_path="/health")
    async with run_proxy(cfg, CollectorRegistry()) as (_, admin_url, _), aiohttp.ClientSession() as s:
        status, body = await readyz(s, admin_url)
    assert status == 503 and body["upstream"] == "ClientConnectorError"


async def test_without_the_option_the_upstream_is_not_asked() -> None:
    async with serve_app(upstream_with_health({"status": 503})) as up:
        cfg = proxy_config(up)
        async with run_proxy(cfg, CollectorRegistry()) as (_, admin_url, _), aiohttp.ClientSession() as s:
            status, body = await readyz(s, admin_url)
    assert status == 200 and "upstream" not in body
