"""The data path: one handler for every method and path, relayed to the one configured upstream.

Read top to bottom: inspect the request (inspect.py), open the upstream (upstream.py, one error table),
relay the answer while a usage tap watches the bytes (relay.py), and in `finally` record the request and
hand its analysis to the pool exactly once, client disconnects included. Nothing here tokenizes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from proxy.server.budget import BodyBudget, refused
from proxy.server.guard import connection_guard
from proxy.server.inspect import Inspected, Policy, inspect
from proxy.server.metrics import Metrics
from proxy.server.pool import AnalysisPool
from proxy.server.problems import ProblemLog
from proxy.server.records import AnalysisJob
from proxy.server.relay import UsageTap, client_response, relay
from proxy.server.upstream import FAILURE_STATUS, UpstreamFailed, error_response, open_upstream


@dataclass(frozen=True)
class ProxyContext:
    """Everything the handler needs, built once by `app.build_apps`."""

    upstream: str  # base URL without a trailing slash
    metrics: Metrics
    pool: AnalysisPool
    policy: Policy
    problems: ProblemLog
    budget: BodyBudget | None = None  # --max-inflight-body-bytes (budget.py)


CONTEXT = web.AppKey("context", ProxyContext)
SESSION = web.AppKey("session", aiohttp.ClientSession)
FRESH_SESSION = web.AppKey("fresh_session", aiohttp.ClientSession)  # never pooled: the one retry goes here


async def handle(request: web.Request) -> web.StreamResponse:
    guarded = connection_guard(request)
    if guarded is not None:
        guarded.head_received()  # the head deadline stops; the next starts with the next head's first byte
    budget = request.app[CONTEXT].budget
    held = 0 if budget is None else budget.size(request)  # the body's share of --max-inflight-body-bytes
    try:
        if budget is not None and held and not budget.take_now(held) and not await budget.take(held):
            held = 0
            return refused()
        return await _handle(request)
    finally:
        if budget is not None and held:
            budget.release(held)
        if guarded is not None:
            guarded.request_done()


async def _handle(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    stage = "request"  # where a client that goes away left: islwatch_client_disconnects_total{stage}
    try:
        req = await inspect(request, ctx.policy, ctx.metrics, ctx.problems)
    except asyncio.CancelledError:
        _client_gone(ctx, stage)
        raise
    status: int | None = None
    tap: UsageTap | None = None
    try:
        stage = "upstream"
        try:
            upstream = await open_upstream(
                request.app[SESSION],
                ctx.upstream,
                request,
                req.data,
                ctx.metrics.upstream_retried,
                request.app[FRESH_SESSION],
                identity=req.identity_upstream,
            )
        except UpstreamFailed as exc:
            status = FAILURE_STATUS[exc.kind]
            _upstream_failed(ctx, req.endpoint_label, exc.kind, f"before a response ({exc})")
            return _last_if_chunked(request, error_response(exc))
        async with upstream:
            status = upstream.status
            if status >= 500:
                ctx.metrics.upstream_error("status_5xx")
            if req.tokenizer_key is not None and 200 <= status < 300:
                tap = UsageTap.of(upstream, req.injected)
            elif req.skipped and 200 <= status < 300:  # where it would have been analysed: counted once
                ctx.metrics.skipped(req.model_label, req.endpoint_label)
            response = client_response(upstream, tap is not None and tap.strips)
            await _last_if_chunked(request, response).prepare(request)
            stage = "response"
            if (kind := await relay(request, upstream, response, tap)) is not None:
                _upstream_failed(ctx, req.endpoint_label, kind, "mid-response")
            elif request.transport is None or request.transport.is_closing():
                ctx.metrics.client_disconnected(stage)  # its connection reset as relay wrote to it
            return response
    except asyncio.CancelledError:
        _client_gone(ctx, stage)
        raise
    finally:
        ctx.metrics.relayed(req.model_label, req.endpoint_label, status)
        if tap is not None:
            if (result := tap.injection_result()) is not None:
                ctx.metrics.injection(result)
            ctx.pool.submit(_job(req, tap))


def _client_gone(ctx: ProxyContext, stage: str) -> None:
    """A client that goes away cancels its handler (`handler_cancellation`, aiohttp's connection_lost). A
    CancelledError the task was not asked for is guard.py ending a read it cut, counted there."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        ctx.metrics.client_disconnected(stage)


def _last_if_chunked(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """After a chunked request the connection closes: aiohttp 3.14's C parser adds a chunked body's last
    trailer field to the head of the next request on the connection (`_http_parser.pyx`:
    `cb_on_message_begin` clears the field list, not the field still being read), so one client could
    plant a header in the request that follows it (tests/reliability/test_smuggling.py). RFC 9112 9.6: a
    server may close after any response; a pipelined request is then sent again by its client."""
    if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
        response.force_close()
    return response


def _upstream_failed(ctx: ProxyContext, endpoint: str, kind: str, when: str) -> None:
    ctx.metrics.upstream_error(kind)
    # The endpoint label, not the method and path: both are the client's to choose (logs carry no content).
    ctx.problems(f"upstream_{kind}", "upstream %s failed %s for endpoint %s", kind, when, endpoint)


def _job(req: Inspected, tap: UsageTap) -> AnalysisJob:
    assert req.endpoint is not None and req.tokenizer_key is not None
    usage = tap.usage()
    return AnalysisJob(
        endpoint=req.endpoint,
        model_label=req.model_label,
        tokenizer_key=req.tokenizer_key,
        body=req.body,
        parsed=req.parsed,
        server_tokens=usage.input_tokens if usage is not None else None,
        server_usage=usage,
        response_json=tap.response_json(),
        streamed=tap.streamed,
    )
