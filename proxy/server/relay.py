"""Relaying the upstream's answer: each chunk to the client as it arrives, while a usage tap watches the bytes.

The tap never changes what the client receives, except to undo what `--inject-stream-usage` added
(core/usage.py `SSEUsageStripper`). Of a JSON answer, only what its usage can be read from is kept for the
worker (core/buffers.py `JSONUsageWindow`: bounded bytes, wherever usage sits); an event stream is parsed as
it passes (`SSEUsageParser`).
"""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import hdrs, web

from proxy.core.buffers import JSON_WHOLE_BYTES, JSONUsageWindow
from proxy.core.usage import SSEUsageParser, SSEUsageStripper, Usage
from proxy.server.upstream import failure_kind, forward_headers

log = logging.getLogger("islwatch.proxy")


class UsageTap:
    """Reads the server's usage from the response bytes that pass through it, holding a bounded number of
    them: a JSON answer is kept whole up to JSON_WHOLE_BYTES, and only windows after its `"usage"` keys beyond."""

    def __init__(self, sse: bool, strip: bool) -> None:
        self.parser = SSEUsageParser() if sse else None
        self.stripper = SSEUsageStripper(self.parser) if sse and strip and self.parser else None
        self.json = None if sse else JSONUsageWindow(whole=JSON_WHOLE_BYTES)

    @property
    def streamed(self) -> bool:
        return self.parser is not None

    def feed(self, chunk: bytes) -> bytes:
        if self.stripper is not None:
            return self.stripper.feed(chunk)
        if self.parser is not None:
            self.parser.feed(chunk)
        elif self.json is not None:
            self.json.feed(chunk)
        return chunk

    def flush(self) -> bytes:
        return self.stripper.flush() if self.stripper is not None else b""

    def usage(self) -> Usage | None:
        """A stream's whole usage (JSON answers are read by the worker, from `response_json`)."""
        return self.parser.result() if self.parser is not None else None

    def response_json(self) -> bytes | None:
        return self.json.kept() if self.json is not None else None


class RelayedResponse(web.StreamResponse):
    """A StreamResponse that adds none of aiohttp's own fields: `StreamResponse._prepare_headers` sets
    `Server: Python/... aiohttp/...` and, on a body without a type, `Content-Type: application/octet-stream`
    (RFC 9110 8.3 lets a sender that does not know the type leave the field out; the upstream did). `Date`
    stays: RFC 9110 6.6.1 asks a recipient that forwards a response without one to add it."""

    _ADDED = (hdrs.SERVER, hdrs.CONTENT_TYPE)
    # The head is held by aiohttp's writer until `relay` either writes the first body bytes with it (one
    # write for both, when they arrived with the upstream's head) or sends it alone (`send_headers`): as
    # `web.Response` does, and never later than the upstream's own head came.
    _send_headers_immediately = False

    async def _prepare_headers(self) -> None:
        absent = [name for name in self._ADDED if name not in self.headers]
        sent = list(self.headers.items()) if self.status == 304 else None
        await super()._prepare_headers()
        for name in absent:
            self.headers.popall(name, None)
        if sent is not None and any(name.lower() == "content-length" for name, _ in sent):
            self._keep_length(sent)

    def _keep_length(self, sent: list[tuple[str, str]]) -> None:
        """A 304's Content-Length is the length of the 200 it stands for (RFC 9110 8.6: a server may send
        it; caches read it), but aiohttp drops it from every 1xx, 204 and 304 (`should_remove_content_length`).
        The upstream's fields go back in their order; what aiohttp added (Date, Connection) after them."""
        names = {name.lower() for name, _ in sent}
        added = [(name, value) for name, value in self.headers.items() if name.lower() not in names]
        self.headers.clear()
        self.headers.extend(sent + added)


def client_response(upstream: aiohttp.ClientResponse, injected: bool) -> web.StreamResponse:
    """Same status, reason and headers as the upstream's (minus hop-by-hop; minus the length when the
    injected usage is stripped from the body), each field line as the upstream sent it (headers.py)."""
    response = RelayedResponse(status=upstream.status, reason=upstream.reason)
    response.headers.extend(forward_headers(upstream.raw_headers, drop_length=injected))
    return response


def is_event_stream(upstream: aiohttp.ClientResponse) -> bool:
    return upstream.headers.get("Content-Type", "").startswith("text/event-stream")


async def relay(
    request: web.Request, upstream: aiohttp.ClientResponse, response: web.StreamResponse, tap: UsageTap | None
) -> str | None:
    """Copy the upstream body to the client. Returns the failure kind when the upstream failed mid-body
    (the client then sees the connection close before the body ended, as it would talking to the upstream
    directly); None when the body was relayed whole or the client went away."""
    try:
        writer = await response.prepare(request)  # prepared already: its writer, the head still held
        first = upstream.content.read_nowait()  # the body bytes that came with the upstream's head
        if tap is not None and first:
            first = tap.feed(first)  # the stripper may hold a partial line back: then nothing goes yet
        if first:
            await response.write(first)  # the head and these bytes in one write
        elif writer is not None:
            writer.send_headers()  # nothing to go with it: the head goes now, never held for the body
        async for chunk in upstream.content.iter_any():
            if tap is not None:
                chunk = tap.feed(chunk)
            if chunk:
                await response.write(chunk)
        if tap is not None and (rest := tap.flush()):
            await response.write(rest)
        await response.write_eof()
        return None
    except BaseException as exc:
        upstream.close()  # never leave the upstream request (and the generation behind it) running
        kind = failure_kind(exc)
        if isinstance(exc, ConnectionResetError):
            return None  # the client went away
        if kind is None:
            raise  # cancelled (client disconnect) or a bug
        # Closing without write_eof leaves the chunked body (or Content-Length) incomplete.
        if request.transport is not None:
            request.transport.close()
        return kind
