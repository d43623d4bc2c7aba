"""Field lines cross the proxy byte for byte, both ways, checked with raw sockets on both sides: a client
socket writes crafted request heads through a real islwatch proxy to a socket upstream that records the
exact bytes it received and answers with a crafted head.

Every line but the hop-by-hop ones arrives as sent: repeated names in any case (`X-B: 1` then `x-b: 2`),
obs-text bytes (RFC 9110 5.5: `\\xe9`, `\\xff`), known names in the client's spelling (`content-type`), the
order. Host is the upstream's; Content-Length is the client's while the body is unchanged. Only the
optional whitespace around a value (not part of it, RFC 9110 5.5) is written as one space.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from proxy.server.app import run_proxy
from tests.server.helpers import Background, proxy_config

DATE = b"Date: Mon, 30 Nov 2026 12:00:00 GMT\r\n"
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


@dataclass
class RawUpstream:
    """Records each request as received (head and Content-Length body) and answers with `answer`."""

    answer: bytes = b"HTTP/1.1 204 No Content\r\n" + DATE + b"Server: raw\r\nConnection: close\r\n\r\n"
    received: list[bytes] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            body = await reader.readexactly(content_length(head))
            self.received.append(head + body)
            writer.write(self.answer)
            await writer.drain()
        finally:
            writer.close()


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            return int(value)
    return 0


@contextlib.asynccontextmanager
async def raw_server(upstream: RawUpstream) -> AsyncIterator[str]:
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@dataclass
class Servers:
    upstream: RawUpstream
    proxy_port: int


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    bg = Background()
    upstream = RawUpstream()
    try:
        url = bg.enter(raw_server(upstream))
        proxy = bg.enter(run_proxy(proxy_config(url, tokenizer="none")))
        yield Servers(upstream, int(proxy.url.rsplit(":", 1)[1]))
    finally:
        bg.close()


def exchange(servers: Servers, request: bytes) -> tuple[bytes, bytes]:
    """Send `request` on a new client socket: (the response as the client got it, the request as the
    upstream got it)."""
    before = len(servers.upstream.received)
    with socket.create_connection(("127.0.0.1", servers.proxy_port), timeout=30) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += _recv(s)
        head, _, body = data.partition(b"\r\n\r\n")
        while len(body) < content_length(head + b"\r\n"):
            body += _recv(s)
    # The upstream recorded the request before it answered, so it is there once the answer arrived.
    assert len(servers.upstream.received) == before + 1
    return head + b"\r\n\r\n" + body, servers.upstream.received[-1]


def _recv(s: socket.socket) -> bytes:
    chunk = s.recv(65536)
    assert chunk, "connection closed before the whole response"
    return chunk


def field_lines(message: bytes) -> list[bytes]:
    """The field lines of a message head, as bytes, in order."""
    return message.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]


def crossed(sent: bytes, received: bytes) -> tuple[list[bytes], list[bytes]]:
    """The request's field lines as sent and as the upstream got them, each without its Host line (this
    hop's: the upstream gets its own)."""

    def without_host(lines: list[bytes]) -> list[bytes]:
        return [line for line in lines if not line.lower().startswith(b"host:")]

    assert sum(line.lower().startswith(b"host:") for line in field_lines(received)) == 1
    return without_host(field_lines(sent)), without_host(field_lines(received))


# ---- requests -------------------------------------------------------------------------------------------


def test_request_names_repeated_in_another_case_all_reach_the_upstream(servers: Servers) -> None:
    sent = b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\nX-B: 1\r\nx-b: 2\r\nX-b: 3\r\nCookie: a=1\r\ncookie: b=2\r\n\r\n"
    response, received = exchange(servers, sent)
    assert response.startswith(b"HTTP/1.1 204 ")
    lines, got = crossed(sent, received)
    assert got == lines


def test_request_obs_text_bytes_reach_the_upstream(servers: Servers) -> None:
    sent = (
        b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\n"
        b"X-Bin: caf\xe9\r\nX-High: \xff\xfe\x80 end\r\nX-Utf8: caf\xc3\xa9\r\nX-Title: \xe9t\xe9\r\n\r\n"
    )
    _, received = exchange(servers, sent)
    lines, got = crossed(sent, received)
    assert got == lines


def test_request_known_names_keep_spelling_order_and_length(servers: Servers) -> None:
    # An analysed endpoint: the body is read and sent again; its Content-Length line is the client's.
    sent = (
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        b"content-type: application/json\r\nx-request-id: 7\r\nHost: proxy\r\n"
        b"authorization: Bearer t0ken\r\nACCEPT: */*\r\ncontent-length: %d\r\nuser-agent: raw/1\r\n\r\n"
        % len(BODY)
    ) + BODY
    _, received = exchange(servers, sent)
    lines, got = crossed(sent, received)
    assert got == lines
    assert received.endswith(b"\r\n\r\n" + BODY)


def test_request_fields_named_by_connection_are_dropped_in_any_case(servers: Servers) -> None:
    # RFC 9110 7.6.1: the fields a Connection header names are this hop's; names are case-insensitive.
    sent = (
        b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\nConnection: keep-alive, X-Hop\r\n"
        b"x-hop: 1\r\nX-HOP: 2\r\nX-Kept: 3\r\nKeep-Alive: timeout=5\r\n\r\n"
    )
    _, received = exchange(servers, sent)
    assert crossed(sent, received)[1] == [b"X-Kept: 3"]


