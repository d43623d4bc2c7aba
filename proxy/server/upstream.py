"""The call to the one configured upstream: which headers cross, and ONE table of what its failures mean.

Like httpx maps transport errors once, every aiohttp failure of the upstream call, opening the request or
mid-stream, is classified by `failure_kind`; the kind labels `islwatch_upstream_errors_total` and picks the
status the client gets when no upstream response exists (`FAILURE_STATUS`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from yarl import URL

from proxy.runtime.pooled import forget_pooled, pooled, retryable
from proxy.server.headers import decoded, for_client

# RFC 9110 section 7.6.1: connection-specific fields are not forwarded by a proxy. Host is the upstream's.
# Lower-case bytes: names are case-insensitive (RFC 9110 5.1) and compared as received (`raw_headers`).
HOP_BY_HOP = frozenset(
    h.lower().encode()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
        "TE", "Trailer", "Trailers", "Transfer-Encoding", "Upgrade",
        "Expect",  # 100-continue is answered by this hop (aiohttp does it when the body is read)
        "Host",
    )
)  # fmt: skip
# Defaults aiohttp's client would add when the client did not send them: the upstream must see only what
# the client sent.
SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
# The proxy's own answer when no upstream response exists (RFC 9110 15.6.3 and 15.6.5).
FAILURE_STATUS = {"connect": 502, "reset": 502, "timeout": 504, "head_too_large": 502}
# Idle pooled connections are dropped after this long: below the 5 s keep-alive of cpp-httplib
# (llama-server) and uvicorn (vLLM, SGLang), so the pool does not hand out one the server is closing.
KEEPALIVE_SECONDS = 4.0


def failure_kind(exc: BaseException) -> str | None:
    """connect | timeout | reset | head_too_large for a failure of the upstream call; None for anything else
    (a client that went away raises ConnectionResetError while we write to it: not the upstream's failure)."""
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.InvalidURL):
        return "connect"
    if isinstance(exc, aiohttp.ClientResponseError) and head_too_large(exc.__cause__):
        return "head_too_large"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionResetError):
        return None
    if isinstance(exc, aiohttp.ClientError):  # ServerDisconnected, ClientOSError, ClientPayloadError...
        return "reset"
    return None


def head_too_large(cause: BaseException | None) -> bool:
    """The upstream's head is past the client's limits (`HeadLimits`): a status line or field longer than
    max_line_size / max_field_size raises LineTooLong, more fields than max_headers a BadHttpMessage with
    this message (aiohttp 3.14 `_http_parser.pyx` `cb_on_header_field`, `http_parser.py` `parse_headers`).
    ResponseHandler.data_received copies it into a new HttpProcessingError caused by it, and
    ClientResponse.start raises a ClientResponseError from that: the parser's error is a cause or two down."""
    for _ in range(3):
        if isinstance(cause, LineTooLong) or (
            isinstance(cause, BadHttpMessage) and "Too many headers" in cause.message
        ):
            return True
        cause = cause.__cause__ if cause is not None else None
    return False


@dataclass(frozen=True)
class HeadLimits:
    """What the upstream client accepts of a response head (aiohttp's defaults are 8,190 bytes a line or
    field and 128 fields, below what curl, httpx or a browser accept; curl takes 100 KiB a field)."""

    max_field_bytes: int  # a status line, a field name, a field value
    max_fields: int


class UpstreamFailed(Exception):
    """No upstream response to relay; `kind` is `failure_kind` of the cause."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def forward_headers(raw: Sequence[tuple[bytes, bytes]], drop_length: bool) -> list[tuple[str, str]]:
    """The field lines that cross this hop, in order, each as received (headers.py: the bytes survive)."""
    named = {t.strip().lower() for n, v in raw if n.lower() == b"connection" for t in v.split(b",")}
    drop = HOP_BY_HOP | named | frozenset((b"content-length",) if drop_length else ())
    return decoded((n, v) for n, v in raw if n.lower() not in drop)


def identity_only(fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`fields` with the client's Accept-Encoding lines replaced by one `Accept-Encoding: identity`, where
    the first of them stood (at the end when there was none): the answer to a request whose usage was asked
    for must come back uncompressed for the injected event to be taken out (inspect.identity_upstream)."""
    kept: list[tuple[str, str]] = []
    at = None
    for name, value in fields:
        if name.lower() == "accept-encoding":
            at = len(kept) if at is None else at
        else:
            kept.append((name, value))
    kept.insert(len(kept) if at is None else at, ("Accept-Encoding", "identity"))
    return kept


def upstream_url(base: str, request: web.Request) -> URL:
    # The path and query go upstream exactly as the client wrote them (encoded=True: no re-quoting); an
    # absolute-form target (`GET http://elsewhere/ HTTP/1.1`) contributes only its path: not an open proxy.
    return URL(base + request.rel_url.raw_path_qs, encoded=True)


async def open_upstream(
    session: aiohttp.ClientSession,
    base: str,
    request: web.Request,
    data: Any,
    on_retry: Callable[[], None] = lambda: None,
    fresh: aiohttp.ClientSession | None = None,
    *,
    identity: bool = False,
) -> aiohttp.ClientResponse:
    """Send the request upstream and wait for its status line and headers; raises UpstreamFailed. A request
    lost on a reused connection before any response byte is sent once more, on a new connection: through
    `fresh` (a session that never pools), since the pool's other idle connections may be closed as well
    (llama-server closes each after a stream). `identity`: send `Accept-Encoding: identity` in place of the
    client's field (`identity_only`); every other line goes as received."""
    # The client's Content-Length goes as sent while it is still the body's length (not when the body was
    # rewritten to ask for usage); aiohttp adds one only when none is given (ClientRequest.update_body_from_data).
    resized = isinstance(data, bytes) and request.content_length != len(data)
    fields = forward_headers(request.raw_headers, drop_length=resized)
    headers = for_client(identity_only(fields) if identity else fields)
    for attempt in (1, 2):
        forget_pooled()
        try:
            return await (session if attempt == 1 or fresh is None else fresh).request(
                request.method, upstream_url(base, request), headers=headers, data=data,
                allow_redirects=False, skip_auto_headers=SKIP_AUTO_HEADERS,
            )  # fmt: skip
        except Exception as exc:
            kind = failure_kind(exc)
            if kind is None:
                raise
            if attempt == 1 and retryable(exc, pooled(), data):
                on_retry()
                continue
            detail = _DETAILS.get(kind, type(exc).__name__)
            raise UpstreamFailed(kind, detail) from exc
    raise AssertionError("unreachable")


_DETAILS = {
    "timeout": "no response within upstream_timeout_seconds",
    "head_too_large": "a response head past upstream_max_field_bytes or upstream_max_header_fields",
}


def error_response(exc: UpstreamFailed) -> web.Response:
    """An OpenAI-style error object, so SDKs surface it like any API error."""
    message = f"islwatch: upstream {exc.kind} error ({exc})"
    body = {"error": {"message": message, "type": "upstream_error", "param": None, "code": exc.kind}}
    return web.Response(
        status=FAILURE_STATUS[exc.kind], body=orjson.dumps(body), content_type="application/json"
    )
