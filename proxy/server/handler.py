"""The data path: one handler for every method and path, relayed to the one configured upstream.

Read top to bottom: read the body (bounded), note the model and the stream flag, send it upstream with the
shared session, prepare the client response with the upstream's status and headers, relay every chunk as it
arrives while feeding the usage parser, and in `finally` hand the record to analysis exactly once, client
disconnects included. Nothing on this path tokenizes; a problem with the request only costs its analysis.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from proxy.core.usage import SSEUsageParser, SSEUsageStripper
from proxy.server.metrics import Metrics, status_class
from proxy.server.pool import AnalysisPool
from proxy.server.records import NONE_LABEL, OTHER_ENDPOINT, AnalysisJob, ProblemLog, route_model

log = logging.getLogger("islwatch.proxy")

# RFC 9110 section 7.6.1: connection-specific fields are not forwarded by a proxy. Host is the upstream's.
HOP_BY_HOP = frozenset(
    istr(h)
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
        "TE", "Trailer", "Trailers", "Transfer-Encoding", "Upgrade",
        "Expect",  # 100-continue is answered by this hop (aiohttp does it when the body is read)
    )
)  # fmt: skip
# Defaults aiohttp's client would add when the client did not send them: the upstream must see only what
# the client sent.
SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
# The OpenAI API paths islwatch analyses (POST only), mapped to the counting core's endpoint names.
ANALYSED = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}
# The proxy's own answer when no upstream response exists (RFC 9110 15.6.3 and 15.6.5).
UPSTREAM_FAILURE_STATUS = {"connect": 502, "reset": 502, "timeout": 504}
INJECTABLE = frozenset({"chat", "completions"})  # the endpoints with `stream_options.include_usage`


@dataclass(frozen=True)
class ProxyContext:
    """Everything the handler needs, built once by `app.build_apps`."""

    upstream: str  # base URL without a trailing slash
    metrics: Metrics
    pool: AnalysisPool
    models: frozenset[str]
    has_default_tokenizer: bool
    max_body_bytes: int
    inject_stream_usage: bool
    thread_mode: bool  # hand the parsed body to the worker (same process) instead of the raw bytes
    problems: ProblemLog


CONTEXT = web.AppKey("context", ProxyContext)
SESSION = web.AppKey("session", aiohttp.ClientSession)


class UpstreamFailed(Exception):
    """No upstream response to relay; `kind` labels islwatch_upstream_errors_total."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def error_response(status: int, message: str, kind: str) -> web.Response:
    """An OpenAI-style error object, so SDKs surface it like any API error."""
    body = {"error": {"message": message, "type": "upstream_error", "param": None, "code": kind}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def forward_headers(headers: CIMultiDictProxy[str], drop_length: bool) -> CIMultiDict[str]:
    named = {istr(v.strip()) for v in headers.getall("Connection", ()) for v in v.split(",") if v.strip()}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if (
            name in HOP_BY_HOP
            or name in named
            or name == "Host"
            or (drop_length and name == "Content-Length")
        ):
            continue
        out.add(name, value)
    return out


async def read_limited(content: aiohttp.StreamReader, limit: int) -> tuple[bytes, bool]:
    """Read the body up to `limit` bytes: (bytes read, True if that is the whole body)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in content.iter_any():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks), False
    return b"".join(chunks), True


async def _chain(prefix: bytes, rest: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    yield prefix
    async for chunk in rest.iter_any():
        yield chunk


def _bad_body(body: bytes) -> tuple[Any, str | None]:
    """Parse the request body: (object, None) or (None, reason). The request path's only JSON parse."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return None, "non_utf8"
        return None, "invalid_json"
    return (obj, None) if isinstance(obj, dict) else (None, "not_a_request")


def _json_content_type(ctype: str | None) -> bool:
    # As FastAPI (vLLM, SGLang) decides whether to parse a body as JSON: absent, application/json or +json.
    if not ctype:
        return True
    main = ctype.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/") and main.endswith("+json"))


def _wants_injection(obj: dict[str, Any]) -> bool:
    """A streaming request that did not ask for usage; other stream_options keys (vLLM's
    continuous_usage_stats) would change every chunk once usage is on, so those are left alone."""
    if obj.get("stream") is not True:
        return False
    opts = obj.get("stream_options")
    return opts is None or (
        isinstance(opts, dict) and set(opts) <= {"include_usage"} and not opts.get("include_usage")
    )


async def handle(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    session = request.app[SESSION]
    metrics = ctx.metrics
    endpoint = ANALYSED.get(request.path) if request.method == "POST" else None
    model_label, endpoint_label = NONE_LABEL, endpoint or OTHER_ENDPOINT
    status: int | None = None
    analyse = False
    tokenizer_key: str | None = None
    body = b""
    parsed: Any = None
    parser: SSEUsageParser | None = None
    json_tail: bytearray | None = None

    # 1. Read the body: whole (bounded) when it is to be analysed, streamed through otherwise.
    data: Any = request.content if request.body_exists else None
    if endpoint is not None and request.body_exists:
        body, complete = await read_limited(request.content, ctx.max_body_bytes)
        if not complete:
            data = _chain(body, request.content)
            ctx.problems(
                "body_too_large",
                "%s body above max_body_bytes=%d: relayed, not analysed",
                endpoint,
                ctx.max_body_bytes,
            )
            metrics.child(metrics.bad_requests, "body_too_large").inc()
        else:
            data = body
            # 2. Note the model and the stream flag.
            if not _json_content_type(request.headers.get("Content-Type")):
                reason: str | None = "wrong_content_type"
            else:
                parsed, reason = _bad_body(body)
            if reason is not None:
                metrics.child(metrics.bad_requests, reason).inc()
                ctx.problems(reason, "%s request not analysed (%d bytes)", endpoint, len(body))
            else:
                route = route_model(parsed.get("model"), ctx.models, ctx.has_default_tokenizer)
                model_label, tokenizer_key = route.label, route.tokenizer_key
                if route.unknown:
                    metrics.child(metrics.bad_requests, "unknown_model").inc()
                    ctx.problems(
                        "unknown_model", "a model not in --model-tokenizer: counted as %r", model_label
                    )
                analyse = tokenizer_key is not None
                if ctx.inject_stream_usage and endpoint in INJECTABLE and _wants_injection(parsed):
                    # Ask for usage upstream; the stripper below hides it from the client again.
                    data = orjson.dumps({**parsed, "stream_options": {"include_usage": True}})
                    parser = SSEUsageParser()
    injected = parser is not None
    headers = forward_headers(request.headers, drop_length=isinstance(data, bytes))
    # The path and query go upstream exactly as the client wrote them (encoded=True: no re-quoting); an
    # absolute-form target (`GET http://elsewhere/ HTTP/1.1`) contributes only its path: not an open proxy.
    url = URL(ctx.upstream + request.rel_url.raw_path_qs, encoded=True)

    response: web.StreamResponse | None = None
    try:
        # 3. Call the upstream with the shared session.
        try:
            upstream_cm = session.request(
                request.method, url, headers=headers, data=data, allow_redirects=False,
                skip_auto_headers=SKIP_AUTO_HEADERS,
            )  # fmt: skip
            upstream = await upstream_cm.__aenter__()
        except (aiohttp.ClientConnectorError, aiohttp.InvalidURL) as exc:
            raise UpstreamFailed("connect", type(exc).__name__) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as exc:
            raise UpstreamFailed("reset", type(exc).__name__) from exc
        except TimeoutError as exc:
            raise UpstreamFailed("timeout", "no response within upstream_timeout_seconds") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamFailed("reset", type(exc).__name__) from exc

        try:
            status = upstream.status
            if status >= 500:
                metrics.child(metrics.upstream_errors, "status_5xx").inc()
            analyse = analyse and 200 <= status < 300
            # 4. Prepare the client response: same status, reason and headers (minus hop-by-hop).
            response = web.StreamResponse(status=status, reason=upstream.reason)
            relay_headers = forward_headers(upstream.headers, drop_length=injected)
            response.headers.extend(relay_headers)
            sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            stripper: SSEUsageStripper | None = None
            if analyse and sse:
                parser = parser or SSEUsageParser()
                stripper = SSEUsageStripper(parser) if injected else None
            elif analyse:
                json_tail = bytearray()
            await response.prepare(request)

            # 5. Relay each chunk as it arrives, feeding the usage parser.
            cap = ctx.max_body_bytes
            async for chunk in upstream.content.iter_any():
                if stripper is not None:
                    chunk = stripper.feed(chunk)
                elif parser is not None:
                    parser.feed(chunk)
                elif json_tail is not None:
                    json_tail += chunk
                    if len(json_tail) > 2 * cap:  # keep the tail: usage comes last
                        del json_tail[:-cap]
                if chunk:
                    await response.write(chunk)
            if stripper is not None and (rest := stripper.flush()):
                await response.write(rest)
            await response.write_eof()
        except (aiohttp.ClientPayloadError, aiohttp.ClientOSError, aiohttp.ServerDisconnectedError,
                TimeoutError) as exc:  # fmt: skip
            kind = "timeout" if isinstance(exc, TimeoutError) else "reset"
            metrics.child(metrics.upstream_errors, kind).inc()
            ctx.problems(
                f"upstream_{kind}",
                "upstream failed mid-response on %s (%s)",
                request.path,
                type(exc).__name__,
            )
            # The client must see the failure it would have seen talking to the upstream directly: a
            # connection closed before the body ended. Closing without write_eof leaves the chunked
            # body (or Content-Length) incomplete.
            if request.transport is not None:
                request.transport.close()
            upstream.close()
        except ConnectionResetError:
            upstream.close()  # the client went away: stop the upstream request (generation) at once
        except BaseException:
            upstream.close()  # cancelled (client disconnect) or a bug: never leave the upstream running
            raise
        finally:
            await upstream_cm.__aexit__(None, None, None)
        return response
    except UpstreamFailed as exc:
        metrics.child(metrics.upstream_errors, exc.kind).inc()
        ctx.problems(
            f"upstream_{exc.kind}",
            "upstream %s failed for %s %s (%s)",
            exc.kind,
            request.method,
            request.path,
            exc,
        )
        status = UPSTREAM_FAILURE_STATUS[exc.kind]
        analyse = False
        return error_response(status, f"islwatch: upstream {exc.kind} error ({exc})", exc.kind)
    finally:
        # 6. Hand the record to analysis exactly once, whatever happened above.
        metrics.child(metrics.requests, model_label, endpoint_label, status_class(status)).inc()
        if analyse and endpoint is not None and tokenizer_key is not None:
            ctx.pool.submit(
                AnalysisJob(
                    endpoint=endpoint,
                    model_label=model_label,
                    tokenizer_key=tokenizer_key,
                    body=b"" if ctx.thread_mode else body,
                    parsed=parsed if ctx.thread_mode else None,
                    server_tokens=_server_tokens(parser),
                    response_json=bytes(json_tail[-ctx.max_body_bytes :]) if json_tail is not None else None,
                    streamed=parser is not None,
                )
            )


def _server_tokens(parser: SSEUsageParser | None) -> int | None:
    usage = parser.result() if parser is not None else None
    return usage.input_tokens if usage is not None else None
