"""The traffic port's client side: a cap on open connections, deadlines for request heads and bodies, and
aiohttp's server log without request content.

aiohttp's web server closes an idle keep-alive connection (`keepalive_timeout`, whose timer also starts when
a connection opens, so one that never completes a head is closed then too) but has no head or body read
deadline and no connection cap, and it logs a malformed request as an ERROR with a traceback that quotes the
raw bytes (`web_protocol.RequestHandler.handle_error`). So, around aiohttp's own RequestHandler:

- `Guard` is the listening socket's protocol factory. Every connection is aiohttp's RequestHandler behind
  `_Guarded`, which forwards each protocol call and closes the connection when a request head is not
  complete `header_timeout` seconds after the connection was accepted, or after the first byte of a later
  head on a kept-alive connection (nginx's `client_header_timeout` runs from the accept,
  ngx_http_init_connection; HAProxy's `timeout http-request` bounds the whole head): bytes that keep coming
  do not extend it. At `max_connections` open connections, the one that has waited longest for a request
  head (never sent one, sent part of one, or idle between requests) is closed to admit the new one, as
  nginx reuses its idle keep-alive connections when out of them (`ngx_drain_connections`); only when every
  open connection is inside a request is the new one closed as soon as it is accepted. So slow or idle
  sockets cannot hold the cap against clients that send a request.
- `body_chunks` reads a request body with a deadline per read (nginx's `client_body_timeout`).
- `ServerLog` stands in for aiohttp's `aiohttp.server` logger: each problem counted, one throttled line
  naming the exception's class, never its message.

What is cut counts in `islwatch_client_connections_cut_total{reason}`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from proxy.server.metrics import Metrics
from proxy.server.problems import ProblemLog, traceback_line

log = logging.getLogger("islwatch.proxy")


@dataclass(frozen=True)
class Limits:
    header_timeout: float  # to a head's end: from the accept, or a later head's first byte
    body_timeout: float  # longest wait for the next body bytes
    max_connections: int


class Guard:
    """The traffic socket's protocol factory (`loop.create_server(guard, ...)`) over aiohttp's Server."""

    def __init__(self, server: web.Server, limits: Limits, metrics: Metrics, problems: ProblemLog) -> None:
        self.server = server
        self.limits = limits
        self.metrics = metrics
        self.problems = problems
        self.open = 0
        # Admitted connections waiting for a request head, the longest-waiting first (dicts keep insertion
        # order): accepted and not yet in a request, or idle after one. The handler takes a connection out
        # when its head is complete and puts it back at the end when its request is done.
        self.waiting: dict[_Guarded, None] = {}
        # Made in the serving loop. Kept: Python 3.11's get_running_loop makes a getpid() system call on
        # every call (strace: one of the three per request), and each head starts a timer on this loop.
        self.loop = asyncio.get_running_loop()

    def __call__(self) -> asyncio.Protocol:
        return _Guarded(self, self.server())

    def cut(self, reason: str, message: str, *args: Any) -> None:
        self.metrics.connection_cut(reason)
        self.problems(reason, message, *args)

    def opened(self, n: int) -> None:
        self.open += n
        self.metrics.client_connections.set(self.open)


class _Guarded(asyncio.Protocol):
    """aiohttp's RequestHandler behind the cap and the head deadline; every protocol call is forwarded."""

    def __init__(self, guard: Guard, handler: web.RequestHandler) -> None:
        self._guard = guard
        self._handler = handler
        # The deadline is checked lazily: one timer at a time, left armed when a head completes; when it
        # fires it closes the connection if the head pending since `_head_since` is late, re-arms for that
        # head's remaining time if one is pending, and otherwise lapses. A timer armed and cancelled per
        # request costs a libuv handle each time (uvloop call_later + cancel: ~5 us quiet, 17 us loaded).
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_since: float | None = None  # loop time a pending head's deadline runs from
        self._in_request = False
        self._admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        if guard.open >= guard.limits.max_connections and not self._evict_one():
            guard.cut(
                "connection_cap", "%d client connections open (max_connections), each in a request: one "
                "more closed", guard.open,
            )  # fmt: skip
            transport.close()  # nothing was read or written: the client sees the connection closed
            return
        self._admitted = True
        guard.opened(1)
        guard.waiting[self] = None
        self._head_started()  # the first head's deadline runs from the accept, bytes or none
        self._handler.connection_made(transport)

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for a request head; False when none waits."""
        guard = self._guard
        oldest = next(iter(guard.waiting), None)
        if oldest is None:
            return False
        guard.cut("evicted", "max_connections reached: the connection waiting longest for a head closed")
        oldest._close()
        return True

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if self._head_since is None and not self._in_request:  # the first bytes of a head
            self._head_started()
        self._handler.data_received(data)

    def eof_received(self) -> None:  # RequestHandler's: None, the transport closes itself
        if self._admitted:
            self._handler.eof_received()

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted = False  # connection_lost comes once; an evicted connection's close may call it late
        self._stop_head_timer()
        self._guard.waiting.pop(self, None)
        self._guard.opened(-1)
        self._handler.connection_lost(exc)

    # ---- from the handler (`connection_guard`), around each request -------------------------------------

    def head_received(self) -> None:
        self._head_since = None  # the timer, if armed, lapses when it fires
        self._in_request = True
        self._guard.waiting.pop(self, None)

    def request_done(self) -> None:
        # The next head's deadline starts with its first byte. Bytes of it that arrived during this request
        # (pipelining) are bounded by aiohttp's keep-alive timer, which closes a connection still waiting.
        self._in_request = False
        if self._admitted:
            self._guard.waiting[self] = None  # the newest to wait: evicted last

    def _head_started(self) -> None:
        loop = self._guard.loop
        self._head_since = loop.time()
        if self._head_timer is None:
            self._head_timer = loop.call_later(self._guard.limits.header_timeout, self._head_check)

    def _stop_head_timer(self) -> None:
        self._head_since = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_check(self) -> None:
        self._head_timer = None
        if self._head_since is None:  # no head pending: the next head's first byte arms a timer
            return
        loop, limit = self._guard.loop, self._guard.limits.header_timeout
        left = self._head_since + limit - loop.time()
        if left > 0:  # a later head than the one this timer was armed for
            self._head_timer = loop.call_later(left, self._head_check)
            return
        self._guard.cut("header_timeout", "a request head unfinished after %gs: connection closed", limit)
        self._close()

    def _close(self) -> None:
        """Close at once, out of the waiting list now: the next eviction picks another before connection_lost."""
        self._stop_head_timer()
        self._guard.waiting.pop(self, None)
        self._handler.force_close()


def connection_guard(request: web.Request) -> _Guarded | None:
    """The `_Guarded` of the request's connection, which the handler tells when the head is complete (its
    deadline stops: `head_received`) and when the request is done (`request_done`); None for a connection a
    `Guard` did not make (an app served another way). Called by the handler itself, not a middleware: an
    aiohttp middleware adds two coroutine frames to every request (py-spy, wrk c=32: ~7 us per request)."""
    transport = request.transport
    guarded = transport.get_protocol() if transport is not None else None
    return guarded if isinstance(guarded, _Guarded) else None


def body_if_arrived(request: web.Request, limit: int) -> bytes | None:
    """The whole body, when its declared length is within `limit` and all of it is already buffered (a
    small request's body comes in the same reads as its head): nothing to wait for, so no reader and no
    deadline. None otherwise: read it with `body_chunks`."""
    length = request.content_length
    if length is None or length > limit or not request.content.is_eof():
        return None
    return request.content.read_nowait()


async def body_chunks(
    request: web.Request, timeout: float, metrics: Metrics, problems: ProblemLog
) -> AsyncIterator[bytes]:
    """The request body as it arrives. No bytes for `timeout` seconds, or a body whose framing breaks (a
    chunk size that is not hex): counted, the connection closed, and the reader ends as on any client
    disconnect (CancelledError; `handler_cancellation` cancels the handler as the transport closes)."""
    content = request.content
    while True:
        try:
            if content.is_eof():  # the whole body is buffered: nothing to wait for
                chunk = await content.readany()
            else:
                async with asyncio.timeout(timeout):
                    chunk = await content.readany()
        except TimeoutError:
            metrics.connection_cut("body_timeout")
            problems("body_timeout", "no request body bytes for %gs: connection closed", timeout)
            _close(request)
            raise asyncio.CancelledError from None
        except RequestPayloadError as exc:  # its message quotes the body: only the class is logged
            metrics.bad_request("malformed_body")
            problems("malformed_body", "a request body whose framing breaks (%s): connection closed",
                     type(exc).__name__)  # fmt: skip
            _close(request)
            raise asyncio.CancelledError from None
        if not chunk:
            return
        yield chunk


def _close(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()


class ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's `logger=` for the proxy's servers: RequestHandler logs a request it cannot parse, and an
    exception out of a handler, with `exc_info`; both quote the request. Here each is a counted kind with one
    throttled line (the exception's class, the frames of a bug), and nothing else aiohttp says reaches the
    log."""

    def __init__(self, metrics: Metrics, problems: ProblemLog) -> None:
        super().__init__(logging.getLogger("islwatch.server"), {})
        self._metrics = metrics
        self._problems = problems

    def log(self, level: int, msg: object, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1] if exc_info else None
        quiet = logging.DEBUG if level < logging.WARNING else logging.WARNING  # non-HTTP bytes: debug
        if isinstance(exc, HttpProcessingError):  # aiohttp answers 400 and closes
            self._metrics.bad_request("malformed_head")
            self._problems("malformed_head", "a request head that does not parse (%s): answered 400",
                           type(exc).__name__, level=quiet)  # fmt: skip
        elif isinstance(exc, RequestPayloadError):  # a body read outside body_chunks
            self._metrics.bad_request("malformed_body")
            self._problems("malformed_body", "a request body whose framing breaks (%s)", type(exc).__name__,
                           level=quiet)  # fmt: skip
        elif exc is not None or level >= logging.ERROR:  # an islwatch bug: aiohttp answered 500
            self._metrics.proxy_error()
            what = traceback_line(exc) if exc is not None else str(msg).split(",", 1)[0]
            self._problems("proxy_error", "a request handler failed: %s", what, level=logging.ERROR)


def ensure_fd_limit(max_connections: int) -> None:
    """Each client connection can hold one upstream connection too: raise the soft open-file limit towards
    the hard one when it is below that (as Go's runtime does at start), and say so when it stays short."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    wanted = 2 * max_connections + 128  # + worker pipes, the admin port, tokenizer files
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft < wanted:
        log.warning("max_connections=%d wants %d open files; the limit is %d", max_connections, wanted, soft)
