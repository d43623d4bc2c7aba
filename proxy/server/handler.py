"""The data path: one handler for every method and path, relayed to the one configured upstream.

Read top to bottom: inspect the request (inspect.py), open the upstream (upstream.py, one error table),
relay the answer while a usage tap watches the bytes (relay.py), and in `finally` record the request and
hand its analysis to the pool exactly once, client disconnects included. Nothing here tokenizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from aiohttp import web

from proxy.server.inspect import Inspected, Policy, inspect
from proxy.server.metrics import Metrics
from proxy.server.pool import AnalysisPool
from proxy.server.problems import ProblemLog
from proxy.server.records import AnalysisJob
from proxy.server.relay import UsageTap, client_response, is_event_stream, relay
from proxy.server.upstream import FAILURE_STATUS, UpstreamFailed, error_response, open_upstream


@dataclass(frozen=True)
class ProxyContext:
    """Everything the handler needs, built once by `app.build_apps`."""

    upstream: str  # base URL without a trailing slash
    metrics: Metrics
    pool: AnalysisPool
    policy: Policy
    problems: ProblemLog


CONTEXT = web.AppKey("context", ProxyContext)
SESSION = web.AppKey("session", aiohttp.ClientSession)


async def handle(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    req = await inspect(request, ctx.policy, ctx.metrics, ctx.problems)
    status: int | None = None
    tap: UsageTap | None = None
    try:
        try:
            upstream = await open_upstream(
                request.app[SESSION], ctx.upstream, request, req.data, ctx.metrics.upstream_retried
            )
        except UpstreamFailed as exc:
            status = FAILURE_STATUS[exc.kind]
            _upstream_failed(ctx, request, exc.kind, f"before a response ({exc})")
            return error_response(exc)
        async with upstream:
            status = upstream.status
            if status >= 500:
                ctx.metrics.upstream_error("status_5xx")
            if req.tokenizer_key is not None and 200 <= status < 300:
                tap = UsageTap(is_event_stream(upstream), req.injected, ctx.policy.max_body_bytes)
            response = client_response(upstream, req.injected and tap is not None and tap.streamed)
            await response.prepare(request)
            if (kind := await relay(request, upstream, response, tap)) is not None:
                _upstream_failed(ctx, request, kind, "mid-response")
            return response
    finally:
        ctx.metrics.relayed(req.model_label, req.endpoint_label, status)
        if tap is not None:
            ctx.pool.submit(_job(req, tap))


def _upstream_failed(ctx: ProxyContext, request: web.Request, kind: str, when: str) -> None:
    ctx.metrics.upstream_error(kind)
    ctx.problems(
        f"upstream_{kind}", "upstream %s failed %s for %s %s", kind, when, request.method, request.path
    )


def _job(req: Inspected, tap: UsageTap) -> AnalysisJob:
    assert req.endpoint is not None and req.tokenizer_key is not None
    return AnalysisJob(
        endpoint=req.endpoint,
        model_label=req.model_label,
        tokenizer_key=req.tokenizer_key,
        body=req.body,
        parsed=req.parsed,
        server_tokens=tap.server_tokens(),
        response_json=tap.response_json(),
        streamed=tap.streamed,
    )
