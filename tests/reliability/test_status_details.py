"""Statuses whose framing aiohttp treats specially cross the proxy as sent. A 304 keeps its Content-Length
(RFC 9110 8.6: the length of the 200 it stands for), its fields in order, and the connection stays usable.
A 103 Early Hints before the answer cannot be relayed: aiohttp's client reads past every 1xx but 101 and
exposes none (client_reqrep.py `ClientResponse.start`, aiohttp 3.14); the final answer still arrives whole
(docs/faults.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from proxy.server.app import run_proxy
from tests.reliability.reliability_peers import (
    READ_DEADLINE_SECONDS,
    SENTINEL,
    Origin,
    exchange,
    recording_origin,
)
from tests.server.helpers import proxy_config

GET = b'GET /v1/models HTTP/1.1\r\nHost: x\r\nIf-None-Match: "v1"\r\n\r\n'
BODY = b'{"object":"list","data":[]}'


@asynccontextmanager
async def proxied() -> AsyncIterator[tuple[int, Origin]]:
    async with recording_origin() as origin:
        config = proxy_config(origin.url, tokenizer="none", server_probe="off")
        async with run_proxy(config) as urls:
            yield int(urls.url.rsplit(":", 1)[1]), origin


async def test_a_304_keeps_its_content_length() -> None:
    fields = [(b"ETag", b'"v1"'), (b"Content-Length", b"1234"), (b"Cache-Control", b"max-age=60")]
    head = b"".join(b"%s: %s\r\n" % f for f in fields)
    async with proxied() as (port, origin):
        origin.replies.append(b"HTTP/1.1 304 Not Modified\r\n" + head + b"\r\n")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                GET + SENTINEL
            )  # a 304 has no body whatever its Content-Length: the next answer follows
            async with asyncio.timeout(READ_DEADLINE_SECONDS):
                not_modified = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[:-2]
                sentinel = await reader.readuntil(b"\r\n\r\n")
        finally:
            writer.close()
    assert not_modified[0] == b"HTTP/1.1 304 Not Modified"
    relayed = [tuple(line.split(b": ", 1)) for line in not_modified[1:]]
    assert [f for f in relayed if f[0].lower() != b"date"] == fields
    assert sentinel.startswith(b"HTTP/1.1 200 ")  # the connection still framed right


async def test_an_answer_after_103_early_hints_arrives_whole() -> None:
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    final = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(BODY),
        BODY,
    )
    async with proxied() as (port, origin):
        origin.replies.append(hints + final)
        got = await exchange(port, GET, sentinel=False)
    (answer,) = got.responses
    assert answer.status == 200 and answer.body == BODY
