"""A global bound on the request bodies held at once (`--max-inflight-body-bytes`).

A request body is held whole while its request is relayed (inspect.py reads it to analyse it and so that a
request lost on a stale pooled connection can be sent again), at 2.5-3.2x its size at peak: without a bound
the worst case is max_connections x max_body_bytes x 3, ~24 GiB at the defaults. Each request takes its
body's declared length from the budget before its body is read (a chunked body, whose length is unknown,
the most the proxy holds of one: max_body_bytes) and gives it back when its answer is done. Past the budget
a request waits, first come first served, up to `WAIT_SECONDS` (its body stays in the socket meanwhile:
aiohttp stops reading a connection whose buffered body passes its high-water mark), then gets a 503 with
Retry-After, as nginx's `limit_conn` answers 503 (RFC 9110 15.6.4). Both are counted.
"""

from __future__ import annotations

import asyncio
from collections import deque

import orjson
from aiohttp import hdrs, web

from proxy.server.metrics import Metrics

WAIT_SECONDS = 10.0
RETRY_AFTER_SECONDS = 1


class BodyBudget:
    def __init__(self, limit: int, max_body_bytes: int, metrics: Metrics) -> None:
        self.limit = limit
        self.max_body_bytes = max_body_bytes
        self.held = 0
        self._metrics = metrics
        self._queue: deque[tuple[int, asyncio.Future[None]]] = deque()
        # Read when scraped: a set() per take and release would cost each request two lock round trips.
        metrics.body_budget_bytes.set_function(lambda: self.held)

    def size(self, request: web.Request) -> int:
        """What the request takes: its body's declared length (capped), 0 without a body."""
        if not request.body_exists:
            return 0
        length = request.content_length
        return min(self.max_body_bytes if length is None else length, self.max_body_bytes, self.limit)

    def take_now(self, n: int) -> bool:
        if self._queue or self.held + n > self.limit:  # first come first served: no overtaking
            return False
        self.held += n
        return True

    async def take(self, n: int) -> bool:
        """Wait for room; False after WAIT_SECONDS (counted). A cancelled wait takes nothing."""
        self._metrics.body_budget("waited")
        entry = (n, asyncio.get_running_loop().create_future())
        self._queue.append(entry)
        try:
            async with asyncio.timeout(WAIT_SECONDS):
                await asyncio.shield(entry[1])
            return True
        except TimeoutError:
            if entry[1].done():  # granted just as the wait ran out
                return True
            self._metrics.body_budget("refused")
            return False
        except asyncio.CancelledError:
            if entry[1].done():  # granted as the client went away: given back
                self.release(n)
            raise
        finally:
            if not entry[1].done():
                entry[1].cancel()
                self._queue.remove(entry)
                self._grant()  # the ones behind it may fit now

    def release(self, n: int) -> None:
        self.held -= n
        self._grant()

    def _grant(self) -> None:
        while self._queue and self.held + self._queue[0][0] <= self.limit:
            n, future = self._queue.popleft()
            self.held += n
            future.set_result(None)


def refused() -> web.Response:
    """The proxy's 503: an OpenAI-style error object, so SDKs retry it like the server's own 503."""
    message = "islwatch: too many request bodies in flight (max_inflight_body_bytes); retry"
    body = {"error": {"message": message, "type": "overloaded", "param": None, "code": "body_budget"}}
    response = web.Response(
        status=503, body=orjson.dumps(body), content_type="application/json",
        headers={hdrs.RETRY_AFTER: str(RETRY_AFTER_SECONDS)},
    )  # fmt: skip
    response.force_close()  # the body was never read: the connection cannot carry another request
    return response