@pytest.mark.parametrize("path", [b"/v1/a%0ab", b"/v1/a%0Db", b"/%0a"])
def test_request_paths_with_encoded_line_breaks_are_relayed_as_sent(servers: Servers, path: bytes) -> None:
    expected = answer(servers.upstream, b"HTTP/1.1 200 OK", [DATE.rstrip(), b"X-Only: 1"], b"ok")
    response, received = exchange(servers, b"GET " + path + b" HTTP/1.1\r\nHost: proxy\r\n\r\n")
    assert received.startswith(b"GET " + path + b" HTTP/1.1\r\n")
    assert response == expected


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/other"])
def test_a_compressed_request_body_reaches_the_upstream_compressed(servers: Servers, path: bytes) -> None:
    """aiohttp's server inflates `Content-Encoding: gzip` bodies by default; the proxy relays them as sent."""
    body = gzip.compress(BODY)
    head = b"POST " + path + b" HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
    head += b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body)
    _, received = exchange(servers, head + body)
    assert received.endswith(b"\r\n\r\n" + body)
    assert b"Content-Encoding: gzip\r\n" in received


# ---- responses ------------------------------------------------------------------------------------------


def answer(upstream: RawUpstream, status_line: bytes, lines: list[bytes], body: bytes) -> bytes:
    """Make the upstream answer with these field lines (and `Connection: close`, which is hop-by-hop), and
    return the response the client must get: the same bytes without that line."""
    head = status_line + b"\r\n" + b"".join(line + b"\r\n" for line in lines)
    length = b"Content-Length: %d\r\n" % len(body)
    upstream.answer = head + b"Connection: close\r\n" + length + b"\r\n" + body
    return head + length + b"\r\n" + body


GET = b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\n\r\n"


def test_response_obs_text_in_values_and_reason_reaches_the_client(servers: Servers) -> None:
    expected = answer(
        servers.upstream,
        b"HTTP/1.1 200 Caf\xe9 ok",
        [
            DATE.rstrip(),
            b"Server: raw",
            b"Content-Type: text/plain",
            b"X-Bin: caf\xe9 \xff\x80",
            b"X-Utf8: \xc3\xa9",
        ],
        b"ok",
    )
    response, _ = exchange(servers, GET)
    assert response == expected


def test_response_repeated_set_cookie_keeps_every_line_spelling_and_order(servers: Servers) -> None:
    expected = answer(
        servers.upstream,
        b"HTTP/1.1 200 OK",
        [
            b"set-cookie: a=1; Path=/",
            b"x-z: first",
            b"Set-Cookie: b=2; HttpOnly",
            b"content-type: application/json",
            b"SET-COOKIE: c=3",
            b"x-a: last",
            b"server: raw",
            DATE.rstrip(),
        ],
        b"{}",
    )
    response, _ = exchange(servers, GET)
    assert response == expected


def test_response_without_server_or_type_gets_neither_from_the_proxy(servers: Servers) -> None:
    """aiohttp would add `Server: Python/... aiohttp/...` and `Content-Type: application/octet-stream`
    (vLLM's /health answers with neither); the client must get the upstream's fields alone."""
    expected = answer(servers.upstream, b"HTTP/1.1 200 OK", [DATE.rstrip(), b"X-Only: 1"], b"ok")
    response, _ = exchange(servers, GET)
    assert response == expected


# ---- the serializer -------------------------------------------------------------------------------------


def aiohttp_serializers(http_writer: Any) -> list[Any]:
    """aiohttp's own head writers: the Python one, and the C one when it is built."""
    return [
        http_writer._py_serialize_headers,
        *filter(None, [getattr(http_writer, "_c_serialize_headers", None)]),
    ]


@pytest.mark.parametrize(
    "fields",
    [
        [("Content-Type", "application/json"), ("X-B", "1"), ("x-b", "2")],
        [("X-Utf8", "café 中文 🦓"), ("X-Tab", "a\tb"), ("X-Empty", "")],
    ],
)
def test_serializer_writes_what_aiohttp_writes_for_heads_without_surrogates(fields) -> None:
    from aiohttp import http_writer
    from multidict import CIMultiDict, istr

    from proxy.server.headers import serialize_head

    headers = CIMultiDict([(istr(k), v) for k, v in fields])
    ours = serialize_head("HTTP/1.1 200 OK", headers)
    for theirs in aiohttp_serializers(http_writer):
        assert ours == theirs("HTTP/1.1 200 OK", headers)


@pytest.mark.parametrize("bad", ["a\r\nX-Injected: 1", "a\nb", "a\x00b", "a\x7fb"])
def test_serializer_refuses_what_aiohttp_refuses(bad: str) -> None:
    from aiohttp import http_writer
    from multidict import CIMultiDict

    from proxy.server.headers import serialize_head

    headers = CIMultiDict([("X-A", bad)])
    for theirs in aiohttp_serializers(http_writer):
        with pytest.raises(ValueError):
            theirs("HTTP/1.1 200 OK", headers)
    with pytest.raises(ValueError):
        serialize_head("HTTP/1.1 200 OK", headers)
