"""Relaying the upstream's answer: each chunk to the client as it arrives, while a usage tap watches the bytes.

The tap never changes what the client receives, except to take out the usage-only event that
`--inject-stream-usage` asked for (core/usage.py `SSEUsageStripper`). Of a JSON answer, only what its
top-level usage can be read from is kept for the worker (core/buffers.py `JSONUsageWindow`); an event stream
is parsed as it passes (core/sse.py, `SSEUsageParser`). A compressed answer is read through a decompressing
copy: the client gets the upstream's bytes as they come, never held for the decoder.
"""

from __future__ import annotations

import logging
import zlib

import aiohttp
from aiohttp import hdrs, web

from proxy.core.buffers import JSON_WHOLE_BYTES, JSONUsageWindow
from proxy.core.usage import SSEUsageParser, SSEUsageStripper, Usage
from proxy.server.upstream import failure_kind, forward_headers

log = logging.getLogger("islwatch.proxy")

# Content codings the tap can read through (RFC 9110 8.4.1): gzip, and deflate (zlib; wbits 32+15 takes
# either header). Others (br, zstd, several codings) are relayed as sent and their usage is not read.
_ZLIB_CODINGS = frozenset({"gzip", "x-gzip", "deflate"})
_DECODE_STEP = 1 << 20  # decompressed bytes produced per step: memory stays bounded whatever the ratio


class Decoder:
    """A decompressing copy of a gzip or deflate body, for the tap only (at most `_DECODE_STEP` bytes made
    at a time); `failed` once it meets bytes it cannot read, and the answer's usage is then not read."""

    def __init__(self) -> None:
        self._z = zlib.decompressobj(32 + zlib.MAX_WBITS)
        self.failed = False

    def decode(self, chunk: bytes) -> list[bytes]:
        out: list[bytes] = []
        if self.failed:
            return out
        try:
            data = chunk
            while data:
                piece = self._z.decompress(data, _DECODE_STEP)
                if piece:
                    out.append(piece)
                data = self._z.unconsumed_tail
                if self._z.eof:  # a gzip body may hold several members (RFC 1952 2.2)
                    data = self._z.unused_data + data
                    self._z = zlib.decompressobj(32 + zlib.MAX_WBITS)
        except zlib.error:
            self.failed = True
        return out


def content_coding(upstream: aiohttp.ClientResponse) -> str:
    """The answer's content coding, lower case; "" for identity."""
    if hdrs.CONTENT_ENCODING not in upstream.headers:  # most answers: one lookup per request
        return ""
    coding = ",".join(upstream.headers.getall(hdrs.CONTENT_ENCODING)).strip().lower()
    return "" if coding == "identity" else coding


class UsageTap:
    """Reads the server's usage from the response bytes that pass through it, holding a bounded number of
    them: a JSON answer is kept whole up to JSON_WHOLE_BYTES, beyond only its top-level usage value."""

    def __init__(self, sse: bool, strip: bool, coding: str = "") -> None:
        readable = coding == "" or coding in _ZLIB_CODINGS
        self.decoder = Decoder() if coding in _ZLIB_CODINGS else None
        # Only an identity stream is edited; a compressed one is relayed as sent (a request whose usage was
        # asked goes with `Accept-Encoding: identity`, so this is a server that compressed regardless).
        self.stripper = SSEUsageStripper() if sse and strip and not coding else None
        self.parser = SSEUsageParser() if sse and self.stripper is None and readable else None
        self.json = JSONUsageWindow(whole=JSON_WHOLE_BYTES) if not sse and readable else None
        self.streamed = sse
        self.injected = strip

    @classmethod
    def of(cls, upstream: aiohttp.ClientResponse, injected: bool) -> UsageTap:
        return cls(is_event_stream(upstream), injected, content_coding(upstream))

    @property
    def strips(self) -> bool:
        """The client's body differs from the upstream's (so its length is not forwarded)."""
        return self.stripper is not None

    def feed(self, chunk: bytes) -> bytes:
        if self.stripper is not None:
            return self.stripper.feed(chunk)
        for data in self.decoder.decode(chunk) if self.decoder is not None else (chunk,):
            if self.parser is not None:
                self.parser.feed(data)
            elif self.json is not None:
                self.json.feed(data)
        return chunk

    def flush(self) -> bytes:
        return self.stripper.flush() if self.stripper is not None else b""

    def usage(self) -> Usage | None:
        """A stream's whole usage (JSON answers are read by the worker, from `response_json`)."""
        if self.decoder is not None and self.decoder.failed:
            return None
        if self.stripper is not None:
            return self.stripper.result()
        return self.parser.result() if self.parser is not None else None

    def response_json(self) -> bytes | None:
        if self.json is None or (self.decoder is not None and self.decoder.failed):
            return None
        return self.json.kept()

    def injection_result(self) -> str | None:
        """This answer's INJECTION_RESULTS outcome, for a stream whose usage was asked for."""
        if not (self.injected and self.streamed):
            return None
        if self.stripper is None:
            return "compressed"
        return "stripped" if self.stripper.stripped else "not_found"


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


def client_response(upstream: aiohttp.ClientResponse, strips: bool) -> web.StreamResponse:
    """Same status, reason and headers as the upstream's (minus hop-by-hop; minus the length when the
    injected usage is taken out of the body), each field line as the upstream sent it (headers.py)."""
    response = RelayedResponse(status=upstream.status, reason=upstream.reason)
    response.headers.extend(forward_headers(upstream.raw_headers, drop_length=strips))
    return response


def is_event_stream(upstream: aiohttp.ClientResponse) -> bool:
    """The media type is text/event-stream: case-insensitive, parameters aside (RFC 9110 8.3.1)."""
    ctype = upstream.headers.get(hdrs.CONTENT_TYPE, "")
    return ctype.split(";", 1)[0].strip().lower() == "text/event-stream"


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
